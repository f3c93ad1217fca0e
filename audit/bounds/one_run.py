"""ε lower bounds from a single training run (Steinke, Nasr, Jagielski 2023).

Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023, arXiv:2305.08846). Each of
``m`` canaries is included independently with probability 1/2; the auditor makes ``r`` guesses (top ``k_pos``
scores IN, bottom ``k_neg`` OUT) of which ``v`` are correct. For an (ε, δ)-DP training algorithm their main
theorem bounds, for every ``v``,

    P[W >= v] <= β + 2·m·δ·α*,    β = P[Bin(r, q) >= v],    q = e^ε / (1 + e^ε),
    α* = max_{1 <= i <= v} (P[Bin(r, q) >= v - i] - P[Bin(r, q) >= v]) / i
       = max_{1 <= i <= v} P[v - i <= Bin(r, q) <= v - 1] / i.

(The paper maximises over ``i`` in 1..m; for ``i >= v`` the numerator is ``1 - β``, so ``i = v`` dominates those
terms and 1..v gives the same maximum.) With δ = 0 the p-value is β alone. The p-value is capped at 1.

The reported bound is ε_lb = sup{ε : p(ε) <= α}, found by bisection that keeps ``p(lo) <= alpha``; the returned
value always has p-value <= α. It is a valid lower bound even where p is not monotone in ε, because an (ε, δ)-DP
mechanism is (ε', δ)-DP for all ε' >= ε, so ``min_{ε' >= ε} p(ε')`` is also a valid p-value.

Ceiling: with every guess correct (``v = r``) and δ = 0, ``q^r <= α`` gives ``ε_max = -ln(α^(-1/r) - 1)
≈ ln(r / ln(1/α))`` (the relative error of the approximation is about ``ln(1/α) / (2 r ln(r / ln(1/α)))``).
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import special, stats

from audit.bounds._search import sup_rejected
from audit.bounds._validate import check_alpha, check_count, check_counts_le, check_delta
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.guesses import best_guess_pair

__all__ = ["one_run_pvalue", "epsilon_one_run", "epsilon_one_run_from_scores", "one_run_epsilon_bounds",
           "k_grids"]

_TOL = 1e-7
_CHUNK_ELEMENTS = 1 << 21


def _pvalues(m: int, r: np.ndarray, v: np.ndarray, eps: np.ndarray, delta: float) -> np.ndarray:
    """Vectorised p-values (arrays of equal shape (P,); no validation)."""
    q = special.expit(eps)
    beta = stats.binom.sf(v - 1, r, q)
    if delta == 0.0:
        return np.minimum(beta, 1.0)
    alpha_star = np.zeros(v.shape)
    j_max = int(v.max(initial=0))
    j = np.arange(j_max)
    step = max(1, _CHUNK_ELEMENTS // max(j_max, 1))  # bound the (pairs × v) matrix
    for lo in range(0, v.size, step):
        sl = slice(lo, lo + step)
        u = v[sl, None] - 1 - j[None, :]  # v-1, v-2, ..., v-J  (i = j + 1)
        valid = u >= 0
        pmf = np.where(valid, stats.binom.pmf(np.maximum(u, 0), r[sl, None], q[sl, None]), 0.0)
        ratios = np.cumsum(pmf, axis=1) / (j + 1)[None, :]
        alpha_star[sl] = np.max(np.where(valid, ratios, 0.0), axis=1, initial=0.0)
    return np.minimum(beta + 2.0 * m * delta * alpha_star, 1.0)


def one_run_pvalue(
    *, m: int, r: int | np.ndarray, v: int | np.ndarray, epsilon: float | np.ndarray, delta: float
) -> float | np.ndarray:
    """p-value of observing ``>= v`` correct out of ``r`` guesses under an (ε, δ)-DP claim.

    ``p = min(1, P[Bin(r, q) >= v] + 2 m δ α*)`` with ``q = e^ε/(1+e^ε)`` and
    ``α* = max_{1<=i<=v} P[v-i <= Bin(r, q) <= v-1] / i`` (Steinke, Nasr, Jagielski 2023). ``r``, ``v`` and
    ``epsilon`` broadcast against each other.

    Args:
        m: Number of canaries, >= 1.
        r: Guesses made, in [1, m].
        v: Correct guesses, in [0, r].
        epsilon: Claimed ε, >= 0.
        delta: Claimed δ, in [0, 1).

    Returns:
        The p-value(s); a float when every argument is a scalar.

    Raises:
        ValueError: If ``r`` is outside [1, m], ``v`` outside [0, r], ``epsilon`` negative or δ outside [0, 1).

    >>> round(one_run_pvalue(m=1000, r=100, v=100, epsilon=2.0, delta=0.0), 6)  # = expit(2) ** 100
    3e-06
    >>> one_run_pvalue(m=1000, r=100, v=60, epsilon=1.0, delta=1e-5) > one_run_pvalue(
    ...     m=1000, r=100, v=60, epsilon=1.0, delta=0.0)
    True
    """
    m = check_count(m, "m", minimum=1)
    delta = check_delta(delta)
    r_a, v_a, e_a = np.broadcast_arrays(np.asarray(r), np.asarray(v), np.asarray(epsilon, dtype=np.float64))
    _check_rv_arrays(m, r_a, v_a)
    if np.any(~(e_a >= 0.0)):
        raise ValueError(f"epsilon must be in [0, inf], got {float(e_a[~(e_a >= 0.0)].reshape(-1)[0])}")
    shape = r_a.shape
    p = _pvalues(m, r_a.reshape(-1).astype(np.int64), v_a.reshape(-1).astype(np.int64), e_a.reshape(-1), delta)
    return float(p[0]) if shape == () else p.reshape(shape)


def one_run_epsilon_bounds(m: int, r: np.ndarray, v: np.ndarray, delta: float, alpha: float) -> np.ndarray:
    """Vectorised ε_lb = sup{ε : p(ε) <= alpha} for arrays ``r``, ``v`` (no validation; bisection to 1e-7).

    The search terminates because ``expit(ε)`` rounds to 1 by ε ≈ 40, where the p-value is 1.
    """
    r = np.asarray(r, dtype=np.int64).reshape(-1)
    v = np.asarray(v, dtype=np.int64).reshape(-1)

    def rejects(i: np.ndarray, eps: np.ndarray) -> np.ndarray:
        return _pvalues(m, r[i], v[i], eps, delta) <= alpha

    return sup_rejected(rejects, r.size, tol=_TOL, points=1)


def epsilon_one_run(*, m: int, r: int, v: int, delta: float, alpha: float) -> EpsilonEstimate:
    """Largest ε rejected at level α by the one-run test with ``v`` of ``r`` guesses correct.

    ε_lb = sup{ε : p(ε) <= α} with ``p`` from :func:`one_run_pvalue` (bisection, tolerance 1e-7, always
    returning a point whose p-value is <= α). The ceiling is the same at ``v = r``.

    Args:
        m: Number of canaries, >= 1 (enters only the δ term).
        r: Guesses made, in [1, m].
        v: Correct guesses, in [0, r].
        delta: δ of the claim, in [0, 1).
        alpha: Significance level in (0, 1).

    Returns:
        An :class:`EpsilonEstimate` with ``method="one_run"`` and counts ``m``, ``r``, ``v``.

    Raises:
        ValueError: On counts out of range (e.g. ``v > r`` or ``r > m``), α outside (0, 1) or δ outside [0, 1).

    >>> est = epsilon_one_run(m=1000, r=1000, v=1000, delta=0.0, alpha=0.05)
    >>> round(est.epsilon_lb, 4), round(float(-np.log(20 ** (1 / 1000) - 1)), 4)  # exact ceiling at δ = 0
    (5.8091, 5.8091)
    """
    m = check_count(m, "m", minimum=1)
    r = check_count(r, "r", minimum=1)
    v = check_count(v, "v")
    check_counts_le(r, "r", m, "m", minimum=1)
    check_counts_le(v, "v", r, "r")
    delta = check_delta(delta)
    alpha = check_alpha(alpha)
    eps, ceiling = one_run_epsilon_bounds(m, np.array([r, r]), np.array([v, r]), delta, alpha)
    return EpsilonEstimate(method="one_run", epsilon_lb=float(eps), alpha=alpha, delta=delta,
                           counts={"m": m, "r": r, "v": v}, ceiling=float(max(ceiling, eps)),
                           extra={"pvalue_at_lb": float(_pvalues(m, np.array([r]), np.array([v]),
                                                                 np.array([eps]), delta)[0])})


def epsilon_one_run_from_scores(
    *,
    scores: object,
    included: object,
    delta: float,
    alpha: float,
    k_pos_grid: object,
    k_neg_grid: object,
    rng: np.random.Generator | int | None = None,
) -> EpsilonEstimate:
    """One-run ε lower bound from canary scores, searching ``(k_pos, k_neg)`` with the search accounted for.

    Every pair of ``k_pos_grid × k_neg_grid`` (after dropping duplicates) is tested at ``alpha / n_pairs``
    (Bonferroni), so the best of them is a lower bound at confidence ``1 - alpha``. The reported counts are those
    of the best pair (ties: the more precise pair, then the first); the ceiling is the largest ε any pair could
    give with all its guesses correct, at the same per-pair α.

    Args:
        scores: One score per canary, shape (m,); higher = member.
        included: Membership of each canary, bool shape (m,) (drawn independently with probability 1/2).
        delta: δ of the claim, in [0, 1).
        alpha: Overall significance level in (0, 1).
        k_pos_grid: Numbers of top-scored canaries to guess IN.
        k_neg_grid: Numbers of bottom-scored canaries to guess OUT.
        rng: Seed or generator for breaking score ties.

    Returns:
        An :class:`EpsilonEstimate` (``method="one_run"``) with counts ``m, k_pos, k_neg, r, v, v_pos, v_neg,
        n_pairs`` and ``extra["alpha_per_pair"]``.

    Raises:
        ValueError: On mismatched shapes, a grid pair with ``k_pos + k_neg`` outside [1, m], or α/δ out of range.

    >>> inc = np.arange(200) % 2 == 0
    >>> est = epsilon_one_run_from_scores(scores=inc.astype(float), included=inc, delta=0.0, alpha=0.05,
    ...                                   k_pos_grid=[50, 100], k_neg_grid=[0, 100], rng=0)
    >>> est.counts["r"], est.counts["v"], est.extra["alpha_per_pair"]
    (200, 200, 0.0125)
    """
    delta = check_delta(delta)
    alpha = check_alpha(alpha)
    g = best_guess_pair(scores=scores, included=included, k_pos_grid=k_pos_grid, k_neg_grid=k_neg_grid, rng=rng,
                        alpha=alpha, bounds=lambda m, r, v, a: one_run_epsilon_bounds(m, r, v, delta, a),
                        ceilings=lambda m, r, a: _ceilings(m, r, delta, a))
    return EpsilonEstimate(method="one_run", epsilon_lb=g.value, alpha=alpha, delta=delta, counts=g.counts,
                           ceiling=max(g.ceiling, g.value), extra=g.extra)


@functools.lru_cache(maxsize=128)
def _ceilings(m: int, r: tuple[int, ...], delta: float, alpha: float) -> tuple[float, ...]:
    """ε_lb with every guess correct (v = r); depends only on the totals, so repeated audits reuse it."""
    return tuple(one_run_epsilon_bounds(m, np.array(r), np.array(r), delta, alpha).tolist())


def _check_rv_arrays(m: int, r: np.ndarray, v: np.ndarray) -> None:
    for name, arr in (("r", r), ("v", v)):
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"{name} must be an integer or integer array, got dtype {arr.dtype}")
    if np.any((r < 1) | (r > m)):
        raise ValueError(f"r must be in [1, m={m}], got {int(r[(r < 1) | (r > m)].reshape(-1)[0])}")
    if np.any((v < 0) | (v > r)):
        i = np.flatnonzero(((v < 0) | (v > r)).reshape(-1))[0]
        raise ValueError(f"v must be in [0, r={int(r.reshape(-1)[i])}], got {int(v.reshape(-1)[i])}")


def k_grids(m: int, *, points: int, guesses: str) -> tuple[np.ndarray, np.ndarray]:
    """The one-run guess grid: ``points`` geometric values of k from min(10, m/2) to m/2.

    ``guesses="in"`` pairs them with ``k_neg = 0``; ``"in_out"`` crosses them with themselves (r <= m always).

    >>> kp, kn = k_grids(1000, points=4, guesses="in")
    >>> kp.tolist(), kn.tolist()
    ([10, 37, 136, 500], [0])
    """
    if m < 2:
        raise ValueError(f"m must be >= 2 canaries, got {m}")
    top = m // 2
    ks = np.unique(np.round(np.geomspace(min(10, top), top, points)).astype(np.int64))
    return (ks, ks) if guesses == "in_out" else (ks, np.zeros(1, dtype=np.int64))
