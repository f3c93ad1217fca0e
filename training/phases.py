"""Training phases: what one phase trains, on which data, with which noise; and what crosses a phase boundary.

A recipe is a sequence of phases run on one model: ``standard`` has one (DP or not), ``continual_pretrain`` a
public non-DP phase then a private DP phase, ``finetune`` one or two DP phases (linear probing, full
fine-tuning). Between phases the model is unwrapped (Opacus hooks removed), the trainable set may change and
the optimizer state is carried by parameter name (:func:`carry_optimizer_state`).

>>> import torch
>>> opt = torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))])
>>> opt.zero_grad(); opt.param_groups[0]["params"][0].grad = torch.ones(2); opt.step()
>>> state = carry_optimizer_state(opt.state_dict(), ["w"], target=opt, target_names=["w"], mode="reset_first")
>>> state["state"][0]["exp_avg"].tolist(), bool(state["state"][0]["exp_avg_sq"].gt(0).all())
([0.0, 0.0], True)
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from training.accel import ResidentImages
from training.config import OptimConfig, PrivacyConfig, TrainingConfig
from training.data import RowArray, to_float_tensor
from training.dp.recipe import TrainRecipe
from training.dp.sampling import BatchSampler, make_sampler
from training.run.manifest import PhaseInfo
from training.run.writer import phase_record

__all__ = ["PhaseSpec", "CARRY_MODES", "carry_optimizer_state", "set_trainable", "FIRST_MOMENT_KEYS"]

CARRY_MODES = ("none", "keep", "reset_first", "reset_both")
#: optimizer-state entries that hold a first moment (Adam/AdamW ``exp_avg``, SGD ``momentum_buffer``)
FIRST_MOMENT_KEYS = ("exp_avg", "momentum_buffer")
#: entries that hold a second moment (Adam/AdamW)
SECOND_MOMENT_KEYS = ("exp_avg_sq", "max_exp_avg_sq")


@dataclass(frozen=True, kw_only=True, eq=False)
class PhaseSpec:
    """One training phase.

    Attributes:
        name: the manifest's phase name (``"private"``, ``"non-private"``, ``"public"``, ``"lp"``, ``"fft"``).
        dp: whether the phase is DP (its steps are accounted).
        dataset: dataset name recorded in the manifest.
        x, y: the images (uint8 NHWC; a :class:`~training.data.stream.RowArray` when the pool streams) and
            labels of the set the phase samples from.
        index: the rows of ``x``/``y`` the phase trains on (the members, for private data); None: all rows.
        batch_size: expected logical batch size; q = batch_size / len(y).
        steps: the phase's length (the most steps it may take; also the learning-rate schedule's span).
        sigma: noise multiplier (DP phases).
        privacy: clipping and sampling settings (``enabled`` equals ``dp``).
        optim: optimizer and schedule of this phase.
        sampler_seed: seed of the batch sampler.
        trainable: names of the parameters trained (None: every parameter that has ``requires_grad`` now).
        carry: what happens to the previous phase's optimizer state (``none``: a fresh optimizer; ``keep``;
            ``reset_first``: keep the second moment, zero the first; ``reset_both``: fresh moments).
        training: the training section whose augmentation, label smoothing and EMA the phase uses (None: none).
    """

    name: str
    dp: bool
    dataset: str
    x: np.ndarray
    y: np.ndarray
    index: np.ndarray | None
    batch_size: int
    steps: int
    sigma: float | None
    privacy: PrivacyConfig
    optim: OptimConfig
    sampler_seed: int
    trainable: tuple[str, ...] | None = None
    carry: Literal["none", "keep", "reset_first", "reset_both"] = "none"
    training: TrainingConfig | None = None

    def __post_init__(self) -> None:
        if self.privacy.enabled != self.dp:
            raise ValueError(f"phase {self.name!r}: privacy.enabled must equal dp={self.dp}")
        if self.dp and (self.sigma is None or not self.sigma >= 0):
            raise ValueError(f"phase {self.name!r}: a DP phase needs sigma >= 0, got {self.sigma!r}")
        if self.n == 0 or not 1 <= self.batch_size <= self.n:
            raise ValueError(f"phase {self.name!r}: batch_size {self.batch_size} must be in [1, {self.n}]")
        if self.steps < 1:
            raise ValueError(f"phase {self.name!r}: steps must be >= 1, got {self.steps}")
        if self.carry not in CARRY_MODES:
            raise ValueError(f"phase {self.name!r}: carry must be one of {CARRY_MODES}, got {self.carry!r}")

    @property
    def n(self) -> int:
        return len(self.y) if self.index is None else len(self.index)

    def rows(self, local: np.ndarray) -> np.ndarray:
        """Rows of ``x``/``y`` for sampler indices ``local`` (positions among the phase's examples)."""
        return local if self.index is None else self.index[local]

    @property
    def sample_rate(self) -> float:
        return self.batch_size / self.n

    def sampler(self) -> BatchSampler:
        """The phase's batch sampler over its ``n`` examples (q = batch_size / n); a DP phase in secure mode
        draws its batches from the OS CSPRNG (no seed), every other phase from ``sampler_seed``."""
        secure = self.dp and self.privacy.secure_mode
        return make_sampler(sampling=self.privacy.sampling, n=self.n, batch_size=self.batch_size,
                            seed=None if secure else self.sampler_seed)

    def batches(self, sampler: BatchSampler, *, start: int, device: torch.device
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(float images, labels)`` on ``device`` for local steps ``start, start + 1, ...`` up to ``steps``.

        Step t's batch is ``rows(sampler.indices(t))``, from the in-memory arrays or, when ``x`` streams
        (:class:`~training.data.stream.RowArray`), decoded by its DataLoader from the same sampler indices, so both
        give the same tensors; a resumed phase (``start`` > 0) gets the uninterrupted phase's batches.
        """
        steps = range(start, self.steps)
        if not isinstance(self.x, RowArray):
            images = ResidentImages(self.x, self.y, device=device)  # on the device when it fits (CIFAR-sized sets)
            for t in steps:
                yield images.batch(self.rows(sampler.indices(t)))
            return
        for xb, idx in self.x.loader((self.rows(sampler.indices(t)) for t in steps), device=device):
            yield to_float_tensor(xb, device), torch.from_numpy(np.asarray(self.y[idx], dtype=np.int64)).to(device)

    def train_recipe(self, *, physical_batch_size: int) -> TrainRecipe:
        """The :class:`~training.dp.recipe.TrainRecipe` the engine runs this phase with."""
        return TrainRecipe.from_privacy(privacy=self.privacy, optim=self.optim, steps=self.steps,
                                        batch_size=self.batch_size, noise_multiplier=self.sigma if self.dp else None,
                                        physical_batch_size=physical_batch_size, training=self.training)

    def phase_info(self, *, steps_done: int, frozen: Sequence[str], epsilon: float | None = None) -> PhaseInfo:
        """The manifest entry of this phase after ``steps_done`` steps."""
        pc = self.privacy
        return phase_record(
            name=self.name, dp=self.dp, dataset=self.dataset, noise_multiplier=self.sigma, sample_rate=self.sample_rate,
            steps=int(steps_done), batch_size=self.batch_size, sampling=pc.sampling, max_grad_norm=pc.max_grad_norm,
            clipping=pc.clipping, grad_sample_mode=pc.grad_sample_mode, optimizer=self.optim.name, lr=self.optim.lr,
            frozen=frozen, epsilon=epsilon)


def set_trainable(model: nn.Module, names: Sequence[str] | None) -> list[str]:
    """Make exactly ``names`` trainable (None: leave ``requires_grad`` as it is); return the frozen names.

    Raises:
        ValueError: if a name is not a parameter of ``model``.
    """
    params = dict(model.named_parameters())
    if names is not None:
        unknown = sorted(set(names) - set(params))
        if unknown:
            raise ValueError(f"unknown parameter names {unknown[:3]}")
        wanted = set(names)
        for n, p in params.items():
            p.requires_grad_(n in wanted)
    return [n for n, p in params.items() if not p.requires_grad]


def carry_optimizer_state(state: dict[str, Any], names: Sequence[str], *, target: torch.optim.Optimizer,
                          target_names: Sequence[str], mode: str) -> dict[str, Any]:
    """An optimizer state for ``target`` built from another optimizer's ``state`` by parameter name.

    Per-parameter entries move to the parameter of the same name and shape; others start fresh. The
    hyper-parameters (``param_groups``) are ``target``'s own.

    Args:
        state: ``optimizer.state_dict()`` of the previous phase.
        names: the previous optimizer's parameter names, in its parameter order.
        target: the new phase's optimizer.
        target_names: its parameter names, in its parameter order.
        mode: ``keep``; ``reset_first`` (first moments zeroed: Adam ``exp_avg``, SGD ``momentum_buffer``);
            ``reset_both`` or ``none`` (nothing carried).

    Returns:
        A state dict for ``target.load_state_dict``.

    Raises:
        ValueError: unknown mode, or name lists that do not match the optimizers.
    """
    if mode not in CARRY_MODES:
        raise ValueError(f"mode must be one of {CARRY_MODES}, got {mode!r}")
    fresh = target.state_dict()
    n_target = sum(len(g["params"]) for g in fresh["param_groups"])
    if len(target_names) != n_target:
        raise ValueError(f"target_names has {len(target_names)} names for {n_target} parameters")
    if len(names) != sum(len(g["params"]) for g in state["param_groups"]):
        raise ValueError("names does not match the parameters of the previous optimizer state")
    out = {"state": {}, "param_groups": copy.deepcopy(fresh["param_groups"])}
    if mode in ("none", "reset_both"):
        return out
    old_ids = [i for g in state["param_groups"] for i in g["params"]]
    new_ids = [i for g in fresh["param_groups"] for i in g["params"]]
    shapes = {i: tuple(p.shape) for i, p in zip(new_ids, (p for g in target.param_groups for p in g["params"]))}
    old_by_name = dict(zip(names, old_ids))
    for name, new_id in zip(target_names, new_ids):
        old_id = old_by_name.get(name)
        entry = state["state"].get(old_id) if old_id is not None else None
        if not entry:
            continue
        tensors = [v for k, v in entry.items() if isinstance(v, torch.Tensor) and k != "step"]
        if any(t.dim() and tuple(t.shape) != shapes[new_id] for t in tensors):
            continue  # e.g. a classifier replaced by one with other classes
        moved = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in entry.items()}
        if mode == "reset_first":
            for k in FIRST_MOMENT_KEYS:
                if k in moved and isinstance(moved[k], torch.Tensor):
                    moved[k] = torch.zeros_like(moved[k])
        out["state"][new_id] = moved
    return out
