"""One-run audit against a Gaussian trade-off curve (Mahloujifar, Melis, Chaudhuri 2024).

Mahloujifar, Melis, Chaudhuri, "Auditing f-Differential Privacy in One Run" (arXiv:2410.22235, ICML 2025). Same
game as :mod:`audit.bounds.one_run` (``m`` canaries included independently w.p. 1/2, ``r`` guesses, ``v``
correct), but the null hypothesis is a whole trade-off curve ``f`` instead of one (ε, δ) pair. Here ``f`` is the
Gaussian curve ``f_μ(x) = Φ(Φ⁻¹(1 - x) - μ)``; write ``f̄(x) = 1 - f(x) = Φ(Φ⁻¹(x) + μ)`` and
``b(y) = f̄⁻¹(y) = Φ(Φ⁻¹(y) - μ)``.

What is implemented (their recursive bound, with the running maximum and the cap at 1). Let ``C`` be the number of
correct guesses and, for ``i = 0..r``,

    R_i = E[C · 1{C >= i}] / m,        H_i = E[(r - C) · 1{C >= i}] / m.

Fix canary ``j`` and a guess side; the event "guess on j is correct and C >= i + 1" and the event "guess on j is
wrong and C >= i" are the *same* test on (output, other canaries) evaluated with canary j in vs out, so f-DP,
the symmetry of ``f_μ``, and concavity of ``f̄`` (averaging over canaries and over the other canaries) give

    R_{i+1} <= f̄(H_i),   i.e.   H_i >= b(R_{i+1}).

Outcomes with exactly ``C = i`` add ``i`` correct and ``r - i`` wrong guesses, so
``R_i - R_{i+1} = i / (r - i) · (H_i - H_{i+1})``, and ``R_0 + H_0 = r / m`` exactly. Suppose
``P[C >= v] >= α``. The configuration needing the least total probability puts mass α at exactly ``C = v``
(``R_v = α v / m``, ``H_v = α (r - v) / m``: any other placement has larger R and smaller H, which only
tightens the constraints; the constraints for ``i >= v`` are dropped, which only weakens the test) and then adds
at each lower level only the mass the constraint forces:

    H_i = max(H_{i+1}, b(R_{i+1})),    R_i = min(1, R_{i+1} + i / (r - i) · (H_i - H_{i+1})),   i = v-1, ..., 0.

(An exchange argument shows this greedy sequence is pointwise below every feasible one.) If
``R_0 + H_0 > r / m`` no μ-GDP mechanism can have ``P[C >= v] >= α``, so μ-GDP is rejected at level α. The test
is monotone in μ; :func:`mu_one_run_fdp` returns the supremum of rejected μ by a multi-point bisection (always
returning a rejected value) and :func:`epsilon_one_run_fdp` converts it to ε at δ with :func:`~audit.bounds.gdp.eps_from_mu`.
The result is labelled ``assumptions="Gaussian trade-off curve"``: it lower-bounds ε for mechanisms whose
trade-off curve is Gaussian; the rejection of μ-GDP itself holds for any mechanism.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy import special

from audit.bounds._search import sup_rejected
from audit.bounds._validate import check_alpha, check_count, check_counts_le, check_delta, check_nonnegative
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.gdp import GAUSSIAN_ASSUMPTION, eps_from_mu
from audit.bounds.guesses import best_guess_pair

__all__ = ["one_run_fdp_rejects", "mu_one_run_fdp", "epsilon_one_run_fdp", "epsilon_one_run_fdp_from_scores",
           "one_run_fdp_mu_bounds"]

_TOL = 1e-7


def _rejects(m: int, r: np.ndarray, v: np.ndarray, mu: np.ndarray, alpha: float) -> np.ndarray:
    """Vectorised recursive test; arrays of shape (P,); True where μ-GDP is rejected at level ``alpha``."""
    order = np.argsort(-v, kind="stable")  # pairs with larger v start earlier: the running ones form a prefix
    r_s, v_s = r[order], v[order]
    mu_s = np.broadcast_to(np.asarray(mu, dtype=np.float64), r.shape)[order]
    big_r = alpha * v_s / m
    big_h = alpha * (r_s - v_s) / m
    n_run = 0
    for i in range(int(v_s[0]) - 1 if v_s.size else -1, -1, -1):
        while n_run < v_s.size and v_s[n_run] > i:
            n_run += 1
        h_old = big_h[:n_run]
        h_new = np.maximum(h_old, special.ndtr(special.ndtri(big_r[:n_run]) - mu_s[:n_run]))
        grown = h_new - h_old
        big_r[:n_run] = np.minimum(big_r[:n_run] + grown * (i / (r_s[:n_run] - i)), 1.0)  # r - i >= 1 as i < v <= r
        big_h[:n_run] = h_new
        # A pair whose H stopped growing is at a fixed point (R stops too); stop when all pairs are.
        if n_run == v_s.size and not np.any(grown):
            break
    out = np.empty(r.shape, dtype=bool)
    out[order] = big_r + big_h > r_s / m
    return out


def one_run_fdp_mu_bounds(m: int, r: np.ndarray, v: np.ndarray, alpha: float) -> np.ndarray:
    """Vectorised μ_lb = sup{μ : rejected} for arrays ``r``, ``v`` (no validation; tolerance 1e-7).

    The search terminates: for large μ, ``b(y) -> 0`` and ``R_0 + H_0 -> α r / m <= r / m``.
    """
    r = np.asarray(r, dtype=np.int64).reshape(-1)
    v = np.asarray(v, dtype=np.int64).reshape(-1)

    def rejects(i: np.ndarray, mu: np.ndarray) -> np.ndarray:
        return _rejects(m, r[i], v[i], mu, alpha)

    # Each test runs a Python-level recursion of length v, so test many μ per pass (few passes).
    return sup_rejected(rejects, r.size, tol=_TOL, points=31)


@functools.lru_cache(maxsize=128)
def _mu_ceilings(m: int, r: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """μ_lb with every guess correct (v = r); depends only on the totals, so repeated audits reuse it."""
    return tuple(one_run_fdp_mu_bounds(m, np.array(r), np.array(r), alpha).tolist())


def _check_mrv(m: object, r: object, v: object) -> tuple[int, int, int]:
    m_i = check_count(m, "m", minimum=1)
    r_i = check_count(r, "r", minimum=1)
    v_i = check_count(v, "v")
    check_counts_le(r_i, "r", m_i, "m", minimum=1)
    check_counts_le(v_i, "v", r_i, "r")
    return m_i, r_i, v_i


def one_run_fdp_rejects(*, m: int, r: int, v: int, mu: float, alpha: float) -> bool:
    """Whether ``v`` correct out of ``r`` guesses on ``m`` canaries rejects μ-GDP at level α (recursive bound).

    To test an (ε, δ) claim as a Gaussian curve, pass ``mu=mu_from_eps(eps=..., delta=...)``.

    Args:
        m: Number of canaries, >= 1.
        r: Guesses made, in [1, m].
        v: Correct guesses, in [0, r].
        mu: Claimed GDP parameter, >= 0.
        alpha: Significance level in (0, 1).

    Returns:
        True when the observation is inconsistent with μ-GDP at level α.

    Raises:
        ValueError: On counts out of range, negative μ or α outside (0, 1).

    >>> one_run_fdp_rejects(m=1000, r=100, v=100, mu=1.0, alpha=0.05)
    True
    >>> one_run_fdp_rejects(m=1000, r=100, v=60, mu=1.0, alpha=0.05)
    False
    """
    m, r, v = _check_mrv(m, r, v)
    mu = check_nonnegative(mu, "mu")
    alpha = check_alpha(alpha)
    return bool(_rejects(m, np.array([r]), np.array([v]), np.array([mu]), alpha)[0])


def mu_one_run_fdp(*, m: int, r: int, v: int, alpha: float) -> float:
    """Lower confidence bound on μ: the supremum of μ rejected by :func:`one_run_fdp_rejects`.

    Args:
        m: Number of canaries, >= 1.
        r: Guesses made, in [1, m].
        v: Correct guesses, in [0, r].
        alpha: Significance level in (0, 1).

    Returns:
        μ_lb >= 0 (0 when even μ = 0 is not rejected).

    Raises:
        ValueError: On counts out of range or α outside (0, 1).

    >>> mu = mu_one_run_fdp(m=1000, r=100, v=100, alpha=0.05)
    >>> one_run_fdp_rejects(m=1000, r=100, v=100, mu=mu, alpha=0.05)
    True
    """
    m, r, v = _check_mrv(m, r, v)
    alpha = check_alpha(alpha)
    return float(one_run_fdp_mu_bounds(m, np.array([r]), np.array([v]), alpha)[0])


def epsilon_one_run_fdp(*, m: int, r: int, v: int, delta: float, alpha: float) -> EpsilonEstimate:
    """ε lower bound at δ from a one-run audit tested against Gaussian trade-off curves.

    ``ε_lb = eps_from_mu(μ_lb, δ)`` with ``μ_lb`` from :func:`mu_one_run_fdp`; the ceiling is the same at
    ``v = r``. Labelled ``assumptions="Gaussian trade-off curve"``.

    Args:
        m: Number of canaries, >= 1.
        r: Guesses made, in [1, m].
        v: Correct guesses, in [0, r].
        delta: δ of the claim, in (0, 1).
        alpha: Significance level in (0, 1).

    Returns:
        An :class:`EpsilonEstimate` with ``method="one_run_fdp"``; ``extra`` holds ``mu_lb`` and ``mu_ceiling``.

    Raises:
        ValueError: On counts out of range, α outside (0, 1) or δ outside (0, 1).

    >>> est = epsilon_one_run_fdp(m=1000, r=100, v=100, delta=1e-5, alpha=0.05)
    >>> est.epsilon_lb == est.ceiling, est.assumptions
    (True, 'Gaussian trade-off curve')
    """
    m, r, v = _check_mrv(m, r, v)
    delta = check_delta(delta, positive=True)
    alpha = check_alpha(alpha)
    mu_lb, mu_ceiling = one_run_fdp_mu_bounds(m, np.array([r, r]), np.array([v, r]), alpha)
    return _estimate(mu_lb=float(mu_lb), mu_ceiling=float(mu_ceiling), delta=delta, alpha=alpha,
                     counts={"m": m, "r": r, "v": v}, extra={})


def epsilon_one_run_fdp_from_scores(
    *,
    scores: object,
    included: object,
    delta: float,
    alpha: float,
    k_pos_grid: object,
    k_neg_grid: object,
    rng: np.random.Generator | int | None = None,
) -> EpsilonEstimate:
    """Gaussian-curve one-run ε lower bound from canary scores, over a ``(k_pos, k_neg)`` grid.

    Each grid pair is tested at ``alpha / n_pairs`` (Bonferroni) and the pair with the largest μ_lb is reported
    with its counts; see :func:`epsilon_one_run_fdp` and :func:`~audit.bounds.guesses.one_run_guess_counts`.

    Args:
        scores: One score per canary, shape (m,); higher = member.
        included: Membership of each canary, bool shape (m,).
        delta: δ of the claim, in (0, 1).
        alpha: Overall significance level in (0, 1).
        k_pos_grid: Numbers of top-scored canaries to guess IN.
        k_neg_grid: Numbers of bottom-scored canaries to guess OUT.
        rng: Seed or generator for breaking score ties.

    Returns:
        An :class:`EpsilonEstimate` (``method="one_run_fdp"``) with counts ``m, k_pos, k_neg, r, v, v_pos,
        v_neg, n_pairs`` and ``extra["alpha_per_pair"]``.

    Raises:
        ValueError: On mismatched shapes, a grid pair with ``k_pos + k_neg`` outside [1, m], or α/δ out of range.
    """
    delta = check_delta(delta, positive=True)
    alpha = check_alpha(alpha)
    g = best_guess_pair(scores=scores, included=included, k_pos_grid=k_pos_grid, k_neg_grid=k_neg_grid, rng=rng,
                        alpha=alpha, bounds=one_run_fdp_mu_bounds, ceilings=_mu_ceilings)
    return _estimate(mu_lb=g.value, mu_ceiling=g.ceiling, delta=delta, alpha=alpha, counts=g.counts, extra=g.extra)


def _estimate(*, mu_lb: float, mu_ceiling: float, delta: float, alpha: float, counts: dict[str, int],
              extra: dict[str, object]) -> EpsilonEstimate:
    eps = eps_from_mu(mu=mu_lb, delta=delta)
    return EpsilonEstimate(method="one_run_fdp", epsilon_lb=eps, alpha=alpha, delta=delta, counts=counts,
                           ceiling=max(eps_from_mu(mu=mu_ceiling, delta=delta), eps),
                           assumptions=GAUSSIAN_ASSUMPTION,
                           extra={"mu_lb": mu_lb, "mu_ceiling": max(mu_ceiling, mu_lb), **extra})
