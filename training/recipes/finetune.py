"""DP fine-tuning: the one loop (:func:`finetune`) and the ``finetune`` recipe that runs it into a run directory.

Ke, Hou, Fanti, Oh, "On the Convergence of Differentially-Private Fine-tuning: To Linearly Probe or to Fully
Fine-tune?" (arXiv:2402.18905, 2024): DP full fine-tuning (FFT) from a pre-trained backbone with a freshly
initialised head distorts the backbone's features; DP linear probing (LP, head only) first aligns the head,
after which FFT helps; the ε budget is split between the two phases (:mod:`training.recipes.budget`).

Every DP fine-tuning in the project is built from the same three pieces:

* :func:`new_head`: the classifier for the downstream classes, ``keep`` (the checkpoint's own), ``zero`` (weight
  and bias zero: every class scores 0 at the start) or ``random`` (the model's own fresh classifier
  initialisation, ``reset_classifier``, drawn from a seed);
* :func:`finetune_phases`: the phases of a plan (:class:`~training.recipes.budget.PhaseBudget` entries named
  ``lp`` or ``fft``) as :class:`~training.phases.PhaseSpec` objects: ``lp`` trains only the head (the
  backbone stays bit-identical), ``fft`` every parameter that was trainable when the plan was made; each
  phase has a fresh optimizer, its own sampler seed (:func:`~training.recipes.common.phase_seed`) and σ;
* the step loop :func:`training.loop.run_phases` (Poisson or shuffled batches, per-example clipping
  and Gaussian noise through :func:`training.dp.engine.make_stepper`, the noise reseeded per global step from
  the seed). :func:`finetune` runs it in memory; the recipe runs it with checkpoints, logging and resume.

Callers: the ``finetune`` recipe below (``audit train``), the transfer evaluator's fine-tuning protocol
(:mod:`audit.transfer.finetune`) and the feature-distortion trajectories (:mod:`audit.transfer.distortion_run`).

Recipe: starting point (``training.finetune.checkpoint``): a run directory (architecture from its manifest,
weights checked against its sha256) or a weights file (architecture from ``model``); the head as
``finetune.head_init`` says (when the number of classes differs, the classifier is always a new one and
``keep`` is an error). With ``lp_fft`` both phases run in that order, LP at ``finetune.lp_lr``. The accountant
composes the DP phases into the claim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from training.config import ModelConfig, OptimConfig, PrivacyConfig, TrainingConfig
from training.dp.engine import StepStats
from training.dp.rng import Stream, derive_seed
from foundation.errors import CheckpointError, ConfigError, DataError, UserError
from foundation.io import sha256_file
from training.run import open_run
from training.run.manifest import PhaseInfo
from training.models import build_model, load_weights_file
from training.models.weights import strip_prefix
from training.recipes.budget import PhaseBudget, split_budget, split_steps
from training.recipes.common import RunSetup, make_gradient_canaries, make_monitor, phase_seed
from training.phases import PhaseSpec, set_trainable
from training.loop import NextPhase, RunContext, run_phases

__all__ = ["HEAD_INITS", "head_seed", "FinetuneOutcome", "classifier_of", "head_parameter_names", "new_head",
           "finetune_phases", "finetune", "FinetuneRecipe", "resolve_checkpoint"]

HeadInit = Literal["keep", "zero", "random"]
HEAD_INITS = ("keep", "zero", "random")


def classifier_of(model: nn.Module) -> nn.Module:
    """The final classifier layer: timm's ``get_classifier()`` or the ``head`` of an ``ImageClassifier``.

    Raises:
        UserError: if the model exposes neither.
    """
    getter = getattr(model, "get_classifier", None)
    head = getter() if callable(getter) else getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        raise UserError(f"{type(model).__name__} exposes no classifier (get_classifier() or .head): it cannot be "
                        "fine-tuned on new classes; build it through training.models")
    return head


def head_parameter_names(model: nn.Module) -> list[str]:
    """Names of the classifier's parameters (:func:`classifier_of`) in ``model.named_parameters()``."""
    ids = {id(p) for p in classifier_of(model).parameters()}
    return [n for n, p in model.named_parameters() if id(p) in ids]


def _num_outputs(head: nn.Module) -> int | None:
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.ndim == 2 else None


def head_seed(seed: int) -> int:
    """Seed of the recipe's ``random`` head for run seed ``seed`` (:func:`training.dp.rng.derive_seed`, HEAD)."""
    return derive_seed(seed, Stream.HEAD)


def new_head(model: nn.Module, num_classes: int, *, init: HeadInit, seed: int = 0) -> list[str]:
    """Give ``model`` the classifier fine-tuning starts from; return the head's parameter names.

    Args:
        model: a model with ``reset_classifier`` (timm's protocol; every model of :mod:`training.models`).
        num_classes: the downstream classes.
        init: ``keep`` the current classifier (it must have ``num_classes`` outputs); ``zero``: weight and bias
            zero (a new classifier first when the number of classes differs); ``random``: a new classifier
            (``reset_classifier``, the model's own initialisation) drawn from ``seed``, the global RNG untouched.
        seed: seed of the ``random`` head.

    Raises:
        ValueError: unknown ``init``, or ``keep`` with another number of classes.
        UserError: the model cannot take a new head.

    >>> from training.config import ModelConfig
    >>> from training.models import build_model
    >>> net = build_model(ModelConfig(arch="small_cnn"), num_classes=3, input_shape=(3, 8, 8)).module
    >>> names = new_head(net, 5, init="zero")
    >>> names, [float(p.detach().abs().sum()) for p in classifier_of(net).parameters()]
    (['net.head.weight', 'net.head.bias'], [0.0, 0.0])
    """
    if init not in HEAD_INITS:
        raise ValueError(f"head init must be one of {HEAD_INITS}, got {init!r}")
    if not callable(getattr(model, "reset_classifier", None)):
        raise UserError(f"{type(model).__name__} has no reset_classifier(): it cannot be fine-tuned on new "
                        "classes; build it through training.models")
    same = _num_outputs(classifier_of(model)) == int(num_classes)
    if init == "keep" and not same:
        raise ValueError(f"head init 'keep' needs a classifier with {num_classes} outputs, the model's has "
                         f"{_num_outputs(classifier_of(model))}; use 'zero' or 'random'")
    if init == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model.reset_classifier(int(num_classes))
    elif init == "zero":
        if not same:
            model.reset_classifier(int(num_classes))
        with torch.no_grad():
            for p in classifier_of(model).parameters():
                p.zero_()
    return head_parameter_names(model)


def finetune_phases(plan: Sequence[PhaseBudget], *, head: Sequence[str], backbone: Sequence[str], x: np.ndarray,
                    y: np.ndarray, index: np.ndarray | None = None, dataset: str, batch_size: int,
                    privacy: PrivacyConfig, optim: OptimConfig, lp_optim: OptimConfig | None = None,
                    seed: int, training: TrainingConfig | None = None) -> list[PhaseSpec]:
    """The phases of a fine-tuning plan (``lp`` then/or ``fft`` entries with their steps and σ).

    Args:
        plan: the phases in order; ``name`` ``lp`` (head only) or ``fft`` (head and backbone).
        head: the head's parameter names (:func:`new_head`).
        backbone: every parameter name an ``fft`` phase trains (head included).
        x, y, index: uint8 NHWC images and labels; ``index``: the rows trained on (None: all).
        dataset: dataset name for the manifest.
        batch_size: expected logical batch size (Poisson rate ``batch_size / n`` under ``poisson`` sampling).
        privacy: DP settings (``enabled``: every phase is DP with its plan entry's σ; ``sampling``).
        optim: optimizer of the phases; ``lp_optim``: of the ``lp`` phase (default ``optim``).
        seed: the run seed; phase ``i`` samples with :func:`~training.recipes.common.phase_seed` ``(seed, i)``.
        training: the training section whose augmentation and label smoothing the phases use (None: none).

    Raises:
        ValueError: a plan entry named other than ``lp``/``fft``, or an impossible phase (see ``PhaseSpec``).
    """
    bad = [b.name for b in plan if b.name not in ("lp", "fft")]
    if bad or not plan:
        raise ValueError(f"a fine-tuning plan holds 'lp' and 'fft' phases, got {[b.name for b in plan]}")
    return [PhaseSpec(
        name=b.name, dp=privacy.enabled, dataset=dataset, x=x, y=y, index=index, batch_size=int(batch_size),
        steps=int(b.steps), sigma=float(b.noise_multiplier) if privacy.enabled else None, privacy=privacy,
        optim=(lp_optim or optim) if b.name == "lp" else optim, sampler_seed=phase_seed(seed, i),
        trainable=tuple(head if b.name == "lp" else backbone), training=training) for i, b in enumerate(plan)]


@dataclass(frozen=True)
class FinetuneOutcome:
    """What :func:`finetune` did: the trained model (hooks removed), one record per phase, the last step's loss."""

    model: nn.Module
    completed: list[dict[str, Any]]
    final_loss: float | None


def finetune(model: nn.Module, phases: Sequence[PhaseSpec], *, seed: int, device: torch.device | str,
             physical_batch_size: int = 256,
             on_step: Callable[[int, str, StepStats, nn.Module], None] | None = None) -> FinetuneOutcome:
    """Run fine-tuning phases on ``model`` (trained in place) in memory: the loop the recipe runs into a run dir.

    Args:
        model: the model with its head in place (:func:`new_head`).
        phases: :func:`finetune_phases` (its ``seed`` and this one equal: the recipe's run, step for step).
        seed: the run seed: the DP noise of global step ``t`` comes from :func:`training.dp.rng.seed_noise` ``(g, seed, t)``.
        device: where to train.
        physical_batch_size: largest chunk per forward/backward pass.
        on_step: called after every step with ``(global step, phase name, stats, model)``.

    Returns:
        :class:`FinetuneOutcome`.

    Raises:
        ConfigError: the DP engine rejects the model (e.g. trainable BatchNorm).
    """
    ctx = RunContext(run_dir=None, config_sha="", seed=int(seed), device=torch.device(device), logger=None,
                     physical_batch_size=int(physical_batch_size), log_every=1, checkpoint_every=1, eval_every=0,
                     test=None, delta=None, on_step=None)
    last: list[float] = []

    def step(g: int, name: str, stats: StepStats, net: nn.Module) -> None:
        last[:] = [float(stats.loss)]
        if on_step is not None:
            on_step(g, name, stats, net)

    ctx.on_step = step
    plan = list(phases)
    trained = run_phases(ctx, model, lambda done: NextPhase(spec=plan[len(done)]) if len(done) < len(plan) else None)
    return FinetuneOutcome(model=trained, completed=ctx.completed, final_loss=last[0] if last else None)


def resolve_checkpoint(path: str | None, model_cfg: ModelConfig) -> tuple[ModelConfig, dict[str, Any]]:
    """The model config that rebuilds the checkpoint (with ``pretrained`` pointing at its weights) and a
    description of the source for the manifest.

    Raises:
        ConfigError: no checkpoint given.
        CheckpointError: the path is missing, or a run directory whose weights fail their sha256.
    """
    if path is None:
        raise ConfigError("training.recipe: finetune needs training.finetune.checkpoint (a run directory or a "
                          "weights file)")
    p = Path(path)
    if p.is_dir():
        run = open_run(p, trust_code=True, verify=False)  # trust is decided by the caller of build_model below
        run.weights_sha256  # the weights file is checked against the manifest before it is used
        manifest = run.manifest
        weights = p / manifest.model.weights_file
        m = manifest.model
        cfg = ModelConfig(arch=m.arch, kwargs=dict(m.kwargs), cifar_stem=m.cifar_stem, fix_batchnorm=m.fix_batchnorm,
                          normalize_mean=m.normalize_mean, normalize_std=m.normalize_std, pretrained=str(weights),
                          freeze=model_cfg.freeze)
        source = {"kind": "run", "path": str(p), "weights_sha256": m.weights_sha256, "run_name": manifest.run_name,
                  "num_classes": m.num_classes, "input_shape": list(m.input_shape),
                  "epsilon": manifest.privacy.epsilon, "dataset": manifest.data.dataset}
        return cfg, source
    if p.is_file():
        return (model_cfg.model_copy(update={"pretrained": str(p)}),
                {"kind": "weights", "path": str(p), "weights_sha256": sha256_file(p)})
    raise CheckpointError(f"training.finetune.checkpoint {path!r} does not exist; give a run directory or a "
                          "weights file")


def _same_head(model: nn.Module, model_cfg: ModelConfig, source: dict[str, Any]) -> bool:
    """Whether the checkpoint's classifier fits the model's (same number of classes)."""
    if "num_classes" in source:
        return int(source["num_classes"]) == int(model.num_classes)
    state = strip_prefix(load_weights_file(model_cfg.pretrained), "net.")
    key = f"{model.head_prefix()}.weight"
    return key in state and tuple(state[key].shape) == tuple(model.head.weight.shape)


class FinetuneRecipe:
    """DP-LP, DP-FFT or DP-LP-FFT from a checkpoint (see the module docstring).

    Raises:
        ConfigError: no checkpoint, ``head_init: keep`` with other classes, gradient canaries with two DP
            phases, an impossible budget split.
        CheckpointError, DataError: a checkpoint that is missing, corrupt, or made for other image sizes.
    """

    def __init__(self, setup: RunSetup, ctx: RunContext) -> None:
        cfg = setup.cfg
        self.setup, self.ctx, self.cfg = setup, ctx, cfg
        tc, pc, ft = cfg.training, cfg.privacy, cfg.training.finetune
        self.ft = ft
        model_cfg, self.source = resolve_checkpoint(ft.checkpoint, cfg.model)
        shape = self.source.get("input_shape")
        if shape is not None and tuple(shape) != setup.input_shape:
            raise DataError(f"the checkpoint was trained on {tuple(shape)} inputs but the data are "
                            f"{setup.input_shape}; set data.image_size: {shape[1]}")
        built = build_model(model_cfg, num_classes=setup.num_classes, input_shape=setup.input_shape, seed=tc.seed,
                            trust_code=setup.trust_code)
        model = built.module.to(setup.device)
        same = _same_head(model, model_cfg, self.source)
        if ft.head_init == "keep" and not same:
            raise ConfigError("finetune.head_init: keep needs the checkpoint's classes, but the data have "
                              f"{setup.num_classes} classes; use head_init: zero or random")
        self.head = new_head(model, setup.num_classes, init=ft.head_init, seed=head_seed(tc.seed))
        model.to(setup.device)
        self.model = model
        self.model_cfg = model_cfg.model_copy(update={"pretrained": None})
        self.model_notes = list(built.notes) + [f"fine-tuned from {self.source['path']} (head_init={ft.head_init})"]
        self.backbone_trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        steps = setup.private_steps()
        q = tc.batch_size / setup.n
        if pc.enabled:
            plan = split_budget(strategy=ft.strategy, split_by=ft.split_by, lp_fraction=ft.lp_fraction,
                                total_steps=steps, sample_rate=q, delta=setup.delta, accountant=pc.accountant,
                                target_epsilon=pc.target_epsilon, noise_multiplier=pc.noise_multiplier,
                                lp_steps_fraction=ft.lp_steps_fraction)
        elif ft.strategy == "lp_fft":
            t_lp, t_fft = split_steps(steps, ft.lp_steps_fraction or ft.lp_fraction)
            plan = [PhaseBudget(name="lp", steps=t_lp, noise_multiplier=0.0),
                    PhaseBudget(name="fft", steps=t_fft, noise_multiplier=0.0)]
        else:
            plan = [PhaseBudget(name=ft.strategy, steps=steps, noise_multiplier=0.0)]
        if tc.gradient_canaries.count and pc.enabled and len(plan) > 1:
            raise ConfigError("training.gradient_canaries need a single DP phase; use finetune.strategy lp or fft")
        images = setup.pool.images
        self.specs = finetune_phases(plan, head=self.head, backbone=self.backbone_trainable, x=images.x, y=images.y,
                                     index=setup.members, dataset=cfg.data.dataset, batch_size=tc.batch_size,
                                     privacy=pc, optim=cfg.optim,
                                     lp_optim=cfg.optim.model_copy(update={"lr": ft.lp_lr or cfg.optim.lr}),
                                     seed=tc.seed, training=tc)
        ctx.hessian = None  # made per phase in prepare (its template must match the phase's trainable set)

    def total_steps(self) -> int:
        return sum(s.steps for s in self.specs)

    def _prepare(self, spec: PhaseSpec):
        def prepare(model: nn.Module) -> None:
            set_trainable(model, spec.trainable)
            self.ctx.canaries = make_gradient_canaries(self.cfg, model) if spec.dp else None
            self.ctx.hessian = make_monitor(self.cfg, model, self.setup.pool.test, sigma=spec.sigma,
                                            batch_size=spec.batch_size, device=self.setup.device,
                                            what="data.test_split")
        return prepare

    def next_phase(self, completed: list[dict[str, Any]]) -> NextPhase | None:
        i = len(completed)
        if i >= len(self.specs):
            return None
        spec = self.specs[i]
        return NextPhase(spec=spec, prepare=self._prepare(spec), write_init=i == 0)

    def phase_infos(self, completed: list[dict[str, Any]]) -> list[PhaseInfo]:
        return [self.specs[c["index"]].phase_info(steps_done=c["steps"], frozen=c["frozen"]) for c in completed]

    def metrics(self, completed: list[dict[str, Any]]) -> dict[str, Any]:
        ft = self.ft
        return {"finetune": {
            "strategy": ft.strategy, "split_by": ft.split_by if ft.strategy == "lp_fft" else None,
            "lp_fraction": ft.lp_fraction if ft.strategy == "lp_fft" else None, "head_init": ft.head_init,
            "source": self.source, "head_parameters": self.head,
            "phases": [{"name": s.name, "steps": s.steps, "noise_multiplier": s.sigma} for s in self.specs]}}
