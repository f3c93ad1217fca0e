"""The sampler contract every DP-SGD engine draws its batches from, and its two samplers.

A :class:`BatchSampler` answers ``indices(step)``: the positions in [0, n) of the examples in step ``step``'s
logical batch. With an integer seed the answer is a pure function of (seed, step) — through
:func:`training.dp.rng.derive_seed` — so a resumed run sees the same batches; with ``seed=None`` (secure mode)
every call draws fresh randomness from the operating system's CSPRNG. The Opacus engine
(:mod:`training.loop`) and the batched engine (:mod:`training.dp.batched`) both build their samplers with
:func:`make_sampler`.

* :class:`PoissonSampler`: every example joins each step's batch independently with probability q (the
  sampling that the DP-SGD privacy analysis of Abadi et al. 2016 and every accountant in
  :mod:`training.accounting` assume). Batch sizes vary; a batch may be empty.
* :class:`ShuffleSampler`: one random permutation per epoch cut into fixed-size batches (the remainder of
  each epoch is dropped). Common in practice, but the Poisson-subsampling analysis does not strictly apply
  to it; a DP claim made with it must say so (the manifest records the sampling scheme).

>>> s = make_sampler(sampling="poisson", n=1000, batch_size=50, seed=3)
>>> bool((s.indices(7) == s.indices(7)).all()), s.expected_batch_size
(True, 50.0)
>>> ShuffleSampler(n=10, batch_size=4, seed=0).indices(0).shape
(4,)
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from training.dp import csprng
from training.dp.rng import Stream, derive_seed

__all__ = ["BatchSampler", "PoissonSampler", "ShuffleSampler", "ShardedSampler", "make_sampler", "SAMPLINGS"]

SAMPLINGS = ("poisson", "shuffle")


def _check_int(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _check_seed(seed: int | None) -> int | None:
    return None if seed is None else _check_int("seed", seed, 0)


class _OsRandom:
    """The two draws the samplers make, straight from the OS CSPRNG (:mod:`training.dp.csprng`; secure mode)."""

    @staticmethod
    def random(n: int) -> np.ndarray:
        return csprng.uniform(n)

    @staticmethod
    def permutation(n: int) -> np.ndarray:
        return csprng.permutation(n)


def _rng(seed: int | None, stream: Stream, index: int) -> np.random.Generator | _OsRandom:
    """The generator of (seed, stream, index); with ``seed`` None (secure mode) every draw comes from the OS
    CSPRNG itself, not from a pseudo-random stream seeded by it."""
    if seed is None:
        return _OsRandom()
    return np.random.default_rng(derive_seed(seed, stream, index))


@runtime_checkable
class BatchSampler(Protocol):
    """What an engine needs from a sampler.

    Attributes:
        sampling: ``"poisson"`` or ``"shuffle"`` (recorded in the manifest).
        n: number of examples sampled from.
        sample_rate: q, the per-example inclusion probability of one step (accounting).
        expected_batch_size: the DP-SGD denominator (q·n for Poisson, the batch size for shuffling).
    """

    sampling: str
    n: int

    @property
    def sample_rate(self) -> float: ...

    @property
    def expected_batch_size(self) -> float: ...

    def indices(self, step: int) -> np.ndarray:
        """int64 positions in [0, n) of step ``step``'s batch (possibly empty)."""
        ...


class PoissonSampler:
    """Poisson sampling: each of ``n`` examples is in step t's batch with probability ``sample_rate``.

    Args:
        n: number of examples (the private members); ≥ 1.
        sample_rate: q in (0, 1].
        seed: integer seed ≥ 0 (the batch of step t depends only on (seed, t)), or None: fresh
            randomness from the OS CSPRNG on every call (secure mode; not reproducible).

    Raises:
        ValueError: if an argument is out of range.
    """

    sampling = "poisson"

    def __init__(self, n: int, sample_rate: float, seed: int | None) -> None:
        self.n = _check_int("n", n, 1)
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real) or not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        self.sample_rate = float(sample_rate)
        self.seed = _check_seed(seed)

    @property
    def expected_batch_size(self) -> float:
        """n · q, the denominator DP-SGD divides the noisy gradient sum by."""
        return self.n * self.sample_rate

    def indices(self, step: int) -> np.ndarray:
        """Sorted int64 indices in [0, n) of the examples in step ``step``'s batch (possibly empty)."""
        step = _check_int("step", step, 0)
        rng = _rng(self.seed, Stream.POISSON, step)
        return np.flatnonzero(rng.random(self.n) < self.sample_rate).astype(np.int64)

    def steps_per_epoch(self) -> float:
        """Expected number of steps for one pass over the data, 1/q."""
        return 1.0 / self.sample_rate

    def __repr__(self) -> str:
        seed = "secure" if self.seed is None else self.seed
        return f"PoissonSampler(n={self.n}, sample_rate={self.sample_rate:g}, seed={seed})"


class ShuffleSampler:
    """Shuffling: a fresh permutation each epoch, cut into ``n // batch_size`` batches of exactly ``batch_size``.

    Step t lies in epoch ``t // steps_per_epoch``, whose permutation depends only on (seed, epoch). With
    ``seed=None`` (secure mode) each epoch's permutation is drawn from the OS CSPRNG the first time the epoch
    is used, so a resumed run starts its current epoch with a new permutation. Examples past the last full
    batch of an epoch are skipped in that epoch.

    Args:
        n: number of examples; ≥ 1.
        batch_size: examples per batch; in [1, n].
        seed: integer seed ≥ 0, or None (secure mode).

    Raises:
        ValueError: if an argument is out of range.
    """

    sampling = "shuffle"

    def __init__(self, n: int, batch_size: int, seed: int | None) -> None:
        self.n = _check_int("n", n, 1)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        if self.batch_size > self.n:
            raise ValueError(f"batch_size must be <= n={self.n} for shuffle sampling, got {batch_size}")
        self.seed = _check_seed(seed)
        self._cache: tuple[int, np.ndarray] | None = None

    @property
    def sample_rate(self) -> float:
        """batch_size / n, the nominal sampling rate recorded for accounting."""
        return self.batch_size / self.n

    @property
    def expected_batch_size(self) -> float:
        return float(self.batch_size)

    def steps_per_epoch(self) -> int:
        return self.n // self.batch_size

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._cache is None or self._cache[0] != epoch:
            perm = _rng(self.seed, Stream.SHUFFLE, epoch).permutation(self.n).astype(np.int64)
            self._cache = (epoch, perm)
        return self._cache[1]

    def indices(self, step: int) -> np.ndarray:
        """int64 indices in [0, n) of the ``batch_size`` examples in step ``step``'s batch (in shuffled order)."""
        step = _check_int("step", step, 0)
        epoch, pos = divmod(step, self.steps_per_epoch())
        start = pos * self.batch_size
        return self._permutation(epoch)[start:start + self.batch_size].copy()

    def __repr__(self) -> str:
        seed = "secure" if self.seed is None else self.seed
        return f"ShuffleSampler(n={self.n}, batch_size={self.batch_size}, seed={seed})"


def make_sampler(*, sampling: str, n: int, batch_size: int, seed: int | None) -> PoissonSampler | ShuffleSampler:
    """The sampler for ``sampling`` ("poisson" or "shuffle") with expected batch size ``batch_size``.

    Poisson sampling uses q = min(1, batch_size / n); shuffling uses batches of min(batch_size, n).

    Args:
        sampling: ``"poisson"`` or ``"shuffle"``.
        n: number of examples; ≥ 1.
        batch_size: (expected) logical batch size; ≥ 1.
        seed: integer seed ≥ 0, or None for fresh OS randomness (secure mode).

    Returns:
        A :class:`BatchSampler`.

    Raises:
        ValueError: if ``sampling`` is unknown or a number is out of range.
    """
    n = _check_int("n", n, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    if sampling == "poisson":
        return PoissonSampler(n, min(1.0, batch_size / n), seed)
    if sampling == "shuffle":
        return ShuffleSampler(n, min(batch_size, n), seed)
    raise ValueError(f"sampling must be 'poisson' or 'shuffle', got {sampling!r}")


class ShardedSampler:
    """Rank ``rank``'s share of another sampler's logical batches (multi-process training, :mod:`training.distributed`).

    Every rank asks the same sampler (same seed) for step t's logical batch and keeps its positions
    ``rank, rank + world_size, ...``: the ranks' shares are disjoint and their union is exactly the one-process
    batch, so the sample rate and the expected batch size, what the accountant and the DP-SGD denominator use,
    are the wrapped sampler's.

    >>> inner = make_sampler(sampling="poisson", n=100, batch_size=20, seed=1)
    >>> shards = [ShardedSampler(inner, rank=r, world_size=3) for r in range(3)]
    >>> sorted(np.concatenate([s.indices(4) for s in shards]).tolist()) == inner.indices(4).tolist()
    True
    >>> shards[0].sample_rate == inner.sample_rate, shards[0].expected_batch_size
    (True, 20.0)

    An unseeded sampler (secure mode: batches from the OS CSPRNG) is drawn by rank 0 alone and its batch sent to
    the others by ``broadcast`` (rank 0's value in, rank 0's value out on every rank).

    Raises:
        ValueError: a rank outside [0, world_size), or an unseeded sampler without ``broadcast`` (each rank would
            draw another logical batch).
    """

    def __init__(self, inner: BatchSampler, *, rank: int, world_size: int,
                 broadcast: Callable[[np.ndarray | None], np.ndarray] | None = None) -> None:
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {rank}")
        self.shared = getattr(inner, "seed", 0) is None
        if self.shared and broadcast is None:
            raise ValueError("a sharded sampler over an unseeded sampler needs a broadcast of rank 0's batch: "
                             "with seed=None every rank would draw another logical batch")
        self.broadcast = broadcast
        self.inner = inner
        self.sampling = inner.sampling
        self.n = inner.n

    @property
    def sample_rate(self) -> float:
        return self.inner.sample_rate

    @property
    def expected_batch_size(self) -> float:
        return self.inner.expected_batch_size

    def indices(self, step: int) -> np.ndarray:
        """This rank's positions of step ``step``'s logical batch."""
        if self.shared:
            batch = self.broadcast(self.inner.indices(step) if self.rank == 0 else None)
        else:
            batch = self.inner.indices(step)
        return batch[self.rank::self.world_size]

    def __repr__(self) -> str:
        return f"ShardedSampler({self.inner!r}, rank={self.rank}, world_size={self.world_size})"
