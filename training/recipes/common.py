"""What every recipe receives from the trainer and gives back, and helpers they share.

A recipe object is built from a :class:`RunSetup` (the validated config, the private pool and its members, δ,
the device) and the :class:`~training.loop.RunContext`; it owns the model, hands its phases to
:func:`~training.loop.run_phases` through :meth:`Recipe.next_phase`, and afterwards describes them
for the manifest (:meth:`Recipe.phase_infos`) and the metrics (:meth:`Recipe.metrics`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from training.accounting import noise_multiplier_for
from training.config import ModelConfig, TrainConfig
from training.data import ImageSet, to_float_tensor
from training.dp.rng import Stream, derive_seed
from foundation.errors import ConfigError
from training.hessian import HessianMonitor
from training.run.manifest import PhaseInfo
from training.pool import Pool, draw_membership
from training.loop import NextPhase

__all__ = ["RunSetup", "Recipe", "HELD_OUT_SEED", "calibrate_sigma", "held_out_batch", "make_monitor",
           "make_gradient_canaries", "phase_seed"]

#: seed of the tr(H) batch: one fixed draw from the test split, whatever the run seed or recipe, so that every arm
#: and every seed of an experiment measures tr(H) on the same held-out images and their curves can be compared
HELD_OUT_SEED = 0


@dataclass
class RunSetup:
    """The trainer's preparation, shared by every recipe.

    Attributes:
        cfg: the validated config; in secure mode its ``training.seed`` is the run's secret seed
            (:func:`training.dp.rng.secret_seed`), held in memory only.
        pool: the private pool (members and non-members, canaries included) and its test set.
        members: indices of the pool's members (what DP protects and training samples from).
        delta: δ of the claim (None without DP).
        device: where to train.
        notes: caveats for the manifest (recipes add theirs).
        trust_code: whether an import-path ``model.arch`` may be imported and called (see
            :func:`training.models.build_model`).
    """

    cfg: TrainConfig
    pool: Pool
    members: np.ndarray
    delta: float | None
    device: torch.device
    notes: list[str] = field(default_factory=list)
    trust_code: bool = False

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (3, *self.pool.images.x.shape[1:3])

    @property
    def num_classes(self) -> int:
        return len(self.pool.images.classes)

    def private_steps(self) -> int:
        """``training.steps``, or ``training.epochs`` passes over the members in expectation."""
        tc = self.cfg.training
        if tc.steps is not None:
            return tc.steps
        return max(1, int(np.ceil(tc.epochs * self.n / tc.batch_size)))


class Recipe(Protocol):
    """The interface the trainer drives."""

    model: nn.Module
    model_cfg: ModelConfig
    model_notes: list[str]

    def next_phase(self, completed: list[dict[str, Any]]) -> NextPhase | None: ...

    def phase_infos(self, completed: list[dict[str, Any]]) -> list[PhaseInfo]: ...

    def metrics(self, completed: list[dict[str, Any]]) -> dict[str, Any]: ...

    def total_steps(self) -> int: ...


def phase_seed(seed: int, index: int) -> int:
    """Sampler seed of phase ``index``: the run seed for the first phase (so a one-phase run samples as a
    standard run would), ``derive_seed(seed, PHASE, index)`` for later ones."""
    if index == 0:
        return int(seed)
    return derive_seed(seed, Stream.PHASE, index)


def calibrate_sigma(cfg: TrainConfig, *, sample_rate: float, steps: int, delta: float) -> float:
    """σ of a single DP phase: ``privacy.noise_multiplier``, or calibrated to ``privacy.target_epsilon``."""
    pc = cfg.privacy
    if pc.noise_multiplier is not None:
        return float(pc.noise_multiplier)
    return float(noise_multiplier_for(target_epsilon=pc.target_epsilon, sample_rate=sample_rate, steps=steps,
                                      delta=delta, accountant=pc.accountant))


def held_out_batch(images: ImageSet, *, size: int, seed: int, device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random batch of ``min(size, len(images))`` examples, as float tensors on ``device``."""
    n = len(images)
    idx = np.sort(np.random.default_rng([int(seed), 0x48425443]).choice(n, size=min(size, n), replace=False))
    return (to_float_tensor(images.x[idx]).to(device),
            torch.as_tensor(images.y[idx], dtype=torch.long, device=device))


def make_monitor(cfg: TrainConfig, model: nn.Module, images: ImageSet | None, *, sigma: float | None,
                 batch_size: float, device: torch.device, what: str) -> HessianMonitor | None:
    """The tr(H) logger ``training.hessian`` asks for (None when ``every`` is 0).

    Every recipe passes the test split: tr(H) is measured on ``training.hessian.batch_size`` images drawn from it
    with :data:`HELD_OUT_SEED` (the same images in every arm and seed of an experiment, never trained on), with
    probes drawn per (run seed, step).

    Args:
        cfg: the config (``training.hessian``, ``privacy.max_grad_norm``, ``training.seed``).
        model: the unwrapped model; a deep copy becomes the monitor's hook-free template.
        images: the held-out images tr(H) is measured on (the test split).
        sigma, batch_size: the DP phase's σ and expected batch size (sigma None: no decelerator).
        device: where to measure.
        what: how to name ``images`` in the error message.

    Raises:
        ConfigError: logging is on but there are no held-out images.
    """
    hc = cfg.training.hessian
    if hc.every == 0:
        return None
    if images is None or len(images) == 0:
        raise ConfigError(f"training.hessian.every > 0 needs held-out data for tr(H) ({what}); the private "
                          "members are never used, so the logged curve is not a side channel")
    x, y = held_out_batch(images, size=hc.batch_size, seed=HELD_OUT_SEED, device=device)
    return HessianMonitor(copy.deepcopy(model), x, y, probes=hc.probes, sigma=sigma, batch_size=batch_size,
                          clip_norm=cfg.privacy.max_grad_norm, seed=cfg.training.seed)


def init_from_members(setup: RunSetup, model: nn.Module) -> str | None:
    """A data-dependent initialisation from the members (e.g. :class:`training.models.fastnet.FastNet`'s patch
    whitening): a network exposing ``init_from_data(x)`` and ``data_init_size`` > 0 is given a seeded sample of
    that many member images (float [0, 1], normalised as the model's input layer does). Returns the manifest's
    note, or None when the network has no such initialisation.

    Raises:
        ConfigError: under DP (the initialisation reads the members outside the DP accounting).
    """
    net = getattr(model, "net", model)
    size = int(getattr(net, "data_init_size", 0) or 0)
    if not hasattr(net, "init_from_data") or size == 0:
        return None
    if setup.cfg.privacy.enabled:
        raise ConfigError(f"model {setup.cfg.model.arch!r} initialises from the members' images (whitening), which "
                          "is not covered by the DP guarantee; set model.kwargs.whiten_images: 0 under DP")
    rng = np.random.default_rng([int(setup.cfg.training.seed or 0), 0x57484954])
    take = np.sort(rng.choice(setup.members, size=min(size, len(setup.members)), replace=False))
    with torch.no_grad():
        x = to_float_tensor(setup.pool.images.x[take])
        normalize = getattr(model, "normalize", None)
        net.init_from_data(normalize(x.to(next(model.parameters()).device)) if normalize is not None else x)
    return f"first layer initialised from {len(take)} member images (init_from_data, seeded)"


def make_gradient_canaries(cfg: TrainConfig, model: nn.Module):
    """White-box gradient canaries over ``model``'s currently trainable parameters (None when count is 0).

    Raises:
        ConfigError: canaries without DP.
    """
    gc = cfg.training.gradient_canaries
    if gc.count == 0:
        return None
    if not cfg.privacy.enabled:
        raise ConfigError("training.gradient_canaries need privacy.enabled: true (they audit the DP-SGD step)")
    from training.dp.canaries import GradientCanaries

    included = draw_membership(gc.count, p=0.5, seed=gc.seed)
    return GradientCanaries.for_model(model, count=gc.count, seed=gc.seed, included=included)
