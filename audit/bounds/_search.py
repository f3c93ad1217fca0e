"""Vectorised search for the largest parameter a test still rejects.

The one-run estimators report ``sup{x >= 0 : rejects(x)}`` for many count pairs at once. :func:`sup_rejected`
keeps, for every pair, a bracket ``[lo, hi]`` with ``rejects(lo)`` True and ``rejects(hi)`` False, and shrinks it by
evaluating ``points`` interior values per pass (``points=1`` is plain bisection). The returned ``lo`` is always a
rejected value, so it is a valid lower confidence bound even where the test is not monotone in ``x`` (it is then
merely not the largest rejected value).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["sup_rejected"]

RejectFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``rejects(index, x) -> bool array``: whether pair ``index[k]`` is rejected at parameter ``x[k]``."""

_MAX_DOUBLINGS = 64


def sup_rejected(rejects: RejectFn, n: int, *, tol: float = 1e-7, points: int = 1) -> np.ndarray:
    """Largest rejected parameter in [0, inf) for each of ``n`` pairs (0 where 0 itself is not rejected).

    Args:
        rejects: Vectorised test, must return False for every pair at large enough ``x``.
        n: Number of pairs.
        tol: Final bracket width.
        points: Interior points evaluated per pass (1 = bisection).

    Returns:
        Float array of shape (n,).

    Raises:
        RuntimeError: If some pair is still rejected at ``x = 2**64`` (a broken test).

    >>> sup_rejected(lambda i, x: x <= np.array([0.5, 3.0])[i], 2, tol=1e-9).round(6).tolist()
    [0.5, 3.0]
    """
    out = np.zeros(n)
    idx = np.flatnonzero(rejects(np.arange(n), np.zeros(n)))
    if idx.size == 0:
        return out
    lo, hi = np.zeros(idx.size), np.ones(idx.size)
    for _ in range(_MAX_DOUBLINGS):
        grow = rejects(idx, hi)
        if not np.any(grow):
            break
        lo = np.where(grow, hi, lo)
        hi = np.where(grow, 2.0 * hi, hi)
    else:
        raise RuntimeError("sup_rejected: the test still rejects at 2**64; it must accept large parameters")
    fractions = np.arange(1, points + 1) / (points + 1)
    while np.max(hi - lo) > tol:
        grid = lo[:, None] + (hi - lo)[:, None] * fractions[None, :]
        ok = rejects(np.repeat(idx, points), grid.reshape(-1)).reshape(idx.size, points)
        leading = np.cumprod(ok, axis=1).sum(axis=1)  # number of consecutive rejected points from lo upward
        new_lo = np.where(leading > 0, grid[np.arange(idx.size), np.maximum(leading - 1, 0)], lo)
        new_hi = np.where(leading < points, grid[np.arange(idx.size), np.minimum(leading, points - 1)], hi)
        if np.array_equal(new_lo, lo) and np.array_equal(new_hi, hi):
            break  # floating-point resolution reached
        lo, hi = new_lo, new_hi
    out[idx] = lo
    return out
