"""δ conventions (the default δ for n examples, warnings about a chosen δ) and steps per epoch."""

from __future__ import annotations

import math
import numbers

from training.accounting.epsilon import check_delta_value
from foundation.errors import UserError

__all__ = ["default_delta", "check_delta", "steps_for_epochs"]


def default_delta(n: int) -> float:
    """The default δ for ``n`` private examples: the largest 10^-k that is ≤ 1/(10 n).

    δ must be well below 1/n: a mechanism that publishes one random example outright satisfies
    (0, 1/n)-DP. One tenth of 1/n, rounded down to a power of ten, is the usual convention.

    Args:
        n: number of examples that the guarantee protects (the members); ≥ 1.

    Returns:
        δ = 10^-k with k = ⌈log10(10 n)⌉ (computed in exact integer arithmetic).

    Raises:
        UserError: if ``n`` < 1.

    >>> default_delta(1000), default_delta(1001), default_delta(60_000)
    (0.0001, 1e-05, 1e-06)
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise UserError(f"the number of examples must be an integer >= 1 to choose delta, got {n!r}")
    m = 10 * int(n)
    k = len(str(m - 1))  # smallest k with 10^k >= m
    return float(f"1e-{k}")


def check_delta(delta: float, n: int) -> list[str]:
    """Warnings about ``delta`` for a dataset of ``n`` private examples (empty list: nothing to say).

    Args:
        delta: δ in (0, 1).
        n: number of protected examples; ≥ 1.

    Returns:
        One-line warnings: δ ≥ 1/n permits leaking an example outright; δ > 1/(10 n) is looser than the
        convention of :func:`default_delta`.

    Raises:
        UserError: if δ or ``n`` is out of range.

    >>> check_delta(1e-5, 1000)
    []
    >>> len(check_delta(0.01, 1000))
    1
    """
    delta = check_delta_value(delta)
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise UserError(f"the number of examples must be an integer >= 1, got {n!r}")
    if delta >= 1.0 / n:
        return [f"delta={delta:g} >= 1/n={1.0 / n:.3g}: a mechanism that publishes one random example satisfies "
                f"this guarantee; use delta << 1/n (default for n={n}: {default_delta(int(n)):g})"]
    if delta > 1.0 / (10 * n):
        return [f"delta={delta:g} > 1/(10 n)={1.0 / (10 * n):.3g}: looser than the usual convention "
                f"(default for n={n}: {default_delta(int(n)):g})"]
    return []


def steps_for_epochs(*, epochs: float, sample_rate: float) -> int:
    """Number of steps that make ``epochs`` passes in expectation: ⌈epochs / q⌉.

    Args:
        epochs: > 0.
        sample_rate: q in (0, 1].

    Returns:
        T ≥ 1.

    Raises:
        UserError: if an argument is out of range.

    >>> steps_for_epochs(epochs=2, sample_rate=256 / 50_000)
    391
    """
    if isinstance(epochs, bool) or not isinstance(epochs, numbers.Real) or not (math.isfinite(epochs) and epochs > 0):
        raise UserError(f"epochs must be a finite number > 0, got {epochs!r}")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real) or not 0.0 < sample_rate <= 1.0:
        raise UserError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    return max(1, math.ceil(epochs / sample_rate - 1e-9))
