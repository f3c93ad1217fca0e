"""Trade-off curves of the DP-SGD family a claim belongs to, and the noise multipliers a measured test refutes.

A claim (σ, q, T, δ) says the implementation is T compositions of the Poisson-subsampled Gaussian mechanism
with noise multiplier σ and sample rate q. Its *trade-off curve* ``f_σ`` (Dong, Roth, Su, "Gaussian Differential
Privacy", JRSS-B 2022) is the least false-negative rate any test can reach at false-positive rate ``x``. The
curve follows from the privacy profile δ_σ(ε) (their Proposition 2.12):

    f_σ(x) = sup_ε max(0, 1 - δ_σ(ε) - e^ε x, e^{-ε} (1 - δ_σ(ε) - x)),

and a test whose error rates (FPR, FNR) lie strictly below ``f_σ`` proves that the implementation is not that
mechanism: it is too private to allow such a test. More noise gives a higher curve, so the refuted σ form an
interval ``(σ_ub, ∞)`` and the audit reports ε_lb = ε_{σ_ub}(δ): the ε of the most private member of the claimed
family that the test does not refute.

* Full batch (q = 1): ``f_σ(x) = Φ(Φ⁻¹(1 - x) - μ)`` with μ = √T/σ (μ-GDP, exact), so σ_ub = √T/μ_lb with
  μ_lb = Φ⁻¹(1 - FPR) - Φ⁻¹(FNR): the GDP bound of Nasr et al. (USENIX Security 2023), and ε_lb = ε_GDP(μ_lb, δ).
* Poisson (q < 1): the curve is *not* Gaussian (converting a GDP μ measured in its bulk overstates ε in the
  tails and understates it in the middle), so δ_σ(ε) comes from a privacy-loss distribution (Google's
  ``dp_accounting``): *pessimistic* discretisation for the curve (δ too large, curve too low: refutes less) and
  *optimistic* for ε_{σ_ub} (too small), so both approximations make the bound more conservative.

The only assumption beyond the measured error rates is that the implementation's trade-off curve lies in the
claimed family (the GDP conversion of Nasr et al. assumes the same for q = 1); whether the claim itself is
refuted (σ > σ_ub) needs no assumption at all, since the claim states the whole curve ``f_σ``.

>>> round(sigma_upper_bound(fpr=0.1, fnr=0.1, sample_rate=1.0, steps=4, start=1.0), 4)  # μ_lb = 2·Φ⁻¹(0.9) = 2.563
0.7803
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from audit.bounds.gdp import eps_from_mu

__all__ = ["tradeoff", "refutes", "sigma_upper_bound", "family_epsilon"]

_PLD_INTERVAL = 1e-3
_FINE = 1e-4
_EPS_GRID = np.linspace(0.0, 40.0, 4001)


@functools.lru_cache(maxsize=256)
def _pld(sigma: float, sample_rate: float, steps: int, pessimistic: bool, interval: float = _PLD_INTERVAL):
    from dp_accounting.pld import privacy_loss_distribution as pld

    one = pld.from_gaussian_mechanism(sigma, sampling_prob=sample_rate, pessimistic_estimate=pessimistic,
                                      value_discretization_interval=interval, use_connect_dots=pessimistic)
    return one.self_compose(steps)


@functools.lru_cache(maxsize=256)
def _profile(sigma: float, sample_rate: float, steps: int) -> np.ndarray:
    """δ_σ(ε) on :data:`_EPS_GRID` (pessimistic: an upper bound on the true profile)."""
    return np.asarray(_pld(sigma, sample_rate, steps, True).get_delta_for_epsilon(_EPS_GRID), dtype=np.float64)


def tradeoff(x: np.ndarray | float, *, sigma: float, sample_rate: float, steps: int) -> np.ndarray:
    """``f_σ(x)``: a lower bound on the false-negative rate of any test at false-positive rate ``x``.

    Exact for q = 1; for q < 1 computed from a pessimistic privacy profile on a finite ε grid, both of which
    can only lower the curve.

    >>> round(float(tradeoff(0.5, sigma=1.0, sample_rate=1.0, steps=1)), 4)  # Φ(0 - 1)
    0.1587
    """
    x = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    if sample_rate >= 1.0:
        mu = math.sqrt(steps) / sigma
        return special.ndtr(special.ndtri(1.0 - x) - mu)
    delta = _profile(float(sigma), float(sample_rate), int(steps))
    e = np.exp(_EPS_GRID)
    xs = x.reshape(-1, 1)
    f = np.maximum(1.0 - delta[None, :] - e[None, :] * xs, (1.0 - delta[None, :] - xs) / e[None, :])
    return np.maximum(f.max(axis=1), 0.0).reshape(x.shape)


def refutes(*, sigma: float, fpr: float, fnr: float, sample_rate: float, steps: int) -> bool:
    """Whether a test with error rates (``fpr``, ``fnr``) is impossible for the (σ, q, T) mechanism."""
    return bool(fnr < float(tradeoff(fpr, sigma=sigma, sample_rate=sample_rate, steps=steps)))


def sigma_upper_bound(*, fpr: float, fnr: float, sample_rate: float, steps: int, start: float,
                      rel_tol: float = 2e-3, span: float = 4.0) -> float:
    """σ_ub: every noise multiplier above it is refuted by the test (``fpr``, ``fnr``): too private to allow it.

    For q = 1 in closed form (σ_ub = √T/μ_lb); for q < 1 by bracketing from ``start`` (the claim's σ) in factors
    of 2 and bisection on log σ. The value returned is always a refuted σ or the boundary itself (rounded *up*
    to within ``rel_tol``; ``start / span`` when even that is refuted), so it can only weaken the bound.

    Args:
        fpr: an upper confidence bound on the false-positive rate, in [0, 1].
        fnr: an upper confidence bound on the false-negative rate, in [0, 1].
        sample_rate: q of the claimed family.
        steps: T of the claimed family.
        start: where the search starts (the claimed σ), > 0.
        rel_tol: relative precision of the bisection (q < 1).
        span: the search stays within [start / span, start · span]; above it σ_ub = inf.

    Returns:
        σ_ub > 0, or ``inf`` when the test refutes no mechanism of the family within the span.
    """
    if sample_rate >= 1.0:
        mu = float(-special.ndtri(fpr) - special.ndtri(fnr))
        return math.inf if mu <= 0 else math.sqrt(steps) / mu
    if fpr + fnr >= 1.0:
        return math.inf

    def ref(s: float) -> bool:
        return refutes(sigma=s, fpr=fpr, fnr=fnr, sample_rate=sample_rate, steps=steps)

    floor, ceil = start / span, start * span
    if ref(start):  # the boundary lies below the claim
        lo, hi = start / 2.0, start
        while ref(lo):
            if lo <= floor:
                return lo
            lo, hi = lo / 2.0, lo
    else:
        lo, hi = start, start * 2.0
        while not ref(hi):
            if hi >= ceil:
                return math.inf
            lo, hi = hi, hi * 2.0
    while hi / lo > 1.0 + rel_tol:  # lo is not refuted, hi is
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ref(mid) else (mid, hi)
    return hi


def family_epsilon(*, sigma: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε at δ of the (σ, q, T) mechanism: exact GDP for q = 1, an optimistic PLD estimate (a lower value) for q < 1.

    >>> round(family_epsilon(sigma=2.0, sample_rate=1.0, steps=4, delta=1e-5), 4)  # μ = 1
    4.3772
    """
    if not math.isfinite(sigma):
        return 0.0
    if sample_rate >= 1.0:
        return eps_from_mu(mu=math.sqrt(steps) / sigma, delta=delta)
    return float(_pld(float(sigma), float(sample_rate), int(steps), False, _FINE).get_epsilon_for_delta(delta))
