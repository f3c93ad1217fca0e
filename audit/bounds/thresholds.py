"""Choosing a decision threshold without peeking, for threshold-based ε estimators.

A threshold attack says "member" when ``score >= threshold`` (higher score = member). The number of false
positives ``fp`` (non-members at or above the threshold) and false negatives ``fn`` (members below it) at a
threshold fixed *in advance* are binomial, which is what the Clopper–Pearson and GDP bounds need. Picking the
threshold that looks best on the same scores breaks that, so the threshold must be chosen by a strategy whose
cost is accounted for:

* :class:`HeldOut` — choose the threshold on a random part of the scores and evaluate the bound on the rest
  (the two parts are independent, so the evaluation counts are binomial at a fixed threshold).
* :class:`Bonferroni` — evaluate every threshold of a grid fixed before seeing the scores, each at
  ``alpha / len(grid)``; by the union bound all of them hold simultaneously with probability ``1 - alpha``.

Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning: How Private is Private SGD?"
(NeurIPS 2020) pick the threshold on held-out runs in the same spirit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from audit.bounds._validate import check_alpha, check_scores

__all__ = ["HeldOut", "Bonferroni", "ThresholdStrategy", "ThresholdChoice", "counts_at_thresholds",
           "choose_threshold", "estimate_at_chosen_threshold"]

BoundFn = Callable[[np.ndarray, int, np.ndarray, int, float], np.ndarray]
"""``bound(fp, n_neg, fn, n_pos, alpha) -> values``: a vectorised bound to maximise (larger = more leakage)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeldOut:
    """Choose the threshold on a random ``fraction`` of the scores, evaluate the bound on the rest.

    The split is stratified: ``fraction`` of the member scores and ``fraction`` of the non-member scores go to
    the selection part. The whole α is spent on the single evaluated threshold.

    Attributes:
        fraction: Share of scores used to select the threshold, in (0, 1).
        rng: Seed or generator for the random split (``np.random.default_rng(rng)``).
    """

    fraction: float = 0.5
    rng: np.random.Generator | int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.fraction, bool) or not 0.0 < float(self.fraction) < 1.0:
            raise ValueError(f"fraction must be in (0, 1), got {self.fraction!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bonferroni:
    """Evaluate every threshold of a fixed grid at ``alpha / len(grid)`` and report the best.

    The grid must be fixed before looking at the audited scores (e.g. from reference models or a fixed range);
    a grid built from the audited scores themselves voids the guarantee.

    Attributes:
        grid: Distinct finite thresholds (any sequence; stored as a sorted tuple of floats).
    """

    grid: Sequence[float]

    def __post_init__(self) -> None:
        arr = np.asarray(self.grid, dtype=np.float64).reshape(-1)
        if arr.size == 0:
            raise ValueError("grid must hold at least one threshold, got an empty grid")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"grid thresholds must be finite, got {arr[~np.isfinite(arr)][:3].tolist()}")
        if np.unique(arr).size != arr.size:
            raise ValueError(f"grid thresholds must be distinct, got {arr.size - np.unique(arr).size} duplicates")
        object.__setattr__(self, "grid", tuple(float(t) for t in np.sort(arr)))


ThresholdStrategy = HeldOut | Bonferroni


@dataclasses.dataclass(frozen=True, kw_only=True)
class ThresholdChoice:
    """The threshold a strategy chose and the counts the final bound is computed from.

    Attributes:
        threshold: The chosen threshold (``score >= threshold`` means "member").
        fp: Non-members at or above the threshold (evaluation part).
        n_neg: Non-members in the evaluation part.
        fn: Members below the threshold (evaluation part).
        n_pos: Members in the evaluation part.
        alpha_test: The α at which the final bound must be computed (``alpha`` or ``alpha / len(grid)``).
        strategy: ``"held_out"`` or ``"bonferroni"``.
        n_thresholds: Number of thresholds the final α is shared among (1 for held-out).
    """

    threshold: float
    fp: int
    n_neg: int
    fn: int
    n_pos: int
    alpha_test: float
    strategy: str
    n_thresholds: int


def counts_at_thresholds(
    *, scores_in: np.ndarray, scores_out: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """False positives and false negatives of the rule ``score >= t`` at every threshold ``t``.

    Args:
        scores_in: Scores of members (higher = member).
        scores_out: Scores of non-members.
        thresholds: Thresholds to evaluate.

    Returns:
        ``(fp, fn)`` int64 arrays shaped like ``thresholds``: ``fp[i] = #{out >= t_i}``, ``fn[i] = #{in < t_i}``.

    >>> fp, fn = counts_at_thresholds(scores_in=np.array([2.0, 3.0]), scores_out=np.array([0.0, 2.0]),
    ...                               thresholds=np.array([1.0, 2.5]))
    >>> fp.tolist(), fn.tolist()
    ([1, 0], [0, 1])
    """
    s_in = np.sort(np.asarray(scores_in, dtype=np.float64))
    s_out = np.sort(np.asarray(scores_out, dtype=np.float64))
    t = np.asarray(thresholds, dtype=np.float64)
    fn = np.searchsorted(s_in, t, side="left").astype(np.int64)
    fp = (s_out.size - np.searchsorted(s_out, t, side="left")).astype(np.int64)
    return fp, fn


def choose_threshold(
    *,
    scores_in: object,
    scores_out: object,
    alpha: float,
    strategy: ThresholdStrategy,
    bound: BoundFn,
) -> ThresholdChoice:
    """Apply a threshold strategy and return the counts at the chosen threshold.

    Args:
        scores_in: Member scores (higher = member), 1-D, finite.
        scores_out: Non-member scores, 1-D, finite.
        alpha: Significance level of the final bound, in (0, 1).
        strategy: :class:`HeldOut` or :class:`Bonferroni`.
        bound: Vectorised bound ``bound(fp, n_neg, fn, n_pos, alpha)``; the threshold maximising it is chosen.

    Returns:
        The :class:`ThresholdChoice`; compute the final bound from its counts at ``alpha_test``.

    Raises:
        ValueError: On empty/non-finite scores, a bad α, or a held-out split leaving a part without members or
            without non-members.
        TypeError: If ``strategy`` is not a known strategy.
    """
    s_in = check_scores(scores_in, "scores_in")
    s_out = check_scores(scores_out, "scores_out")
    alpha = check_alpha(alpha)
    if isinstance(strategy, Bonferroni):
        grid = np.asarray(strategy.grid, dtype=np.float64)
        a_test = alpha / grid.size
        fp, fn = counts_at_thresholds(scores_in=s_in, scores_out=s_out, thresholds=grid)
        values = bound(fp, s_out.size, fn, s_in.size, a_test)
        best = int(np.argmax(values))
        return ThresholdChoice(threshold=float(grid[best]), fp=int(fp[best]), n_neg=s_out.size, fn=int(fn[best]),
                               n_pos=s_in.size, alpha_test=a_test, strategy="bonferroni", n_thresholds=grid.size)
    if isinstance(strategy, HeldOut):
        rng = np.random.default_rng(strategy.rng)
        sel_in, ev_in = _split(s_in, strategy.fraction, rng, "scores_in")
        sel_out, ev_out = _split(s_out, strategy.fraction, rng, "scores_out")
        candidates = np.unique(np.concatenate([sel_in, sel_out]))
        fp, fn = counts_at_thresholds(scores_in=sel_in, scores_out=sel_out, thresholds=candidates)
        values = bound(fp, sel_out.size, fn, sel_in.size, alpha)
        threshold = float(candidates[int(np.argmax(values))])
        fp_ev, fn_ev = counts_at_thresholds(scores_in=ev_in, scores_out=ev_out, thresholds=np.array([threshold]))
        return ThresholdChoice(threshold=threshold, fp=int(fp_ev[0]), n_neg=ev_out.size, fn=int(fn_ev[0]),
                               n_pos=ev_in.size, alpha_test=alpha, strategy="held_out", n_thresholds=1)
    raise TypeError(f"threshold_strategy must be HeldOut or Bonferroni, got {type(strategy).__name__}")


def _split(scores: np.ndarray, fraction: float, rng: np.random.Generator, name: str) -> tuple[np.ndarray, np.ndarray]:
    n_sel = int(math.floor(fraction * scores.size))
    if not 1 <= n_sel <= scores.size - 1:
        raise ValueError(
            f"HeldOut(fraction={fraction}) leaves an empty part of {name} ({scores.size} scores); "
            "use more scores or a fraction nearer 0.5"
        )
    perm = rng.permutation(scores.size)
    return scores[perm[:n_sel]], scores[perm[n_sel:]]


def estimate_at_chosen_threshold(*, scores_in, scores_out, alpha: float, strategy, bound: Callable,
                                 estimate: Callable):
    """Choose a threshold with ``strategy`` (never on the scores it is judged on), then estimate at it.

    ``estimate(fp=, n_neg=, fn=, n_pos=, alpha=, extra=)`` builds the estimate at the per-test α; the result
    reports the overall (family-wise) α, with the per-test α and the threshold in ``extra``.
    """
    alpha = check_alpha(alpha)
    choice = choose_threshold(scores_in=scores_in, scores_out=scores_out, alpha=alpha, strategy=strategy,
                              bound=bound)
    extra = {"threshold": choice.threshold, "threshold_strategy": choice.strategy,
             "n_thresholds": choice.n_thresholds, "alpha_per_test": choice.alpha_test}
    est = estimate(fp=choice.fp, n_neg=choice.n_neg, fn=choice.fn, n_pos=choice.n_pos, alpha=choice.alpha_test,
                   extra=extra)
    return dataclasses.replace(est, alpha=alpha)
