"""Clopper–Pearson ε lower bounds from false-positive and false-negative counts.

Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning: How Private is Private SGD?"
(NeurIPS 2020). Any test that decides "member" vs "non-member" of an (ε, δ)-DP mechanism satisfies

    1 - FNR <= e^ε · FPR + δ      and      1 - FPR <= e^ε · FNR + δ,

so with one-sided Clopper–Pearson upper bounds FPR_ub and FNR_ub, each at confidence ``1 - alpha/2`` (so both
hold together with probability ``1 - alpha``),

    ε_lb = max(0, ln((1 - δ - FPR_ub) / FNR_ub), ln((1 - δ - FNR_ub) / FPR_ub)),

where a term with a non-positive numerator is dropped. Positives are members; the attack says "member" when
``score >= threshold`` (higher score = member); ``fp`` counts non-members called members, ``fn`` members called
non-members.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

from audit.bounds._validate import check_alpha, check_count, check_delta, check_rate_test
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.thresholds import ThresholdStrategy, estimate_at_chosen_threshold

__all__ = [
    "clopper_pearson_upper",
    "clopper_pearson_lower",
    "clopper_pearson_interval",
    "epsilon_clopper_pearson",
    "epsilon_from_scores_cp",
    "cp_epsilon_bound",
    "cp_rate_bounds",
    "rate_counts",
]


def clopper_pearson_upper(*, k: int | np.ndarray, n: int, alpha: float) -> float | np.ndarray:
    """One-sided Clopper–Pearson upper bound on a binomial rate at confidence ``1 - alpha``.

    ``p_ub = Beta.quantile(1 - alpha; k + 1, n - k)`` for ``k < n`` and 1 for ``k = n``: the largest ``p`` with
    ``P[Bin(n, p) <= k] >= alpha``.

    Args:
        k: Observed successes (scalar or array), each in [0, n].
        n: Number of trials, >= 1.
        alpha: Significance level in (0, 1).

    Returns:
        The upper bound(s), a float for scalar ``k``.

    Raises:
        ValueError: If ``n < 1``, some ``k`` is outside [0, n], or ``alpha`` is outside (0, 1).

    >>> round(clopper_pearson_upper(k=0, n=100, alpha=0.05), 5)  # = 1 - 0.05 ** (1 / 100)
    0.02951
    """
    n = check_count(n, "n", minimum=1)
    alpha = check_alpha(alpha)
    k_arr = _check_k(k, n)
    safe_b = np.maximum(n - k_arr, 1)
    ub = np.where(k_arr < n, stats.beta.isf(alpha, k_arr + 1, safe_b), 1.0)
    return float(ub) if ub.ndim == 0 else ub


def clopper_pearson_lower(*, k: int | np.ndarray, n: int, alpha: float) -> float | np.ndarray:
    """One-sided Clopper–Pearson lower bound at confidence ``1 - alpha``: ``Beta.quantile(alpha; k, n - k + 1)``.

    Args:
        k: Observed successes (scalar or array), each in [0, n].
        n: Number of trials, >= 1.
        alpha: Significance level in (0, 1).

    Returns:
        The lower bound(s) (0 where ``k = 0``), a float for scalar ``k``.

    Raises:
        ValueError: If ``n < 1``, some ``k`` is outside [0, n], or ``alpha`` is outside (0, 1).

    >>> round(clopper_pearson_lower(k=100, n=100, alpha=0.05), 5)  # = 0.05 ** (1 / 100)
    0.97049
    """
    n = check_count(n, "n", minimum=1)
    alpha = check_alpha(alpha)
    k_arr = _check_k(k, n)
    lb = np.where(k_arr > 0, stats.beta.ppf(alpha, np.maximum(k_arr, 1), n - k_arr + 1), 0.0)
    return float(lb) if lb.ndim == 0 else lb


def clopper_pearson_interval(*, k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval with coverage ``1 - alpha`` (``alpha/2`` in each tail).

    Args:
        k: Observed successes, in [0, n].
        n: Number of trials, >= 1.
        alpha: Significance level in (0, 1).

    Returns:
        ``(lower, upper)``.

    Raises:
        ValueError: If ``n < 1``, ``k`` is outside [0, n], or ``alpha`` is outside (0, 1).

    >>> lo, hi = clopper_pearson_interval(k=5, n=10, alpha=0.05)
    >>> round(lo, 4), round(hi, 4)
    (0.1871, 0.8129)
    """
    k = check_count(k, "k")
    alpha = check_alpha(alpha)
    return (float(clopper_pearson_lower(k=k, n=n, alpha=alpha / 2)),
            float(clopper_pearson_upper(k=k, n=n, alpha=alpha / 2)))


def cp_rate_bounds(fp: object, n_neg: int, fn: object, n_pos: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """``(FPR_ub, FNR_ub)`` of a fixed-threshold test: one-sided Clopper–Pearson upper bounds at ``alpha / 2``
    each, so both hold together with probability ``1 - alpha`` (vectorised over counts; no validation).

    >>> [round(float(b), 5) for b in cp_rate_bounds(0, 100, 0, 100, 0.1)]  # = 1 - 0.05 ** (1 / 100)
    [0.02951, 0.02951]
    """
    return (np.asarray(clopper_pearson_upper(k=np.asarray(fp), n=n_neg, alpha=alpha / 2)),
            np.asarray(clopper_pearson_upper(k=np.asarray(fn), n=n_pos, alpha=alpha / 2)))


def rate_counts(*, fp: int, n_neg: int, fn: int, n_pos: int) -> dict[str, int]:
    """The ``counts`` an estimate from one fixed-threshold test records (``tn`` and ``tp`` added).

    >>> rate_counts(fp=1, n_neg=10, fn=2, n_pos=10)
    {'fp': 1, 'tn': 9, 'n_neg': 10, 'fn': 2, 'tp': 8, 'n_pos': 10}
    """
    return {"fp": fp, "tn": n_neg - fp, "n_neg": n_neg, "fn": fn, "tp": n_pos - fn, "n_pos": n_pos}


def cp_epsilon_bound(
    fp: np.ndarray, n_neg: int, fn: np.ndarray, n_pos: int, alpha: float, *, delta: float
) -> np.ndarray:
    """Vectorised ε_lb over arrays of counts (no validation; see :func:`epsilon_clopper_pearson`)."""
    fpr_ub, fnr_ub = cp_rate_bounds(fp, n_neg, fn, n_pos, alpha)
    return np.maximum(_log_ratio(1.0 - delta - fpr_ub, fnr_ub), _log_ratio(1.0 - delta - fnr_ub, fpr_ub)).clip(0.0)


def epsilon_clopper_pearson(
    *, fp: int, n_neg: int, fn: int, n_pos: int, delta: float, alpha: float
) -> EpsilonEstimate:
    """ε lower bound from the counts of one fixed-threshold test (Jagielski et al. 2020).

    ``ε_lb = max(0, ln((1 - δ - FPR_ub) / FNR_ub), ln((1 - δ - FNR_ub) / FPR_ub))`` with Clopper–Pearson upper
    bounds FPR_ub = CP_ub(fp, n_neg) and FNR_ub = CP_ub(fn, n_pos), each at ``alpha / 2``. The ceiling is the same
    formula at ``fp = fn = 0``: ``FPR_ub = 1 - (alpha/2) ** (1 / n_neg)``.

    The counts must come from a threshold fixed independently of them (see :mod:`audit.bounds.thresholds`).

    Args:
        fp: Non-members the test called members, in [0, n_neg].
        n_neg: Non-member trials, >= 1.
        fn: Members the test called non-members, in [0, n_pos].
        n_pos: Member trials, >= 1.
        delta: δ of the claim, in [0, 1).
        alpha: Significance level in (0, 1); the bound holds with probability ``1 - alpha``.

    Returns:
        An :class:`EpsilonEstimate` with ``method="clopper_pearson"``; ``extra`` holds ``fpr_ub``, ``fnr_ub``
        and ``direction`` (which inequality gave the bound, or ``"none"``).

    Raises:
        ValueError: On a count outside its range, ``alpha`` outside (0, 1) or ``delta`` outside [0, 1).

    >>> est = epsilon_clopper_pearson(fp=0, n_neg=1000, fn=0, n_pos=1000, delta=0.0, alpha=0.05)
    >>> round(est.epsilon_lb, 3), est.epsilon_lb == est.ceiling
    (5.601, True)
    """
    return _estimate(**check_rate_test(fp=fp, n_neg=n_neg, fn=fn, n_pos=n_pos, delta=delta, alpha=alpha), extra={})


def epsilon_from_scores_cp(
    *,
    scores_in: object,
    scores_out: object,
    delta: float,
    alpha: float,
    threshold_strategy: ThresholdStrategy,
) -> EpsilonEstimate:
    """Clopper–Pearson ε lower bound from member / non-member scores, with the threshold choice accounted for.

    Each score is one trial (e.g. the canary's score in one model trained with it, or without it). The
    threshold comes from ``threshold_strategy``: :class:`~audit.bounds.thresholds.HeldOut` (choose on one part,
    bound on the other, at ``alpha``) or :class:`~audit.bounds.thresholds.Bonferroni` (best of a fixed grid, each
    at ``alpha / len(grid)``). The ceiling uses the evaluation totals and the same per-test α.

    Args:
        scores_in: Scores of member trials (higher = member).
        scores_out: Scores of non-member trials.
        delta: δ of the claim, in [0, 1).
        alpha: Overall significance level in (0, 1).
        threshold_strategy: How the threshold is chosen.

    Returns:
        An :class:`EpsilonEstimate` (``method="clopper_pearson"``) whose ``extra`` records the threshold, the
        strategy, the number of thresholds tested and the per-test α.

    Raises:
        ValueError: On empty or non-finite scores, or α/δ out of range.

    >>> from audit.bounds.thresholds import Bonferroni
    >>> est = epsilon_from_scores_cp(scores_in=np.full(500, 2.0), scores_out=np.zeros(500), delta=0.0,
    ...                              alpha=0.05, threshold_strategy=Bonferroni(grid=[1.0]))
    >>> est.counts["fp"], est.counts["fn"], round(est.epsilon_lb, 2)
    (0, 0, 4.91)
    """
    delta = check_delta(delta)
    return estimate_at_chosen_threshold(scores_in=scores_in, scores_out=scores_out, alpha=alpha,
                                        strategy=threshold_strategy, bound=functools.partial(cp_epsilon_bound,
                                                                                             delta=delta),
                                        estimate=functools.partial(_estimate, delta=delta))


def _estimate(*, fp: int, n_neg: int, fn: int, n_pos: int, delta: float, alpha: float,
              extra: dict[str, object]) -> EpsilonEstimate:
    fpr_ub, fnr_ub = (float(b) for b in cp_rate_bounds(fp, n_neg, fn, n_pos, alpha))
    by_tnr = float(_log_ratio(1.0 - delta - fpr_ub, fnr_ub))
    by_tpr = float(_log_ratio(1.0 - delta - fnr_ub, fpr_ub))
    eps = max(0.0, by_tnr, by_tpr)
    direction = "none" if eps == 0.0 else ("tpr_fpr" if by_tpr >= by_tnr else "tnr_fnr")
    ceiling = float(cp_epsilon_bound(np.array([0]), n_neg, np.array([0]), n_pos, alpha, delta=delta)[0])
    return EpsilonEstimate(method="clopper_pearson", epsilon_lb=eps, alpha=alpha, delta=delta,
                           counts=rate_counts(fp=fp, n_neg=n_neg, fn=fn, n_pos=n_pos), ceiling=max(ceiling, eps),
                           extra={"fpr_ub": fpr_ub, "fnr_ub": fnr_ub, "direction": direction, **extra})


def _log_ratio(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
    """``ln(num / den)`` where ``num > 0``, ``-inf`` elsewhere (den > 0 always: CP upper bounds are positive)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(num > 0.0, np.log(np.where(num > 0.0, num, 1.0)) - np.log(den), -math.inf)


def _check_k(k: int | np.ndarray, n: int) -> np.ndarray:
    k_arr = np.asarray(k)
    if k_arr.dtype == bool or not np.issubdtype(k_arr.dtype, np.integer):
        raise TypeError(f"k must be an integer or integer array, got dtype {k_arr.dtype}")
    if np.any(k_arr < 0) or np.any(k_arr > n):
        bad = k_arr[(k_arr < 0) | (k_arr > n)].reshape(-1)[0]
        raise ValueError(f"k must be in [0, n={n}], got {int(bad)}")
    return k_arr.astype(np.int64)
