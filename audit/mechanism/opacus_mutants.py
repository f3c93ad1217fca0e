"""Planted bugs in a user's Opacus set-up, written the way a training script would have them (tests, benchmarks).

:func:`opacus_setup` returns what :func:`audit.mechanism.opacus_target.audit_opacus_mechanism` takes for an
honest ``DPOptimizer`` (plain SGD, two parameter groups, Opacus's Poisson sampler at q) or for one user bug,
the claim (σ, q) staying what the user's accountant call was given. Never use them for a real run.

* ``noise_0.8``: the optimizer is built with ``noise_multiplier = 0.8 σ`` while ε is computed for σ.
* ``noise_without_C``: a subclass's ``add_noise`` draws noise of std σ instead of σ·C (a bug only when C ≠ 1).
* ``double_rate``: the data loader samples at 2q while the accountant is told q.
* ``unclipped_group``: a subclass leaves the second parameter group's per-sample gradients unclipped
  ("the head does not need clipping").
* ``reused_noise``: a subclass re-seeds the noise generator before every step ("for reproducibility"), so each
  step adds the same noise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from audit.mechanism.opacus_target import SamplerFactory, opacus_sampler

__all__ = ["OPACUS_BUGS", "OpacusSetup", "opacus_setup"]

OPACUS_BUGS = ("noise_0.8", "noise_without_C", "double_rate", "unclipped_group", "reused_noise")


@dataclasses.dataclass(frozen=True)
class OpacusSetup:
    """``optimizer_factory``, ``sampler_factory`` and the claimed ``noise_multiplier`` of one set-up."""

    optimizer_factory: Callable[[list[torch.nn.Parameter]], Any]
    sampler_factory: SamplerFactory
    noise_multiplier: float


def _classes():
    from opacus.optimizers import DPOptimizer
    from opacus.optimizers.optimizer import _generate_noise, _mark_as_processed

    class NoiseWithoutC(DPOptimizer):
        def add_noise(self):
            for p in self.params:
                noise = _generate_noise(std=self.noise_multiplier, reference=p.summed_grad, generator=self.generator)
                p.grad = (p.summed_grad + noise).view_as(p)
                _mark_as_processed(p.summed_grad)

    class HeadUnclipped(DPOptimizer):
        def clip_and_accumulate(self):
            head = self.original_optimizer.param_groups[1]["params"]
            raw = {id(p): p.grad_sample.sum(0) for p in head}
            super().clip_and_accumulate()
            for p in head:
                p.summed_grad = raw[id(p)]

    class ReseededNoise(DPOptimizer):
        def add_noise(self):
            torch.manual_seed(0)
            super().add_noise()

    return DPOptimizer, {"noise_without_C": NoiseWithoutC, "unclipped_group": HeadUnclipped,
                         "reused_noise": ReseededNoise}


def opacus_setup(*, sigma: float, max_grad_norm: float, expected_batch_size: float, sample_rate: float,
                 bug: str | None = None) -> OpacusSetup:
    """An Opacus set-up claiming (σ, q) with C = ``max_grad_norm``; ``bug`` plants one of :data:`OPACUS_BUGS`.

    Raises:
        ValueError: for an unknown bug.
    """
    if bug is not None and bug not in OPACUS_BUGS:
        raise ValueError(f"unknown Opacus bug {bug!r}; choose one of {', '.join(OPACUS_BUGS)}")
    honest, broken = _classes()
    cls = broken.get(bug, honest)
    used_sigma = 0.8 * sigma if bug == "noise_0.8" else sigma

    def factory(params):
        base = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]]}], lr=0.1)
        return cls(base, noise_multiplier=used_sigma, max_grad_norm=max_grad_norm,
                   expected_batch_size=int(round(expected_batch_size)))
    rate = min(1.0, 2 * sample_rate) if bug == "double_rate" else sample_rate
    return OpacusSetup(optimizer_factory=factory, sampler_factory=opacus_sampler(rate), noise_multiplier=sigma)
