"""The ε curve logged while training: :class:`RdpCurve`, the stateful part of accounting.

The claim itself is computed once, at the end, by the configured accountant
(:func:`training.accounting.epsilon_for`). During training the logger wants ε after every few steps; RDP
composes by adding RDP vectors, linear in the steps, so one RDP evaluation per (σ, q) — cached here — serves
every step of every phase.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RdpCurve"]


class RdpCurve:
    """ε spent by DP phases given as (σ, q, steps), with the one-step RDP vector of each (σ, q) cached.

    Args:
        delta: δ of the curve, in (0, 1).

    >>> curve = RdpCurve(delta=1e-5)
    >>> curve([(1.0, 0.01, 500), (1.0, 0.01, 500)]) == curve([(1.0, 0.01, 1000)])
    True
    >>> curve([(0.0, 0.01, 1)])
    inf
    """

    ORDERS = tuple([1 + x / 4.0 for x in range(1, 40)] + list(range(11, 64)) + [128, 256])

    def __init__(self, *, delta: float) -> None:
        if not 0.0 < float(delta) < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self._delta = float(delta)
        self._one_step: dict[tuple[float, float], np.ndarray] = {}

    def _rdp1(self, sigma: float, q: float) -> np.ndarray:
        from opacus.accountants.analysis.rdp import compute_rdp

        key = (float(sigma), float(q))
        if key not in self._one_step:
            self._one_step[key] = np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=1,
                                                         orders=list(self.ORDERS)))
        return self._one_step[key]

    def __call__(self, phases: list[tuple[float, float, int]]) -> float:
        """ε at the curve's δ after the phases ``[(σ, q, steps), ...]`` (0 for none, inf when some σ ≤ 0)."""
        from opacus.accountants.analysis.rdp import get_privacy_spent

        active = [(s, q, t) for s, q, t in phases if t > 0]
        if not active:
            return 0.0
        if any(s <= 0 for s, _, _ in active):
            return float("inf")
        rdp = sum(self._rdp1(s, q) * t for s, q, t in active)
        eps, _ = get_privacy_spent(orders=list(self.ORDERS), rdp=rdp, delta=self._delta)
        return float(eps)
