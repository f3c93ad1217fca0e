"""The power of an ε audit stated before its scores are read, as ``epsilon.json`` records it (``power``).

For every deciding one-run bound, :func:`plan_power` states what the audit *could* detect, from what is fixed
before any score is looked at: the number of canaries ``m``, the claim (ε, δ), the level α the bound is computed
at (after the verdict's split) and the guess grid (:func:`~audit.bounds.runner.k_grids`). The statement is
:func:`~audit.bounds.power.kit_power` at detection probability 1/2: the smallest true ε at which a perfect attack
on the mechanism the one-run theorem is tight for refutes the claim in the median audit, and the per-canary
membership-signal accuracy (the memorisation) that takes. So a ``CONSISTENT`` verdict is read with what it could
not have seen. Sources over :data:`POWER_MAX_M` examples (a large pool) are recorded as not computed (minutes of
CPU); their ``ceiling`` still bounds what they could show.

>>> from audit.bounds.power import kit_power
>>> e = power_entry(source="pool", m=200, claimed_epsilon=1.0, delta=1e-5, alpha=0.05, grid=None)
>>> e.epsilon_detectable == kit_power(m=200, claim=1.0, delta=1e-5, alpha=0.05).epsilon_detectable
True
"""

from __future__ import annotations

import functools
import math

from foundation.result_json import Real, ResultModel

__all__ = ["POWER_MAX_M", "DETECTION_PROBABILITY", "REMEDIES", "PowerEntry", "power_entry", "plan_power"]

#: Sources with more examples are not stated (the computation grows with m: ~1 CPU-minute at m = 20,000).
POWER_MAX_M = 20_000
#: The detection probability the statement is made at: the median audit refutes.
DETECTION_PROBABILITY = 0.5
#: What raises a source's ceiling when the claim is out of its reach (auditor_canaries: a bigger kit, the default).
REMEDIES = {
    "pool": "audit more examples (a larger data.pool_size, members drawn with p = 1/2)",
    "input_canaries": "train with more input canaries (training.canaries.count)",
    "gradient_canaries": "train with more gradient canaries (training.gradient_canaries.count)",
}


class PowerEntry(ResultModel):
    """One deciding bound's power, fixed before its scores were read.

    Attributes:
        source, method: which bound (``method`` is ``one_run``).
        m: canaries (examples) audited.
        claimed_epsilon, delta, alpha: the claim and the level the bound is computed at.
        power: the detection probability the statement is made at (1/2).
        computed: False when ``m`` is over :data:`POWER_MAX_M` (then only ``statement`` says so).
        ceiling: the largest ε_lb the bound can report (every guess correct); None when not computed.
        epsilon_detectable: the smallest true ε refuting the claim with probability >= ``power``; None when
            not computed or when no true ε can (``ceiling`` <= claim).
        accuracy_needed: the per-canary membership-signal accuracy that takes (the memorisation expected of the
            attack): ``expit(epsilon_detectable)``.
        guesses: the number of guesses of the best pair of the grid.
        statement: the sentence for the terminal and the report.
    """

    source: str
    method: str
    m: int
    claimed_epsilon: Real
    delta: Real
    alpha: Real
    power: Real
    computed: bool
    ceiling: Real | None
    epsilon_detectable: Real | None
    accuracy_needed: Real | None
    guesses: int | None
    statement: str


@functools.lru_cache(maxsize=64)
def _kit_power(m: int, claim: float, delta: float, alpha: float, grid: tuple | None):
    from audit.bounds.power import kit_power

    return kit_power(m=m, claim=claim, delta=delta, alpha=alpha, power=DETECTION_PROBABILITY,
                     grid=None if grid is None else (list(grid[0]), list(grid[1])))


def power_entry(*, source: str, m: int, claimed_epsilon: float, delta: float, alpha: float,
                grid: tuple[object, object] | None, method: str = "one_run") -> PowerEntry:
    """The power statement of one one-run bound over ``m`` canaries at level ``alpha`` with guess ``grid``
    ((k_pos_grid, k_neg_grid); None: the default grid)."""
    head = f"power of {source} (m = {m}; what it could detect, whatever it found): "
    common = dict(source=source, method=method, m=int(m), claimed_epsilon=float(claimed_epsilon), delta=float(delta),
                  alpha=float(alpha), power=DETECTION_PROBABILITY)
    if m > POWER_MAX_M:
        return PowerEntry(**common, computed=False, ceiling=None, epsilon_detectable=None, accuracy_needed=None,
                          guesses=None, statement=head + f"not computed for more than {POWER_MAX_M:,} examples")
    key = None if grid is None else (tuple(int(k) for k in grid[0]), tuple(int(k) for k in grid[1]))
    p = _kit_power(int(m), float(claimed_epsilon), float(delta), float(alpha), key)
    return PowerEntry(**common, computed=True, ceiling=p.ceiling, epsilon_detectable=p.epsilon_detectable,
                      accuracy_needed=p.accuracy_needed, guesses=p.guesses,
                      statement=head + p.summary(remedy=REMEDIES.get(source)))


def plan_power(*, plans, claimed_epsilon: float, delta: float, alpha_deciding: float, points: int,
               guesses: str) -> tuple[PowerEntry, ...]:
    """The power of each deciding ``one_run`` bound in ``plans`` (evidence, [(method, in_verdict)]), before any
    estimate is computed; none for a claim that is not a finite ε > 0 (nothing, or everything, refutes it)."""
    from audit.bounds.runner import k_grids

    if claimed_epsilon is None or not math.isfinite(claimed_epsilon) or claimed_epsilon <= 0:
        return ()
    out = []
    for ev, plan in plans:
        if ev.m < 2 or not any(method == "one_run" and deciding for method, deciding in plan):
            continue
        grid = k_grids(ev.m, points=points, guesses=guesses) if ev.m <= POWER_MAX_M else None
        out.append(power_entry(source=ev.source, m=ev.m, claimed_epsilon=claimed_epsilon, delta=delta,
                               alpha=alpha_deciding, grid=grid))
    return tuple(out)
