"""Hessian-trace estimation (Hutchinson) and the DP "decelerator" of Bu et al. 2024.

Hutchinson's estimator (Hutchinson, "A stochastic estimator of the trace of the influence matrix for
Laplacian smoothing splines", 1989): for Rademacher probes v (entries ±1 with probability 1/2),
E[vᵀHv] = tr(H), so tr(H) ≈ (1/m) Σᵢ vᵢᵀHvᵢ. Each vᵢᵀHvᵢ needs one Hessian-vector product, computed here by
double backward (Pearlmutter's trick): Hv = ∇_w (∇_w L · v). The cost is one backward pass that keeps its
graph plus ``probes`` further backward passes; nothing of size d² is ever formed.

The decelerator (Bu, Zhang, Hong, Zha, Karypis, "Pre-training Differentially Private Models with Limited
Public Data", NeurIPS 2024) is the part of DP-SGD's second-order loss term that the Gaussian noise adds:
σ²·tr(H)/(B·c²) in the normalisation this project uses (noise multiplier σ, expected batch size B, clipping
norm c). When it is small, DP noise barely slows the loss down, which is when Bu et al. switch from public
non-DP pre-training to private DP training. Its absolute scale depends on that normalisation, so a switch
threshold must be chosen in the same units (compare values logged by :class:`HessianMonitor`).

>>> import torch
>>> w = torch.tensor([1.0, 2.0], requires_grad=True)
>>> est = hutchinson_trace(lambda: (3.0 * w[0] ** 2 + 0.5 * w[1] ** 2), [w], probes=4,
...                        generator=torch.Generator().manual_seed(0))
>>> round(est.mean, 6), round(est.stderr, 6)  # H = diag(6, 1): vᵀHv = 7 for every Rademacher v
(7.0, 0.0)
>>> decelerator(sigma=1.0, trace_h=100.0, batch_size=50, clip_norm=2.0)
0.5
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from training.dp.rng import Stream, derive_seed

__all__ = ["TraceEstimate", "rademacher_like", "hutchinson_trace", "model_hessian_trace", "decelerator",
           "HessianMonitor"]


@dataclass(frozen=True)
class TraceEstimate:
    """A Hutchinson estimate of tr(H).

    Attributes:
        mean: (1/m) Σᵢ vᵢᵀHvᵢ, unbiased for tr(H).
        stderr: the standard error of ``mean``: sample std (ddof=1) / √m; nan when m = 1.
        values: the m per-probe quadratic forms vᵢᵀHvᵢ.
    """

    mean: float
    stderr: float
    values: tuple[float, ...]

    @property
    def probes(self) -> int:
        return len(self.values)


def rademacher_like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A tensor shaped like ``t`` with i.i.d. ±1 entries (probability 1/2 each), drawn from ``generator``."""
    bits = torch.randint(0, 2, t.shape, generator=generator, device=generator.device, dtype=torch.int8)
    return (bits.to(device=t.device, dtype=t.dtype) * 2 - 1)


def hutchinson_trace(loss_fn: Callable[[], torch.Tensor], params: Sequence[torch.Tensor], *, probes: int,
                     generator: torch.Generator) -> TraceEstimate:
    """Estimate tr(∇²L) over ``params`` with ``probes`` Rademacher probes.

    Args:
        loss_fn: computes the scalar loss L from ``params`` (called once, with autograd enabled).
        params: the tensors (``requires_grad=True``) the Hessian is taken over; their block-diagonal and
            off-diagonal blocks all count, so this is the trace of the full Hessian over their concatenation.
        probes: m ≥ 1, the number of Hessian-vector products.
        generator: the source of the probes (its device decides where they are drawn).

    Returns:
        :class:`TraceEstimate` (mean and standard error over the probes).

    Raises:
        ValueError: if ``probes`` < 1, ``params`` is empty or holds a tensor without ``requires_grad``, or the
            loss is not a finite scalar.
    """
    if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
        raise ValueError(f"probes must be an integer >= 1, got {probes!r}")
    params = list(params)
    if not params:
        raise ValueError("params must hold at least one tensor")
    if not all(p.requires_grad for p in params):
        raise ValueError("every tensor in params must have requires_grad=True")
    with torch.enable_grad():
        loss = loss_fn()
        if loss.numel() != 1:
            raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
        if not bool(torch.isfinite(loss.detach())):
            raise ValueError(f"the loss is not finite ({float(loss.detach()):g}); tr(H) is undefined there")
        grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
        pairs = [(p, g) for p, g in zip(params, grads) if g is not None]  # unused params: zero Hessian rows
        values: list[float] = []
        for i in range(probes):
            vs = [rademacher_like(p, generator) for p, _ in pairs]
            gv = sum((g * v).sum() for (_, g), v in zip(pairs, vs))
            if not gv.requires_grad:  # the loss is linear in params: H = 0
                values.append(0.0)
                continue
            hvs = torch.autograd.grad(gv, [p for p, _ in pairs], retain_graph=i < probes - 1, allow_unused=True)
            values.append(float(sum((hv * v).sum() for hv, v in zip(hvs, vs) if hv is not None)))
    arr = np.asarray(values, dtype=np.float64)
    stderr = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else float("nan")
    return TraceEstimate(mean=float(arr.mean()), stderr=stderr, values=tuple(values))


def model_hessian_trace(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, probes: int,
                        generator: torch.Generator) -> TraceEstimate:
    """Hutchinson tr(H) of the mean cross-entropy of ``model`` on (x, y), over its trainable parameters.

    The model runs in eval mode for the estimate (dropout off, so every probe sees the same loss surface)
    and is returned to its previous mode. It must carry no per-sample-gradient hooks (use a plain copy of
    a model that Opacus wraps; :class:`HessianMonitor` keeps one).

    Args:
        model: logits = model(x).
        x: inputs (N, ...); y: integer labels (N,).
        probes: number of Rademacher probes (≥ 1).
        generator: the probes' random source.

    Returns:
        :class:`TraceEstimate` over the parameters with ``requires_grad``.

    Raises:
        ValueError: no trainable parameters, an empty batch, or as :func:`hutchinson_trace`.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters; tr(H) over nothing is undefined")
    if len(y) == 0:
        raise ValueError("the batch for tr(H) is empty")
    was_training = model.training
    model.eval()
    try:
        return hutchinson_trace(lambda: nn.functional.cross_entropy(model(x), y), params, probes=probes,
                                generator=generator)
    finally:
        model.train(was_training)


def decelerator(*, sigma: float, trace_h: float, batch_size: float, clip_norm: float) -> float:
    """The DP decelerator σ²·tr(H)/(B·c²) (Bu et al. 2024; see the module docstring for the convention).

    Args:
        sigma: noise multiplier σ ≥ 0.
        trace_h: tr(H) (may be negative away from a minimum; the sign is kept).
        batch_size: expected logical batch size B > 0.
        clip_norm: clipping norm c > 0.

    Returns:
        σ²·tr(H)/(B·c²).

    Raises:
        ValueError: if σ < 0, B ≤ 0, c ≤ 0 or a value is not finite.
    """
    for name, value in (("sigma", sigma), ("trace_h", trace_h), ("batch_size", batch_size), ("clip_norm", clip_norm)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma!r}")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size!r}")
    if clip_norm <= 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm!r}")
    return float(sigma) ** 2 * float(trace_h) / (float(batch_size) * float(clip_norm) ** 2)


class HessianMonitor:
    """Measures tr(H) (and the decelerator) of a live model on a fixed held-out batch, at bounded cost.

    It keeps its own hook-free copy of the model (``template``, deep-copied by the caller *before* Opacus wraps
    the live model) and loads the live weights into it for each measurement, so per-sample-gradient hooks never
    see the double backward. The cost of one measurement is one forward, one graph-keeping backward and
    ``probes`` Hessian-vector products on ``batch_size`` examples.

    Args:
        template: a plain copy of the model's architecture (its weights are overwritten each time).
        x, y: the held-out batch (public or test data, never private members: the curve is logged in the clear).
        probes: Rademacher probes per measurement.
        sigma, batch_size, clip_norm: the DP phase's σ, expected B and c for the decelerator (sigma None: not
            logged).
        seed: probes at step t are drawn from a generator seeded by (seed, t), so a resumed run logs the same
            numbers.
    """

    def __init__(self, template: nn.Module, x: torch.Tensor, y: torch.Tensor, *, probes: int,
                 sigma: float | None, batch_size: float, clip_norm: float, seed: int) -> None:
        if isinstance(probes, bool) or not isinstance(probes, int) or probes < 1:
            raise ValueError(f"probes must be an integer >= 1, got {probes!r}")
        if len(y) == 0:
            raise ValueError("HessianMonitor needs a non-empty batch")
        self.model = template
        self.x, self.y = x, y
        self.probes = probes
        self.sigma = sigma
        self.batch_size = batch_size
        self.clip_norm = clip_norm
        self.seed = int(seed)

    def measure(self, live: nn.Module, step: int) -> dict[str, float]:
        """``{"trace_h", "trace_h_stderr"[, "decelerator"]}`` of ``live``'s current weights at ``step``.

        The trainable set is ``live``'s (parameters with ``requires_grad``), matched by name.
        """
        self.model.load_state_dict(live.state_dict())
        trainable = {n for n, p in live.named_parameters() if p.requires_grad}
        for n, p in self.model.named_parameters():
            p.requires_grad_(n in trainable)
        device = next(self.model.parameters()).device
        gen = torch.Generator(device=device)
        gen.manual_seed(derive_seed(self.seed, Stream.HESSIAN, int(step)))
        est = model_hessian_trace(self.model, self.x, self.y, probes=self.probes, generator=gen)
        out = {"trace_h": est.mean, "trace_h_stderr": est.stderr}
        if self.sigma is not None and self.sigma > 0:
            out["decelerator"] = decelerator(sigma=self.sigma, trace_h=est.mean, batch_size=self.batch_size,
                                             clip_norm=self.clip_norm)
        return out
