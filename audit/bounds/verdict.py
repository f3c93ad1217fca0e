"""Scoring empirical ε lower bounds against the ε a checkpoint claims.

Every :class:`~audit.bounds.estimate.EpsilonEstimate` is already a lower confidence bound (level ``1 - alpha``),
so the verdict is ``VIOLATION`` only when some ``epsilon_lb`` is strictly greater than the claimed ε. With several
estimates the chance that at least one is wrong is at most the sum of their α (union bound); the verdict reports
``confidence = 1 - Σα`` for that reason. Otherwise the claim is ``CONSISTENT`` with the evidence, which is not
evidence that it is tight: ``tightness = ε_lb / ε`` says how much of the claim the audit could certify, and when
even the best possible result (the largest ``ceiling``) is below the claim, the audit could not have detected a
violation at all and the verdict says so. A non-DP checkpoint (claimed ε = inf) gets ``NO_CLAIM``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Literal

from audit.bounds._validate import check_delta, check_nonnegative
from audit.bounds.estimate import EpsilonEstimate
from foundation.result_json import Real, ResultModel

__all__ = ["VerdictStatus", "Finding", "Verdict", "verdict"]


class VerdictStatus(enum.StrEnum):
    """Outcome of comparing ε lower bounds with a claim."""

    VIOLATION = "VIOLATION"
    CONSISTENT = "CONSISTENT"
    NO_CLAIM = "NO_CLAIM"


class Finding(ResultModel):
    """A problem with the claim found by a check other than an ε lower bound.

    Attributes:
        kind: what was checked, a stable identifier (e.g. ``"claim_not_from_mechanism"``).
        severity: ``"error"``: the claim cannot stand as stated; ``"warning"``: it stands with a caveat.
        message: one line for the reader, with the numbers behind it.
    """

    kind: str
    severity: Literal["error", "warning"]
    message: str


class Verdict(ResultModel):
    """The one verdict type: :func:`verdict` returns it and it is the ``verdict`` block of ``epsilon.json``.

    Attributes:
        status: ``VIOLATION``, ``CONSISTENT`` or ``NO_CLAIM``.
        claimed_epsilon: The ε the checkpoint claims (``inf`` for no DP claim).
        claimed_delta: The δ of the claim, when given.
        best_epsilon_lb: The largest ``ε_lb`` among the deciding estimates (0 without any).
        best_method: Method with the largest ``ε_lb`` (first on ties); None without estimates.
        best_source: The evidence source of that estimate, when the caller knows it.
        tightness: ``best_epsilon_lb / claimed ε`` (``None`` when the claim is 0 or inf).
        inconclusive_above: ``max_ceiling`` when the verdict is ``CONSISTENT`` and ``max_ceiling < claimed ε`` (no
            violation of the claim could have been detected), else ``None``.
        confidence: ``max(0, 1 - Σ alpha)``: probability that no estimate overstates ε.
        max_ceiling: Largest ceiling among the estimates.
        violating: Methods whose ``ε_lb`` exceeds the claim, in input order.
        notes: Human-readable remarks (inconclusiveness, assumptions, δ mismatches).
        findings: Problems with the claim found by other checks (:class:`Finding`); an ``error`` finding means
            the claim does not stand whatever the bounds say.
    """

    status: VerdictStatus
    claimed_epsilon: Real
    claimed_delta: Real | None
    best_epsilon_lb: Real
    best_method: str | None
    best_source: str | None
    tightness: Real | None
    inconclusive_above: Real | None
    confidence: Real
    max_ceiling: Real
    violating: tuple[str, ...]
    notes: tuple[str, ...]
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> tuple[Finding, ...]:
        """The findings of severity ``error``."""
        return tuple(f for f in self.findings if f.severity == "error")

    def with_findings(self, *findings: Finding) -> Verdict:
        """This verdict with ``findings`` appended.

        >>> v = Verdict.no_evidence(claimed_epsilon=1.0, claimed_delta=1e-5, reason="no source")
        >>> v.with_findings(Finding(kind="k", severity="error", message="m")).errors[0].kind
        'k'
        """
        return self.model_copy(update={"findings": self.findings + tuple(findings)})

    @classmethod
    def no_evidence(cls, *, claimed_epsilon: float, claimed_delta: float | None, reason: str,
                    notes: Sequence[str] = ()) -> Verdict:
        """The verdict when no bound decides: ``CONSISTENT`` (``NO_CLAIM`` for ε = inf) and inconclusive at 0."""
        claim = check_nonnegative(claimed_epsilon, "claimed_epsilon", allow_inf=True)
        finite = math.isfinite(claim)
        return cls(status=VerdictStatus.CONSISTENT if finite else VerdictStatus.NO_CLAIM, claimed_epsilon=claim,
                   claimed_delta=claimed_delta, best_epsilon_lb=0.0, best_method=None, best_source=None,
                   tightness=0.0 if finite and claim > 0 else None, inconclusive_above=0.0 if finite else None,
                   confidence=1.0, max_ceiling=0.0, violating=(), findings=(),
                   notes=(f"no evidence: {reason}, so no violation could have been detected", *notes))


def verdict(
    *,
    claimed_epsilon: float,
    estimates: Sequence[EpsilonEstimate],
    claimed_delta: float | None = None,
    sources: Sequence[str] | None = None,
) -> Verdict:
    """Compare ε lower bounds with a claimed ε.

    Args:
        claimed_epsilon: The claimed ε, in [0, inf] (``inf`` = no DP claim).
        estimates: At least one estimate; all should bound ε at the claim's δ.
        claimed_delta: The claim's δ in [0, 1); when given, every estimate's δ must equal it.
        sources: the evidence source of each estimate, when known (one per estimate); the verdict records the
            best one's.

    Returns:
        A :class:`Verdict`: ``VIOLATION`` iff some ``ε_lb > claimed_epsilon`` (finite claim), ``NO_CLAIM`` for an
        infinite claim, else ``CONSISTENT``.

    Raises:
        ValueError: If ``estimates`` is empty, ``claimed_epsilon`` is negative or NaN, or an estimate's δ differs
            from ``claimed_delta``.
        TypeError: If an element of ``estimates`` is not an :class:`EpsilonEstimate`.

    >>> from audit.bounds.estimate import EpsilonEstimate
    >>> e = EpsilonEstimate(method="one_run", epsilon_lb=2.5, alpha=0.05, delta=1e-5, counts={}, ceiling=6.0)
    >>> v = verdict(claimed_epsilon=2.0, estimates=[e])
    >>> str(v.status), v.tightness, v.violating
    ('VIOLATION', 1.25, ('one_run',))
    """
    claim = check_nonnegative(claimed_epsilon, "claimed_epsilon", allow_inf=True)
    if claimed_delta is not None:
        claimed_delta = check_delta(claimed_delta, name="claimed_delta")
    ests = tuple(estimates)
    if not ests:
        raise ValueError("estimates must hold at least one EpsilonEstimate, got an empty sequence")
    if sources is not None and len(sources) != len(ests):
        raise ValueError(f"sources must name one source per estimate: {len(sources)} for {len(ests)} estimates")
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
        best_epsilon_lb=float(best_e.epsilon_lb),
        best_method=best_e.method,
        best_source=None if sources is None else str(sources[best]),
        tightness=tightness[best],
        inconclusive_above=inconclusive_above,
        confidence=confidence,
        max_ceiling=float(max_ceiling),
        violating=violating,
        notes=tuple(notes),
        findings=(),
    )
