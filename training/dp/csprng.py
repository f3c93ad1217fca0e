"""Secure mode's randomness: every draw straight from the operating system's CSPRNG.

In secure mode (``privacy.secure_mode``) neither the DP noise nor the batches may be predictable from anything
an adversary could learn: no seed, no generator state, no pseudo-random stream that a seed expands. Opacus gets
this from torchcsprng; that package is not built for current PyTorch, so this module draws the bits itself
from ``os.urandom`` (the kernel's CSPRNG: ``getrandom(2)`` on Linux) and turns them into numbers:

* :func:`uniform` — float64 in [0, 1) with 53 random bits each (the top 53 of a random 64-bit word);
* :func:`gaussian` — N(0, std²) by the Box–Muller transform in float64, hardened against floating-point attacks
  on the noise (Mironov 2012; Haney et al. 2022, arXiv:2107.10138 §5.1; the attack on Opacus in
  arXiv:2112.05307) the way Opacus's secure mode is: each value is the sum of four independent standard normals
  divided by 2 (still N(0, 1)), so the low bits of a released value do not reveal one sample's inputs;
* :func:`permutation` — a uniform random permutation (sort of independent 64-bit random keys).

The cost is bandwidth: 32 random bytes per noise coordinate (four uniforms for two Box–Muller pairs), which the
kernel serves at hundreds of MB/s — fine for models of millions of parameters, slower than the seeded noise of
the reproducible mode. Nothing here can be reproduced or resumed bit for bit, by design.

>>> u = uniform(1000)
>>> bool(((0.0 <= u) & (u < 1.0)).all()), u.dtype.name
(True, 'float64')
>>> sorted(permutation(5).tolist())
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

__all__ = ["random_words", "uniform", "gaussian", "permutation"]

_BYTES_PER_CALL = 1 << 24  # os.urandom reads in pieces of at most 16 MiB (getrandom returns short reads above 32 MiB)


def random_words(n: int) -> np.ndarray:
    """``n`` independent uniform 64-bit words (uint64) from ``os.urandom``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    total = 8 * n
    chunks = [os.urandom(min(_BYTES_PER_CALL, total - start)) for start in range(0, total, _BYTES_PER_CALL)]
    return np.frombuffer(b"".join(chunks), dtype=np.uint64, count=n)


def uniform(n: int) -> np.ndarray:
    """``n`` independent uniforms on [0, 1), float64 with 53 random bits each."""
    return (random_words(n) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _standard_normal(n: int) -> np.ndarray:
    """``n`` independent N(0, 1) in float64 by Box–Muller (one pair of uniforms gives two normals)."""
    pairs = (n + 1) // 2
    u = uniform(2 * pairs).reshape(2, pairs)
    radius = np.sqrt(-2.0 * np.log1p(-u[0]))  # 1 - u in (0, 1]: log is finite
    angle = (2.0 * math.pi) * u[1]
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]


def gaussian(shape: tuple[int, ...] | torch.Size, std: float, *, device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Noise N(0, std²) of ``shape`` from the OS CSPRNG: (z₁ + z₂ + z₃ + z₄) / 2 · std for fresh normals z.

    Args:
        shape: the tensor's shape.
        std: the standard deviation (σ·C for DP-SGD); 0 gives zeros and reads no randomness.
        device: where the tensor is returned (drawn on the CPU, then moved).
        dtype: its dtype (the sum is formed in float64, then cast).
    """
    n = math.prod(shape)
    if std == 0.0 or n == 0:
        return torch.zeros(tuple(shape), device=device, dtype=dtype)
    z = _standard_normal(4 * n).reshape(4, n).sum(axis=0) * (0.5 * float(std))
    return torch.from_numpy(z).reshape(tuple(shape)).to(device=device, dtype=dtype)


def permutation(n: int) -> np.ndarray:
    """A uniform random permutation of ``range(n)`` (int64): indices sorted by independent 64-bit random keys
    (ties, of probability below n²/2⁶⁵, fall back to index order, a negligible bias)."""
    return np.argsort(random_words(n), kind="stable").astype(np.int64)
