"""Which TPR-at-FPR figures a ROC can resolve, and how every table writes the ones it cannot.

With ``N`` non-members the attainable false-positive rates are ``j / N``: the smallest non-zero FPR is
``1 / N``. A TPR "at FPR t" for ``t < 1 / N`` is the TPR at zero false positives, a different quantity whose
value says nothing about the rate ``t`` (a 0.01 % FPR needs at least 10,000 non-members). Every table and report
of this package writes such a figure as :func:`not_resolvable` instead of a number; ``attack.json`` keeps the
raw value beside ``n_nonmembers`` so that the rule can always be re-applied.

>>> resolvable(0.001, 1_000), resolvable(0.0001, 1_000)
(True, False)
>>> format_tpr(0.25, 0.0001, 690)
'not resolvable with 690 non-members'
>>> format_tpr(0.25, 0.01, 690)
'25.0%'
"""

from __future__ import annotations

import math

__all__ = ["resolvable", "not_resolvable", "format_tpr", "min_resolvable_fpr"]

_SLACK = 1e-9


def min_resolvable_fpr(n_nonmembers: int) -> float:
    """``1 / n_nonmembers``: the smallest FPR level a ROC over that many non-members resolves (inf for 0)."""
    return math.inf if n_nonmembers <= 0 else 1.0 / n_nonmembers


def resolvable(fpr: float, n_nonmembers: int) -> bool:
    """Whether TPR at ``fpr`` is resolvable with ``n_nonmembers`` non-members (``fpr >= 1 / n_nonmembers``)."""
    return float(fpr) * int(n_nonmembers) >= 1.0 - _SLACK


def not_resolvable(n_nonmembers: int) -> str:
    """The text that replaces a TPR no table may print as a number."""
    return f"not resolvable with {int(n_nonmembers):,} non-members"


def format_tpr(tpr: float | None, fpr: float, n_nonmembers: int, *, digits: int = 1,
               interval: tuple[float, float] | None = None) -> str:
    """``tpr`` as a percentage (with ``[lo, hi]`` when ``interval`` is given), or :func:`not_resolvable`.

    >>> format_tpr(0.034, 0.001, 2_000, interval=(0.01, 0.05))
    '3.4% [1.0%, 5.0%]'
    """
    if not resolvable(fpr, n_nonmembers):
        return not_resolvable(n_nonmembers)
    if tpr is None or (isinstance(tpr, float) and math.isnan(tpr)):
        return "n/a"
    text = f"{100 * tpr:.{digits}f}%"
    if interval is not None:
        text += f" [{100 * interval[0]:.{digits}f}%, {100 * interval[1]:.{digits}f}%]"
    return text
