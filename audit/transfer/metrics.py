"""Accuracy with a binomial confidence interval, and input checks shared by the transfer evaluators.

Every transfer number is a proportion of correctly classified test examples, so it is reported with an
exact or score interval for a binomial proportion:

* Wilson (1927) score interval: centre ``(k + z^2/2) / (n + z^2)``; good coverage even near 0 and 1.
* Clopper & Pearson (1934) exact interval: Beta quantiles; never under-covers, slightly wider.

>>> est = accuracy_estimate(correct=90, total=100)
>>> est.accuracy, round(est.ci_low, 4), round(est.ci_high, 4)
(0.9, 0.8256, 0.9448)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats

__all__ = [
    "CIMethod",
    "AccuracyEstimate",
    "binomial_ci",
    "accuracy_estimate",
    "check_features",
    "check_labels",
]

CIMethod = Literal["wilson", "clopper_pearson"]


class Record:
    """A frozen dataclass of plain values whose :meth:`to_dict` is its JSON form (``dataclasses.asdict``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class AccuracyEstimate(Record):
    """A test accuracy with its two-sided confidence interval.

    Attributes:
        correct: number of correctly classified examples.
        total: number of examples scored.
        accuracy: ``correct / total`` (nan when ``total == 0``).
        ci_low, ci_high: the interval's ends, in [0, 1].
        confidence: the interval's nominal coverage (e.g. 0.95).
        method: ``"wilson"`` or ``"clopper_pearson"``.
    """

    correct: int
    total: int
    accuracy: float
    ci_low: float
    ci_high: float
    confidence: float
    method: str


def binomial_ci(successes: int, trials: int, *, confidence: float = 0.95,
                method: CIMethod = "wilson") -> tuple[float, float]:
    """Two-sided confidence interval for a binomial proportion.

    Args:
        successes: number of successes ``k`` (0 <= k <= n).
        trials: number of trials ``n`` (>= 0); ``n == 0`` gives ``(0.0, 1.0)``.
        confidence: nominal coverage in (0, 1).
        method: ``"wilson"`` (score interval) or ``"clopper_pearson"`` (exact, conservative).

    Returns:
        ``(low, high)`` with ``0 <= low <= k/n <= high <= 1``.

    Raises:
        ValueError: if the counts or the confidence are out of range, or the method is unknown.

    >>> binomial_ci(0, 10, method="clopper_pearson")[1] > 0.0
    True
    """
    k, n = int(successes), int(trials)
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= trials, got successes={successes}, trials={trials}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n == 0:
        return 0.0, 1.0
    alpha = 1.0 - confidence
    if method == "wilson":
        z = float(stats.norm.ppf(1.0 - alpha / 2.0))
        p = k / n
        denom = 1.0 + z * z / n
        centre = (p + z * z / (2 * n)) / denom
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
        low, high = max(0.0, centre - half), min(1.0, centre + half)
        # Exact ends at the boundaries (the formula gives them only up to rounding).
        return (0.0 if k == 0 else min(low, p)), (1.0 if k == n else max(high, p))
    if method == "clopper_pearson":
        low = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2.0, k, n - k + 1))
        high = 1.0 if k == n else float(stats.beta.ppf(1.0 - alpha / 2.0, k + 1, n - k))
        return low, high
    raise ValueError(f"method must be 'wilson' or 'clopper_pearson', got {method!r}")


def accuracy_estimate(*, correct: int, total: int, confidence: float = 0.95,
                      method: CIMethod = "wilson") -> AccuracyEstimate:
    """Bundle ``correct / total`` with its :func:`binomial_ci` interval."""
    low, high = binomial_ci(correct, total, confidence=confidence, method=method)
    acc = correct / total if total > 0 else float("nan")
    return AccuracyEstimate(correct=int(correct), total=int(total), accuracy=float(acc), ci_low=low,
                            ci_high=high, confidence=float(confidence), method=method)


def check_features(features: Any, *, name: str = "features") -> np.ndarray:
    """Return ``features`` as a finite 2-D float array (n, d), or raise naming the parameter.

    Raises:
        ValueError: if it is not 2-D, is empty, or holds NaN/inf.
    """
    arr = np.asarray(features)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n_examples, n_features), got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} holds NaN or inf values ({int((~np.isfinite(arr)).sum())} entries)")
    return arr


def check_labels(labels: Any, *, n: int, name: str = "labels") -> np.ndarray:
    """Return ``labels`` as a 1-D int64 array of length ``n`` with values >= 0, or raise naming it.

    Raises:
        ValueError: on a wrong shape, a non-integer dtype or negative values.
    """
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must be a 1-D array of length {n}, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(arr == np.round(arr)):
            raise ValueError(f"{name} must hold integer class indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0 (class indices), got minimum {arr.min()}")
    return arr
