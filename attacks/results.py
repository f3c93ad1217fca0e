"""Turn attack scores into the ``attack.json`` entries: metrics with intervals, a banded ROC, slices, LOO.

Pure functions over arrays (no files). Scores are "higher = member". The ROC stored in ``attack.json`` is
the exact ROC read at up to :data:`ROC_POINTS` FPR values spaced logarithmically from ``1 / n_nonmembers`` to
1 (plus FPR 0): at each FPR ``t`` the TPR is the largest TPR of a ROC point with FPR ``<= t``, as
:func:`attacks.metrics.tpr_at_fpr` defines it; ``tpr_lo``/``tpr_hi`` are pointwise percentile intervals of
the same quantity over stratified bootstrap resamples (members and non-members resampled separately).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from attacks.metrics import DEFAULT_FPRS, average_metrics, compute_metrics
from attacks.slices import most_vulnerable, per_class_metrics

__all__ = ["ROC_POINTS", "roc_grid", "banded_roc", "evaluate_scores", "loo_summary"]

ROC_POINTS = 200
_BOOT_BLOCK = 1 << 22

def roc_grid(n_nonmembers: int, n_points: int = ROC_POINTS) -> np.ndarray:
    """At most ``n_points`` FPRs at which to read a ROC with ``n_nonmembers`` non-members.

    Every attainable FPR ``j / N`` when there are at most ``n_points`` of them; otherwise 0 and log-spaced
    values from ``1 / N`` to 1, each rounded down to an attainable ``j / N`` (where the step ROC changes),
    duplicates removed.

    >>> roc_grid(4).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    >>> g = roc_grid(10_000, 50)
    >>> g.size <= 50, float(g[1]), float(g[-1])
    (True, 0.0001, 1.0)
    """
    if n_nonmembers < 1 or n_points < 2:
        raise ValueError(f"need n_nonmembers >= 1 and n_points >= 2; got {n_nonmembers}, {n_points}")
    n = int(n_nonmembers)
    if n + 1 <= n_points:
        return np.arange(n + 1) / n
    steps = np.floor(np.geomspace(1.0, n, n_points - 1) + 1e-9)
    return np.unique(np.r_[0.0, steps]) / n


def _boot_counts(y: np.ndarray, b: int, rng: np.random.Generator) -> np.ndarray:
    """``(b, n)`` stratified bootstrap counts: members and non-members each resampled to their own size."""
    counts = np.zeros((b, y.size))
    for cls in (True, False):
        idx = np.flatnonzero(y == cls)
        counts[:, idx] = rng.multinomial(idx.size, np.full(idx.size, 1.0 / idx.size), size=b)
    return counts


def _tpr_at_grid(s: np.ndarray, y: np.ndarray, weights: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """``(B, T)``: for each count-weighted copy of the data, the largest TPR with FPR ``<= grid[t]``.

    One sort serves every row; each row is then read with one ``searchsorted`` (the cumulative false-positive
    weight is non-decreasing along the descending-score order). Equals
    :func:`attacks.metrics.weighted_roc_metrics` ``["tpr_at"]``.
    """
    order = np.argsort(-s, kind="stable")
    ss, ys = s[order], y[order]
    ends = np.flatnonzero(np.r_[ss[1:] != ss[:-1], True])
    w = weights[:, order]
    tp = np.cumsum(np.where(ys, w, 0.0), axis=1)[:, ends]
    fp = np.cumsum(np.where(ys, 0.0, w), axis=1)[:, ends]
    zero = np.zeros((len(w), 1))
    tpr = np.hstack([zero, tp / tp[:, -1:]])
    fp0 = np.hstack([zero, fp])
    out = np.empty((len(w), grid.size))
    for r in range(len(w)):
        pos = np.searchsorted(fp0[r], grid * fp0[r, -1] + 1e-9, side="right") - 1
        out[r] = tpr[r, pos]
    return out


def banded_roc(scores: np.ndarray, membership: np.ndarray, *, n_boot: int, level: float = 0.95,
               rng: np.random.Generator | int | None = None, n_points: int = ROC_POINTS) -> dict[str, list[float]]:
    """The ROC at :func:`roc_grid` FPRs with pointwise bootstrap bands (``n_boot = 0``: no band).

    Returns:
        ``{"fpr", "tpr", "tpr_lo", "tpr_hi"}`` lists of equal length (at most ``n_points``); without a
        band ``tpr_lo == tpr_hi == tpr``.
    """
    y = np.asarray(membership, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    grid = roc_grid(int((~y).sum()), n_points)
    tpr = _tpr_at_grid(s, y, np.ones((1, s.size)), grid)[0]
    lo = hi = tpr
    if n_boot:
        gen = np.random.default_rng(rng)
        step = max(1, min(n_boot, _BOOT_BLOCK // max(1, s.size)))
        rows = [_tpr_at_grid(s, y, _boot_counts(y, min(step, n_boot - b), gen), grid)
                for b in range(0, n_boot, step)]
        lo, hi = np.quantile(np.concatenate(rows), [(1 - level) / 2, (1 + level) / 2], axis=0)
    return {"fpr": grid.tolist(), "tpr": tpr.tolist(), "tpr_lo": np.asarray(lo).tolist(),
            "tpr_hi": np.asarray(hi).tolist()}


def _metrics_json(m: Any) -> dict[str, Any]:
    d = m.to_dict()
    return {"auc": d["auc"], "auc_ci": d["auc_ci"], "tpr_at_fpr": d["tpr_at_fpr"],
            "tpr_at_fpr_ci": d["tpr_at_fpr_ci"] or {}, "balanced_accuracy": d["balanced_accuracy"],
            "n_members": d["n_members"], "n_nonmembers": d["n_nonmembers"]}


def evaluate_scores(scores: np.ndarray, membership: np.ndarray, labels: np.ndarray, *, n_boot: int, seed: int,
                    top_k: int, fpr_targets: Sequence[float] = DEFAULT_FPRS) -> dict[str, Any]:
    """Metrics (bootstrap intervals), banded ROC, per-class AUC and most vulnerable members of one score vector.

    Args:
        scores: ``(n,)`` higher = member. membership: ``(n,)`` truth. labels: ``(n,)`` class labels.
        n_boot: bootstrap resamples (0: no intervals). seed: bootstrap seed.
        top_k: how many most-exposed members to list (positions in ``scores``).

    Returns:
        ``{"metrics", "roc", "per_class", "most_vulnerable"}`` in the ``attack.json`` layout.

    >>> rng = np.random.default_rng(0)
    >>> y = rng.random(200) < 0.5
    >>> out = evaluate_scores(rng.normal(size=200) + y, y, rng.integers(0, 2, 200), n_boot=20, seed=0, top_k=3)
    >>> sorted(out), len(out["most_vulnerable"]), out["metrics"]["auc"] > 0.6
    (['metrics', 'most_vulnerable', 'per_class', 'roc'], 3, True)
    """
    metrics = compute_metrics(scores, membership, rng=seed, n_boot=n_boot, fpr_targets=fpr_targets)
    slices = per_class_metrics(scores, membership, labels)
    return {
        "metrics": _metrics_json(metrics),
        "roc": banded_roc(scores, membership, n_boot=n_boot, rng=seed + 1),
        "per_class": {str(c): {"auc": v["auc"], "n": v["n"]} for c, v in slices.items()},
        "most_vulnerable": most_vulnerable(scores, membership, top_k),
    }


def loo_summary(rounds: Sequence[tuple[np.ndarray, np.ndarray]],
                fpr_targets: Sequence[float] = DEFAULT_FPRS) -> dict[str, Any]:
    """Mean and std (ddof 1) of AUC and TPR at each FPR over leave-one-out rounds ``(scores, membership)``.

    >>> rng = np.random.default_rng(1)
    >>> ys = [rng.random(100) < 0.5 for _ in range(3)]
    >>> out = loo_summary([(rng.normal(size=100) + 2 * y, y) for y in ys])
    >>> sorted(out), out["n_runs"], 0.8 < out["auc_mean"] < 1.0
    (['auc_mean', 'auc_std', 'n_runs', 'tpr_at_fpr_mean', 'tpr_at_fpr_std'], 3, True)
    """
    avg = average_metrics([compute_metrics(s, m, n_boot=0, fpr_targets=fpr_targets) for s, m in rounds]).to_dict()
    return {"auc_mean": avg["auc"]["mean"], "auc_std": avg["auc"]["std"], "n_runs": avg["n_runs"],
            "tpr_at_fpr_mean": {k: v["mean"] for k, v in avg["tpr_at_fpr"].items()},
            "tpr_at_fpr_std": {k: v["std"] for k, v in avg["tpr_at_fpr"].items()}}


def summary_rows(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per attack of an ``attack.json`` dict: name, AUC, its interval and TPR at each FPR level."""
    rows = []
    for name, entry in report.get("attacks", {}).items():
        m = entry["metrics"]
        rows.append({"attack": name, "auc": m["auc"], "auc_ci": m.get("auc_ci"), "tpr_at_fpr": m["tpr_at_fpr"],
                     "loo_auc": (entry.get("leave_one_out") or {}).get("auc_mean")})
    return rows
