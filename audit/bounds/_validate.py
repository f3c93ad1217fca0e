"""Argument checks shared by the ε estimators.

Every check raises :class:`ValueError` (or :class:`TypeError` for a wrong type) whose message names the parameter,
the allowed range and the value received, e.g. ``alpha must be in (0, 1), got 1.5``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "check_alpha",
    "check_delta",
    "check_count",
    "check_counts_le",
    "check_nonnegative",
    "check_int_array",
    "check_scores",
    "check_rate_counts",
    "check_rate_test",
]


def _as_real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def check_alpha(alpha: object, name: str = "alpha") -> float:
    """Return ``alpha`` as a float after checking that it lies in the open interval (0, 1)."""
    a = _as_real(alpha, name)
    if not 0.0 < a < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {alpha!r}")
    return a


def check_delta(delta: object, *, positive: bool = False, name: str = "delta") -> float:
    """Return ``delta`` as a float after checking it lies in [0, 1) (or (0, 1) when ``positive``)."""
    d = _as_real(delta, name)
    if positive:
        if not 0.0 < d < 1.0:
            raise ValueError(f"{name} must be in (0, 1) for this estimator, got {delta!r}")
    elif not 0.0 <= d < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {delta!r}")
    return d


def check_nonnegative(value: object, name: str, *, allow_inf: bool = False) -> float:
    """Return ``value`` as a float after checking it is >= 0 (finite unless ``allow_inf``) and not NaN."""
    v = _as_real(value, name)
    if math.isnan(v) or v < 0.0 or (math.isinf(v) and not allow_inf):
        allowed = "[0, inf]" if allow_inf else "[0, inf)"
        raise ValueError(f"{name} must be in {allowed}, got {value!r}")
    return v


def check_count(value: object, name: str, *, minimum: int = 0) -> int:
    """Return ``value`` as an int after checking it is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v}")
    return v


def check_counts_le(k: int, k_name: str, n: int, n_name: str, *, minimum: int = 0) -> None:
    """Raise when a count ``k`` exceeds its total ``n`` (``minimum`` is only used in the message)."""
    if k > n:
        raise ValueError(f"{k_name} must be in [{minimum}, {n_name}={n}], got {k}")


def check_int_array(values: object, name: str, *, minimum: int = 0) -> np.ndarray:
    """Return ``values`` as a 1-D int64 array after checking every entry is an integer >= ``minimum``."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of integers, got shape {arr.shape}")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if np.any(arr < minimum):
        raise ValueError(f"{name} entries must be >= {minimum}, got min {int(arr.min())}")
    return arr.astype(np.int64)


def check_scores(values: object, name: str) -> np.ndarray:
    """Return ``values`` as a 1-D float64 array of finite scores (non-empty)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D array of scores, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {int(np.sum(~np.isfinite(arr)))} non-finite entries")
    return arr


def check_rate_counts(*, fp: object, n_neg: object, fn: object, n_pos: object) -> tuple[int, int, int, int]:
    """Check error counts of a member/non-member test: ``0 <= fp <= n_neg``, ``0 <= fn <= n_pos``, totals >= 1."""
    fp_i = check_count(fp, "fp")
    fn_i = check_count(fn, "fn")
    n_neg_i = check_count(n_neg, "n_neg", minimum=1)
    n_pos_i = check_count(n_pos, "n_pos", minimum=1)
    check_counts_le(fp_i, "fp", n_neg_i, "n_neg")
    check_counts_le(fn_i, "fn", n_pos_i, "n_pos")
    return fp_i, n_neg_i, fn_i, n_pos_i


def check_rate_test(*, fp: object, n_neg: object, fn: object, n_pos: object, delta: object, alpha: object,
                    positive_delta: bool = False) -> dict[str, int | float]:
    """The checked arguments of a bound from one fixed-threshold test (:func:`check_rate_counts`, then δ, then α),
    as the keyword arguments ``fp, n_neg, fn, n_pos, delta, alpha``.

    >>> check_rate_test(fp=1, n_neg=10, fn=2, n_pos=10, delta=0, alpha=0.05)
    {'fp': 1, 'n_neg': 10, 'fn': 2, 'n_pos': 10, 'delta': 0.0, 'alpha': 0.05}
    """
    fp_i, n_neg_i, fn_i, n_pos_i = check_rate_counts(fp=fp, n_neg=n_neg, fn=fn, n_pos=n_pos)
    return {"fp": fp_i, "n_neg": n_neg_i, "fn": fn_i, "n_pos": n_pos_i,
            "delta": check_delta(delta, positive=positive_delta), "alpha": check_alpha(alpha)}
