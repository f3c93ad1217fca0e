"""ε of a composition of DP-SGD phases under one accountant (PRV, RDP, PLD), and the cross-check.

Pure functions over numbers; see :mod:`training.accounting` for the accountants and their references.

>>> round(epsilon_for(phases=[DPPhase(noise_multiplier=1.0, sample_rate=0.01, steps=1000)],
...                   delta=1e-5, accountant="rdp"), 3)
2.101
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from foundation.errors import UserError

__all__ = [
    "ACCOUNTANTS",
    "WEAK_PRIVACY_EPSILON",
    "PLD_DISCRETIZATION",
    "PRV_EPS_ERROR",
    "RDP_ORDERS",
    "DPPhase",
    "epsilon_for",
    "epsilons_for",
    "cross_check",
    "check_delta_value",
    "check_accountant",
    "epsilon_of_active",
]

ACCOUNTANTS: tuple[str, ...] = ("prv", "rdp", "pld")
#: Above this RDP ε, "prv" and "pld" fall back to the (valid, looser) RDP bound; see :mod:`training.accounting`.
WEAK_PRIVACY_EPSILON = 50.0
#: Discretisation interval of the PLD accountant (privacy-loss units); smaller is tighter and slower.
PLD_DISCRETIZATION = 1e-4
#: Acceptable ε error of the PRV accountant (its result is the certified upper bound).
PRV_EPS_ERROR = 0.01
#: RDP orders searched: Opacus's default grid widened at both ends (a wider grid can only tighten the bound).
RDP_ORDERS: tuple[float, ...] = (
    tuple(1 + x / 100.0 for x in range(1, 10))
    + tuple(1 + x / 10.0 for x in range(1, 100))
    + tuple(float(a) for a in range(12, 64))
    + (80.0, 96.0, 128.0, 192.0, 256.0, 512.0, 1024.0)
)


@dataclass(frozen=True)
class DPPhase:
    """One DP phase: T steps of the Poisson-subsampled Gaussian mechanism.

    ``DPPhase(sigma, q, steps)`` or with keywords.

    Args:
        noise_multiplier: σ, the noise standard deviation divided by the clipping norm; > 0.
        sample_rate: q, the probability that each example is in a step's batch; in (0, 1].
        steps: T, the number of steps; ≥ 0 (a phase of 0 steps costs nothing).

    Raises:
        UserError: if a value is out of range.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        sigma, q, steps = self.noise_multiplier, self.sample_rate, self.steps
        if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not math.isfinite(sigma) or sigma <= 0:
            raise UserError(f"noise_multiplier must be a finite number > 0, got {sigma!r}")
        if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 < q <= 1.0:
            raise UserError(f"sample_rate must be in (0, 1], got {q!r}")
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
            raise UserError(f"steps must be an integer >= 0, got {steps!r}")
        object.__setattr__(self, "noise_multiplier", float(sigma))
        object.__setattr__(self, "sample_rate", float(q))
        object.__setattr__(self, "steps", int(steps))


# --------------------------------------------------------------------------------------------- validation


def check_delta_value(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
        raise UserError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise UserError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {accountant!r}")
    return accountant


def _check_phases(phases: Sequence[DPPhase]) -> list[DPPhase]:
    if isinstance(phases, DPPhase) or not isinstance(phases, Sequence):
        raise UserError(f"phases must be a sequence of DPPhase, got {type(phases).__name__}")
    for p in phases:
        if not isinstance(p, DPPhase):
            raise UserError(f"phases must hold DPPhase objects, got {type(p).__name__}")
    return [p for p in phases if p.steps > 0]


# -------------------------------------------------------------------------------------------- accountants


def _rdp_epsilon(phases: list[DPPhase], delta: float) -> float:
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(p.noise_multiplier, p.sample_rate, p.steps) for p in phases]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "optimal order is the largest alpha": the grid is wide
        return float(acc.get_epsilon(delta=delta, alphas=RDP_ORDERS))


def _prv_epsilon(phases: list[DPPhase], delta: float) -> float:
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = [(p.noise_multiplier, p.sample_rate, p.steps) for p in phases]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(acc.get_epsilon(delta=delta, eps_error=PRV_EPS_ERROR))


def _pld_epsilon(phases: list[DPPhase], delta: float) -> float:
    import dp_accounting
    from dp_accounting import pld

    acc = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    for p in phases:
        event = dp_accounting.PoissonSampledDpEvent(p.sample_rate, dp_accounting.GaussianDpEvent(p.noise_multiplier))
        acc.compose(dp_accounting.SelfComposedDpEvent(event, p.steps))
    return float(acc.get_epsilon(delta))


_EPSILON_FNS: dict[str, Callable[[list[DPPhase], float], float]] = {
    "prv": _prv_epsilon,
    "rdp": _rdp_epsilon,
    "pld": _pld_epsilon,
}


@functools.lru_cache(maxsize=1024)
def _accountant_epsilon(accountant: str, phases: tuple[DPPhase, ...], delta: float) -> float:
    """One accountant's ε of validated phases, computed once per process: the accountants are pure and slow (a PRV
    or PLD composition takes 0.1-2 s), and one claim is recomputed by the trainer's cross-check, the claim check,
    the report and the gate."""
    return _EPSILON_FNS[accountant](list(phases), delta)


def epsilon_for(*, phases: Sequence[DPPhase], delta: float, accountant: str = "prv") -> float:
    """ε of the composition of ``phases`` at ``delta`` (add/remove-one neighbours).

    Args:
        phases: the DP phases of the run, in any order (composition is commutative).
        delta: δ in (0, 1).
        accountant: ``"prv"``, ``"rdp"`` or ``"pld"``.

    Returns:
        ε ≥ 0 (0.0 when no phase has steps). For very weak privacy "prv" and "pld" return the RDP bound
        (see :data:`WEAK_PRIVACY_EPSILON`).

    Raises:
        UserError: if δ, the accountant name or a phase is invalid.

    >>> p = DPPhase(noise_multiplier=2.0, sample_rate=0.1, steps=50)
    >>> epsilon_for(phases=[p, p], delta=1e-5, accountant="rdp") == epsilon_for(
    ...     phases=[DPPhase(noise_multiplier=2.0, sample_rate=0.1, steps=100)], delta=1e-5, accountant="rdp")
    True
    """
    delta = check_delta_value(delta)
    check_accountant(accountant)
    return epsilon_of_active(_check_phases(phases), delta, accountant, warn=True)


def epsilon_of_active(active: list[DPPhase], delta: float, accountant: str, *, warn: bool) -> float:
    """ε of validated, non-empty-step phases, with the weak-privacy fallback to RDP; never below 0 (at a large δ
    the PRV/PLD conversion can return ε < 0, which means ε = 0 already holds)."""
    if not active:
        return 0.0
    rdp = max(0.0, _accountant_epsilon("rdp", tuple(active), delta))
    if accountant == "rdp":
        return rdp
    if rdp > WEAK_PRIVACY_EPSILON:
        if warn:
            warnings.warn(
                f"RDP epsilon is {rdp:.3g} > {WEAK_PRIVACY_EPSILON:g}: the {accountant} accountant is impractical "
                "at such weak privacy; returning the RDP upper bound instead",
                RuntimeWarning,
                stacklevel=3,
            )
        return rdp
    return max(0.0, _accountant_epsilon(accountant, tuple(active), delta))


def epsilons_for(*, phases: Sequence[DPPhase], delta: float,
                 accountants: Sequence[str] = ACCOUNTANTS) -> dict[str, float]:
    """ε of ``phases`` under each accountant in ``accountants`` (a table for reports and the CLI).

    Args:
        phases: the DP phases of the run.
        delta: δ in (0, 1).
        accountants: names from :data:`ACCOUNTANTS`.

    Returns:
        ``{accountant: ε}`` in the order given.

    Raises:
        UserError: as :func:`epsilon_for`.
    """
    return {a: epsilon_for(phases=phases, delta=delta, accountant=a) for a in accountants}


def cross_check(*, phases: Sequence[DPPhase], delta: float, accountant: str) -> dict[str, float | str]:
    """The claimed ε and the same ε recomputed by a second accountant (PLD; PRV when the claim used PLD).

    Args:
        phases: the DP phases of the run.
        delta: δ in (0, 1).
        accountant: the accountant the claim is made with.

    Returns:
        ``{"accountant": accountant, "epsilon": claimed ε, "reference_accountant": "pld" (or "prv"),
        "reference_epsilon": its ε, "epsilon_pld": the PLD ε (= the claim when it used PLD),
        "relative_difference": (claimed − reference) / reference}`` (0.0 when both are 0). A positive
        difference means the claim is the more conservative number; RDP claims typically exceed PLD by
        5–20%, PRV claims agree with PLD to about 1%.

    Raises:
        UserError: as :func:`epsilon_for`.
    """
    claimed = epsilon_for(phases=phases, delta=delta, accountant=accountant)
    reference = "prv" if accountant == "pld" else "pld"
    other = epsilon_for(phases=phases, delta=delta, accountant=reference)
    rel = 0.0 if other == claimed else ((claimed - other) / other if other > 0 else float("inf"))
    return {
        "accountant": accountant,
        "epsilon": claimed,
        "reference_accountant": reference,
        "reference_epsilon": other,
        "epsilon_pld": claimed if accountant == "pld" else other,
        "relative_difference": rel,
    }
