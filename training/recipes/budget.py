"""Splitting a DP fine-tuning budget between linear probing and full fine-tuning (DP-LP-FFT).

Ke, Hou, Fanti, Oh ("On the Convergence of Differentially-Private Fine-tuning: To Linearly Probe or to Fully
Fine-tune?", arXiv:2402.18905, 2024) show that DP full fine-tuning (FFT) of a pre-trained model distorts its
features when the new head is misaligned with the backbone (e.g. randomly initialised), that a DP
linear-probing (LP) phase first, then DP FFT (DP-LP-FFT), mitigates it, and that the privacy budget must then
be split between the two phases. Two splits are offered:

* ``steps``: one noise multiplier σ for all T steps (calibrated as for a single phase of T steps at rate q);
  LP takes ⌊f·T⌉ of them, FFT the rest. Each phase's ε is whatever its share of the steps costs.
* ``epsilon``: LP alone gets ε_LP = f·ε (σ_LP calibrated for its T_LP steps), and σ_FFT is the smallest noise
  multiplier (to within the tolerance) with which the accountant's composition of both phases is ≤ ε. The
  FFT phase alone thus costs more than (1 − f)·ε, because composition is sub-additive.

In both cases the manifest's ε is the accountant's composition of the DP phases, never a sum.

>>> plan = split_budget(strategy="lp_fft", split_by="steps", lp_fraction=0.25, total_steps=8, sample_rate=0.1,
...                     delta=1e-5, accountant="rdp", noise_multiplier=2.0)
>>> [(p.name, p.steps, p.noise_multiplier) for p in plan]
[('lp', 2, 2.0), ('fft', 6, 2.0)]
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from training.accounting import DPPhase, epsilon_for, noise_multiplier_for
from foundation.errors import ConfigError

__all__ = ["PhaseBudget", "split_steps", "split_budget", "sigma_for_remaining"]


@dataclass(frozen=True, kw_only=True)
class PhaseBudget:
    """One phase of a fine-tuning plan.

    Attributes:
        name: ``"lp"`` (head only) or ``"fft"`` (all parameters).
        steps: its number of DP steps (≥ 1).
        noise_multiplier: its σ.
    """

    name: str
    steps: int
    noise_multiplier: float

    def dp_phase(self, sample_rate: float) -> DPPhase:
        return DPPhase(noise_multiplier=self.noise_multiplier, sample_rate=sample_rate, steps=self.steps)


def split_steps(total_steps: int, fraction: float) -> tuple[int, int]:
    """(T_LP, T_FFT) = (round(f·T), T − round(f·T)), each at least 1.

    Raises:
        ConfigError: if T < 2 or the fraction is not in (0, 1).

    >>> split_steps(10, 0.25), split_steps(3, 0.01)
    ((2, 8), (1, 2))
    """
    if total_steps < 2:
        raise ConfigError(f"lp_fft needs training.steps >= 2 (one LP and one FFT step), got {total_steps}")
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"the LP share of the steps must be in (0, 1), got {fraction}")
    lp = min(total_steps - 1, max(1, round(fraction * total_steps)))
    return lp, total_steps - lp


@functools.lru_cache(maxsize=256)
def sigma_for_remaining(*, first: DPPhase, steps: int, sample_rate: float, target_epsilon: float, delta: float,
                        accountant: str, tolerance: float = 0.01) -> float:
    """The smallest σ (to within ``tolerance`` in ε) such that ``first`` composed with (σ, q, steps) has ε ≤ target.

    Bisection on σ: ε of the composition decreases as σ grows and tends to ε(first) < target.

    Args:
        first: the phase already planned (LP).
        steps, sample_rate: the second phase's T and q.
        target_epsilon: the total ε.
        delta, accountant: as :func:`training.accounting.epsilon_for`.
        tolerance: how far below the target the composition may end; > 0.

    Returns:
        σ of the second phase; the composition's ε is ≤ target.

    Raises:
        ConfigError: if ``first`` alone already spends the target.
    """
    eps_first = epsilon_for(phases=[first], delta=delta, accountant=accountant)
    if eps_first >= target_epsilon:
        raise ConfigError(f"the LP phase alone spends epsilon {eps_first:.3g} >= the total {target_epsilon:g}; "
                          "lower finetune.lp_fraction")

    def total(sigma: float) -> float:
        second = DPPhase(noise_multiplier=sigma, sample_rate=sample_rate, steps=steps)
        return epsilon_for(phases=[first, second], delta=delta, accountant=accountant)

    # ε(first ∘ second) ≥ ε(second): sigma for the whole target alone is a lower end.
    lo = noise_multiplier_for(target_epsilon=target_epsilon, sample_rate=sample_rate, steps=steps, delta=delta,
                              accountant=accountant)
    eps_lo = total(lo)
    if eps_lo <= target_epsilon:
        return lo
    hi = noise_multiplier_for(target_epsilon=max(target_epsilon - eps_first, 1e-3), sample_rate=sample_rate,
                              steps=steps, delta=delta, accountant=accountant)
    eps_hi = total(hi)
    while eps_hi > target_epsilon:
        lo, hi = hi, hi * 1.5
        eps_hi = total(hi)
    while target_epsilon - eps_hi > tolerance and hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        e = total(mid)
        if e <= target_epsilon:
            hi, eps_hi = mid, e
        else:
            lo = mid
    return hi


def split_budget(*, strategy: str, split_by: str, lp_fraction: float, total_steps: int, sample_rate: float,
                 delta: float, accountant: str, target_epsilon: float | None = None,
                 noise_multiplier: float | None = None, lp_steps_fraction: float | None = None
                 ) -> list[PhaseBudget]:
    """The DP phases of a fine-tuning run (see the module docstring).

    Args:
        strategy: ``"lp"``, ``"fft"`` or ``"lp_fft"``.
        split_by: ``"steps"`` or ``"epsilon"`` (``lp_fft`` only).
        lp_fraction: the LP share f in (0, 1) of the steps (``steps``) or of ε (``epsilon``).
        total_steps: T ≥ 1 (≥ 2 for ``lp_fft``).
        sample_rate: q of both phases.
        delta, accountant: as :func:`training.accounting.epsilon_for`.
        target_epsilon: the total ε (give it or ``noise_multiplier``).
        noise_multiplier: a fixed σ for every phase (not with ``split_by="epsilon"``).
        lp_steps_fraction: ``epsilon`` split: the LP share of the steps (default: ``lp_fraction``).

    Returns:
        The phases in training order.

    Raises:
        ConfigError: an impossible combination (see the messages).
    """
    return list(_split_budget(strategy=strategy, split_by=split_by, lp_fraction=float(lp_fraction),
                              total_steps=int(total_steps), sample_rate=float(sample_rate), delta=float(delta),
                              accountant=accountant,
                              target_epsilon=None if target_epsilon is None else float(target_epsilon),
                              noise_multiplier=None if noise_multiplier is None else float(noise_multiplier),
                              lp_steps_fraction=None if lp_steps_fraction is None else float(lp_steps_fraction)))


@functools.lru_cache(maxsize=256)
def _split_budget(*, strategy: str, split_by: str, lp_fraction: float, total_steps: int, sample_rate: float,
                  delta: float, accountant: str, target_epsilon: float | None, noise_multiplier: float | None,
                  lp_steps_fraction: float | None) -> tuple[PhaseBudget, ...]:
    """Cached core of :func:`split_budget` (hashable arguments, tuple result)."""
    if (target_epsilon is None) == (noise_multiplier is None):
        raise ConfigError("give exactly one of privacy.target_epsilon and privacy.noise_multiplier")
    if strategy not in ("lp", "fft", "lp_fft"):
        raise ConfigError(f"finetune.strategy must be lp, fft or lp_fft, got {strategy!r}")
    if split_by not in ("steps", "epsilon"):
        raise ConfigError(f"finetune.split_by must be steps or epsilon, got {split_by!r}")

    def one_sigma(steps: int, eps: float) -> float:
        return noise_multiplier_for(target_epsilon=eps, sample_rate=sample_rate, steps=steps, delta=delta,
                                    accountant=accountant)

    if strategy in ("lp", "fft"):
        sigma = noise_multiplier if noise_multiplier is not None else one_sigma(total_steps, target_epsilon)
        return (PhaseBudget(name=strategy, steps=total_steps, noise_multiplier=float(sigma)),)
    if split_by == "steps":
        t_lp, t_fft = split_steps(total_steps, lp_fraction)
        sigma = noise_multiplier if noise_multiplier is not None else one_sigma(total_steps, target_epsilon)
        return (PhaseBudget(name="lp", steps=t_lp, noise_multiplier=float(sigma)),
                PhaseBudget(name="fft", steps=t_fft, noise_multiplier=float(sigma)))
    if target_epsilon is None:
        raise ConfigError("finetune.split_by: epsilon needs privacy.target_epsilon (not a fixed noise_multiplier); "
                          "use split_by: steps with a fixed sigma")
    if not 0.0 < lp_fraction < 1.0:
        raise ConfigError(f"finetune.lp_fraction must be in (0, 1), got {lp_fraction}")
    t_lp, t_fft = split_steps(total_steps, lp_fraction if lp_steps_fraction is None else lp_steps_fraction)
    sigma_lp = one_sigma(t_lp, lp_fraction * target_epsilon)
    lp = PhaseBudget(name="lp", steps=t_lp, noise_multiplier=float(sigma_lp))
    sigma_fft = sigma_for_remaining(first=lp.dp_phase(sample_rate), steps=t_fft, sample_rate=sample_rate,
                                    target_epsilon=float(target_epsilon), delta=float(delta), accountant=accountant)
    return (lp, PhaseBudget(name="fft", steps=t_fft, noise_multiplier=float(sigma_fft)))
