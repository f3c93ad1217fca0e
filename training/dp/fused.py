"""A fixed-shape DP-SGD step that keeps one GPU busy: device-side Poisson batches, no host synchronisation.

The Opacus-based :class:`~training.dp.stepper.Stepper` draws each Poisson batch on the host, cuts it into chunks
whose sizes vary from step to step, walks the parameters in Python per chunk and reads its statistics back with
``.item()``-like transfers every step: on a GPU one such process leaves the device idle most of the time (the
H100 profile of ``results/reference/seed_gpu``: ~16 ms of kernels in a 103 ms DP step). This module is the
alternative for one process:

* :class:`DevicePoissonSampler` draws step t's Poisson mask on the device (a device generator seeded from
  ``derive_seed(seed, POISSON, t)``) and pads the batch to a fixed ``capacity`` — the members first, in index
  order, then filler rows whose ``valid`` flag is False. The capacity is the (1 − ``tail``) quantile of the
  Binomial(n, q) batch size; a batch above it (probability ≤ ``tail`` per step) is truncated and counted on the
  device, and :meth:`FusedDPStep.check` (one transfer, whenever the caller syncs anyway) raises if it ever
  happened, so a run whose sampling departed from Poisson is never reported as if it had not.
* :class:`FusedDPStep` computes per-example gradients of the fixed-shape padded batch with ``torch.func``
  (``vmap`` of ``grad`` over ``functional_call``), the per-example norms, flat or automatic clipping factors
  (times ``valid``: filler rows contribute nothing), the clipped sums, the gradient canaries' C·u_i, Gaussian
  noise N(0, σ²C²) drawn parameter by parameter from the caller's generator exactly as Opacus's ``DPOptimizer``
  draws it (so for the same generator state the noise is bit-identical), the division by the *expected* batch
  size, and the wrapped optimizer's update. Statistics (loss sum, realised batch size, clipped count, norm sum)
  accumulate in one device tensor that :meth:`FusedDPStep.stats` reads when asked.
* The per-chunk function has fixed shapes, so ``compile="default"`` (``torch.compile``) or
  ``compile="reduce-overhead"`` (``torch.compile`` with CUDA graphs) can capture it; off by default, and every
  path equals the eager one (``tests/test_dp_fused.py`` checks the clipped sums, the noise and the update against
  the Opacus stepper on the CPU, and the sampler's accounting against :class:`~training.dp.sampling.PoissonSampler`).

Models must treat examples independently (no BatchNorm: the builder's ``fix_batchnorm``), as for every DP mode.

>>> import torch
>>> from torch import nn
>>> s = DevicePoissonSampler(n=1000, sample_rate=0.05, seed=0, device="cpu")
>>> idx, valid = s.padded(3)
>>> idx.shape == valid.shape == (s.capacity,), bool((s.mask(3).nonzero().flatten() == idx[valid]).all())
(True, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.dp.clipping import automatic_clip_factors, flat_clip_factors
from training.dp.rng import Stream, derive_seed

__all__ = ["DevicePoissonSampler", "FusedDPStep", "poisson_capacity", "COMPILE_MODES"]

COMPILE_MODES = ("off", "default", "reduce-overhead")


def poisson_capacity(n: int, sample_rate: float, *, tail: float = 1e-12, multiple: int = 8) -> int:
    """The smallest c (a multiple of ``multiple``, at most n) with P[Binomial(n, q) > c] <= ``tail``.

    >>> poisson_capacity(50_000, 0.02)  # 1,000 expected
    1232
    >>> poisson_capacity(10, 1.0)
    10
    """
    if not 0.0 < sample_rate <= 1.0 or not 0.0 < tail < 1.0 or n < 1:
        raise ValueError(f"need n >= 1, sample_rate in (0, 1] and tail in (0, 1); got {n}, {sample_rate}, {tail}")
    from scipy.stats import binom

    c = int(binom.isf(tail, n, sample_rate))
    while c < n and binom.sf(c, n, sample_rate) > tail:
        c += 1
    return min(n, int(math.ceil(max(c, 1) / multiple) * multiple))


class DevicePoissonSampler:
    """Poisson sampling drawn on ``device`` and padded to a fixed ``capacity`` (see the module docstring).

    Also a :class:`~training.dp.sampling.BatchSampler` (``indices(step)`` on the host, same batches), so the
    eager engine can be fed the very batches the fused step takes.

    Args:
        n: examples sampled from; sample_rate: q in (0, 1]; seed: integer >= 0 (the mask of step t depends on
            (seed, t) only); device: where masks are drawn; capacity: padded batch size (default
            :func:`poisson_capacity` at ``tail``).

    Raises:
        ValueError: an argument out of range.
    """

    sampling = "poisson"

    def __init__(self, n: int, sample_rate: float, seed: int, *, device: torch.device | str = "cpu",
                 capacity: int | None = None, tail: float = 1e-12) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0 (the device sampler has no secure mode), got {seed!r}")
        self.n, self.sample_rate, self.seed = int(n), float(sample_rate), seed
        self.device = torch.device(device)
        self.tail = float(tail)
        self.capacity = int(capacity) if capacity is not None else poisson_capacity(n, sample_rate, tail=tail)
        if not 1 <= self.capacity <= self.n:
            raise ValueError(f"capacity must be in [1, n={self.n}], got {self.capacity}")
        self._gen = torch.Generator(device=self.device)
        self._arange = torch.arange(self.n, device=self.device)

    @property
    def expected_batch_size(self) -> float:
        """n · q: the DP-SGD denominator, as :class:`~training.dp.sampling.PoissonSampler`'s."""
        return self.n * self.sample_rate

    def mask(self, step: int) -> Tensor:
        """(n,) bool on the device: who is in step ``step``'s batch (no host synchronisation)."""
        self._gen.manual_seed(derive_seed(self.seed, Stream.POISSON, int(step)))
        return torch.rand(self.n, generator=self._gen, device=self.device) < self.sample_rate

    def padded(self, step: int, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(idx, valid)``, both (capacity,) on the device: the batch's members first in index order, then filler
        rows (``valid`` False). Fixed shapes, no host synchronisation."""
        m = self.mask(step) if mask is None else mask
        key = torch.where(m, self._arange, self._arange + self.n)  # members sort first, each group in index order
        idx = torch.sort(key).indices[: self.capacity]
        return idx, m[idx]

    def indices(self, step: int) -> np.ndarray:
        """Host-side sorted int64 indices of step ``step``'s (untruncated) batch: the BatchSampler contract."""
        return self.mask(step).nonzero().flatten().cpu().numpy().astype(np.int64)

    def __repr__(self) -> str:
        return (f"DevicePoissonSampler(n={self.n}, sample_rate={self.sample_rate:g}, seed={self.seed}, "
                f"capacity={self.capacity}, device={self.device})")


def _cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits, targets, reduction="none")


class FusedDPStep:
    """One DP-SGD step over a fixed-shape padded batch, on the device end to end (see the module docstring).

    Args:
        model: the network (its trainable parameters are those with ``requires_grad``; no BatchNorm).
        optimizer: a torch optimizer over exactly those parameters (in ``model.parameters()`` order).
        noise_multiplier: σ; max_grad_norm: C; expected_batch_size: the DP-SGD denominator (q·n).
        clipping: ``"flat"`` (Opacus's min(1, C/(‖g‖+1e-6))) or ``"automatic"`` (C/(‖g‖+γ), ``gamma``).
        generator: the noise generator, on the model's device.
        physical_batch_size: rows per vmap chunk; the padded batch is processed in ceil(capacity / this) chunks.
        loss_fn: ``(logits, targets) -> per-example losses``; default cross-entropy.
        compile: one of :data:`COMPILE_MODES` (``torch.compile`` of the per-chunk function; ``reduce-overhead``
            adds CUDA graphs). Any failure falls back to eager with a warning through ``warn``.
        compile_backend: ``torch.compile``'s backend (``inductor``; the CPU tests trace with ``aot_eager``).
        debug_disable_noise: TEST ONLY: no noise (breaks DP on purpose).

    Raises:
        ValueError: an argument out of range, or an optimizer over other parameters than the trainable ones.
    """

    def __init__(self, model: nn.Module, *, optimizer: torch.optim.Optimizer, noise_multiplier: float,
                 max_grad_norm: float, expected_batch_size: float, generator: torch.Generator,
                 clipping: str = "flat", gamma: float = 0.01, physical_batch_size: int = 256,
                 loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None, compile: str = "off",
                 compile_backend: str = "inductor", warn: Callable[[str], None] | None = None,
                 debug_disable_noise: bool = False) -> None:
        if clipping not in ("flat", "automatic"):
            raise ValueError(f"clipping must be 'flat' or 'automatic' for the fused step, got {clipping!r}")
        if compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {compile!r}")
        if not (noise_multiplier >= 0 and max_grad_norm > 0 and expected_batch_size > 0 and physical_batch_size >= 1):
            raise ValueError("need noise_multiplier >= 0, max_grad_norm > 0, expected_batch_size > 0 and "
                             f"physical_batch_size >= 1; got {noise_multiplier}, {max_grad_norm}, "
                             f"{expected_batch_size}, {physical_batch_size}")
        self.model, self.optimizer, self.generator = model, optimizer, generator
        self.noise_multiplier, self.max_grad_norm = float(noise_multiplier), float(max_grad_norm)
        self.expected_batch_size, self.physical_batch_size = float(expected_batch_size), int(physical_batch_size)
        self.clipping, self.gamma = clipping, float(gamma)
        self.loss_fn = loss_fn or _cross_entropy
        self.debug_disable_noise = bool(debug_disable_noise)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for p in model.parameters() if p.requires_grad]
        in_opt = [p for g in optimizer.param_groups for p in g["params"]]
        if [id(p) for p in in_opt] != [id(p) for p in self.params]:
            raise ValueError("the optimizer must hold exactly the model's trainable parameters, in order")
        device = self.params[0].device
        self._stats = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, n, clipped, norm sum
        self._overflow = torch.zeros((), dtype=torch.int64, device=device)
        self._chunk = self._chunk_eager
        self._warn = warn or (lambda m: None)
        self._compiled_ran = False
        if compile != "off":
            try:
                self._chunk = torch.compile(self._chunk_eager, backend=compile_backend, dynamic=False,
                                            mode=None if compile == "default" or compile_backend != "inductor"
                                            else compile)
            except Exception as exc:  # noqa: BLE001 - an optional optimisation falls back
                self._warn(f"fused DP step: torch.compile failed ({exc!r}); running eagerly")

    # ---------------------------------------------------------------------------------------------- pieces

    def _per_example(self, params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, y: Tensor
                     ) -> tuple[dict[str, Tensor], Tensor]:
        def loss_one(p, b, xi, yi):
            out = torch.func.functional_call(self.model, (p, b), (xi.unsqueeze(0),))
            loss = self.loss_fn(out, yi.unsqueeze(0))[0]
            return loss, loss.detach()

        fn = torch.func.vmap(torch.func.grad(loss_one, has_aux=True), in_dims=(None, None, 0, 0),
                             randomness="different")
        return fn(params, buffers, x, y)

    def _chunk_eager(self, params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, y: Tensor,
                     valid: Tensor) -> tuple[list[Tensor], Tensor, Tensor]:
        """Clipped sums of one fixed-shape chunk, its statistics [loss sum, n, clipped, norm sum] and its rows'
        pre-clip norms."""
        grads, losses = self._per_example(params, buffers, x, y)
        g = [grads[n] for n in self.names]
        norms = torch.stack([t.reshape(t.shape[0], -1).norm(2, dim=1) for t in g], dim=1).norm(2, dim=1)
        if self.clipping == "flat":
            factors = flat_clip_factors(norms, max_grad_norm=self.max_grad_norm)
        else:
            factors = automatic_clip_factors(norms, max_grad_norm=self.max_grad_norm, gamma=self.gamma)
        v = valid.to(norms.dtype)
        factors = factors * v
        sums = [torch.einsum("i,i...->...", factors.to(t.dtype), t) for t in g]
        stats = torch.stack([(losses.detach() * v).sum(), v.sum(), ((norms > self.max_grad_norm).to(v.dtype) * v).sum(),
                             (norms * v).sum()]).double()
        return sums, stats, norms.detach()

    def clipped_sums(self, x: Tensor, y: Tensor, valid: Tensor) -> list[Tensor]:
        """Σ_i valid_i · c_i · g_i over the padded batch (one tensor per trainable parameter); adds to the stats.
        The padded batch's pre-clip per-example norms stay on the device in :attr:`last_norms`."""
        params = {n: p.detach() for n, p in self.model.named_parameters()}
        buffers = dict(self.model.named_buffers())
        total: list[Tensor] | None = None
        norms: list[Tensor] = []
        for start in range(0, len(y), self.physical_batch_size):
            stop = start + self.physical_batch_size
            args = (params, buffers, x[start:stop], y[start:stop], valid[start:stop])
            try:
                sums, stats, chunk_norms = self._chunk(*args)
            except Exception as exc:  # noqa: BLE001 - compilation happens at the first call: fall back once
                if self._chunk is self._chunk_eager or self._compiled_ran:
                    raise
                self._warn(f"fused DP step: the compiled step failed ({type(exc).__name__}); running eagerly")
                self._chunk = self._chunk_eager
                sums, stats, chunk_norms = self._chunk(*args)
            self._compiled_ran = self._chunk is not self._chunk_eager
            total = list(sums) if total is None else [a + b for a, b in zip(total, sums)]
            self._stats += stats
            norms.append(chunk_norms)
        self.last_norms = torch.cat(norms) if norms else valid.new_zeros(0, dtype=torch.float32)
        if total is None:
            total = [torch.zeros_like(p) for p in self.params]
        return total

    def noise(self) -> list[Tensor]:
        """N(0, σ²C²) per trainable parameter from ``generator``, drawn as Opacus's ``DPOptimizer`` draws it
        (``torch.normal`` per parameter, in order); zeros under ``debug_disable_noise``."""
        std = 0.0 if self.debug_disable_noise else self.noise_multiplier * self.max_grad_norm
        if std == 0.0:
            return [torch.zeros_like(p) for p in self.params]
        return [torch.normal(mean=0.0, std=std, size=p.shape, device=p.device, generator=self.generator)
                for p in self.params]

    # ------------------------------------------------------------------------------------------------ step

    def step(self, x: Tensor, y: Tensor, valid: Tensor, *, canary_grad: Sequence[Tensor] | None = None,
             overflow: Tensor | None = None) -> None:
        """One logical step on the padded batch ``(x, y, valid)`` (device tensors of fixed shape): clipped sums,
        canaries (``canary_grad``: C·Σu_i per parameter), noise, division by the expected batch size, update.
        ``overflow``: the sampler's truncation flag of this batch (0-d), counted for :meth:`check`. The caller sets
        the modules' train/eval modes (frozen normalisation layers stay in eval mode, as the stepper keeps them)."""
        sums = self.clipped_sums(x, y, valid)
        if canary_grad is not None:
            sums = [s + c.to(s.dtype) for s, c in zip(sums, canary_grad)]
        for p, s, z in zip(self.params, sums, self.noise()):
            p.grad = ((s + z) / self.expected_batch_size).view_as(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if overflow is not None:
            self._overflow += overflow.to(torch.int64)

    def sampled_step(self, sampler: DevicePoissonSampler, step: int, images: Tensor, labels: Tensor, *,
                     transform: Callable[[Tensor], Tensor] | None = None,
                     canary_grad: Sequence[Tensor] | None = None) -> None:
        """Draw step ``step``'s padded Poisson batch on the device from resident ``images``/``labels`` and take
        the step (``transform``: uint8 rows to the model's float input, e.g. a cast and augmentation)."""
        mask = sampler.mask(step)
        idx, valid = sampler.padded(step, mask)
        x = images.index_select(0, idx)
        self.step(transform(x) if transform is not None else x, labels.index_select(0, idx), valid,
                  canary_grad=canary_grad, overflow=mask.sum() > sampler.capacity)

    def pop_stats(self) -> Tensor:
        """The device tensor [loss sum, examples, clipped, norm sum] since the last reset, and reset (no transfer)."""
        out = self._stats.clone()
        self._stats.zero_()
        return out

    def stats(self, *, reset: bool = True) -> dict[str, float]:
        """Loss mean, examples, clipped fraction and mean pre-clip norm since the last reset (one transfer)."""
        loss, n, clipped, norm = self._stats.tolist()
        if reset:
            self._stats.zero_()
        nan = float("nan")
        return {"loss": loss / n if n else nan, "examples": n, "clipped_fraction": clipped / n if n else nan,
                "grad_norm_mean": norm / n if n else nan}

    def check(self) -> None:
        """Raise if any batch was truncated at the sampler's capacity (one transfer; call where a sync is due).

        Raises:
            RuntimeError: a batch exceeded the capacity (the run's sampling was not exactly Poisson).
        """
        k = int(self._overflow)
        if k:
            raise RuntimeError(f"{k} Poisson batch(es) exceeded the padded capacity and were truncated: the "
                               "sampling was not exactly Poisson; raise the capacity (a smaller tail) and rerun")
