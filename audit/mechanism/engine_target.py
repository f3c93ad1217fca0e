"""Run the project's own DP-SGD engine on the probe and return what the auditor observes.

One run trains :class:`~audit.mechanism.probe.Probe` with m Dirac canaries for T steps through exactly the code a
real run uses: :func:`training.dp.engine.make_stepper` (every ``grad_sample_mode``: Opacus hooks, functorch,
ghost clipping, book-keeping, the fused step; flat / per-layer / automatic clipping where the engine offers it, the noise generator, scaling by the expected batch size, the SGD update) and the Poisson
sampler of :func:`training.dp.sampling.make_sampler`. Half of the canaries (chosen by the seed) are the data
set; the others never are. After every step the weights are read and turned into the noisy sum along each
canary's direction (:func:`~audit.mechanism.probe.read_sums`). Each canary is one trial: it owns its
coordinates, so with the i.i.d. noise of a correct implementation the m trials of one run are independent and
distributed exactly as m separate runs with one canary each.
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import numpy as np
import torch

from audit.mechanism.mutants import RATE_SCALE, apply_mutant
from audit.mechanism.probe import Probe, canary_inputs, flat_weights, probe_loss, read_sums
from audit.mechanism.scoring import alternating_signs

__all__ = ["EngineSpec", "Observations", "engine_observations"]

CLIPPINGS = ("flat", "per_layer", "automatic")
ENGINES = ("hooks", "bk", "functorch", "ghost", "fused")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSpec:
    """The DP-SGD configuration audited on the probe.

    Attributes:
        noise_multiplier: σ > 0 (as claimed).
        sample_rate: q in (0, 1]; ``q · population`` must be a whole number (the expected batch size B).
        steps: T ≥ 1.
        max_grad_norm: C > 0.
        clipping: ``flat``, ``per_layer`` or ``automatic``.
        grad_sample_mode: ``hooks``, ``functorch``, ``ghost`` (Opacus), ``bk`` (book-keeping) or ``fused``; a
            clipping style the engine does not offer is refused by :func:`~training.dp.engine.make_stepper`.
        canaries: m per run, even, ≥ 2 (half of them members).
        sampling: ``poisson`` (what the claim assumes) or ``shuffle`` (fixed-size batches of a shuffled epoch),
            the batch sampler a run with ``privacy.sampling`` set so uses.
        population: the number of examples the sampler draws from (a run's n, so its batches are exactly the run's:
            rate B/n, or fixed batches of B); the member canaries are the first ``members`` of them and the others'
            gradients, orthogonal to every canary, are left out. Default: the members.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    max_grad_norm: float = 1.0
    clipping: str = "flat"
    grad_sample_mode: str = "hooks"
    canaries: int = 2000
    sampling: str = "poisson"
    population: int | None = None

    def __post_init__(self) -> None:
        if self.sampling not in ("poisson", "shuffle"):
            raise ValueError(f"sampling must be poisson or shuffle, got {self.sampling!r}")
        if self.clipping not in CLIPPINGS:
            raise ValueError(f"clipping must be one of {', '.join(CLIPPINGS)}, got {self.clipping!r}")
        if self.grad_sample_mode not in ENGINES:
            raise ValueError(f"grad_sample_mode must be one of {', '.join(ENGINES)}, got {self.grad_sample_mode!r}")
        if self.canaries < 2 or self.canaries % 2:
            raise ValueError(f"canaries must be an even number >= 2, got {self.canaries!r}")
        if not 0.0 < self.sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if self.population is not None and self.population < self.members:
            raise ValueError(f"population must be >= the {self.members} member canaries, got {self.population!r}")
        b = self.sample_rate * self.n
        if abs(b - round(b)) > 1e-6 * max(1.0, b) or round(b) < 1:
            raise ValueError(f"sample_rate × {'population' if self.population else 'members'} = {self.sample_rate} × "
                             f"{self.n} = {b:g} must be a whole number >= 1 (the expected batch size); change "
                             "canaries")

    @property
    def members(self) -> int:
        return self.canaries // 2

    @property
    def n(self) -> int:
        """The examples the sampler draws from: ``population`` or the members."""
        return self.population if self.population is not None else self.members

    @property
    def batch_size(self) -> int:
        return int(round(self.sample_rate * self.n))


@dataclasses.dataclass(frozen=True)
class Observations:
    """``x``: (trials, T) sign-corrected noisy sums in units of C; ``members``: (trials,) bool; ``seconds``: CPU."""

    x: np.ndarray
    members: np.ndarray
    seconds: float


def engine_observations(spec: EngineSpec, *, seed: int, mutant: str | None = None) -> Observations:
    """One run of the engine on the probe (see the module docstring); ``mutant`` plants a bug
    (:mod:`audit.mechanism.mutants`).

    Args:
        spec: the configuration.
        seed: seeds the membership draw, the sampler and the noise generator.
        mutant: a :data:`~audit.mechanism.mutants.MUTANTS` name, or None for the engine as it is.

    Returns:
        The run's :class:`Observations` (m trials).
    """
    from training.config import OptimConfig
    from training.dp.engine import make_stepper
    from training.dp.recipe import TrainRecipe
    from training.dp.sampling import make_sampler

    t0 = time.process_time()
    m, n, B = spec.canaries, spec.members, spec.batch_size
    rng = np.random.default_rng(seed)
    order = rng.permutation(m)
    member_ids = np.sort(order[:n])
    members = np.zeros(m, dtype=bool)
    members[member_ids] = True
    recipe = TrainRecipe(steps=spec.steps, batch_size=B, optim=OptimConfig(name="sgd", lr=1.0),
                         noise_multiplier=float(spec.noise_multiplier), max_grad_norm=float(spec.max_grad_norm),
                         clipping=spec.clipping, grad_sample_mode=spec.grad_sample_mode, physical_batch_size=max(n, 1))
    model = Probe(m)
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stepper = make_stepper(model=model, recipe=recipe, sample_rate=spec.sample_rate, generator=gen, device="cpu",
                               loss_fn=probe_loss)
    if mutant is not None:
        apply_mutant(stepper, mutant)
    real_batch = min(spec.n, int(round(B * RATE_SCALE.get(mutant, 1.0))))
    sampler = make_sampler(sampling=spec.sampling, n=spec.n, batch_size=real_batch, seed=int(rng.integers(2**31)))
    signs = alternating_signs(spec.steps)
    x = np.empty((m, spec.steps))
    try:
        for t in range(spec.steps):
            local = np.asarray(sampler.indices(t))
            idx = member_ids[local[local < n]]
            inputs = canary_inputs(idx, m, max_grad_norm=spec.max_grad_norm)
            targets = torch.full((len(idx),), float(signs[t]))
            before = flat_weights(model)
            stepper.step(inputs, targets)
            y = read_sums(before, flat_weights(model), batch_size=B, lr=1.0, max_grad_norm=spec.max_grad_norm)
            x[:, t] = signs[t] * y
    finally:
        stepper.close()
    return Observations(x=x, members=members, seconds=time.process_time() - t0)
