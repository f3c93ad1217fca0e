"""Gaussian differential privacy (GDP) lower bounds and the μ ↔ (ε, δ) conversion.

Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini, Terzis, "Tight Auditing of Differentially Private
Machine Learning" (USENIX Security 2023) audit DP-SGD in the f-DP framework of Dong, Roth, Su, "Gaussian
Differential Privacy" (JRSS-B 2022). A mechanism is μ-GDP when every test's errors satisfy
``FNR >= Φ(Φ⁻¹(1 - FPR) - μ)``, i.e. ``μ >= Φ⁻¹(1 - FPR) - Φ⁻¹(FNR)``. The right side decreases in both rates,
so Clopper–Pearson upper bounds (each at ``alpha / 2``) give a lower confidence bound

    μ_lb = max(0, Φ⁻¹(1 - FPR_ub) - Φ⁻¹(FNR_ub)).

(The swapped inequality gives the same value because the Gaussian trade-off curve is symmetric.) μ_lb holds for
any mechanism; turning it into ε at δ assumes the mechanism's trade-off curve is Gaussian, through
(Dong–Roth–Su, Corollary 2.13)

    δ(ε) = Φ(-ε/μ + μ/2) - e^ε · Φ(-ε/μ - μ/2),

which decreases in ε and increases in μ; :func:`eps_from_mu` and :func:`mu_from_eps` invert it by bisection.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from audit.bounds._validate import (check_alpha, check_delta, check_nonnegative, check_rate_counts,
                                    check_rate_test)
from audit.bounds.clopper_pearson import cp_rate_bounds, rate_counts
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.thresholds import ThresholdStrategy, estimate_at_chosen_threshold

__all__ = ["gdp_delta", "eps_from_mu", "mu_from_eps", "gdp_mu_bound", "gdp_mu_lower_bound", "epsilon_gdp",
           "epsilon_from_scores_gdp", "GAUSSIAN_ASSUMPTION"]

GAUSSIAN_ASSUMPTION = "Gaussian trade-off curve"
_MAX_ITER = 200


def _log_gdp_delta(eps: float, mu: float) -> float:
    """``ln δ(ε)`` for μ-GDP, computed in the log domain (μ > 0, ε >= 0 finite)."""
    log_a = float(special.log_ndtr(-eps / mu + mu / 2))
    log_b = float(special.log_ndtr(-eps / mu - mu / 2))
    gap = min(eps + log_b - log_a, -1e-300)  # < 0 mathematically; guard rounding
    return log_a + math.log1p(-math.exp(gap)) if gap > -700 else log_a


def gdp_delta(*, mu: float, eps: float) -> float:
    """δ(ε) of a μ-GDP mechanism: ``Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2)`` (Dong, Roth, Su 2022, Cor. 2.13).

    Args:
        mu: GDP parameter, >= 0 (finite).
        eps: ε, >= 0 (finite).

    Returns:
        The smallest δ such that μ-GDP implies (ε, δ)-DP (0 when ``mu == 0``).

    Raises:
        ValueError: If ``mu`` or ``eps`` is negative, NaN or infinite.

    >>> round(gdp_delta(mu=1.0, eps=0.0), 6)  # = 2 Φ(1/2) - 1
    0.382925
    """
    mu = check_nonnegative(mu, "mu")
    eps = check_nonnegative(eps, "eps")
    return 0.0 if mu == 0.0 else math.exp(_log_gdp_delta(eps, mu))


def eps_from_mu(*, mu: float, delta: float) -> float:
    """Smallest ε with μ-GDP ⇒ (ε, δ)-DP: the root of ``δ(ε) = delta`` (bisection, relative tolerance 1e-12).

    Args:
        mu: GDP parameter in [0, inf]; ``inf`` gives ``inf``.
        delta: Target δ in [0, 1); ``delta = 0`` gives ``inf`` for any ``mu > 0``.

    Returns:
        ε >= 0 (0 when ``delta >= δ(0) = 2Φ(μ/2) - 1``).

    Raises:
        ValueError: If ``mu`` is negative or NaN, or ``delta`` is outside [0, 1).

    >>> eps_from_mu(mu=0.0, delta=1e-5)
    0.0
    >>> round(eps_from_mu(mu=1.0, delta=1e-5), 4)
    4.3772
    """
    mu = check_nonnegative(mu, "mu", allow_inf=True)
    delta = check_delta(delta)
    if mu == 0.0:
        return 0.0
    if math.isinf(mu) or delta == 0.0:
        return math.inf
    log_target = math.log(delta)
    if _log_gdp_delta(0.0, mu) <= log_target:
        return 0.0
    lo, hi = 0.0, max(1.0, mu * mu)
    while _log_gdp_delta(hi, mu) > log_target:
        lo, hi = hi, 2.0 * hi
    return _bisect(lambda e: _log_gdp_delta(e, mu) > log_target, lo, hi)


def mu_from_eps(*, eps: float, delta: float) -> float:
    """Largest μ with μ-GDP ⇒ (ε, δ)-DP: the root in μ of ``δ_μ(eps) = delta`` (bisection).

    Args:
        eps: ε in [0, inf]; ``inf`` gives ``inf``.
        delta: δ in [0, 1); ``delta = 0`` gives 0 for finite ``eps`` (no μ > 0 is (ε, 0)-DP).

    Returns:
        μ >= 0.

    Raises:
        ValueError: If ``eps`` is negative or NaN, or ``delta`` is outside [0, 1).

    >>> mu = mu_from_eps(eps=2.0, delta=1e-5)
    >>> round(eps_from_mu(mu=mu, delta=1e-5), 8)
    2.0
    """
    eps = check_nonnegative(eps, "eps", allow_inf=True)
    delta = check_delta(delta)
    if math.isinf(eps):
        return math.inf
    if delta == 0.0:
        return 0.0
    log_target = math.log(delta)
    lo, hi = 0.0, 1.0
    while _log_gdp_delta(eps, hi) < log_target:
        lo, hi = hi, 2.0 * hi
    return _bisect(lambda m: m == 0.0 or _log_gdp_delta(eps, m) <= log_target, lo, hi)


def _bisect(keep_lo: object, lo: float, hi: float) -> float:
    """Bisection on [lo, hi] where ``keep_lo(x)`` is True left of the root; returns the root's left end."""
    for _ in range(_MAX_ITER):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi) or hi - lo <= 1e-12 * max(1.0, hi):
            break
        if keep_lo(mid):  # type: ignore[operator]
            lo = mid
        else:
            hi = mid
    return lo


def gdp_mu_bound(fp: np.ndarray, n_neg: int, fn: np.ndarray, n_pos: int, alpha: float) -> np.ndarray:
    """Vectorised ``μ_lb = max(0, Φ⁻¹(1 - FPR_ub) - Φ⁻¹(FNR_ub))`` (no validation; CP bounds at ``alpha/2``)."""
    fpr_ub, fnr_ub = cp_rate_bounds(fp, n_neg, fn, n_pos, alpha)
    return np.maximum(-special.ndtri(fpr_ub) - special.ndtri(fnr_ub), 0.0)


def gdp_mu_lower_bound(*, fp: int, n_neg: int, fn: int, n_pos: int, alpha: float) -> float:
    """Lower confidence bound on μ from one fixed-threshold test (Nasr et al. 2023).

    ``μ_lb = max(0, Φ⁻¹(1 - FPR_ub) - Φ⁻¹(FNR_ub))`` with Clopper–Pearson upper bounds at ``alpha / 2`` each.

    Args:
        fp: Non-members called members, in [0, n_neg].
        n_neg: Non-member trials, >= 1.
        fn: Members called non-members, in [0, n_pos].
        n_pos: Member trials, >= 1.
        alpha: Significance level in (0, 1).

    Returns:
        μ_lb >= 0, valid with probability ``1 - alpha``.

    Raises:
        ValueError: On counts out of range or ``alpha`` outside (0, 1).

    >>> round(gdp_mu_lower_bound(fp=0, n_neg=1000, fn=0, n_pos=1000, alpha=0.05), 3)
    5.36
    """
    fp, n_neg, fn, n_pos = check_rate_counts(fp=fp, n_neg=n_neg, fn=fn, n_pos=n_pos)
    alpha = check_alpha(alpha)
    return float(gdp_mu_bound(np.array(fp), n_neg, np.array(fn), n_pos, alpha))


def epsilon_gdp(*, fp: int, n_neg: int, fn: int, n_pos: int, delta: float, alpha: float) -> EpsilonEstimate:
    """ε lower bound at δ through GDP: ``ε_lb = eps_from_mu(μ_lb, δ)`` (Nasr et al. 2023).

    Valid at confidence ``1 - alpha`` *assuming the mechanism's trade-off curve is Gaussian* (μ_lb itself needs no
    such assumption); the estimate is labelled ``assumptions="Gaussian trade-off curve"``. The ceiling is the
    same computation at ``fp = fn = 0``.

    Args:
        fp: Non-members called members, in [0, n_neg].
        n_neg: Non-member trials, >= 1.
        fn: Members called non-members, in [0, n_pos].
        n_pos: Member trials, >= 1.
        delta: δ of the claim, in (0, 1) (at δ = 0 every μ > 0 maps to ε = inf).
        alpha: Significance level in (0, 1).

    Returns:
        An :class:`EpsilonEstimate` with ``method="gdp"``; ``extra`` holds ``mu_lb``, ``mu_ceiling``, ``fpr_ub``
        and ``fnr_ub``.

    Raises:
        ValueError: On counts out of range, ``alpha`` outside (0, 1) or ``delta`` outside (0, 1).

    >>> est = epsilon_gdp(fp=10, n_neg=1000, fn=500, n_pos=1000, delta=1e-5, alpha=0.05)
    >>> round(est.extra["mu_lb"], 3), round(est.epsilon_lb, 3)
    (2.011, 10.065)
    """
    return _estimate(**check_rate_test(fp=fp, n_neg=n_neg, fn=fn, n_pos=n_pos, delta=delta, alpha=alpha,
                                       positive_delta=True), extra={})


def epsilon_from_scores_gdp(
    *,
    scores_in: object,
    scores_out: object,
    delta: float,
    alpha: float,
    threshold_strategy: ThresholdStrategy,
) -> EpsilonEstimate:
    """GDP ε lower bound from member / non-member scores, with the threshold choice accounted for.

    The threshold maximising μ_lb is chosen by ``threshold_strategy`` (held-out split, or the best of a fixed
    grid at ``alpha / len(grid)``); see :func:`epsilon_gdp` for the bound and its assumption.

    Args:
        scores_in: Scores of member trials (higher = member).
        scores_out: Scores of non-member trials.
        delta: δ of the claim, in (0, 1).
        alpha: Overall significance level in (0, 1).
        threshold_strategy: :class:`~audit.bounds.thresholds.HeldOut` or
            :class:`~audit.bounds.thresholds.Bonferroni`.

    Returns:
        An :class:`EpsilonEstimate` (``method="gdp"``) with the threshold and per-test α in ``extra``.

    Raises:
        ValueError: On empty or non-finite scores, or α/δ out of range.
    """
    delta = check_delta(delta, positive=True)
    return estimate_at_chosen_threshold(scores_in=scores_in, scores_out=scores_out, alpha=alpha,
                                        strategy=threshold_strategy, bound=gdp_mu_bound,
                                        estimate=functools.partial(_estimate, delta=delta))


def _estimate(*, fp: int, n_neg: int, fn: int, n_pos: int, delta: float, alpha: float,
              extra: dict[str, object]) -> EpsilonEstimate:
    fpr_ub, fnr_ub = (float(b) for b in cp_rate_bounds(fp, n_neg, fn, n_pos, alpha))
    mu_lb = float(gdp_mu_bound(np.array(fp), n_neg, np.array(fn), n_pos, alpha))
    mu_ceiling = float(gdp_mu_bound(np.array(0), n_neg, np.array(0), n_pos, alpha))
    eps = eps_from_mu(mu=mu_lb, delta=delta)
    return EpsilonEstimate(method="gdp", epsilon_lb=eps, alpha=alpha, delta=delta,
                           counts=rate_counts(fp=fp, n_neg=n_neg, fn=fn, n_pos=n_pos),
                           ceiling=max(eps_from_mu(mu=mu_ceiling, delta=delta), eps), assumptions=GAUSSIAN_ASSUMPTION,
                           extra={"mu_lb": mu_lb, "mu_ceiling": mu_ceiling, "fpr_ub": fpr_ub, "fnr_ub": fnr_ub,
                                  **extra})
