"""Audit a user's Opacus optimizer (clipping, noise, scaling) and batch sampler on the Dirac-canary probe.

The user's ``DPOptimizer`` is built by ``optimizer_factory(params)`` over two probe tensors of shape (1, m), the
way the training script builds it (its class, subclass or patches included). Each step the auditor draws the
batch from the user's sampler (``sampler_factory``; default Opacus's ``UniformWithReplacementSampler`` at the
claimed q, what ``DPDataLoader`` uses), hands the optimizer the sampled member canaries' per-sample gradients
(Dirac, norm 100·C, alternating signs) in ``p.grad_sample``, calls ``step()`` and reads the privatised gradient
``p.grad`` it applied: ``x = s_t · ⟨p.grad, v_i⟩ · B / C`` is the noisy clipped sum along canary i in units of C
(B, C: the optimizer's own expected batch size and clipping norm; a constant scale never changes privacy).

The claim is the accountant at the claimed σ (``noise_multiplier``; default the optimizer's own attribute), q, T,
δ, or ``claimed_epsilon`` when given (what the user reports).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from audit.mechanism.estimate import MechanismClaim
from audit.mechanism.probe import SCALE
from audit.mechanism.result import MechanismResult, make_result, score_and_judge, write_mechanism
from audit.mechanism.scoring import alternating_signs
from foundation.errors import UserError

__all__ = ["audit_opacus_mechanism", "opacus_sampler", "shuffle_sampler", "same_optimizer", "claim_for"]

SamplerFactory = Callable[[int, torch.Generator], Iterable[Any]]


def claim_for(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str,
              claimed_epsilon: float | None) -> MechanismClaim:
    """The :class:`MechanismClaim` at (σ, q, T, δ) from ``accountant``, its ε replaced by ``claimed_epsilon``
    when given; a one-line :class:`UserError` for a value out of range."""
    try:
        claim = MechanismClaim.from_accountant(noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                                               steps=steps, delta=delta, accountant=accountant)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if claimed_epsilon is None:
        return claim
    if not (math.isfinite(claimed_epsilon) and claimed_epsilon > 0):
        raise UserError(f"claimed_epsilon must be a finite number > 0, got {claimed_epsilon!r}")
    return MechanismClaim(noise_multiplier=claim.noise_multiplier, sample_rate=claim.sample_rate, steps=claim.steps,
                          delta=claim.delta, epsilon=float(claimed_epsilon), accountant=accountant)


def opacus_sampler(sample_rate: float) -> SamplerFactory:
    """The sampler factory of Opacus's ``DPDataLoader``: ``UniformWithReplacementSampler`` at ``sample_rate``."""
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    def make(num_samples: int, generator: torch.Generator):
        return UniformWithReplacementSampler(num_samples=num_samples, sample_rate=sample_rate, generator=generator)
    return make


class _Shuffled:
    """Fixed-size batches of a fresh shuffle every epoch (a plain ``DataLoader(shuffle=True, drop_last=True)``)."""

    def __init__(self, n: int, batch: int, generator: torch.Generator) -> None:
        self.n, self.batch, self.generator = n, batch, generator

    def __iter__(self):
        perm = torch.randperm(self.n, generator=self.generator).tolist()
        for i in range(0, self.n - self.batch + 1, self.batch):
            yield perm[i:i + self.batch]


def shuffle_sampler(sample_rate: float) -> SamplerFactory:
    """The sampler factory of a shuffling loader: batches of ``round(q · n)`` examples, each epoch a new order."""
    def make(num_samples: int, generator: torch.Generator):
        return _Shuffled(num_samples, max(1, int(round(sample_rate * num_samples))), generator)
    return make


def same_optimizer(opt: Any) -> Callable[[list[torch.nn.Parameter]], Any]:
    """A factory building a new instance of ``opt``'s class (a user's subclass and its overrides included) over a
    new base optimizer of ``opt``'s base class and defaults, with its σ, C, expected batch size, loss reduction and
    secure mode: what the script built, over the probe's parameters. Flat clipping only.

    Raises:
        UserError: ``opt`` clips per layer or adaptively, or its class cannot be rebuilt this way (pass an
            ``optimizer_factory``).
    """
    cls, base = type(opt), opt.original_optimizer
    if hasattr(opt, "max_grad_norms") or cls.__name__ in ("AdaClipDPOptimizer",) or "FastGradientClipping" in \
            cls.__name__ or "Distributed" in cls.__name__:
        raise UserError(f"{cls.__name__} cannot be rebuilt over the probe's two parameters (per-layer, adaptive, "
                        "ghost or distributed clipping): pass optimizer_factory=lambda params: <your optimizer "
                        "over params>")

    def factory(params: list[torch.nn.Parameter]):
        try:
            return cls(type(base)(params, **base.defaults), noise_multiplier=float(opt.noise_multiplier),
                       max_grad_norm=float(opt.max_grad_norm), expected_batch_size=opt.expected_batch_size,
                       loss_reduction=opt.loss_reduction, secure_mode=bool(opt.secure_mode))
        except TypeError as exc:
            raise UserError(f"cannot rebuild {cls.__name__} ({exc}): pass optimizer_factory=lambda params: <your "
                            "optimizer over params>") from None
    return factory


def _batches(sampler: Iterable[Any]):
    while True:
        empty = True
        for batch in sampler:
            empty = False
            yield batch
        if empty:
            raise UserError("the sampler yielded no batch")


def _one_run(*, factory, sampler_factory: SamplerFactory, m: int, steps: int, rng: np.random.Generator):
    """One probe run: the membership, the optimizer's (σ, C, B, class name) and the (m, T) observations."""
    from opacus.optimizers import DPOptimizer

    n = m // 2
    member_ids = np.sort(rng.permutation(m)[:n])
    members = np.zeros(m, dtype=bool)
    members[member_ids] = True
    params = [torch.nn.Parameter(torch.zeros(1, m)), torch.nn.Parameter(torch.zeros(1, m))]
    opt = factory(params)
    if not isinstance(opt, DPOptimizer):
        raise UserError(f"optimizer_factory must return an opacus DPOptimizer, got {type(opt).__name__}")
    norms = opt.max_grad_norms if hasattr(opt, "max_grad_norms") else [opt.max_grad_norm]
    C = float(np.sqrt(np.sum(np.square(norms)))) if len(norms) > 1 else float(norms[0])
    B = float(opt.expected_batch_size)
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    batches = _batches(sampler_factory(n, gen))
    signs = alternating_signs(steps)
    x = np.empty((m, steps))
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(int(rng.integers(2**62)))
        for t in range(steps):
            local = np.asarray(list(next(batches)), dtype=np.int64).reshape(-1)
            if local.size and (local.min() < 0 or local.max() >= n):
                raise UserError(f"the sampler yielded index {int(local.max())} outside [0, {n})")
            idx = member_ids[local]
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
    return members, x, (float(opt.noise_multiplier), C, type(opt).__name__)


def audit_opacus_mechanism(*, optimizer_factory: Callable[[list[torch.nn.Parameter]], Any], sample_rate: float,
                           steps: int, delta: float, trials: int = 20_000, canaries_per_run: int = 2000,
                           alpha: float = 0.05, seed: int = 0, accountant: str = "prv",
                           noise_multiplier: float | None = None, claimed_epsilon: float | None = None,
                           sampler_factory: SamplerFactory | None = None,
                           run_dir: str | Path | None = None) -> MechanismResult:
    """Audit a user's Opacus ``DPOptimizer`` and sampler against the claimed (ε, δ) (see the module docstring).

    Args:
        optimizer_factory: ``params -> DPOptimizer``, built exactly as in the training script.
        sample_rate, steps, delta: the claim's q, T, δ.
        trials: canaries over all runs (half members); canaries_per_run: m per run, even.
        alpha: significance level; seed: run r uses seed ``seed + r``.
        accountant: the accountant of the claim.
        noise_multiplier: the σ the accountant was called with (default: the optimizer's ``noise_multiplier``).
        claimed_epsilon: the ε the user reports (default: the accountant's at σ, q, T, δ).
        sampler_factory: ``(num_samples, generator) -> iterable of index batches``, the training script's batch
            sampler (default :func:`opacus_sampler` at ``sample_rate``).
        run_dir: write ``mechanism.json`` there (signed; bound to the run's claim in a run directory).

    Raises:
        UserError: the factory does not return a ``DPOptimizer``, the sampler misbehaves, or an argument is out
            of range (one line naming it).
    """
    if trials < 2 or canaries_per_run < 2 or canaries_per_run % 2:
        raise UserError(f"trials must be >= 2 and canaries_per_run an even number >= 2, got {trials} and "
                        f"{canaries_per_run}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise UserError(f"steps must be an integer >= 1, got {steps!r}")
    if not 0.0 < sample_rate <= 1.0:
        raise UserError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    if not 0.0 < delta < 1.0:
        raise UserError(f"delta must be in (0, 1), got {delta!r}")
    t0 = time.process_time()
    runs = max(1, math.ceil(trials / canaries_per_run))
    sampler_factory = sampler_factory or opacus_sampler(sample_rate)
    xs, ms, info = [], [], None
    for r in range(runs):
        members, x, info = _one_run(factory=optimizer_factory, sampler_factory=sampler_factory, m=canaries_per_run,
                                    steps=int(steps), rng=np.random.default_rng(seed + r))
        xs.append(x)
        ms.append(members)
    sigma_opt, C, name = info
    claim = claim_for(noise_multiplier=sigma_opt if noise_multiplier is None else float(noise_multiplier),
                      sample_rate=sample_rate, steps=int(steps), delta=delta, accountant=accountant,
                      claimed_epsilon=claimed_epsilon)
    x, members = np.concatenate(xs), np.concatenate(ms)
    est, v = score_and_judge(x=x, members=members, claim=claim, alpha=alpha)
    result = make_result(target=f"opacus {name}", claim=claim, max_grad_norm=C, runs=runs,
                         canaries_per_run=canaries_per_run, members=members, est=est, v=v,
                         cpu_seconds=time.process_time() - t0, seed=seed, mutant=None)
    if run_dir is not None:
        write_mechanism(run_dir, result)
    return result
