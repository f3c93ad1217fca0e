"""σ for a target ε: a bracketed root search over the accountants of :mod:`training.accounting.epsilon`."""

from __future__ import annotations

import math
import numbers

from training.accounting.epsilon import (
    DPPhase,
    check_accountant,
    check_delta_value,
    epsilon_of_active,
)
from training.accounting.sigma_cache import cache_dir, cached_sigma
from foundation.errors import UserError

__all__ = ["noise_multiplier_for"]

_MAX_SIGMA = 1e4
_MIN_SIGMA = 1e-3


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

    With ``DP_AUDIT_SIGMA_CACHE`` set to a directory, results are kept there and shared between processes
    (:mod:`training.accounting.sigma_cache`).

    Returns:
        σ > 0.

    Raises:
        UserError: if an argument is out of range, or the target is unreachable (needs σ > 1e4), or so large that
            σ < 1e-3 meets it (no meaningful noise: train without DP instead).

    >>> from training.accounting.epsilon import epsilon_for
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
    delta = check_delta_value(delta)
    check_accountant(accountant)
    DPPhase(noise_multiplier=1.0, sample_rate=sample_rate, steps=int(steps))  # validates q
    directory = cache_dir()
    if directory is None:
        return _calibrate(target_epsilon, sample_rate, int(steps), delta, accountant, epsilon_tolerance)
    key = {"target_epsilon": float(target_epsilon), "sample_rate": float(sample_rate), "steps": int(steps),
           "delta": float(delta), "accountant": accountant, "epsilon_tolerance": float(epsilon_tolerance)}
    return cached_sigma(directory, key, lambda: _calibrate(target_epsilon, sample_rate, int(steps), delta,
                                                            accountant, epsilon_tolerance))


def _calibrate(target_epsilon: float, sample_rate: float, steps: int, delta: float, accountant: str,
               epsilon_tolerance: float) -> float:
    """The search of :func:`noise_multiplier_for` on validated arguments."""

    def eps(acc: str, sigma: float) -> float:
        phase = DPPhase(noise_multiplier=sigma, sample_rate=sample_rate, steps=int(steps))
        return epsilon_of_active([phase], delta, acc, warn=False)

    log_target = math.log(target_epsilon)

    def no_noise(sigma: float, epsilon: float) -> UserError:
        return UserError(
            f"target epsilon {target_epsilon:g} needs no meaningful noise (sigma={sigma:.2g} already gives epsilon "
            f"{epsilon:.3g} with sample rate {sample_rate:g}, {steps} steps and delta {delta:g}); an epsilon that "
            "large bounds no attack: choose a meaningful target (epsilon <= ~10) or train without DP")

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
            raise no_noise(lo, eps_lo)
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
            raise no_noise(lo, eps_lo)
        hi, eps_hi, lo = lo, eps_lo, 0.85 * lo
        eps_lo = eps(accountant, lo)
    return search(accountant, lo, eps_lo, hi, eps_hi)
