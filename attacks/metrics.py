"""Attack metrics: exact ROC, AUC, TPR at low FPR, best balanced accuracy, bootstrap intervals, slices.

Pure numpy. Scores are "higher = member": an example is predicted member when ``score >= threshold``. The
ROC has one point per DISTINCT score (tied scores move together, giving a diagonal segment), starting at
``(0, 0)`` (threshold ``+inf``) and ending at ``(1, 1)``; AUC is the trapezoidal area, which equals the
Mann-Whitney statistic ``P(s_member > s_non) + P(s_member = s_non) / 2``. TPR at FPR ``t`` is the largest
TPR of a ROC point whose FPR is ``<= t`` (no interpolation), as reported by Carlini et al. (S&P 2022).

Bootstrap intervals resample members and non-members separately (stratified; the class sizes are fixed)
and report percentile intervals. Resamples are evaluated in blocks as count-weighted ROCs, so one sort
serves every replicate.

>>> scores = np.array([0.9, 0.8, 0.8, 0.3, 0.1])
>>> labels = np.array([1, 1, 0, 0, 0])
>>> fpr, tpr, thr = roc_curve(scores, labels)
>>> fpr.tolist(), tpr.tolist()
([0.0, 0.0, 0.3333333333333333, 0.6666666666666666, 1.0], [0.0, 0.5, 1.0, 1.0, 1.0])
>>> round(auc(scores, labels), 4)
0.9167
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_FPRS",
    "roc_curve",
    "auc",
    "tpr_at_fpr",
    "best_balanced_accuracy",
    "membership_advantage",
    "weighted_roc_metrics",
    "bootstrap_ci",
    "AttackMetrics",
    "compute_metrics",
    "AveragedMetrics",
    "average_metrics",
]

DEFAULT_FPRS: tuple[float, ...] = (0.01, 0.001, 0.0001)
_BLOCK_ELEMENTS = 1 << 22
_FPR_SLACK = 1e-9


def _check(scores: Any, labels: Any, *, need_both: bool = True) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels)
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D; got shape {s.shape}")
    if y.shape != s.shape:
        raise ValueError(f"labels must have the shape of scores {s.shape}; got {y.shape}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN; every example needs a score")
    if y.dtype != np.bool_:
        if y.size and not np.isin(y, (0, 1)).all():
            raise ValueError("labels must be boolean or 0/1 membership labels")
        y = y.astype(bool)
    if need_both and (y.all() or not y.any()):
        raise ValueError(f"need both members and non-members; got {int(y.sum())} members of {y.size}")
    return s, y


def _groups(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Descending stable order and the index (in that order) of the last element of each tie group."""
    order = np.argsort(-s, kind="stable")
    ss = s[order]
    ends = np.flatnonzero(np.r_[ss[1:] != ss[:-1], True])
    return order, ends


def roc_curve(scores: Any, labels: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact ROC of "member if score >= threshold", one point per distinct score.

    Args:
        scores: ``(n,)`` scores, higher = member (``+-inf`` allowed, NaN not).
        labels: ``(n,)`` bool (or 0/1) true membership; both classes must be present.

    Returns:
        ``(fpr, tpr, thresholds)``, each of length ``G + 1`` for ``G`` distinct scores; the first point is
        ``(0, 0)`` at threshold ``+inf``, then thresholds decrease through the distinct scores.

    Raises:
        ValueError: on shape mismatch, NaN scores, non-binary labels, or a single class.
    """
    s, y = _check(scores, labels)
    order, ends = _groups(s)
    tp = np.cumsum(y[order])[ends]
    fp = (ends + 1) - tp
    fpr = np.r_[0.0, fp / fp[-1]]
    tpr = np.r_[0.0, tp / tp[-1]]
    return fpr, tpr, np.r_[np.inf, s[order][ends]]


def _auc_from_roc(fpr: np.ndarray, tpr: np.ndarray) -> np.ndarray:
    return (np.diff(fpr, axis=-1) * (tpr[..., 1:] + tpr[..., :-1]) * 0.5).sum(axis=-1)


def auc(scores: Any, labels: Any) -> float:
    """Area under the exact ROC (ties count one half: equals the Mann-Whitney statistic).

    >>> auc([3.0, 2.0, 1.0], [True, False, True])
    0.5
    """
    fpr, tpr, _ = roc_curve(scores, labels)
    return float(_auc_from_roc(fpr, tpr))


def _check_fprs(fpr_targets: Sequence[float]) -> tuple[float, ...]:
    targets = tuple(float(t) for t in fpr_targets)
    if not targets or any(not 0.0 <= t <= 1.0 for t in targets):
        raise ValueError(f"fpr_targets must be a non-empty list of numbers in [0, 1]; got {fpr_targets!r}")
    return targets


def tpr_at_fpr(scores: Any, labels: Any, fpr_targets: Sequence[float] = DEFAULT_FPRS) -> dict[float, float]:
    """Largest TPR among ROC points with FPR ``<= t``, for each target ``t`` (exact, no interpolation).

    With ``N`` non-members the attainable FPRs are multiples of ``1 / N``; below ``1 / N`` this is the TPR
    at zero false positives.

    >>> tpr_at_fpr([4, 3, 2, 1], [1, 0, 1, 0], fpr_targets=(0.0, 0.5, 1.0))
    {0.0: 0.5, 0.5: 1.0, 1.0: 1.0}
    """
    targets = _check_fprs(fpr_targets)
    s, y = _check(scores, labels)
    fpr, tpr, _ = roc_curve(s, y)
    n_neg = int((~y).sum())
    fp = np.rint(fpr * n_neg)
    return {t: float(tpr[fp <= t * n_neg + _FPR_SLACK].max()) for t in targets}


def best_balanced_accuracy(scores: Any, labels: Any) -> float:
    """``max over thresholds of (TPR + TNR) / 2`` (at least 0.5: the trivial thresholds are included).

    >>> best_balanced_accuracy([4, 3, 2, 1], [1, 0, 1, 0])
    0.75
    """
    fpr, tpr, _ = roc_curve(scores, labels)
    return float(((tpr + 1.0 - fpr) * 0.5).max())


def membership_advantage(scores: Any, labels: Any) -> float:
    """``max over thresholds of TPR - FPR`` (Yeom et al. 2018) ``= 2 * best_balanced_accuracy - 1``."""
    fpr, tpr, _ = roc_curve(scores, labels)
    return float((tpr - fpr).max())


def weighted_roc_metrics(
    scores: Any, labels: Any, weights: np.ndarray, *, fpr_targets: Sequence[float] = DEFAULT_FPRS
) -> dict[str, np.ndarray]:
    """AUC, best balanced accuracy and TPR at each FPR target for ``B`` count-weighted copies of the data.

    Row ``b`` of ``weights`` gives how many times each example appears (a bootstrap resample as counts);
    the metrics equal those of the expanded data set. One sort serves all rows.

    Args:
        scores: ``(n,)`` scores, higher = member.
        labels: ``(n,)`` membership.
        weights: ``(B, n)`` non-negative weights; every row needs positive weight on both classes.
        fpr_targets: FPR targets.

    Returns:
        ``{"auc": (B,), "balanced_accuracy": (B,), "tpr_at": (B, T)}``.

    >>> w = np.array([[1, 1, 1, 1], [2, 1, 1, 1]])
    >>> weighted_roc_metrics([4, 3, 2, 1], [1, 0, 1, 0], w, fpr_targets=(0.0,))["tpr_at"].ravel().tolist()
    [0.5, 0.6666666666666666]
    """
    targets = np.asarray(_check_fprs(fpr_targets))
    s, y = _check(scores, labels)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != s.size:
        raise ValueError(f"weights must have shape (B, {s.size}); got {w.shape}")
    if (w < 0).any():
        raise ValueError("weights must be non-negative")
    order, ends = _groups(s)
    ys = y[order]
    out = {"auc": np.empty(len(w)), "balanced_accuracy": np.empty(len(w)),
           "tpr_at": np.empty((len(w), targets.size))}
    step = max(1, _BLOCK_ELEMENTS // max(1, s.size))
    for b in range(0, len(w), step):
        ws = w[b: b + step][:, order]
        tp = np.cumsum(np.where(ys, ws, 0.0), axis=1)[:, ends]
        fp = np.cumsum(np.where(ys, 0.0, ws), axis=1)[:, ends]
        p, n = tp[:, -1:], fp[:, -1:]
        if (p <= 0).any() or (n <= 0).any():
            raise ValueError("every weight row needs positive weight on members and non-members")
        zero = np.zeros((len(ws), 1))
        tpr, fpr = np.hstack([zero, tp / p]), np.hstack([zero, fp / n])
        fp0 = np.hstack([zero, fp])
        out["auc"][b: b + step] = _auc_from_roc(fpr, tpr)
        out["balanced_accuracy"][b: b + step] = ((tpr + 1.0 - fpr) * 0.5).max(axis=1)
        for j, t in enumerate(targets):
            ok = fp0 <= t * n + _FPR_SLACK
            out["tpr_at"][b: b + step, j] = np.where(ok, tpr, 0.0).max(axis=1)
    return out


def _resample_blocks(y: np.ndarray, n_boot: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Stratified bootstrap resamples as ``(b, n)`` index blocks (members, then non-members, per row)."""
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    step = max(1, _BLOCK_ELEMENTS // max(1, y.size))
    for start in range(0, n_boot, step):
        b = min(step, n_boot - start)
        yield np.hstack([pos[rng.integers(0, pos.size, size=(b, pos.size))],
                         neg[rng.integers(0, neg.size, size=(b, neg.size))]])


def _counts(idx: np.ndarray, n: int) -> np.ndarray:
    rows = np.arange(len(idx))[:, None] * n
    return np.bincount((idx + rows).ravel(), minlength=len(idx) * n).reshape(len(idx), n)


def _check_boot(n_boot: int, level: float, *, allow_zero: bool) -> None:
    low = 0 if allow_zero else 1
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < low:
        raise ValueError(f"n_boot must be an integer >= {low}; got {n_boot!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1); got {level!r}")


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(values, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=0)
    return float(lo), float(hi)


_NAMED = ("auc", "balanced_accuracy")


def bootstrap_ci(
    scores: Any,
    labels: Any,
    *,
    metric_fn: Callable[[np.ndarray, np.ndarray], float] | str,
    n_boot: int = 200,
    level: float = 0.95,
    rng: np.random.Generator | int | None = None,
) -> tuple[float, float]:
    """Stratified percentile-bootstrap confidence interval of a metric.

    Args:
        scores: ``(n,)`` scores, higher = member.
        labels: ``(n,)`` membership.
        metric_fn: any ``f(scores, labels) -> float`` (evaluated once per resample), or a name evaluated
            vectorised over resamples: ``"auc"``, ``"balanced_accuracy"`` or ``"tpr@<fpr>"`` (e.g.
            ``"tpr@0.01"``). The same ``rng`` gives the same resamples either way.
        n_boot: number of resamples (``>= 1``).
        level: two-sided confidence level in (0, 1).
        rng: generator or seed.

    Returns:
        ``(low, high)``.

    >>> s = np.r_[np.arange(50) + 10.0, np.arange(50)]
    >>> y = np.r_[np.ones(50, bool), np.zeros(50, bool)]
    >>> lo, hi = bootstrap_ci(s, y, metric_fn="auc", n_boot=50, rng=0)
    >>> lo <= auc(s, y) <= hi
    True
    """
    _check_boot(n_boot, level, allow_zero=False)
    s, y = _check(scores, labels)
    gen = np.random.default_rng(rng)
    if isinstance(metric_fn, str):
        if metric_fn in _NAMED:
            key, col = metric_fn, None
        elif metric_fn.startswith("tpr@"):
            key, col = "tpr_at", float(metric_fn[4:])
        else:
            raise ValueError(f"metric_fn name must be 'auc', 'balanced_accuracy' or 'tpr@<fpr>'; "
                             f"got {metric_fn!r}")
        fprs = (col,) if col is not None else DEFAULT_FPRS
        vals = np.concatenate([
            weighted_roc_metrics(s, y, _counts(idx, s.size), fpr_targets=fprs)[key].reshape(len(idx), -1)[:, 0]
            for idx in _resample_blocks(y, n_boot, gen)])
    elif callable(metric_fn):
        vals = np.array([metric_fn(s[row], y[row]) for idx in _resample_blocks(y, n_boot, gen) for row in idx],
                        dtype=np.float64)
    else:
        raise TypeError(f"metric_fn must be callable or a metric name; got {type(metric_fn).__name__}")
    return _interval(vals, level)


def _fkey(t: float) -> str:
    return f"{t:g}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttackMetrics:
    """Metrics of one attack on one target, with stratified-bootstrap percentile intervals.

    Attributes:
        auc: area under the ROC.
        tpr_at: ``{fpr_target: TPR}`` (exact, see :func:`tpr_at_fpr`).
        balanced_accuracy: best balanced accuracy over thresholds.
        n_members, n_nonmembers: class sizes.
        auc_ci, tpr_at_ci, balanced_accuracy_ci: ``(low, high)`` intervals, None when ``n_boot == 0``.
        n_boot: bootstrap resamples used; level: confidence level of the intervals.
    """

    auc: float
    tpr_at: dict[float, float]
    balanced_accuracy: float
    n_members: int
    n_nonmembers: int
    auc_ci: tuple[float, float] | None = None
    tpr_at_ci: dict[float, tuple[float, float]] | None = None
    balanced_accuracy_ci: tuple[float, float] | None = None
    n_boot: int = 0
    level: float = 0.95

    @property
    def membership_advantage(self) -> float:
        """``max(TPR - FPR) = 2 * balanced_accuracy - 1``."""
        return 2.0 * self.balanced_accuracy - 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (FPR keys as strings such as ``"0.001"``, intervals as ``[low, high]``)."""
        ci = (lambda v: None if v is None else [float(v[0]), float(v[1])])
        return {
            "auc": self.auc,
            "auc_ci": ci(self.auc_ci),
            "tpr_at_fpr": {_fkey(t): v for t, v in self.tpr_at.items()},
            "tpr_at_fpr_ci": None if self.tpr_at_ci is None else
            {_fkey(t): ci(v) for t, v in self.tpr_at_ci.items()},
            "balanced_accuracy": self.balanced_accuracy,
            "balanced_accuracy_ci": ci(self.balanced_accuracy_ci),
            "membership_advantage": self.membership_advantage,
            "n_members": self.n_members,
            "n_nonmembers": self.n_nonmembers,
            "min_nonzero_fpr": 1.0 / self.n_nonmembers,
            "n_boot": self.n_boot,
            "ci_level": self.level,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AttackMetrics:
        """Inverse of :meth:`to_dict`."""
        tup = (lambda v: None if v is None else (float(v[0]), float(v[1])))
        return cls(
            auc=float(d["auc"]), auc_ci=tup(d.get("auc_ci")),
            tpr_at={float(k): float(v) for k, v in d["tpr_at_fpr"].items()},
            tpr_at_ci=None if d.get("tpr_at_fpr_ci") is None else
            {float(k): tup(v) for k, v in d["tpr_at_fpr_ci"].items()},
            balanced_accuracy=float(d["balanced_accuracy"]), balanced_accuracy_ci=tup(d.get("balanced_accuracy_ci")),
            n_members=int(d["n_members"]), n_nonmembers=int(d["n_nonmembers"]),
            n_boot=int(d.get("n_boot", 0)), level=float(d.get("ci_level", 0.95)))


def compute_metrics(
    scores: Any,
    labels: Any,
    *,
    rng: np.random.Generator | int | None = None,
    n_boot: int = 200,
    level: float = 0.95,
    fpr_targets: Sequence[float] = DEFAULT_FPRS,
) -> AttackMetrics:
    """All metrics of one attack, with stratified-bootstrap percentile intervals (``n_boot=0``: none).

    >>> rng = np.random.default_rng(0)
    >>> y = rng.random(400) < 0.5
    >>> m = compute_metrics(rng.normal(size=400) + 2.0 * y, y, rng=1, n_boot=100)
    >>> m.auc_ci[0] < m.auc < m.auc_ci[1], m.n_members + m.n_nonmembers
    (True, 400)
    """
    _check_boot(n_boot, level, allow_zero=True)
    targets = _check_fprs(fpr_targets)
    s, y = _check(scores, labels)
    point = weighted_roc_metrics(s, y, np.ones((1, s.size)), fpr_targets=targets)
    kw: dict[str, Any] = {}
    if n_boot:
        gen = np.random.default_rng(rng)
        blocks = [weighted_roc_metrics(s, y, _counts(idx, s.size), fpr_targets=targets)
                  for idx in _resample_blocks(y, n_boot, gen)]
        boot = {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
        kw = {"auc_ci": _interval(boot["auc"], level),
              "balanced_accuracy_ci": _interval(boot["balanced_accuracy"], level),
              "tpr_at_ci": {t: _interval(boot["tpr_at"][:, j], level) for j, t in enumerate(targets)}}
    return AttackMetrics(
        auc=float(point["auc"][0]),
        tpr_at={t: float(point["tpr_at"][0, j]) for j, t in enumerate(targets)},
        balanced_accuracy=float(point["balanced_accuracy"][0]),
        n_members=int(y.sum()), n_nonmembers=int((~y).sum()), n_boot=int(n_boot), level=float(level), **kw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AveragedMetrics:
    """Mean and standard deviation (``ddof=1``; 0 for one run) of metrics over leave-one-out targets."""

    n_runs: int
    auc: tuple[float, float]
    tpr_at: dict[float, tuple[float, float]]
    balanced_accuracy: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``{"auc": {"mean": ., "std": .}, "tpr_at_fpr": {"0.01": {...}}, ...}``."""
        ms = (lambda v: {"mean": v[0], "std": v[1]})
        return {"n_runs": self.n_runs, "auc": ms(self.auc),
                "tpr_at_fpr": {_fkey(t): ms(v) for t, v in self.tpr_at.items()},
                "balanced_accuracy": ms(self.balanced_accuracy)}


def average_metrics(metrics: Sequence[AttackMetrics]) -> AveragedMetrics:
    """Mean +- std of AUC, TPR at each FPR target and balanced accuracy over several targets.

    Raises:
        ValueError: for an empty list or runs with different FPR targets.
    """
    if not metrics:
        raise ValueError("average_metrics needs at least one AttackMetrics")
    fprs = tuple(metrics[0].tpr_at)
    if any(tuple(m.tpr_at) != fprs for m in metrics):
        raise ValueError("all AttackMetrics must use the same fpr_targets to be averaged")

    def ms(values: Sequence[float]) -> tuple[float, float]:
        v = np.asarray(values, dtype=np.float64)
        return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0

    return AveragedMetrics(n_runs=len(metrics), auc=ms([m.auc for m in metrics]),
                           tpr_at={t: ms([m.tpr_at[t] for m in metrics]) for t in fprs},
                           balanced_accuracy=ms([m.balanced_accuracy for m in metrics]))
