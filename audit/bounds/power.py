"""Power of a one-run canary audit before it is run: which violations a kit of ``m`` canaries can detect.

The model is the mechanism the one-run theorem is tight for (Steinke, Nasr, Jagielski 2023, §6): each of the
``m`` canaries is included with probability 1/2 and the model reveals, per canary, a membership signal that is
right with probability ``a`` independently (randomised response; exactly ε_true-DP for
``a = e^ε_true / (1 + e^ε_true)``). A perfect attack ranks the canaries by that signal, and the audit guesses the
top ``k_pos`` IN and the bottom ``k_neg`` OUT for every pair of its grid, so a guess is right with probability
``a`` until a pair guesses more canaries than signal that way (:class:`_Pair`: with N1 ~ Bin(m, 1/2) signalling IN,
the excess is right with probability 1 - a). "The smallest detectable ε" of a kit for a claim ``c`` is

    ε_detect(c) = inf{ε_true : P[ε_lb(V) > c] >= power},   a = expit(ε_true),

where ``ε_lb`` is the estimator the audit runs (:func:`~audit.bounds.one_run.one_run_epsilon_bounds`, at the
per-pair level ``alpha / n_pairs`` of its (k_pos, k_neg) grid, :func:`~audit.bounds.one_run.k_grids`). For every
``r = k_pos + k_neg``, ``ε_lb(v)`` is non-decreasing in ``v``, so the event is ``V >= v*(r)`` (the fewest correct
guesses whose bound exceeds ``c``, by bisection over ``v`` with the estimator itself); for a pair below every
likely group size ``V ~ Bin(r, a)`` and ``P[V >= v*] = I_a(v*, r - v* + 1)`` (regularised incomplete beta) is
inverted in closed form, otherwise the mixture over N1 is bisected in ``a``. The audit reports the best pair of
the grid, at least any one pair's bound, so the best single-pair probability is a lower bound on the audit's
power and ε_detect an upper bound on the smallest ε it detects (conservative in both). tests/test_kit_power.py
checks both against Monte Carlo runs of the estimator.

A real attack is not perfect: with a *stated* accuracy ``a`` (say measured on a pilot model), :func:`kit_power`
gives the detection probability and the largest claim refuted with the given probability. A model that does not
memorise the canaries has ``a`` near 1/2 whatever its ε (results/reference/forged_claims_readme.md: small_cnn).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special, stats

from audit.bounds._validate import check_alpha, check_count, check_delta, check_nonnegative
from audit.bounds.one_run import k_grids, one_run_epsilon_bounds

__all__ = ["KitPower", "grid_pairs", "guess_totals", "min_correct", "detection_probability", "kit_power",
           "canaries_for_claim"]


@dataclasses.dataclass(frozen=True)
class KitPower:
    """What a kit of ``m`` canaries can show about a claim ``claim`` at level ``alpha`` (see the module notes).

    Attributes:
        m, claim, delta, alpha, power: the inputs (``power``: the detection probability asked for).
        ceiling: the largest ε_lb the audit can report (every guess correct, best pair); claims at or above it
            can never be refuted by this kit.
        epsilon_detectable: the smallest ε_true at which a perfect attack on an ε_true-DP mechanism refutes the
            claim with probability >= ``power`` (None when ``ceiling <= claim``).
        accuracy_needed: the guess accuracy that gives the same: ``expit(epsilon_detectable)``.
        guesses: the number of guesses ``r`` that achieves it.
        accuracy: the stated guess accuracy, or None.
        probability: with ``accuracy`` stated, the probability that the audit refutes the claim (lower bound).
        refutable_claim: with ``accuracy`` stated, the largest claim refuted with probability >= ``power``.
    """

    m: int
    claim: float
    delta: float
    alpha: float
    power: float
    ceiling: float
    epsilon_detectable: float | None
    accuracy_needed: float | None
    guesses: int | None
    accuracy: float | None = None
    probability: float | None = None
    refutable_claim: float | None = None

    def detects(self, factor: float) -> bool:
        """Whether a violation by ``factor`` (true ε = factor × claim) is detected with probability >= power."""
        return self.epsilon_detectable is not None and self.epsilon_detectable <= factor * self.claim

    def summary(self, *, remedy: str | None = None) -> str:
        """One line for the CLI; ``remedy``: what raises the ceiling when the claim cannot be refuted (default: a
        bigger auditor's kit)."""
        head = f"claim ε = {self.claim:g}: "
        if self.epsilon_detectable is None:
            remedy = remedy or f"use more canaries ('audit canaries make --claim {self.claim:g}' sizes a kit for it)"
            text = (head + f"cannot be refuted by {self.m} canaries at α = {self.alpha:g} (the most the audit can "
                    f"show is ε_lb {self.ceiling:.3f}); {remedy}")
        else:
            text = (head + f"refuted with probability >= {self.power:g} when the model's true ε >= "
                    f"{self.epsilon_detectable:.3f} ({self.epsilon_detectable / self.claim:.2f}x the claim: each "
                    f"canary's membership signal right with probability {100 * self.accuracy_needed:.1f}%, best "
                    f"guessing {self.guesses} of {self.m})" if self.claim > 0
                    else head + f"refuted when the true ε >= {self.epsilon_detectable:.3f}")
        if self.accuracy is not None:
            text += (f"; at {100 * self.accuracy:.1f}% accuracy: refuted with probability "
                     f"{self.probability:.2f}, claims up to ε = {self.refutable_claim:.3f} refuted with probability "
                     f">= {self.power:g}")
        return text


def grid_pairs(m: int, *, points: int = 4, guesses: str = "in_out",
               grid: tuple[object, object] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The audit's (k_pos, k_neg) pairs (:func:`~audit.bounds.one_run.k_grids`, or ``grid`` = (k_pos_grid,
    k_neg_grid) as an estimate records them), those with ``1 <= k_pos + k_neg <= m``."""
    kp, kn = k_grids(m, points=points, guesses=guesses) if grid is None else grid
    pairs = sorted({(int(a), int(b)) for a in kp for b in kn if 1 <= a + b <= m})
    return np.array([a for a, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.int64)


def guess_totals(m: int, *, points: int = 4, guesses: str = "in_out") -> tuple[np.ndarray, int]:
    """The distinct guess totals ``r = k_pos + k_neg`` of the audit's grid and its number of pairs (Bonferroni)."""
    kp, kn = grid_pairs(m, points=points, guesses=guesses)
    return np.unique(kp + kn), int(kp.size)


def min_correct(*, m: int, r: np.ndarray, claim: float, delta: float, alpha: float) -> np.ndarray:
    """For each ``r``, the fewest correct guesses whose one-run bound exceeds ``claim`` (``r + 1``: none does).

    Bisection over ``v`` on the estimator itself (:func:`one_run_epsilon_bounds`), vectorised over ``r``.
    """
    r = np.asarray(r, dtype=np.int64).reshape(-1)
    lo = np.full(r.shape, -1, dtype=np.int64)  # ε_lb(lo) <= claim (v = -1: sentinel)
    hi = r + 1  # ε_lb(hi) > claim (v = r + 1: sentinel)
    while np.any(hi - lo > 1):
        active = hi - lo > 1
        mid = (lo + hi) // 2
        eps = np.zeros(r.shape)
        eps[active] = one_run_epsilon_bounds(m, r[active], mid[active], delta, alpha)
        above = active & (eps > claim)
        hi = np.where(above, mid, hi)
        lo = np.where(active & ~above, mid, lo)
    return hi


class _Pair:
    """The number of correct guesses V of one (k_pos, k_neg) pair when each canary's signal is right w.p. ``a``.

    The audit guesses exactly ``k_pos`` IN and ``k_neg`` OUT. With N1 ~ Bin(m, 1/2) canaries signalling IN, the
    top ``k_pos`` hold min(k_pos, N1) of them (each right w.p. a) and the rest signal OUT (right w.p. 1 - a);
    likewise at the bottom. So ``V = Bin(g, a) + Bin(b, 1 - a)`` given N1 (``b`` = guesses beyond their group),
    which is ``Bin(r, a)`` whenever both k are below every likely group size (N1 within ±6 SD).
    """

    def __init__(self, m: int, k_pos: int, k_neg: int) -> None:
        self.r = k_pos + k_neg
        half, sd = m / 2.0, math.sqrt(m) / 2.0
        n1 = np.arange(max(0, math.floor(half - 6 * sd)), min(m, math.ceil(half + 6 * sd)) + 1)
        b = (k_pos - np.minimum(k_pos, n1)) + (k_neg - np.minimum(k_neg, m - n1))
        self.w = stats.binom.pmf(n1, m, 0.5)
        self.w /= self.w.sum()
        self.b, self.g = b, self.r - b
        self.exact_binomial = not b.any()

    def tail(self, v: int, a: float) -> float:
        """P[V >= v]."""
        if v > self.r:
            return 0.0
        if self.exact_binomial:
            return float(stats.binom.sf(v - 1, self.r, a))
        j = np.arange(int(self.b.max()) + 1)
        pb = stats.binom.pmf(j[None, :], self.b[:, None], 1.0 - a)
        t = stats.binom.sf(v - 1 - j[None, :], self.g[:, None], a)
        return float(self.w @ (pb * t).sum(axis=1))

    def accuracy_needed(self, v: int, power: float) -> float:
        """The smallest guess accuracy with P[V >= v] >= power (inf: not even a = 1)."""
        if v > self.r:
            return math.inf
        if v <= 0:
            return 0.5
        if self.exact_binomial:  # P[Bin(r, a) >= v] = I_a(v, r - v + 1)
            return max(0.5, float(special.betaincinv(v, self.r - v + 1, power)))
        if self.tail(v, 1.0) < power:
            return math.inf
        lo, hi = 0.5, 1.0
        if self.tail(v, lo) >= power:
            return lo
        for _ in range(30):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if self.tail(v, mid) >= power else (mid, hi)
        return hi

    def quantile(self, a: float, power: float) -> int:
        """The largest v with P[V >= v] >= power."""
        lo, hi = 0, self.r + 1  # tail(lo) >= power always; tail(r + 1) = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.tail(mid, a) >= power else (lo, mid)
        return lo


def _setup(m: int, claim: float, delta: float, alpha: float, points: int, guesses: str, grid=None):
    kp, kn = grid_pairs(m, points=points, guesses=guesses, grid=grid)
    a_pair = alpha / kp.size
    r_unique = np.unique(kp + kn)
    v_unique = min_correct(m=m, r=r_unique, claim=claim, delta=delta, alpha=a_pair)
    v_of = dict(zip(r_unique.tolist(), v_unique.tolist()))
    return [_Pair(m, int(a), int(b)) for a, b in zip(kp, kn)], v_of, a_pair, r_unique


def detection_probability(*, m: int, claim: float, accuracy: float, delta: float, alpha: float,
                          points: int = 4, guesses: str = "in_out") -> float:
    """Lower bound on P[the one-run audit's ε_lb > claim] when each canary's signal is right w.p. ``accuracy``.

    The audit's grid at the per-pair level α / n_pairs; the best single pair (:class:`_Pair` for its V).

    >>> detection_probability(m=1000, claim=1.0, accuracy=0.999, delta=0.0, alpha=0.05) > 0.99
    True
    >>> detection_probability(m=1000, claim=1.0, accuracy=0.5, delta=0.0, alpha=0.05) < 0.05
    True
    """
    m, claim, delta, alpha = _check(m, claim, delta, alpha)
    accuracy = _check_accuracy(accuracy)
    pairs, v_of, _, _ = _setup(m, claim, delta, alpha, points, guesses)
    return max(p.tail(v_of[p.r], accuracy) for p in pairs)


def kit_power(*, m: int, claim: float, delta: float, alpha: float, power: float = 0.5,
              accuracy: float | None = None, points: int = 4, guesses: str = "in_out",
              grid: tuple[object, object] | None = None) -> KitPower:
    """What ``m`` canaries can detect about ``claim`` (see :class:`KitPower` and the module notes).

    Args:
        m: Canaries in the kit (>= 2), each included w.p. 1/2.
        claim: The claimed ε (>= 0).
        delta: The claim's δ, in [0, 1).
        alpha: The audit's level (α of the verdict; the grid's Bonferroni split is applied here).
        power: The detection probability asked for, in (0, 1) (0.5: the median audit refutes).
        accuracy: A stated guess accuracy in [0.5, 1] (e.g. measured on a pilot), or None.
        points, guesses: The audit's (k_pos, k_neg) grid (``EpsilonConfig.k_grid_points``, ``guesses``).
        grid: The grid itself, (k_pos_grid, k_neg_grid), as an estimate records it (overrides points, guesses).

    Raises:
        ValueError: On an argument out of range.

    >>> p = kit_power(m=2000, claim=1.0, delta=1e-5, alpha=0.05)
    >>> 1.0 < p.epsilon_detectable < 2.0 < p.ceiling
    True
    """
    m, claim, delta, alpha = _check(m, claim, delta, alpha)
    power = check_alpha(power, "power")
    pairs, v_of, a_pair, r_unique = _setup(m, claim, delta, alpha, points, guesses, grid)
    ceiling = float(one_run_epsilon_bounds(m, r_unique, r_unique, delta, a_pair).max())
    need = [p.accuracy_needed(v_of[p.r], power) for p in pairs]
    i = int(np.argmin(need))
    eps_det = acc_needed = best_r = None
    if math.isfinite(need[i]):
        acc_needed, best_r = float(need[i]), pairs[i].r
        eps_det = float(special.logit(acc_needed)) if acc_needed < 1.0 else math.inf
    out = KitPower(m=m, claim=claim, delta=delta, alpha=alpha, power=power, ceiling=ceiling,
                   epsilon_detectable=eps_det, accuracy_needed=acc_needed, guesses=best_r)
    if accuracy is None:
        return out
    accuracy = _check_accuracy(accuracy)
    prob = max(p.tail(v_of[p.r], accuracy) for p in pairs)
    # the largest claim refuted w.p. >= power: per pair, ε_lb at the largest v with P[V >= v] >= power
    v_q = np.array([p.quantile(accuracy, power) for p in pairs], dtype=np.int64)
    r_p = np.array([p.r for p in pairs], dtype=np.int64)
    refutable = float(one_run_epsilon_bounds(m, r_p, v_q, delta, a_pair).max())
    return dataclasses.replace(out, accuracy=accuracy, probability=prob, refutable_claim=refutable)


def canaries_for_claim(*, claim: float, delta: float, alpha: float, factor: float = 2.0, power: float = 0.5,
                       accuracy: float | None = None, max_count: int = 20_000, points: int = 4,
                       guesses: str = "in_out") -> KitPower | None:
    """The smallest kit that refutes ``claim`` with probability >= ``power``.

    Without ``accuracy``: when the model's true ε is ``factor`` × claim and the attack is perfect (guess accuracy
    ``expit(factor · claim)``, :meth:`KitPower.detects`). With ``accuracy``: when the guesses are that often
    correct. Doubling from 64 then bisection over ``m`` in [2, max_count] (the criterion grows with ``m``; the kit
    returned always meets it). None when even ``max_count`` canaries do not (the δ term 2·m·δ of the one-run
    bound caps its ceiling, so more canaries stop helping: at δ = 1e-5 no kit shows more than ε_lb ≈ 5.4 at
    α = 0.05).

    >>> canaries_for_claim(claim=1.0, factor=2.0, delta=1e-5, alpha=0.05).m < 2000
    True
    >>> canaries_for_claim(claim=8.0, factor=2.0, delta=1e-5, alpha=0.05, max_count=4000) is None
    True
    """
    factor = check_nonnegative(factor, "factor")
    if not factor > 1.0:
        raise ValueError(f"factor must be > 1 (a violation means a true ε above the claim), got {factor!r}")
    max_count = check_count(max_count, "max_count", minimum=2)
    power = check_alpha(power, "power")
    a = _check_accuracy(accuracy) if accuracy is not None else float(special.expit(factor * claim))

    def ok(m: int) -> bool:
        return detection_probability(m=m, claim=claim, accuracy=a, delta=delta, alpha=alpha, points=points,
                                     guesses=guesses) >= power

    lo, hi = 1, None  # ok(lo) is False (sentinel); ok(hi) is True
    m = min(64, max_count)
    while hi is None:
        if ok(m):
            hi = m
        elif m == max_count:
            return None
        else:
            lo, m = m, min(2 * m, max_count)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return kit_power(m=hi, claim=claim, delta=delta, alpha=alpha, power=power, accuracy=accuracy, points=points,
                     guesses=guesses)


def _check(m: object, claim: object, delta: object, alpha: object) -> tuple[int, float, float, float]:
    m = check_count(m, "m", minimum=2)
    claim = check_nonnegative(claim, "claim")
    if math.isinf(claim):
        raise ValueError("claim must be finite (no DP claim: there is nothing to refute)")
    return m, claim, check_delta(delta), check_alpha(alpha)


def _check_accuracy(accuracy: object) -> float:
    a = check_nonnegative(accuracy, "accuracy")
    if not 0.5 <= a <= 1.0:
        raise ValueError(f"accuracy (the share of correct guesses) must be in [0.5, 1], got {accuracy!r}")
    return a
