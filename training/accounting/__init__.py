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

Modules: :mod:`~training.accounting.epsilon` (ε of a composition of phases under one accountant, the
cross-check), :mod:`~training.accounting.calibrate` (σ for a target ε), :mod:`~training.accounting.delta` (δ
conventions, steps per epoch) — pure functions over numbers — and :mod:`~training.accounting.curve`
(:class:`RdpCurve`, the only stateful piece: a cache for the ε curve logged during training).

To recompute the ε of one phase (σ, q, T) at δ with a given accountant (e.g. PLD)::

    epsilon_for(phases=[DPPhase(noise_multiplier=σ, sample_rate=q, steps=T)], delta=δ, accountant="pld")
"""

from training.accounting.calibrate import noise_multiplier_for
from training.accounting.curve import RdpCurve
from training.accounting.delta import check_delta, default_delta, steps_for_epochs
from training.accounting.epsilon import (
    ACCOUNTANTS,
    PLD_DISCRETIZATION,
    PRV_EPS_ERROR,
    RDP_ORDERS,
    WEAK_PRIVACY_EPSILON,
    DPPhase,
    cross_check,
    epsilon_for,
    epsilons_for,
)

__all__ = [
    "ACCOUNTANTS",
    "PLD_DISCRETIZATION",
    "PRV_EPS_ERROR",
    "RDP_ORDERS",
    "WEAK_PRIVACY_EPSILON",
    "DPPhase",
    "RdpCurve",
    "epsilon_for",
    "epsilons_for",
    "noise_multiplier_for",
    "cross_check",
    "default_delta",
    "check_delta",
    "steps_for_epochs",
]
