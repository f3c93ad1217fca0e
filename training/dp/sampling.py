"""Batch samplers whose batches are a pure function of (seed, step), so a resumed run sees the same batches.

* :class:`PoissonSampler`: every example joins each step's batch independently with probability q (the
  sampling that the DP-SGD privacy analysis of Abadi et al. 2016 and every accountant in
  :mod:`training.accounting` assume). Batch sizes vary; a batch may be empty.
* :class:`ShuffleSampler`: one random permutation per epoch cut into fixed-size batches (the remainder of
  each epoch is dropped). Common in practice, but the Poisson-subsampling analysis does not strictly apply
  to it; a DP claim made with it must say so (the manifest records the sampling scheme).

>>> s = PoissonSampler(n=1000, sample_rate=0.05, seed=3)
>>> bool((s.indices(7) == s.indices(7)).all()), s.expected_batch_size
(True, 50.0)
>>> ShuffleSampler(n=10, batch_size=4, seed=0).indices(0).shape
(4,)
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["PoissonSampler", "ShuffleSampler", "make_sampler"]

_POISSON_TAG = 0x504F4953  # domain separation of the random streams ("POIS")
_SHUFFLE_TAG = 0x53485546  # "SHUF"


def _check_int(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


class PoissonSampler:
    """Poisson sampling: each of ``n`` examples is in step t's batch with probability ``sample_rate``.

    The batch of step t is drawn from ``np.random.default_rng([TAG, seed, t])``, so it depends only on
    (seed, t): resuming at step t reproduces the uninterrupted run exactly.

    Args:
        n: number of examples (the private members); ≥ 1.
        sample_rate: q in (0, 1].
        seed: integer seed ≥ 0.

    Raises:
        ValueError: if an argument is out of range.
    """

    sampling = "poisson"

    def __init__(self, n: int, sample_rate: float, seed: int) -> None:
        self.n = _check_int("n", n, 1)
        if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real) or not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        self.sample_rate = float(sample_rate)
        self.seed = _check_int("seed", seed, 0)

    @property
    def expected_batch_size(self) -> float:
        """n · q, the denominator DP-SGD divides the noisy gradient sum by."""
        return self.n * self.sample_rate

    def indices(self, step: int) -> np.ndarray:
        """Sorted int64 indices in [0, n) of the examples in step ``step``'s batch (possibly empty)."""
        step = _check_int("step", step, 0)
        rng = np.random.default_rng([_POISSON_TAG, self.seed, step])
        return np.flatnonzero(rng.random(self.n) < self.sample_rate).astype(np.int64)

    def steps_per_epoch(self) -> float:
        """Expected number of steps for one pass over the data, 1/q."""
        return 1.0 / self.sample_rate

    def __repr__(self) -> str:
        return f"PoissonSampler(n={self.n}, sample_rate={self.sample_rate:g}, seed={self.seed})"


class ShuffleSampler:
    """Shuffling: a fresh permutation each epoch, cut into ``n // batch_size`` batches of exactly ``batch_size``.

    Epoch e's permutation comes from ``np.random.default_rng([TAG, seed, e])``; step t lies in epoch
    ``t // steps_per_epoch``. Examples past the last full batch of an epoch are skipped in that epoch.

    Args:
        n: number of examples; ≥ 1.
        batch_size: examples per batch; in [1, n].
        seed: integer seed ≥ 0.

    Raises:
        ValueError: if an argument is out of range.
    """

    sampling = "shuffle"

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n = _check_int("n", n, 1)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        if self.batch_size > self.n:
            raise ValueError(f"batch_size must be <= n={self.n} for shuffle sampling, got {batch_size}")
        self.seed = _check_int("seed", seed, 0)
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
            perm = np.random.default_rng([_SHUFFLE_TAG, self.seed, epoch]).permutation(self.n).astype(np.int64)
            self._cache = (epoch, perm)
        return self._cache[1]

    def indices(self, step: int) -> np.ndarray:
        """int64 indices in [0, n) of the ``batch_size`` examples in step ``step``'s batch (in shuffled order)."""
        step = _check_int("step", step, 0)
        epoch, pos = divmod(step, self.steps_per_epoch())
        start = pos * self.batch_size
        return self._permutation(epoch)[start:start + self.batch_size].copy()

    def __repr__(self) -> str:
        return f"ShuffleSampler(n={self.n}, batch_size={self.batch_size}, seed={self.seed})"


def make_sampler(*, sampling: str, n: int, batch_size: int, seed: int) -> PoissonSampler | ShuffleSampler:
    """The sampler for ``sampling`` ("poisson" or "shuffle") with expected batch size ``batch_size``.

    Poisson sampling uses q = min(1, batch_size / n).

    Args:
        sampling: ``"poisson"`` or ``"shuffle"``.
        n: number of examples; ≥ 1.
        batch_size: (expected) logical batch size; ≥ 1.
        seed: integer seed ≥ 0.

    Returns:
        A sampler with ``.indices(step)``, ``.sample_rate``, ``.expected_batch_size`` and ``.sampling``.

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
