"""Per-sample gradient clipping styles and the Opacus DP optimizers that apply them.

Clipping styles (each bounds the L2 norm of one example's total clipped gradient by C, so the Gaussian
noise N(0, σ²C²) on the clipped sum gives the DP-SGD guarantee of Abadi et al., CCS 2016):

* ``flat``: g · min(1, C / (‖g‖ + 1e-6)) (Opacus's formula).
* ``per_layer``: each parameter tensor ("layer") l is clipped separately to C_l = C/√L (L trainable tensors),
  so the total norm is at most √(Σ C_l²) = C. This is the equal split Opacus's per-layer examples use.
* ``automatic``: g · C / (‖g‖ + γ) (Bu, Wang, Zha, Karypis, "Automatic Clipping: Differentially Private
  Deep Learning Made Easier and Stronger", NeurIPS 2023, AUTO-S with stability constant γ). Every
  gradient is rescaled (not only the large ones) and its norm is < C, so the sensitivity is C.

The optimizers below extend Opacus's ``DPOptimizer`` family. The stepper drives them explicitly, chunk by
chunk: ``clip_and_accumulate`` (or ``accumulate`` for ghost clipping) per physical chunk, then once per
logical step :meth:`_StepperHooks.finish_step`: add the sampled gradient canaries to the clipped sum, add
noise, divide by the *expected* batch size, and step the wrapped optimizer.

>>> norms = torch.tensor([0.5, 2.0])
>>> (norms * flat_clip_factors(norms, max_grad_norm=1.0)).tolist()  # doctest: +ELLIPSIS
[0.5, 0.99999...]
>>> (norms * automatic_clip_factors(norms, max_grad_norm=1.0, gamma=0.01)).lt(1.0).all().item()
True
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping, DPPerLayerOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

from training.distributed import SINGLE, World, all_reduce_sum_
from training.dp import csprng

__all__ = [
    "CLIPPING_STYLES",
    "flat_clip_factors",
    "automatic_clip_factors",
    "per_layer_norms",
    "FlatDPOptimizer",
    "PerLayerDPOptimizer",
    "AutomaticDPOptimizer",
    "GhostDPOptimizer",
]

CLIPPING_STYLES = ("flat", "per_layer", "automatic")
_EPS = 1e-6


def flat_clip_factors(norms: torch.Tensor, *, max_grad_norm: float) -> torch.Tensor:
    """Flat clipping factors min(1, C / (‖g‖ + 1e-6)) for per-sample norms ``norms``."""
    return (max_grad_norm / (norms + _EPS)).clamp(max=1.0)


def automatic_clip_factors(norms: torch.Tensor, *, max_grad_norm: float, gamma: float) -> torch.Tensor:
    """Automatic-clipping factors C / (‖g‖ + γ) (Bu et al. 2023); every scaled norm is < C."""
    return max_grad_norm / (norms + gamma)


def per_layer_norms(max_grad_norm: float, num_layers: int) -> list[float]:
    """The per-tensor thresholds C/√L of per-layer clipping; their L2 norm is C."""
    if num_layers < 1:
        raise ValueError(f"per-layer clipping needs at least one trainable parameter, got {num_layers}")
    return [max_grad_norm / math.sqrt(num_layers)] * num_layers


class _StepperHooks:
    """Mixin for the Opacus DP optimizers: statistics, canary injection, explicit logical-step finish.

    Attributes set by the stepper after construction:
        canary_grad: callable returning the canary gradient (list of tensors shaped like the params) to add
            to the clipped sum at this step, or None.
        debug_disable_noise: TEST ONLY. When True the Gaussian noise is skipped and everything else is
            unchanged, which breaks the DP guarantee on purpose (used to prove that audits detect it).
    """

    canary_grad: Callable[[], list[torch.Tensor] | None] | None = None
    debug_disable_noise: bool = False
    world: World = SINGLE

    def reset_stats(self) -> None:
        self.sample_norms: list[torch.Tensor] = []  # pre-clip per-sample total norms, one tensor per chunk
        self.sample_clipped: list[torch.Tensor] = []  # bool: the sample was scaled down by clipping

    def _record(self, norms: torch.Tensor, clipped: torch.Tensor) -> None:
        if not hasattr(self, "sample_norms"):
            self.reset_stats()
        self.sample_norms.append(norms.detach().float())  # stays on the device: one transfer per step
        self.sample_clipped.append(clipped.detach())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear ``p.grad`` and ``p.grad_sample``; the clipped sum ``p.summed_grad`` survives (see ``reset_sum``)."""
        for p in self.params:
            p.grad_sample = None
        self.original_optimizer.zero_grad(set_to_none)

    def reset_sum(self) -> None:
        """Forget the clipped-gradient sum and the statistics (start of a logical step)."""
        for p in self.params:
            p.summed_grad = None
        self._is_last_step_skipped = False
        self.reset_stats()

    def ensure_sum(self) -> None:
        """Give every parameter a zero clipped sum if no example contributed (an empty Poisson batch)."""
        for p in self.params:
            if p.summed_grad is None:
                p.summed_grad = torch.zeros_like(p)

    def add_noise(self) -> None:
        """Add the sampled canaries' C·u_i, then N(0, σ²C²) noise, to the clipped sum; result in ``p.grad``.

        In secure mode the noise is drawn from the OS CSPRNG (:func:`training.dp.csprng.gaussian`, hardened
        against floating-point attacks as Opacus's secure mode is), never from the seeded generator.
        """
        extra = self.canary_grad() if self.canary_grad is not None else None
        if extra is not None:
            for p, g in zip(self.params, extra):
                p.summed_grad = p.summed_grad + g.to(p.summed_grad.dtype)
        if not self.debug_disable_noise and not self.secure_mode:
            super().add_noise()
            return
        std = 0.0 if self.debug_disable_noise else self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            noise = csprng.gaussian(p.summed_grad.shape, std, device=p.summed_grad.device, dtype=p.summed_grad.dtype)
            p.grad = (p.summed_grad + noise).view_as(p)
            _mark_as_processed(p.summed_grad)

    def scale_grad(self) -> None:
        """Divide the noisy sum by the expected batch size (not the realised one: Poisson-sampling DP-SGD)."""
        for p in self.params:
            p.grad /= self.expected_batch_size

    def finish_step(self) -> None:
        """Canaries, noise, scaling and the wrapped optimizer's update for one logical step.

        Several ranks (:mod:`training.distributed`): as Opacus's ``DistributedDPOptimizer``, rank 0 alone adds
        the canaries and the noise to its clipped sum, the others pass theirs on unchanged, and an all-reduce
        (sum) gives every rank the noisy sum of the whole logical batch: the noise is drawn once per step.
        """
        self.ensure_sum()
        if self.world.is_main:
            self.add_noise()
        else:
            for p in self.params:
                p.grad = p.summed_grad.clone().view_as(p)
        all_reduce_sum_([p.grad for p in self.params], self.world)
        self.scale_grad()
        self.original_optimizer.step()
        self.reset_sum()


class FlatDPOptimizer(_StepperHooks, DPOptimizer):
    """Opacus ``DPOptimizer`` with flat clipping that records per-sample norms."""

    def clip_factors(self, norms: torch.Tensor) -> torch.Tensor:
        return flat_clip_factors(norms, max_grad_norm=self.max_grad_norm)

    def clip_and_accumulate(self) -> None:
        """Per-sample norms over all parameters, factors from :meth:`clip_factors`, the weighted sum."""
        grads = self.grad_samples
        n = len(grads[0])
        if n == 0:
            return
        norms = torch.stack([g.reshape(n, -1).norm(2, dim=-1).to(grads[0].device) for g in grads], dim=1).norm(2, dim=1)
        self._record(norms, norms > self.max_grad_norm)
        _accumulate(self, self.clip_factors(norms))


class AutomaticDPOptimizer(FlatDPOptimizer):
    """``DPOptimizer`` with automatic clipping g·C/(‖g‖+γ) (Bu et al. 2023); sensitivity C."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, gamma: float, **kwargs) -> None:
        if not gamma > 0:
            raise ValueError(f"automatic clipping gamma must be > 0, got {gamma!r}")
        self.gamma = float(gamma)
        super().__init__(optimizer, **kwargs)

    def clip_factors(self, norms: torch.Tensor) -> torch.Tensor:
        return automatic_clip_factors(norms, max_grad_norm=self.max_grad_norm, gamma=self.gamma)


class PerLayerDPOptimizer(_StepperHooks, DPPerLayerOptimizer):
    """Opacus ``DPPerLayerOptimizer`` (thresholds C/√L, total sensitivity C) that records per-sample norms.

    "Clipped" in the statistics means at least one of the example's tensors exceeded its threshold.
    """

    def clip_and_accumulate(self) -> None:
        grads = self.grad_samples
        n = len(grads[0])
        if n == 0:
            return
        device = grads[0].device
        sq_total = torch.zeros(n, device=device)
        clipped = torch.zeros(n, dtype=torch.bool, device=device)
        for p, c_l in zip(self.params, self.max_grad_norms):
            _check_processed_flag(p.grad_sample)
            g = self._get_flat_grad_sample(p)
            norms = g.reshape(n, -1).norm(2, dim=-1)
            sq_total += norms.to(device).float() ** 2
            clipped |= (norms > c_l).to(device)
            factors = flat_clip_factors(norms, max_grad_norm=c_l).to(p.dtype)
            summed = torch.einsum("i,i...", factors, g.to(p.dtype))
            p.summed_grad = summed if p.summed_grad is None else p.summed_grad + summed
            _mark_as_processed(p.grad_sample)
        self._record(sq_total.sqrt(), clipped)


class GhostDPOptimizer(_StepperHooks, DPOptimizerFastGradientClipping):
    """Opacus fast-gradient / ghost-clipping optimizer (flat clipping only).

    The clipped sum arrives in ``p.grad`` from the second backward pass of ``DPLossFastGradientClipping``;
    :meth:`accumulate` adds it to ``p.summed_grad``. Per-sample norms come from the module.
    """

    def record_norms(self, norms: torch.Tensor) -> None:
        self._record(norms, norms > self.max_grad_norm)

    def accumulate(self) -> None:
        for p in self.params:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            p.summed_grad = g.detach().clone() if p.summed_grad is None else p.summed_grad + g.detach()


def _accumulate(opt: DPOptimizer, factors: torch.Tensor) -> None:
    """p.summed_grad += Σ_i factors_i · grad_sample_i for every parameter (Opacus's einsum)."""
    for p in opt.params:
        _check_processed_flag(p.grad_sample)
        g = opt._get_flat_grad_sample(p).to(p.dtype)
        summed = torch.einsum("i,i...", factors.to(g.device).to(p.dtype), g)
        p.summed_grad = summed if p.summed_grad is None else p.summed_grad + summed
        _mark_as_processed(p.grad_sample)
