"""Fixed-precision number formatting shared by every report renderer.

The report shows each number from the JSON files through exactly one of these functions, so the HTML, the
Markdown and ``report.json`` agree, and a test can recompute the string from the JSON value:

=========================  =================  ==============
quantity                   function           example
=========================  =================  ==============
AUC, TPR, FPR, accuracy    :func:`prob`       ``0.1234``
epsilon, ceiling           :func:`eps`        ``2.345``, ``∞``
delta                      :func:`sci`        ``1.00e-05``
sigma, q, C, alpha, ratio  :func:`num`        ``1.1``, ``0.004``
counts                     :func:`count`      ``12,345``
=========================  =================  ==============

Missing values print as ``—`` and NaN as ``n/a``; a text in place of a number (a TPR the ROC cannot resolve,
:func:`attacks.resolution.not_resolvable`) prints as it is.

>>> prob(0.123456), eps(float("inf")), sci(1e-5), num(0.00390625), count(12345), ci(0.1, 0.25)
('0.1235', '∞', '1.00e-05', '0.003906', '12,345', '[0.1000, 0.2500]')
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["MISSING", "prob", "pct", "eps", "sci", "num", "count", "ci", "fpr_label"]

MISSING = "—"


def _number(spec: str, doc: str, *, scale: float = 1.0, suffix: str = "") -> Callable[[float | int | str | None], str]:
    """A formatter ``f"{scale * x:{spec}}{suffix}"`` for finite numbers; ``None`` -> ``—``, NaN -> ``n/a``,
    ±inf -> ``±∞``, and a string (an already formatted value) is returned as it is."""

    def fmt(x: float | int | str | None) -> str:
        if x is None:
            return MISSING
        if isinstance(x, str):
            return x
        x = float(x)
        if math.isnan(x):
            return "n/a"
        if math.isinf(x):
            return "∞" if x > 0 else "−∞"
        return f"{scale * x:{spec}}{suffix}"

    fmt.__doc__ = doc
    return fmt


prob = _number(".4f", "A probability-like quantity (AUC, TPR, accuracy) with 4 decimals.")
pct = _number(".2f", "A probability as a percentage with 2 decimals (used only in prose, next to :func:`prob`).",
              scale=100.0, suffix="%")
eps = _number(".3f", "An epsilon (claimed, lower bound or ceiling) with 3 decimals.")
sci = _number(".2e", "A small probability such as delta in scientific notation with 3 significant digits.")
num = _number(".4g", "A parameter (sigma, q, C, alpha, a ratio) with 4 significant digits.")


def count(x: int | float | None) -> str:
    """An integer count with thousands separators."""
    if x is None:
        return MISSING
    if isinstance(x, float) and not x.is_integer():
        return num(x)
    return f"{int(x):,}"


def ci(lo: float | None, hi: float | None, fmt: Callable[[float | None], str] = prob) -> str:
    """A confidence interval ``[lo, hi]``; ``—`` when either end is missing."""
    if lo is None or hi is None:
        return MISSING
    return f"[{fmt(lo)}, {fmt(hi)}]"


def fpr_label(fpr: float) -> str:
    """An FPR level as a percentage label: 0.001 -> ``0.1%``.

    >>> fpr_label(0.001), fpr_label(0.01), fpr_label(0.0001)
    ('0.1%', '1%', '0.01%')
    """
    return f"{100.0 * fpr:.10g}%"
