"""What every seed-paper arm shares: its scale, its data, its phases, the one training loop, its measurements.

An arm trains small models in memory with the project's own loop (:func:`training.recipes.finetune.finetune`, i.e.
:func:`training.loop.run_phases` with the DP engine), so an arm can express what a config cannot (a DP phase with
σ = 0, a head rate by parameter group, interpolated weights) while the DP steps stay exactly the project's.

Data (:func:`load_arm_data`): one seeded draw of ``private + public + val`` training images, shuffled by a fixed
permutation (some array files are sorted by class) and split into three disjoint sets (private: what DP protects;
public: the non-DP pre-training data; val: held out for every selection, e.g. of a budget split), and the test
split, whose first fixed draw of ``hessian_batch`` images (:data:`training.recipes.common.HELD_OUT_SEED`) is the
tr(H) batch of every arm.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from training.config import AugmentConfig, DataConfig, ModelConfig, OptimConfig, PrivacyConfig, TrainingConfig
from training.data import ImageSet, load_pool, load_test
from training.phases import PhaseSpec

__all__ = ["CROP_FLIP", "CONTINUAL_ARMS", "TRACE_RUNS", "ArmScale", "ArmData", "load_arm_data", "build", "sigma_for",
           "phase", "train", "train_dynamic", "TraceLogger", "test_acc", "head_names", "per_seed", "PART_FIELDS",
           "AFTER_FIT_FIELDS", "KE_SOURCES", "chosen_parts"]


#: the arms' augmentation (``ArmScale.augment``, ``ArmScale.vit_pretrain_augment``): CIFAR's crop and flip
CROP_FLIP = AugmentConfig(crop_padding=4, flip=True)


#: the trainings of the continual arm (:func:`experiments.arms.bu.continual_arm`), each one model per seed
CONTINUAL_ARMS = ("nondp", "clip_only", "scratch", "continual", "plateau")
#: the Ke et al. arm's source models (``ArmScale.ke_source``)
KE_SOURCES = ("arch", "vit")
#: the trainings of the tr(H) arm (:func:`experiments.arms.bu.trace_arm`), each one model per seed
TRACE_RUNS = ("pretrain_nondp", "pretrain_dp", "finetune_dp")


@dataclass(frozen=True, kw_only=True)
class ArmScale:
    """Sizes, steps, seeds and privacy of every arm at one scale (see :mod:`experiments.arms.scales` for the named ones).

    ``steps`` is the private (DP) phase of each arm; ``switch`` the public steps of the continual arms;
    ``public_steps`` the Ganesh et al. sweep; tr(H) uses ``hessian_batch`` test images and ``hessian_probes`` probes
    every ``hessian_every`` steps over ``trace_steps`` steps. σ is calibrated to ``epsilon`` by ``accountant``
    unless ``noise_multiplier`` fixes it (then no ε is claimed: tests). The downstream (fine-tuning) data of the Ke
    et al. arm has ``downstream_private`` private and ``downstream_val`` validation images (when given; else the
    pre-training sizes) and then no public part. The ``vit_*`` fields belong to the ViT arm
    (:mod:`experiments.arms.vit`): its timm architecture and kwargs, its learning rate (None: ``lr``), its ε grid
    (``inf``: non-DP), the tuning search (``vit_trials`` trials of ``vit_trial_steps`` steps, learning rates
    log-uniform in ``lr`` times ``vit_lr_range``, on the ``vit_tune_fraction`` of the public images held out of
    pre-training), ``vit_probe_images`` test images for the per-block features, ``vit_public`` public images
    (None: ``public``), ``vit_pretrain_augment`` (:data:`CROP_FLIP` in the ViT's public pre-training),
    ``vit_shared_pretrain`` (one public pre-trained model, seed 0, for every seed, whose seeds then vary the
    fine-tuning and the search only, as a study of one public checkpoint does) and the pre-training's learning-rate
    ``vit_pretrain_schedule`` (``optim.schedule``) and ``vit_pretrain_warmup`` steps.
    ``augment`` puts :data:`CROP_FLIP` (random crops with 4 pixels of reflected padding, horizontal flips) in every
    phase of every arm, DP ones included: each example still gives one clipped gradient, so the DP analysis is
    unchanged (ResNet-20 on 20,000 CIFAR-10 images needs it to pass 60 % non-DP in 1,000 steps).
    ``grad_sample_mode`` is how the DP phases get their clipped per-example gradients (``privacy.grad_sample_mode``:
    the same clipped sums by any mode; ``bk`` takes one backward pass and no per-example gradient of the linear
    layers, which makes a ViT's DP step several times cheaper). ``continual_arms`` names the trainings of the
    continual arm to run (:func:`experiments.arms.bu.continual_arm`; all five by default; one each when a GPU queue
    splits a seed into parts); ``ganesh_parts`` the parts of the Ganesh et al. arm
    (:func:`experiments.arms.ganesh.ganesh_parts`; None: all); ``trace_runs`` the tr(H) arm's trainings;
    ``ke_parts`` the Ke et al. arm's runs (:func:`experiments.arms.ke.ke_parts`; None: all). ``ke_source`` is the
    Ke et al. arm's pre-trained source model: ``arch`` (``scale.arch`` trained non-DP for ``source_steps`` on the
    public images) or ``vit`` (the ViT arm's public pre-training, :func:`experiments.arms.vit.pretrained_vit`, seed 0,
    fine-tuned at ``vit_lr``). ``membership_models`` is how many models of each training the membership arm trains
    (:func:`experiments.arms.membership.membership_arm`: each is a target, the others its references).
    """

    name: str
    dataset: str = "cifar10"
    root: str | None = "../shared/data/cifar10"
    downstream: str = "food101"
    downstream_root: str | None = "../shared/data/food101"
    downstream_private: int | None = None
    downstream_val: int | None = None
    image_size: int | None = None
    private: int = 2000
    public: int = 1000
    val: int = 500
    test: int = 1000
    arch: str = "small_cnn"
    optim: str = "adamw"
    lr: float = 0.002
    head_lr_scale: float = 5.0
    batch_size: int = 128
    steps: int = 100
    switch: int = 30
    source_steps: int = 200
    public_steps: tuple[int, ...] = (0, 10, 30, 100, 300)
    seeds: tuple[int, ...] = (0, 1, 2)
    epsilon: float = 8.0
    delta: float = 1e-5
    clip: float = 1.0
    hessian_batch: int = 256
    hessian_probes: int = 32
    hessian_every: int = 25
    trace_steps: int = 200
    knn_every: int = 20
    barrier_points: int = 11
    lp_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)
    accountant: str = "pld"
    noise_multiplier: float | None = None
    vit_arch: str = "vit_tiny_patch16_224"
    vit_kwargs: dict[str, Any] = field(default_factory=lambda: {"embed_dim": 32, "num_heads": 2, "depth": 12})
    vit_lr: float | None = None
    vit_epsilons: tuple[float, ...] = (1.0, 3.0, 8.0, math.inf)
    vit_trials: int = 6
    vit_trial_steps: int = 30
    vit_lr_range: tuple[float, float] = (0.1, 10.0)
    vit_tune_fraction: float = 0.4
    vit_probe_images: int = 1000
    vit_public: int | None = None
    vit_pretrain_augment: bool = False
    vit_shared_pretrain: bool = False
    vit_pretrain_schedule: str = "constant"
    vit_pretrain_warmup: int = 0
    augment: bool = False
    grad_sample_mode: str = "hooks"
    continual_arms: tuple[str, ...] = CONTINUAL_ARMS
    ganesh_parts: tuple[str, ...] | None = None
    trace_runs: tuple[str, ...] = TRACE_RUNS
    ke_parts: tuple[str, ...] | None = None
    ke_source: str = "arch"
    membership_models: int = 16
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in ("private", "public", "val", "test", "batch_size", "steps", "hessian_batch", "hessian_probes"):
            if getattr(self, f) < 1:
                raise ValueError(f"ArmScale.{f} must be >= 1, got {getattr(self, f)}")
        if not self.seeds:
            raise ValueError("ArmScale.seeds must hold at least one seed")
        if self.ke_source not in KE_SOURCES:
            raise ValueError(f"ArmScale.ke_source must be one of {', '.join(KE_SOURCES)}, got {self.ke_source!r}")

    def with_(self, **kw: Any) -> "ArmScale":
        return replace(self, **kw)


@dataclass(frozen=True)
class ArmData:
    """Disjoint private / public / val training images, the test split and the fixed tr(H) batch."""

    private: ImageSet
    public: ImageSet
    val: ImageSet
    test: ImageSet
    hessian_x: torch.Tensor
    hessian_y: torch.Tensor

    @property
    def num_classes(self) -> int:
        return len(self.private.classes)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, *self.private.x.shape[1:3])


def load_arm_data(scale: ArmScale, *, downstream: bool = False, device: torch.device | str = "cpu") -> ArmData:
    """The arm data of ``scale`` (``downstream``: the fine-tuning dataset instead of the pre-training one).

    Raises:
        DataError: the dataset is missing or smaller than ``private + public + val``.
    """
    from foundation.errors import DataError
    from training.recipes.common import HELD_OUT_SEED, held_out_batch

    name, root = (scale.downstream, scale.downstream_root) if downstream else (scale.dataset, scale.root)
    n_priv, n_pub, n_val = scale.private, scale.public, scale.val
    if downstream and scale.downstream_private is not None:
        n_priv, n_pub, n_val = scale.downstream_private, 0, scale.downstream_val or scale.val
    n = n_priv + n_pub + n_val
    cfg = DataConfig(dataset=name, root=root, pool_size=n, pool_seed=0, audit_split=False, test_size=scale.test,
                     image_size=scale.image_size)
    pool = load_pool(cfg)
    if len(pool) < n:
        raise DataError(f"{name} has {len(pool)} training images, the scale needs {n}")
    test = load_test(cfg)
    hx, hy = held_out_batch(test, size=scale.hessian_batch, seed=HELD_OUT_SEED, device=torch.device(device))
    # a fixed permutation first: a pool subset keeps the file's order, and some files are sorted by class
    order = np.random.default_rng([0, 0x53504C54]).permutation(len(pool))[:n]
    return ArmData(private=pool.subset(order[:n_priv]), public=pool.subset(order[n_priv:n_priv + n_pub]),
                   val=pool.subset(order[n_priv + n_pub:]), test=test, hessian_x=hx, hessian_y=hy)


def build(scale: ArmScale, data: ArmData, *, seed: int, device: torch.device | str = "cpu", arch: str | None = None,
          kwargs: dict[str, Any] | None = None) -> nn.Module:
    """A fresh ``arch`` (default ``scale.arch``; timm ``kwargs``) for ``data``'s classes, initialised from ``seed``."""
    from training.models import build_model

    return build_model(ModelConfig(arch=arch or scale.arch, kwargs=dict(kwargs or {})), num_classes=data.num_classes,
                       input_shape=data.input_shape, seed=seed).module.to(device)


def sigma_for(scale: ArmScale, *, n: int, steps: int, epsilon: float | None = None) -> float:
    """σ of ``steps`` Poisson-sampled DP steps (q = B/n) at ``epsilon`` (default ``scale.epsilon``) by
    ``scale.accountant`` (cached: a PLD calibration takes tens of seconds on a busy CPU); a fixed
    ``scale.noise_multiplier`` instead when given (tests)."""
    if scale.noise_multiplier is not None:
        return float(scale.noise_multiplier)
    return _sigma(float(epsilon or scale.epsilon), scale.batch_size / n, int(steps), scale.delta, scale.accountant)


@functools.lru_cache(maxsize=256)
def _sigma(epsilon: float, q: float, steps: int, delta: float, accountant: str) -> float:
    from training.accounting import noise_multiplier_for

    return float(noise_multiplier_for(target_epsilon=epsilon, sample_rate=q, steps=steps, delta=delta,
                                      accountant=accountant))


def phase(name: str, images: ImageSet, *, scale: ArmScale, steps: int, sigma: float | None, seed: int, index: int,
          lr: float | None = None, trainable: Sequence[str] | None = None, lr_scales: dict[str, float] | None = None,
          members: np.ndarray | None = None, augment: AugmentConfig | None = None, schedule: str = "constant",
          warmup_steps: int = 0) -> PhaseSpec:
    """One phase on ``images`` (rows ``members``): DP with noise multiplier ``sigma`` (0 allowed: clipping only) or,
    with ``sigma`` None, non-DP with shuffled batches; sampler seed = ``phase_seed(seed, index)``; ``augment``: the
    phase's training-time augmentation (None: :data:`CROP_FLIP` when ``scale.augment``, else none); ``schedule``
    and ``warmup_steps``: the learning rate over the phase's steps (``optim.schedule``, ``optim.warmup_steps``)."""
    from training.recipes.common import phase_seed

    if augment is None and scale.augment:
        augment = CROP_FLIP

    dp = sigma is not None
    privacy = (PrivacyConfig(enabled=True, noise_multiplier=1.0, max_grad_norm=scale.clip,
                             grad_sample_mode=scale.grad_sample_mode) if dp
               else PrivacyConfig(enabled=False, sampling="shuffle"))
    optim = OptimConfig(name=scale.optim, lr=lr or scale.lr, lr_scales=dict(lr_scales or {}), schedule=schedule,
                        warmup_steps=int(warmup_steps))
    return PhaseSpec(name=name, dp=dp, dataset=scale.dataset, x=images.x, y=images.y, index=members,
                     batch_size=min(scale.batch_size, len(images) if members is None else len(members)),
                     steps=int(steps), sigma=float(sigma) if dp else None, privacy=privacy, optim=optim,
                     sampler_seed=phase_seed(seed, index), trainable=tuple(trainable) if trainable else None,
                     training=(TrainingConfig(steps=max(1, int(steps)), augment=augment)
                               if augment is not None and augment.active else None))


def train(model: nn.Module, phases: Sequence[PhaseSpec], *, seed: int, device: torch.device | str = "cpu",
          on_step: Callable[[int, str, Any, nn.Module], None] | None = None) -> nn.Module:
    """Run ``phases`` on ``model`` with the project's loop (:func:`training.recipes.finetune.finetune`)."""
    from training.recipes.finetune import finetune

    return finetune(model, list(phases), seed=seed, device=device, on_step=on_step).model


def train_dynamic(model: nn.Module, next_phase: Callable[[list[dict[str, Any]]], Any], *, seed: int,
                  device: torch.device | str = "cpu") -> tuple[nn.Module, list[dict[str, Any]]]:
    """:func:`training.loop.run_phases` with a recipe-like ``next_phase`` (phases that end on a switch rule's
    ``decide``); returns the model and the completed-phase records (their ``steps`` and ``reason``)."""
    from training.loop import RunContext, run_phases

    ctx = RunContext(run_dir=None, config_sha="", seed=int(seed), device=torch.device(device), logger=None,
                     physical_batch_size=256, log_every=1, checkpoint_every=1, eval_every=0, test=None, delta=None,
                     on_step=None)
    trained = run_phases(ctx, model, next_phase)
    return trained, ctx.completed


class TraceLogger:
    """tr(H) (Hutchinson, the data's fixed test batch) every ``every`` global steps, with its standard error.

    Use :meth:`at_start` before training and pass :meth:`on_step` to :func:`train`.
    """

    def __init__(self, model: nn.Module, data: ArmData, *, scale: ArmScale, seed: int, every: int) -> None:
        from training.hessian import HessianMonitor

        self.monitor = HessianMonitor(copy.deepcopy(model), data.hessian_x, data.hessian_y,
                                      probes=scale.hessian_probes, sigma=None, batch_size=1.0, clip_norm=1.0, seed=seed)
        self.every = int(every)
        self.rows: list[dict[str, float]] = []

    def at_start(self, model: nn.Module) -> None:
        self.rows.append({"step": 0, **self.monitor.measure(model, 0)})

    def on_step(self, g: int, _name: str, _stats: Any, net: nn.Module) -> None:
        if self.every and g % self.every == 0:
            self.rows.append({"step": g, **self.monitor.measure(net, g)})


def test_acc(model: nn.Module, images: ImageSet, device: torch.device | str = "cpu") -> float:
    from training.evaluate import accuracy

    return float(accuracy(model, images, device=device))


def head_names(model: nn.Module) -> list[str]:
    from training.recipes.finetune import head_parameter_names

    return head_parameter_names(model)


def per_seed(scale: ArmScale, fn: Callable[[int], dict[str, Any]], log: Callable[[str], None] | None = None
             ) -> dict[str, list[Any]]:
    """``{key: [value of seed 0, value of seed 1, ...]}`` of ``fn(seed)`` over ``scale.seeds``."""
    out: dict[str, list[Any]] = {}
    for s in scale.seeds:
        res = fn(s)
        if log:
            log(f"  seed {s}: " + ", ".join(f"{k}={v:.3f}" for k, v in res.items()
                                            if isinstance(v, float) and math.isfinite(v)))
        for k, v in res.items():
            out.setdefault(k, []).append(v)
    return out


def chosen_parts(scale: ArmScale, field: str, every: Sequence[str]) -> list[str]:
    """The parts of an arm that ``scale.<field>`` asks for (None: ``every``), checked against ``every``.

    Raises:
        ValueError: none, or one that is not a part of the arm.
    """
    value = getattr(scale, field)
    parts = list(every) if value is None else list(value)
    if not parts or any(p not in every for p in parts):
        raise ValueError(f"{field} must name some of {', '.join(every)}, got {parts}")
    return parts


#: scale fields that differ between the part jobs of one run (:mod:`experiments.arms.runner`'s splits) and do not
#: touch a model that the parts share (a seed's pre-trained ViT, the Ke et al. arm's source model)
PART_FIELDS = ("seeds", "vit_epsilons", "continual_arms", "ganesh_parts", "trace_runs", "ke_parts")
#: scale fields read only after a shared (public, non-DP) model is trained: the scale's name, the DP and
#: fine-tuning phases that start from it, the measurements and the other arms' settings. Two scales that differ
#: only in these share the model (a Ke et al. arm on the ViT arm's pre-trained model). Every field not named here
#: stays in the key, so a new field keys the model until it is shown not to touch it.
AFTER_FIT_FIELDS = ("name", "downstream", "downstream_root", "downstream_private", "downstream_val", "head_lr_scale",
                    "steps", "switch", "public_steps", "epsilon", "delta", "clip", "hessian_probes", "hessian_every",
                    "trace_steps", "knn_every", "barrier_points", "lp_fractions", "accountant", "noise_multiplier",
                    "vit_trials", "vit_trial_steps", "vit_lr_range", "vit_probe_images", "grad_sample_mode",
                    "ke_source", "membership_models")


