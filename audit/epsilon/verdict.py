"""Scoring empirical ε lower bounds against the ε a checkpoint claims.

Every :class:`~audit.epsilon.estimate.EpsilonEstimate` is already a lower confidence bound (level ``1 - alpha``),
so the verdict is ``VIOLATION`` only when some ``epsilon_lb`` is strictly greater than the claimed ε. With several
estimates the chance that at least one is wrong is at most the sum of their α (union bound); the verdict reports
``confidence = 1 - Σα`` for that reason. Otherwise the claim is ``CONSISTENT`` with the evidence, which is not
evidence that it is tight: ``tightness = ε_lb / ε`` says how much of the claim the audit could certify, and when
even the best possible result (the largest ``ceiling``) is below the claim, the audit could not have detected a
violation at all and the verdict says so. A non-DP checkpoint (claimed ε = inf) gets ``NO_CLAIM``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from typing import Any

from audit.epsilon._validate import check_delta, check_nonnegative
from audit.epsilon.estimate import EpsilonEstimate

__all__ = ["VerdictStatus", "Verdict", "verdict"]


class VerdictStatus(enum.StrEnum):
    """Outcome of comparing ε lower bounds with a claim."""

    VIOLATION = "VIOLATION"
    CONSISTENT = "CONSISTENT"
    NO_CLAIM = "NO_CLAIM"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """The verdict and the numbers behind it.

    Attributes:
        status: ``VIOLATION``, ``CONSISTENT`` or ``NO_CLAIM``.
        claimed_epsilon: The ε the checkpoint claims (``inf`` for no DP claim).
        claimed_delta: The δ of the claim, when given.
        estimates: The estimates judged, in input order.
        tightness_by_estimate: ``ε_lb / claimed ε`` per estimate (``None`` when the claim is 0 or inf).
        violating: Methods whose ``ε_lb`` exceeds the claim.
        best_method: Method with the largest ``ε_lb`` (first on ties).
        best_epsilon_lb: That largest ``ε_lb``.
        tightness: ``best_epsilon_lb / claimed ε`` (``None`` when the claim is 0 or inf).
        max_ceiling: Largest ceiling among the estimates.
        inconclusive_above: ``max_ceiling`` when the verdict is ``CONSISTENT`` and ``max_ceiling < claimed ε`` (no
            violation of the claim could have been detected), else ``None``.
        confidence: ``max(0, 1 - Σ alpha)``: probability that no estimate overstates ε.
        notes: Human-readable remarks (inconclusiveness, assumptions, δ mismatches).
    """

    status: VerdictStatus
    claimed_epsilon: float
    claimed_delta: float | None
    estimates: tuple[EpsilonEstimate, ...]
    tightness_by_estimate: tuple[float | None, ...]
    violating: tuple[str, ...]
    best_method: str
    best_epsilon_lb: float
    tightness: float | None
    max_ceiling: float
    inconclusive_above: float | None
    confidence: float
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dictionary (the ``verdict`` block of ``epsilon.json``).

        The estimates themselves are not repeated; ``per_estimate`` lists, in input order, each one's method,
        ``epsilon_lb``, ``ceiling``, ``tightness`` and whether it exceeds the claim.
        """
        return {
            "status": str(self.status),
            "claimed_epsilon": self.claimed_epsilon,
            "claimed_delta": self.claimed_delta,
            "best_method": self.best_method,
            "best_epsilon_lb": self.best_epsilon_lb,
            "tightness": self.tightness,
            "max_ceiling": self.max_ceiling,
            "inconclusive_above": self.inconclusive_above,
            "confidence": self.confidence,
            "violating": list(self.violating),
            "per_estimate": [
                {"method": e.method, "epsilon_lb": e.epsilon_lb, "ceiling": e.ceiling, "tightness": t,
                 "exceeds_claim": math.isfinite(self.claimed_epsilon) and e.epsilon_lb > self.claimed_epsilon}
                for e, t in zip(self.estimates, self.tightness_by_estimate, strict=True)
            ],
            "notes": list(self.notes),
        }


def verdict(
    *,
    claimed_epsilon: float,
    estimates: Sequence[EpsilonEstimate],
    claimed_delta: float | None = None,
) -> Verdict:
    """Compare ε lower bounds with a claimed ε.

    Args:
        claimed_epsilon: The claimed ε, in [0, inf] (``inf`` = no DP claim).
        estimates: At least one estimate; all should bound ε at the claim's δ.
        claimed_delta: The claim's δ in [0, 1); when given, every estimate's δ must equal it.

    Returns:
        A :class:`Verdict`: ``VIOLATION`` iff some ``ε_lb > claimed_epsilon`` (finite claim), ``NO_CLAIM`` for an
        infinite claim, else ``CONSISTENT``.

    Raises:
        ValueError: If ``estimates`` is empty, ``claimed_epsilon`` is negative or NaN, or an estimate's δ differs
            from ``claimed_delta``.
        TypeError: If an element of ``estimates`` is not an :class:`EpsilonEstimate`.

    >>> from audit.epsilon.estimate import EpsilonEstimate
    >>> e = EpsilonEstimate(method="one_run", epsilon_lb=2.5, alpha=0.05, delta=1e-5, counts={}, ceiling=6.0)
    >>> v = verdict(claimed_epsilon=2.0, estimates=[e])
    >>> str(v.status), v.tightness
    ('VIOLATION', 1.25)
    """
    claim = check_nonnegative(claimed_epsilon, "claimed_epsilon", allow_inf=True)
    if claimed_delta is not None:
        claimed_delta = check_delta(claimed_delta, name="claimed_delta")
    ests = tuple(estimates)
    if not ests:
        raise ValueError("estimates must hold at least one EpsilonEstimate, got an empty sequence")
    for k, e in enumerate(ests):
        if not isinstance(e, EpsilonEstimate):
            raise TypeError(f"estimates[{k}] must be an EpsilonEstimate, got {type(e).__name__}")
        if claimed_delta is not None and not math.isclose(e.delta, claimed_delta, rel_tol=1e-9, abs_tol=0.0):
            raise ValueError(f"estimates[{k}] ({e.method}) bounds ε at delta={e.delta}, but claimed_delta="
                             f"{claimed_delta}; compute every estimate at the claim's δ")

    finite = math.isfinite(claim)
    tightness = tuple(e.epsilon_lb / claim if finite and claim > 0 else None for e in ests)
    best = max(range(len(ests)), key=lambda k: (ests[k].epsilon_lb, -k))
    violating = tuple(e.method for e in ests if finite and e.epsilon_lb > claim)
    max_ceiling = max(e.ceiling for e in ests)
    confidence = max(0.0, 1.0 - sum(e.alpha for e in ests))

    notes: list[str] = []
    inconclusive_above = None
    if not finite:
        status = VerdictStatus.NO_CLAIM
        notes.append("no DP claim (claimed ε = inf): the bounds are reported for information")
    elif violating:
        status = VerdictStatus.VIOLATION
        for e in ests:
            if e.epsilon_lb > claim:
                notes.append(f"{e.method}: ε_lb = {e.epsilon_lb:.4g} > claimed ε = {claim:.4g} "
                             f"(lower bound at confidence {1 - e.alpha:.4g})")
    else:
        status = VerdictStatus.CONSISTENT
        if max_ceiling < claim:
            inconclusive_above = max_ceiling
            notes.append(f"inconclusive for violations above {max_ceiling:.4g}: the largest ε_lb these estimators "
                         f"could report with these counts and α is {max_ceiling:.4g} < claimed ε = {claim:.4g}, "
                         "so a violation of the claim could not have been detected")
    if len(ests) > 1:
        notes.append(f"{len(ests)} estimates: the chance that any bound overstates ε is at most Σα = "
                     f"{sum(e.alpha for e in ests):.4g}")
    for e in ests:
        if e.assumptions:
            notes.append(f"{e.method} assumes: {e.assumptions}")
    deltas = sorted({e.delta for e in ests})
    if claimed_delta is None and len(deltas) > 1:
        notes.append(f"estimates bound ε at different δ: {deltas}")
    best_e = ests[best]
    return Verdict(
        status=status,
        claimed_epsilon=claim,
        claimed_delta=claimed_delta,
        estimates=ests,
        tightness_by_estimate=tightness,
        violating=violating,
        best_method=best_e.method,
        best_epsilon_lb=best_e.epsilon_lb,
        tightness=tightness[best],
        max_ceiling=max_ceiling,
        inconclusive_above=inconclusive_above,
        confidence=confidence,
        notes=tuple(notes),
    )
