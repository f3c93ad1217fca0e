"""Audit a DP-SGD mechanism implementation: the project's engine, a run's settings, or a user's Opacus optimizer.

>>> r = audit_mechanism(noise_multiplier=2.0, sample_rate=1.0, steps=4, delta=1e-5, trials=4000,
...                     canaries_per_run=2000, seed=0)
>>> str(r.verdict.status), r.tightness > 0.6
('CONSISTENT', True)
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from audit.mechanism.engine_target import EngineSpec, engine_observations
from audit.mechanism.estimate import MechanismClaim
from audit.mechanism.probe import SCALE
from audit.mechanism.result import MechanismResult, make_result, score_and_judge, write_mechanism
from audit.mechanism.scoring import alternating_signs
from foundation.errors import UserError

__all__ = ["audit_mechanism", "audit_run_mechanism", "audit_opacus_mechanism"]


def _claim(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str,
           claimed_epsilon: float | None) -> MechanismClaim:
    try:
        claim = MechanismClaim.from_accountant(noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                                               steps=steps, delta=delta, accountant=accountant)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if claimed_epsilon is not None:
        if not (math.isfinite(claimed_epsilon) and claimed_epsilon > 0):
            raise UserError(f"claimed_epsilon must be a finite number > 0, got {claimed_epsilon!r}")
        claim = MechanismClaim(noise_multiplier=claim.noise_multiplier, sample_rate=claim.sample_rate,
                               steps=claim.steps, delta=claim.delta, epsilon=float(claimed_epsilon),
                               accountant=accountant)
    return claim


def _runs(trials: int, canaries_per_run: int) -> int:
    if trials < 2 or canaries_per_run < 2:
        raise UserError(f"trials and canaries_per_run must be >= 2, got {trials} and {canaries_per_run}")
    return max(1, math.ceil(trials / canaries_per_run))


def audit_mechanism(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                    max_grad_norm: float = 1.0, clipping: str = "flat", grad_sample_mode: str = "hooks",
                    trials: int = 20_000, canaries_per_run: int = 2000, alpha: float = 0.05, seed: int = 0,
                    accountant: str = "prv", claimed_epsilon: float | None = None, mutant: str | None = None,
                    run_dir: str | Path | None = None) -> MechanismResult:
    """Audit the project's DP-SGD engine at (σ, q, T, C) with ``trials`` Dirac canaries (half members).

    Args:
        noise_multiplier, sample_rate, steps, delta: the claim's σ, q, T, δ.
        max_grad_norm: C.
        clipping: ``flat``, ``per_layer`` or ``automatic``.
        grad_sample_mode: ``hooks`` (Opacus) or ``bk`` (book-keeping).
        trials: total canaries over all runs (each run holds ``canaries_per_run``).
        canaries_per_run: m, even; ``q · m/2`` must be whole.
        alpha: significance level of the bound.
        seed: run r uses seed ``seed + r``.
        accountant: the accountant of the claim; ``claimed_epsilon`` overrides its ε (e.g. a manifest's).
        mutant: plant a bug (:mod:`audit.mechanism.mutants`; tests and benchmarks only).
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
                          canaries=canaries_per_run)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    t0 = time.process_time()
    runs = _runs(trials, canaries_per_run)
    obs = [engine_observations(spec, seed=seed + r, mutant=mutant) for r in range(runs)]
    x = np.concatenate([o.x for o in obs])
    members = np.concatenate([o.members for o in obs])
    est, v = score_and_judge(x=x, members=members, claim=claim, alpha=alpha)
    result = make_result(target=f"engine {grad_sample_mode}/{clipping}", claim=claim, max_grad_norm=max_grad_norm,
                         runs=runs, canaries_per_run=canaries_per_run, members=members, est=est, v=v,
                         cpu_seconds=time.process_time() - t0, seed=seed, mutant=mutant)
    if run_dir is not None:
        write_mechanism(run_dir, result)
    return result


def audit_run_mechanism(run_dir: str | Path, *, trials: int = 20_000, canaries_per_run: int = 2000,
                        alpha: float = 0.05, seed: int = 0, write: bool = True) -> MechanismResult:
    """Audit the engine at a finished run's DP settings (its manifest's one DP phase) against its claimed ε.

    Raises:
        UserError: the run has no DP claim, several DP phases, or settings the probe cannot take.
    """
    from training.run.manifest import read_manifest

    manifest = read_manifest(run_dir)
    p = manifest.privacy
    phases = [ph for ph in p.phases if ph.dp]
    if not p.dp or p.epsilon is None or not phases:
        raise UserError(f"{run_dir} makes no DP claim (privacy.dp false or no DP phase): nothing to audit")
    if len(phases) > 1:
        raise UserError(f"{run_dir} has {len(phases)} DP phases; audit mechanism audits one phase: use "
                        "audit.audit_mechanism(...) with each phase's σ, q, T")
    ph = phases[0]
    mode = ph.grad_sample_mode if ph.grad_sample_mode in ("hooks", "bk") else "hooks"
    return audit_mechanism(noise_multiplier=float(ph.noise_multiplier), sample_rate=float(ph.sample_rate),
                           steps=int(ph.steps), delta=float(p.delta), max_grad_norm=float(ph.max_grad_norm or 1.0),
                           clipping=ph.clipping or "flat", grad_sample_mode=mode, trials=trials,
                           canaries_per_run=canaries_per_run, alpha=alpha, seed=seed,
                           accountant=p.accountant or "prv", claimed_epsilon=float(p.epsilon),
                           run_dir=run_dir if write else None)


def audit_opacus_mechanism(*, optimizer_factory: Callable[[list[torch.nn.Parameter]], Any], sample_rate: float,
                           steps: int, delta: float, trials: int = 20_000, canaries_per_run: int = 2000,
                           alpha: float = 0.05, seed: int = 0, accountant: str = "prv",
                           claimed_epsilon: float | None = None, run_dir: str | Path | None = None) -> MechanismResult:
    """Audit a user's Opacus ``DPOptimizer`` (clipping, noise, scaling) and Opacus's Poisson sampler.

    ``optimizer_factory(params)`` must return the user's ``DPOptimizer`` over ``params`` (two tensors of shape
    (1, m)), built exactly as in the training script (its σ, C and expected batch size are the claim's:
    ``expected_batch_size`` must be ``q · m/2``). Each step the auditor hands it the sampled member canaries'
    per-sample gradients (Dirac, norm 100·C, alternating signs) in ``p.grad_sample``, calls ``step()``, and
    reads the privatised gradient ``p.grad`` the wrapped optimizer applied. Batches come from Opacus's
    ``UniformWithReplacementSampler`` at rate q (what ``DPDataLoader`` uses).

    Raises:
        UserError: the factory does not return a ``DPOptimizer``, or an argument is out of range.
    """
    from opacus.optimizers import DPOptimizer
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    t0 = time.process_time()
    runs = _runs(trials, canaries_per_run)
    m = canaries_per_run
    n = m // 2
    xs, ms, claim, name, C = [], [], None, "", 1.0
    signs = alternating_signs(int(steps))
    for r in range(runs):
        rng = np.random.default_rng(seed + r)
        member_ids = np.sort(rng.permutation(m)[:n])
        members = np.zeros(m, dtype=bool)
        members[member_ids] = True
        params = [torch.nn.Parameter(torch.zeros(1, m)), torch.nn.Parameter(torch.zeros(1, m))]
        opt = optimizer_factory(params)
        if not isinstance(opt, DPOptimizer):
            raise UserError(f"optimizer_factory must return an opacus DPOptimizer, got {type(opt).__name__}")
        name = type(opt).__name__
        norms = opt.max_grad_norms if hasattr(opt, "max_grad_norms") else [opt.max_grad_norm]
        C = float(np.sqrt(np.sum(np.square(norms)))) if len(norms) > 1 else float(norms[0])
        B = float(opt.expected_batch_size)
        if claim is None:
            claim = _claim(noise_multiplier=float(opt.noise_multiplier), sample_rate=sample_rate, steps=int(steps),
                           delta=delta, accountant=accountant, claimed_epsilon=claimed_epsilon)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        sampler = UniformWithReplacementSampler(num_samples=n, sample_rate=sample_rate, generator=gen)
        batches = _batches(sampler)
        x = np.empty((m, int(steps)))
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(int(rng.integers(2**62)))
            for t in range(int(steps)):
                idx = member_ids[np.asarray(next(batches), dtype=np.int64)]
                value = float(signs[t]) * SCALE * C / math.sqrt(2.0)
                for p in params:
                    gs = torch.zeros(len(idx), 1, m)
                    gs[torch.arange(len(idx)), 0, torch.as_tensor(idx)] = value
                    p.grad_sample = gs
                    p.grad = torch.zeros_like(p)
                opt.step()
                g = (params[0].grad + params[1].grad).detach().double().numpy()[0] / math.sqrt(2.0)
                x[:, t] = signs[t] * g * B / C
                opt.zero_grad()
        xs.append(x)
        ms.append(members)
    x, members = np.concatenate(xs), np.concatenate(ms)
    est, v = score_and_judge(x=x, members=members, claim=claim, alpha=alpha)
    result = make_result(target=f"opacus {name}", claim=claim, max_grad_norm=C, runs=runs, canaries_per_run=m,
                         members=members, est=est, v=v, cpu_seconds=time.process_time() - t0, seed=seed, mutant=None)
    if run_dir is not None:
        write_mechanism(run_dir, result)
    return result


def _batches(sampler):
    while True:
        yield from sampler
