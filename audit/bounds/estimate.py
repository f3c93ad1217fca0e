"""The result type every empirical-ε estimator returns.

An :class:`EpsilonEstimate` is a one-sided lower confidence bound: with probability at least ``1 - alpha`` over
the audit's randomness, a mechanism that satisfies (ε, δ)-DP with ``delta`` has ε >= ``epsilon_lb``. It carries
the raw counts it was computed from, so anyone can recompute it, and the ``ceiling``: the largest ``epsilon_lb``
the same estimator could have reported with the same numbers of trials and the same α (perfect attack). A
ceiling below a claimed ε means the audit could not have detected a violation of that claim.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

__all__ = ["EpsilonEstimate", "to_plain"]


def to_plain(value: Any) -> Any:
    """Convert numpy scalars/arrays and mappings into plain Python values (for JSON).

    >>> to_plain({"a": np.int64(3), "b": np.array([0.5, 1.0])})
    {'a': 3, 'b': [0.5, 1.0]}
    """
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return [to_plain(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpsilonEstimate:
    """An empirical ε lower bound with everything needed to check it.

    Attributes:
        method: Estimator name: ``"clopper_pearson"``, ``"gdp"``, ``"one_run"`` or ``"one_run_fdp"``.
        epsilon_lb: Lower confidence bound on ε at level ``1 - alpha`` (>= 0; 0 means "no evidence").
        alpha: Significance level (probability that the bound is wrong when the claim holds).
        delta: The δ at which ε is bounded.
        counts: Raw integer counts the bound was computed from (e.g. ``fp``, ``n_neg``, ``r``, ``v``).
        ceiling: Largest ``epsilon_lb`` this estimator could report with the same totals and α.
        assumptions: What the bound assumes beyond (ε, δ)-DP, e.g. ``"Gaussian trade-off curve"``; ``""`` if
            nothing.
        extra: Estimator-specific details (bounds on rates, μ, chosen threshold, α per test, ...).

    >>> e = EpsilonEstimate(method="one_run", epsilon_lb=1.2, alpha=0.05, delta=0.0,
    ...                     counts={"r": 100, "v": 90}, ceiling=3.5)
    >>> e.to_dict()["counts"]
    {'r': 100, 'v': 90}
    """

    method: str
    epsilon_lb: float
    alpha: float
    delta: float
    counts: Mapping[str, int]
    ceiling: float
    assumptions: str = ""
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"method must be a non-empty string, got {self.method!r}")
        for name in ("epsilon_lb", "ceiling"):
            value = float(getattr(self, name))
            if math.isnan(value) or value < 0.0:
                raise ValueError(f"{name} must be in [0, inf], got {value!r}")
            object.__setattr__(self, name, value)
        alpha = float(self.alpha)
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha!r}")
        delta = float(self.delta)
        if not 0.0 <= delta < 1.0:
            raise ValueError(f"delta must be in [0, 1), got {self.delta!r}")
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "delta", delta)
        counts = {str(k): int(v) for k, v in dict(self.counts).items()}
        negative = {k: v for k, v in counts.items() if v < 0}
        if negative:
            raise ValueError(f"counts must be non-negative integers, got {negative}")
        object.__setattr__(self, "counts", MappingProxyType(counts))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dictionary (JSON-ready apart from ``inf``) with every field."""
        return {
            "method": self.method,
            "epsilon_lb": self.epsilon_lb,
            "alpha": self.alpha,
            "delta": self.delta,
            "counts": to_plain(self.counts),
            "ceiling": self.ceiling,
            "assumptions": self.assumptions,
            "extra": to_plain(self.extra),
        }
