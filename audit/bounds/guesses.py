"""Turning one-run canary scores into guesses and counting the correct ones.

In a one-run audit (Steinke, Nasr, Jagielski 2023; Mahloujifar, Melis, Chaudhuri 2024) each of ``m`` canaries is
included in training independently with probability 1/2. The auditor ranks canaries by score (higher score =
member), guesses the top ``k_pos`` as IN and the bottom ``k_neg`` as OUT, and abstains on the rest: ``r = k_pos +
k_neg`` guesses of which ``v`` are correct. Trying several ``(k_pos, k_neg)`` pairs is a multiple test; the
estimators account for it with a Bonferroni correction over the pairs counted here.

Ties in the scores are broken with independent random keys from ``rng``. Breaking them by canary index instead
would let the canary order (which may correlate with membership) leak into the guesses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from audit.bounds._validate import check_int_array, check_scores

__all__ = ["GuessCounts", "GridBest", "one_run_guess_counts", "best_guess_pair"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuessCounts:
    """Guess counts for every ``(k_pos, k_neg)`` pair tried (all arrays have one entry per pair).

    Attributes:
        m: Number of canaries.
        k_pos: Canaries guessed IN (the top of the ranking).
        k_neg: Canaries guessed OUT (the bottom of the ranking).
        r: Guesses made, ``k_pos + k_neg``.
        v: Correct guesses, ``v_pos + v_neg``.
        v_pos: IN guesses that were members.
        v_neg: OUT guesses that were non-members.
    """

    m: int
    k_pos: np.ndarray
    k_neg: np.ndarray
    r: np.ndarray
    v: np.ndarray
    v_pos: np.ndarray
    v_neg: np.ndarray

    @property
    def n_pairs(self) -> int:
        """Number of ``(k_pos, k_neg)`` pairs (the Bonferroni divisor)."""
        return int(self.r.size)

    def best(self, bounds: np.ndarray) -> int:
        """The pair with the largest bound; ties go to the more precise pair (larger v / r), then the first."""
        return int(np.lexsort((-self.v / self.r, -np.asarray(bounds)))[0])

    def record(self, i: int) -> tuple[dict[str, int], dict[str, object]]:
        """Pair ``i``'s counts (``m, k_pos, k_neg, r, v, v_pos, v_neg, n_pairs``) and the grid it was chosen from
        (``extra``: ``alpha_per_pair`` is added by the caller)."""
        counts = {"m": self.m, "k_pos": int(self.k_pos[i]), "k_neg": int(self.k_neg[i]), "r": int(self.r[i]),
                  "v": int(self.v[i]), "v_pos": int(self.v_pos[i]), "v_neg": int(self.v_neg[i]),
                  "n_pairs": self.n_pairs}
        grid = {"k_pos_grid": tuple(int(k) for k in np.unique(self.k_pos)),
                "k_neg_grid": tuple(int(k) for k in np.unique(self.k_neg))}
        return counts, grid


def one_run_guess_counts(
    *,
    scores: object,
    included: object,
    k_pos_grid: object,
    k_neg_grid: object,
    rng: np.random.Generator | int | None = None,
) -> GuessCounts:
    """Correct-guess counts for every pair of the grid ``k_pos_grid × k_neg_grid`` (vectorised).

    Args:
        scores: One finite score per canary, shape (m,); higher = member.
        included: Whether each canary was in the training set, bool shape (m,).
        k_pos_grid: Numbers of top-ranked canaries to guess IN (integers >= 0; duplicates are dropped).
        k_neg_grid: Numbers of bottom-ranked canaries to guess OUT (integers >= 0; duplicates are dropped).
        rng: Seed or generator for breaking score ties.

    Returns:
        :class:`GuessCounts` with pairs in ``k_pos``-major order.

    Raises:
        ValueError: If shapes differ, ``included`` is not boolean, or a pair has ``k_pos + k_neg`` outside
            [1, m].

    >>> c = one_run_guess_counts(scores=np.array([0.9, 0.1, 0.8, 0.2]), included=np.array([True, False, True, True]),
    ...                          k_pos_grid=[1, 2], k_neg_grid=[1])
    >>> c.r.tolist(), c.v.tolist()
    ([2, 3], [2, 3])
    """
    s = check_scores(scores, "scores")
    inc = np.asarray(included)
    if inc.dtype != bool:
        raise ValueError(f"included must be a boolean array, got dtype {inc.dtype}")
    if inc.shape != s.shape:
        raise ValueError(f"included must have the shape of scores {s.shape}, got {inc.shape}")
    m = int(s.size)
    kp, kn = np.meshgrid(np.unique(check_int_array(k_pos_grid, "k_pos_grid")),
                         np.unique(check_int_array(k_neg_grid, "k_neg_grid")), indexing="ij")
    kp, kn = kp.ravel(), kn.ravel()
    r = kp + kn
    bad = (r < 1) | (r > m)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"k_pos + k_neg must be in [1, m={m}] for every grid pair, got (k_pos={kp[i]}, "
                         f"k_neg={kn[i]})")
    keys = np.random.default_rng(rng).random(m)
    order = np.lexsort((keys, -s))  # descending score, random tie-break
    inc_desc = inc[order]
    top_in = np.concatenate([[0], np.cumsum(inc_desc)])
    bottom_out = np.concatenate([[0], np.cumsum(~inc_desc[::-1])])
    v_pos = top_in[kp].astype(np.int64)
    v_neg = bottom_out[kn].astype(np.int64)
    return GuessCounts(m=m, k_pos=kp, k_neg=kn, r=r, v=v_pos + v_neg, v_pos=v_pos, v_neg=v_neg)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GridBest:
    """The best ``(k_pos, k_neg)`` pair of a guess grid under a bound, every pair tested at ``alpha / n_pairs``.

    Attributes:
        value: the best pair's bound.
        ceiling: the largest bound any pair could give with every guess correct (``v = r``), at the same α.
        counts: the best pair's counts (:meth:`GuessCounts.record`).
        extra: ``alpha_per_pair`` and the grid it was chosen from (``k_pos_grid``, ``k_neg_grid``).
    """

    value: float
    ceiling: float
    counts: dict[str, int]
    extra: dict[str, object]


def best_guess_pair(*, scores: object, included: object, k_pos_grid: object, k_neg_grid: object,
                    rng: np.random.Generator | int | None, alpha: float,
                    bounds: Callable[[int, np.ndarray, np.ndarray, float], np.ndarray],
                    ceilings: Callable[[int, tuple[int, ...], float], Sequence[float]]) -> GridBest:
    """Search a one-run guess grid with the search accounted for (Bonferroni over the pairs).

    Args:
        scores, included, k_pos_grid, k_neg_grid, rng: as for :func:`one_run_guess_counts`.
        alpha: the overall significance level (checked by the caller).
        bounds: ``bounds(m, r, v, alpha_per_pair)``, the vectorised bound of every pair.
        ceilings: ``ceilings(m, r, alpha_per_pair)`` with ``r`` a tuple, the bound of every pair with all its
            guesses correct (it depends on the totals only, so callers cache it).

    Returns:
        :class:`GridBest`; ties go to the more precise pair, then the first (:meth:`GuessCounts.best`).

    >>> inc = np.arange(8) % 2 == 0
    >>> g = best_guess_pair(scores=inc.astype(float), included=inc, k_pos_grid=[2, 4], k_neg_grid=[0], rng=0,
    ...                     alpha=0.1, bounds=lambda m, r, v, a: v / r, ceilings=lambda m, r, a: [1.0] * len(r))
    >>> g.value, g.counts["k_pos"], g.extra["alpha_per_pair"]
    (1.0, 2, 0.05)
    """
    c = one_run_guess_counts(scores=scores, included=included, k_pos_grid=k_pos_grid, k_neg_grid=k_neg_grid,
                             rng=rng)
    a_pair = alpha / c.n_pairs
    values = np.asarray(bounds(c.m, c.r, c.v, a_pair))
    best = c.best(values)
    counts, grid = c.record(best)
    ceiling = float(np.max(ceilings(c.m, tuple(int(x) for x in c.r), a_pair)))
    return GridBest(value=float(values[best]), ceiling=ceiling, counts=counts, extra={"alpha_per_pair": a_pair, **grid})
