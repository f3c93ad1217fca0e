"""How the findings' prose writes a number it quotes: one place for the formats, so a sentence reads the same figure
its table row shows.

>>> mean_pct([0.4, 0.42]), spread_pct([0.601, 0.672]), thousands(1000), words(3)
('41.0', '60.1-67.2', '1,000', 'three')
>>> signed(0.12), plain_p(0.0224), plain_p(0.0004)
('+12.0', 'p = 0.022', 'p < 0.001')
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from experiments.stats import fmt_mean_sd, fmt_p

_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def mean_pct(values: Sequence[float], digits: int = 1) -> str:
    """The mean of accuracies in [0, 1], in percent: ``41.7``."""
    return f"{100 * statistics.mean(values):.{digits}f}"


def ms_pct(values: Sequence[float], digits: int = 1) -> str:
    """Mean ± SD of accuracies in [0, 1], in percent: ``41.7 ± 0.6``."""
    return fmt_mean_sd(values, f".{digits}f", 100)


def ms(values: Sequence[float], fmt: str = ".3f") -> str:
    """Mean ± SD as they are: ``0.096 ± 0.011``; thousands separated for ``,.0f``."""
    return fmt_mean_sd(values, fmt)


def spread_pct(values: Sequence[float], digits: int = 1) -> str:
    """The lowest and highest of accuracies in [0, 1], in percent: ``60.1-67.2``."""
    return f"{100 * min(values):.{digits}f}-{100 * max(values):.{digits}f}"


def spread(values: Sequence[float], fmt: str = ".2f") -> str:
    """The lowest and highest as they are: ``1.39-1.46``."""
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def signed(diff: float, digits: int = 1, scale: float = 100) -> str:
    """A difference in points with its sign: ``+12.0``."""
    return f"{scale * diff:+.{digits}f}"


def points(diff: float, digits: int = 1, scale: float = 100) -> str:
    """A difference's size in points, without its sign: ``1.1``."""
    return f"{abs(scale * diff):.{digits}f}"


def thousands(n: float) -> str:
    """An integer with thousands separated: ``1,000``."""
    return f"{round(n):,}"


def words(n: int) -> str:
    """A small count in words (``three``), a larger one in digits."""
    return _WORDS.get(n, f"{n:,}")


def plain_p(p: float) -> str:
    """``p = 0.022`` / ``p < 0.001``, as the table rows write it."""
    return fmt_p(p)


def p2(p: float) -> str:
    """A p-value to two significant decimals, as prose rounds it: ``p = 0.20``, ``p < 0.001``."""
    return "p < 0.001" if p < 0.001 else f"p = {p:.2f}"
