"""Privacy accounting for DP-SGD: ε from (σ, q, T, δ), σ from a target ε, and cross-checks.

A DP-SGD run is a sequence of *phases*; each phase applies the Poisson-subsampled Gaussian mechanism
(noise multiplier σ, sample rate q) for T steps, under the add/remove-one neighbouring relation. Phases
compose, so the ε of a run is the ε of the composition of all its DP phases (non-DP phases on public data
cost nothing and are not listed).

Three accountants are offered:

* ``"prv"``: numerical composition of privacy-loss random variables (Gopi, Lee and Wutschitz, "Numerical
  Composition of Differential Privacy", NeurIPS 2021), via Opacus; returns the certified upper bound
  (``eps_upper``, ε error 0.01). The default for claims.
* ``"rdp"``: Rényi DP (Mironov, "Rényi Differential Privacy", CSF 2017; Mironov, Talwar and Zhang 2019 for
  the subsampled Gaussian), via Opacus. A valid but looser upper bound (RDP ε ≥ PLD ε).
* ``"pld"``: privacy-loss distributions (Koskela et al. 2020; Doroshenko et al., "Connect the Dots", PETS
  2022), via Google's ``dp_accounting`` with pessimistic discretisation. Used to cross-check a claim made
  with another accountant.

For very weak privacy (RDP ε above :data:`WEAK_PRIVACY_EPSILON`) the discretised PRV and PLD accountants
become impractically slow (minutes) and may return ``inf``; there the RDP bound, which is still a valid
upper bound, is returned instead and a :class:`RuntimeWarning` says so.

>>> round(epsilon_for(phases=[DPPhase(noise_multiplier=1.0, sample_rate=0.01, steps=1000)],
...                   delta=1e-5, accountant="rdp"), 3)
2.101
>>> default_delta(50_000)
1e-06
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from training.errors import UserError

__all__ = [
    "ACCOUNTANTS",
    "WEAK_PRIVACY_EPSILON",
    "DPPhase",
    "epsilon_for",
    "epsilons_for",
    "noise_multiplier_for",
    "cross_check",
    "default_delta",
    "check_delta",
    "steps_for_epochs",
]

ACCOUNTANTS: tuple[str, ...] = ("prv", "rdp", "pld")
#: Above this RDP ε, "prv" and "pld" fall back to the (valid, looser) RDP bound; see the module docstring.
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
_MAX_SIGMA = 1e4
_MIN_SIGMA = 1e-3


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


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < delta < 1.0:
        raise UserError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def _check_accountant(accountant: str) -> str:
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
    delta = _check_delta(delta)
    _check_accountant(accountant)
    return _epsilon(_check_phases(phases), delta, accountant, warn=True)


def _epsilon(active: list[DPPhase], delta: float, accountant: str, *, warn: bool) -> float:
    """ε of validated, non-empty-step phases, with the weak-privacy fallback to RDP."""
    if not active:
        return 0.0
    rdp = _rdp_epsilon(active, delta)
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
    return _EPSILON_FNS[accountant](active, delta)


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


def noise_multiplier_for(*, target_epsilon: float, sample_rate: float, steps: int, delta: float,
                         accountant: str = "prv", epsilon_tolerance: float = 0.01) -> float:
    """The smallest σ (to within the tolerance) whose ε is at most ``target_epsilon``.

    A bracketed root search (Illinois false position on log ε against log σ): the result σ* always satisfies
    ε(σ*) ≤ target, and target − ε(σ*) ≤ ``epsilon_tolerance`` unless the bracket shrank below 1e-7 relative
    width first. The bracket comes from the fast RDP accountant (RDP ε ≥ PRV/PLD ε, so the RDP σ is an upper
    end for the other accountants), so PRV and PLD need only a handful of evaluations.

    Args:
        target_epsilon: ε > 0 to reach after ``steps`` steps.
        sample_rate: q in (0, 1].
        steps: T ≥ 1.
        delta: δ in (0, 1).
        accountant: ``"prv"``, ``"rdp"`` or ``"pld"``.
        epsilon_tolerance: how far below the target the returned σ's ε may be; > 0.

    Returns:
        σ > 0.

    Raises:
        UserError: if an argument is out of range, or the target is unreachable (needs σ > 1e4).

    >>> sigma = noise_multiplier_for(target_epsilon=2.0, sample_rate=0.01, steps=1000, delta=1e-5,
    ...                              accountant="rdp")
    >>> 0.0 <= 2.0 - epsilon_for(phases=[DPPhase(noise_multiplier=sigma, sample_rate=0.01, steps=1000)],
    ...                          delta=1e-5, accountant="rdp") <= 0.01
    True
    """
    if isinstance(target_epsilon, bool) or not isinstance(target_epsilon, numbers.Real) or not (
            math.isfinite(target_epsilon) and target_epsilon > 0):
        raise UserError(f"target epsilon must be a finite number > 0, got {target_epsilon!r}")
    if not isinstance(epsilon_tolerance, numbers.Real) or not epsilon_tolerance > 0:
        raise UserError(f"epsilon_tolerance must be > 0, got {epsilon_tolerance!r}")
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise UserError(f"steps must be an integer >= 1 to calibrate sigma, got {steps!r}")
    delta = _check_delta(delta)
    _check_accountant(accountant)
    DPPhase(noise_multiplier=1.0, sample_rate=sample_rate, steps=int(steps))  # validates q

    def eps(acc: str, sigma: float) -> float:
        phase = DPPhase(noise_multiplier=sigma, sample_rate=sample_rate, steps=int(steps))
        return _epsilon([phase], delta, acc, warn=False)

    log_target = math.log(target_epsilon)

    def search(acc: str, lo: float, e_lo: float, hi: float, e_hi: float) -> float:
        """Illinois false position on log ε vs log σ; invariant e_lo > target >= e_hi, returns hi."""
        x_lo, x_hi = math.log(lo), math.log(hi)
        f_lo, f_hi = math.log(e_lo) - log_target, math.log(max(e_hi, 1e-300)) - log_target
        side = 0
        for _ in range(200):
            if target_epsilon - e_hi <= epsilon_tolerance or x_hi - x_lo <= 1e-7:
                break
            x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
            if not x_lo < x < x_hi:
                x = 0.5 * (x_lo + x_hi)
            e = eps(acc, math.exp(x))
            f = math.log(max(e, 1e-300)) - log_target
            if e <= target_epsilon:
                x_hi, e_hi, f_hi = x, e, f
                if side == 1:
                    f_lo *= 0.5
                side = 1
            else:
                x_lo, e_lo, f_lo = x, e, f
                if side == -1:
                    f_hi *= 0.5
                side = -1
        return math.exp(x_hi)

    # 1) Bracket and solve with the fast RDP accountant.
    hi = 1.0
    eps_hi = eps("rdp", hi)
    while eps_hi > target_epsilon:
        if hi >= _MAX_SIGMA:
            raise UserError(
                f"target epsilon {target_epsilon:g} is unreachable with sample rate {sample_rate:g}, {steps} steps "
                f"and delta {delta:g} (even sigma={_MAX_SIGMA:g} gives epsilon {eps_hi:.3g}); raise the target "
                "epsilon or delta, or lower the sample rate or the number of steps")
        hi *= 2.0
        eps_hi = eps("rdp", hi)
    lo = hi / 2.0
    eps_lo = eps("rdp", lo)
    while eps_lo <= target_epsilon:  # only when hi stayed at 1.0: move the bracket down
        if lo < _MIN_SIGMA:
            return lo
        hi, eps_hi, lo = lo, eps_lo, lo / 2.0
        eps_lo = eps("rdp", lo)
    sigma_rdp = search("rdp", lo, eps_lo, hi, eps_hi)
    if accountant == "rdp":
        return sigma_rdp

    # 2) The tighter accountant needs no more noise than RDP: search just below sigma_rdp.
    hi, eps_hi = sigma_rdp, eps(accountant, sigma_rdp)
    while eps_hi > target_epsilon:  # numerical error of the tight accountant: step up a little
        hi *= 1.02
        eps_hi = eps(accountant, hi)
    lo = 0.85 * hi
    eps_lo = eps(accountant, lo)
    while eps_lo <= target_epsilon:
        if lo < _MIN_SIGMA:
            return lo
        hi, eps_hi, lo = lo, eps_lo, 0.85 * lo
        eps_lo = eps(accountant, lo)
    return search(accountant, lo, eps_lo, hi, eps_hi)


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


# ------------------------------------------------------------------------------------------------- delta


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
    delta = _check_delta(delta)
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
