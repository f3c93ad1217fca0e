"""Audit a DP-SGD mechanism implementation: the project's engine, a run's settings, or a user's Opacus optimizer.

>>> r = audit_mechanism(noise_multiplier=2.0, sample_rate=1.0, steps=4, delta=1e-5, trials=4000,
...                     canaries_per_run=2000, seed=0)
>>> str(r.verdict.status), r.tightness > 0.6
('CONSISTENT', True)
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from audit.mechanism.engine_target import EngineSpec, engine_observations
from audit.mechanism.estimate import MechanismClaim
from audit.mechanism.opacus_target import audit_opacus_mechanism, claim_for
from audit.mechanism.result import MechanismResult, make_result, score_and_judge, write_mechanism
from foundation.errors import UserError

__all__ = ["audit_mechanism", "audit_run_mechanism", "audit_opacus_mechanism"]


def _claim(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str,
           claimed_epsilon: float | None) -> MechanismClaim:
    return claim_for(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, delta=delta,
                     accountant=accountant, claimed_epsilon=claimed_epsilon)


def _runs(trials: int, canaries_per_run: int) -> int:
    if trials < 2 or canaries_per_run < 2:
        raise UserError(f"trials and canaries_per_run must be >= 2, got {trials} and {canaries_per_run}")
    return max(1, math.ceil(trials / canaries_per_run))


def audit_mechanism(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                    max_grad_norm: float = 1.0, clipping: str = "flat", grad_sample_mode: str = "hooks",
                    trials: int = 20_000, canaries_per_run: int = 2000, alpha: float = 0.05, seed: int = 0,
                    accountant: str = "prv", claimed_epsilon: float | None = None, mutant: str | None = None,
                    sampling: str = "poisson", population: int | None = None,
                    run_dir: str | Path | None = None) -> MechanismResult:
    """Audit the project's DP-SGD engine at (σ, q, T, C) with ``trials`` Dirac canaries (half members).

    Args:
        noise_multiplier, sample_rate, steps, delta: the claim's σ, q, T, δ.
        max_grad_norm: C.
        clipping: ``flat``, ``per_layer`` or ``automatic``.
        grad_sample_mode: the engine: ``hooks``, ``functorch``, ``ghost``, ``bk`` or ``fused``.
        trials: total canaries over all runs (each run holds ``canaries_per_run``).
        canaries_per_run: m, even; ``q · m/2`` must be whole.
        alpha: significance level of the bound.
        seed: run r uses seed ``seed + r``.
        accountant: the accountant of the claim; ``claimed_epsilon`` overrides its ε (e.g. a manifest's).
        mutant: plant a bug (:mod:`audit.mechanism.mutants`; tests and benchmarks only).
        sampling: the batch sampler, ``poisson`` or ``shuffle`` (a run's ``privacy.sampling``).
        population: the examples the sampler draws from (a run's n; ``q · population`` whole), of which each run's
            ``canaries_per_run / 2`` members are the canaries (:class:`~audit.mechanism.engine_target.EngineSpec`);
            default the members.
        run_dir: write ``mechanism.json`` there.

    Returns:
        The :class:`~audit.mechanism.result.MechanismResult`.

    Raises:
        UserError: on an argument out of range (one line naming it).
    """
    claim = _claim(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, delta=delta,
                   accountant=accountant, claimed_epsilon=claimed_epsilon)
    try:
        spec = EngineSpec(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=int(steps),
                          max_grad_norm=max_grad_norm, clipping=clipping, grad_sample_mode=grad_sample_mode,
                          canaries=canaries_per_run, sampling=sampling, population=population)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    t0 = time.process_time()
    runs = _runs(trials, canaries_per_run)
    obs = [engine_observations(spec, seed=seed + r, mutant=mutant) for r in range(runs)]
    x = np.concatenate([o.x for o in obs])
    members = np.concatenate([o.members for o in obs])
    est, v = score_and_judge(x=x, members=members, claim=claim, alpha=alpha)
    name = f"engine {grad_sample_mode}/{clipping}" + ("" if sampling == "poisson" else f", {sampling} sampling")
    result = make_result(target=name, claim=claim, max_grad_norm=max_grad_norm,
                         runs=runs, canaries_per_run=canaries_per_run, members=members, est=est, v=v,
                         cpu_seconds=time.process_time() - t0, seed=seed, mutant=mutant)
    if run_dir is not None:
        write_mechanism(run_dir, result)
    return result


def audit_run_mechanism(run_dir: str | Path, *, trials: int = 20_000, canaries_per_run: int = 2000,
                        alpha: float = 0.05, seed: int = 0, write: bool = True) -> MechanismResult:
    """Audit the engine at a finished run's DP settings (its manifest's one DP phase: σ, q, T, C, clipping,
    engine and sampler) against its claimed ε.

    Raises:
        UserError: the run has no DP claim, several DP phases, was not trained by this project's engine
            (``audit.OpacusAuditor`` or ``audit import``), or has settings the probe cannot take.
    """
    from training.run.manifest import read_manifest

    manifest = read_manifest(run_dir)
    recipe = manifest.training.get("recipe")
    if recipe == "opacus":
        raise UserError(f"{run_dir} was trained by the user's Opacus script (audit.OpacusAuditor): its optimizer is "
                        "the script's code, which audit mechanism cannot rebuild; call auditor.audit_mechanism() "
                        "in the script after auditor.finish(model)")
    if recipe == "external":
        raise UserError(f"{run_dir} was imported (audit import): its training code is not this project's engine; "
                        "audit that implementation with audit.audit_opacus_mechanism(...), or the engine with "
                        "audit mechanism --sigma/--sample-rate/--steps/--delta")
    p = manifest.privacy
    phases = [ph for ph in p.phases if ph.dp]
    if not p.dp or p.epsilon is None or not phases:
        raise UserError(f"{run_dir} makes no DP claim (privacy.dp false or no DP phase): nothing to audit")
    if len(phases) > 1:
        raise UserError(f"{run_dir} has {len(phases)} DP phases; audit mechanism audits one phase: use "
                        "audit.audit_mechanism(...) with each phase's σ, q, T")
    ph = phases[0]
    population = None
    if ph.batch_size and ph.sample_rate:  # the run's n: its sampler's batches exactly (q = B / n)
        population = int(round(ph.batch_size / ph.sample_rate))
        if population < canaries_per_run // 2:  # fewer examples than member canaries: the members are the n
            canaries_per_run, population = 2 * population, None
    return audit_mechanism(noise_multiplier=float(ph.noise_multiplier), sample_rate=float(ph.sample_rate),
                           steps=int(ph.steps), delta=float(p.delta), max_grad_norm=float(ph.max_grad_norm or 1.0),
                           clipping=ph.clipping or "flat", grad_sample_mode=ph.grad_sample_mode or "hooks",
                           trials=trials, canaries_per_run=canaries_per_run, alpha=alpha, seed=seed,
                           accountant=p.accountant or "prv", claimed_epsilon=float(p.epsilon),
                           sampling=ph.sampling or "poisson", population=population,
                           run_dir=run_dir if write else None)
