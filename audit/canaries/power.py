"""Power before the audit: which claims a canary kit of m canaries can refute, and how many a claim needs.

The one-run estimator (Steinke et al. 2023) turns m canaries, each trained on with probability 1/2, into an ε
lower bound at confidence 1 - α. Its largest possible value (every guess right) is the kit's *ceiling*: a claim at
or above it can never be refuted by this kit, whatever the model memorised (the gate then says UNVERIFIABLE).
A model rarely memorises every canary: with a fraction ``memorisation`` of the member canaries scored above
everything else (and the rest indistinguishable from non-members), the bound is lower; :func:`kit_power` reports it
for the same guess grid and α split as ``audit epsilon`` (``epsilon.k_grid_points``, ``guesses: in_out``).

>>> p = kit_power(m=1000, alpha=0.05, delta=1e-5, memorisation=1.0)
>>> p.detectable > 1.0 and p.m == 1000
True
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["KitPower", "kit_power", "size_kit", "KIT_SIZES"]

#: The kit sizes :func:`size_kit` tries, smallest first.
KIT_SIZES = (100, 200, 500, 1000, 2000, 5000, 10_000, 20_000)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KitPower:
    """What a kit can show.

    Attributes:
        m: canaries in the kit.
        alpha, delta: the audit's confidence level 1 - α and the claim's δ.
        memorisation: assumed fraction of member canaries the model memorises.
        detectable: the ε lower bound the audit reaches at that memorisation: claims below it are refuted when
            the model memorises at least that much; claims at or above it cannot be.
        ceiling: the bound with every canary memorised (no claim at or above it is refutable by this kit).
    """

    m: int
    alpha: float
    delta: float
    memorisation: float
    detectable: float
    ceiling: float

    def sentence(self) -> str:
        """One line for the command's output."""
        return (f"this kit ({self.m} canaries, α = {self.alpha:g}, δ = {self.delta:g}) can refute a claim below "
                f"ε = {self.detectable:.3g} if the model memorises {self.memorisation:.0%} of its member canaries "
                f"(below ε = {self.ceiling:.3g} at best, all memorised); a larger claim is unverifiable with it")


def _bound(m: int, *, alpha: float, delta: float, memorisation: float, seed: int) -> float:
    from audit.bounds.one_run import epsilon_one_run_from_scores
    from audit.bounds.runner import k_grids

    rng = np.random.default_rng([seed, m])
    included = rng.random(m) < 0.5
    memorised = included & (rng.random(m) < memorisation)
    scores = memorised.astype(np.float64) + 1e-9 * rng.random(m)  # the rest: ties broken at random
    kp, kn = k_grids(m, points=4, guesses="in_out")
    est = epsilon_one_run_from_scores(scores=scores, included=included, delta=delta, alpha=alpha, k_pos_grid=kp,
                                      k_neg_grid=kn, rng=seed)
    return float(est.epsilon_lb)


def kit_power(*, m: int, alpha: float = 0.05, delta: float = 1e-5, memorisation: float = 1.0,
              seed: int = 0) -> KitPower:
    """The power of a kit of ``m`` canaries (see the module docstring); one seeded draw of the inclusion bits.

    Raises:
        ValueError: m < 20, α or δ outside (0, 1), memorisation outside (0, 1].
    """
    if m < 20:
        raise ValueError(f"a kit needs at least 20 canaries, got {m}")
    if not (0 < alpha < 1 and 0 < delta < 1):
        raise ValueError(f"alpha and delta must be in (0, 1), got {alpha}, {delta}")
    if not 0 < memorisation <= 1:
        raise ValueError(f"memorisation must be in (0, 1], got {memorisation}")
    ceiling = _bound(m, alpha=alpha, delta=delta, memorisation=1.0, seed=seed)
    detectable = ceiling if memorisation == 1 else _bound(m, alpha=alpha, delta=delta, memorisation=memorisation,
                                                          seed=seed)
    return KitPower(m=m, alpha=alpha, delta=delta, memorisation=memorisation, detectable=detectable,
                    ceiling=ceiling)


def size_kit(*, claim: float, alpha: float = 0.05, delta: float = 1e-5, memorisation: float = 1.0,
             seed: int = 0) -> KitPower | None:
    """The smallest kit of :data:`KIT_SIZES` whose bound at ``memorisation`` exceeds ``claim``; None if none does.

    >>> size_kit(claim=1.0).m <= 2000
    True
    """
    for m in KIT_SIZES:
        power = kit_power(m=m, alpha=alpha, delta=delta, memorisation=memorisation, seed=seed)
        if power.detectable > claim:
            return power
    return None
