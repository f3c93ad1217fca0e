"""An honest implementation is refuted at most at rate α: the engine is the mechanism's math, and the rule's rate."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from audit.mechanism.engine_target import EngineSpec, engine_observations
from audit.mechanism.estimate import MechanismClaim
from audit.mechanism.false_rate import false_violation_probability, simulated_false_violations
from audit.mechanism.scoring import alternating_signs

warnings.filterwarnings("ignore", category=UserWarning)
ALPHA = 0.05


@pytest.mark.parametrize("mode,clipping", [("hooks", "flat"), ("hooks", "per_layer"), ("bk", "flat"),
                                           ("bk", "per_layer"), ("functorch", "flat"), ("ghost", "flat"),
                                           ("fused", "flat")])
def test_engine_is_the_mechanism_math_with_its_own_noise_draws(mode, clipping):
    """What the auditor reads from the engine is b + s_t·z_t with z_t the noise generator's own N(0, σ²C²) draws:
    no noise reuse, no wrong σ or C, no lost or extra step (the seed that gave an honest VIOLATION included)."""
    sigma, C, m, T = 2.0, 2.0, 200, 4
    spec = EngineSpec(noise_multiplier=sigma, sample_rate=1.0, steps=T, max_grad_norm=C, canaries=m,
                      clipping=clipping, grad_sample_mode=mode)
    for seed in (10_000, 7):
        o = engine_observations(spec, seed=seed)
        rng = np.random.default_rng(seed)
        rng.permutation(m)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        s = alternating_signs(T)
        expected = np.empty((m, T))
        for t in range(T):
            a, b = (torch.normal(0.0, sigma * C, size=(1, m), generator=gen).double().numpy()[0] for _ in range(2))
            expected[:, t] = o.members + s[t] * (a + b) / math.sqrt(2.0) / C
        np.testing.assert_allclose(o.x, expected, atol=1e-5)


def _binomial_ok(k: int, n: int) -> bool:
    """False when k false refutations in n audits would be very unlikely (p < 0.001) at a rate of α."""
    return stats.binomtest(k, n, ALPHA, alternative="greater").pvalue >= 1e-3


@pytest.mark.parametrize("sigma,q,T", [(2.0, 1.0, 4), (1.0, 0.1, 20)])
def test_false_violation_rate_of_the_honest_mechanism_is_at_most_alpha(sigma, q, T):
    claim = MechanismClaim.from_accountant(noise_multiplier=sigma, sample_rate=q, steps=T, delta=1e-5)
    k = simulated_false_violations(claim, trials=4000, seeds=range(150), alpha=ALPHA)
    assert _binomial_ok(k, 150), k
    # the check has teeth: a mechanism with 15 % less noise than claimed is refuted far above α and fails it
    broken = simulated_false_violations(claim, trials=4000, seeds=range(40), alpha=ALPHA, noise_scale=0.85)
    assert not _binomial_ok(broken, 40), broken


def test_exact_false_violation_probability_agrees_with_the_estimator_and_is_far_below_alpha():
    honest = MechanismClaim.from_accountant(noise_multiplier=2.0, sample_rate=1.0, steps=4, delta=1e-5)
    p = false_violation_probability(honest, trials=8000, draws=200_000, rng=1)
    assert 1e-4 < p < 1e-3  # ≈ 3.5e-4: a false VIOLATION in 20 seeds has probability ≈ 0.7 %
    # the counts-only computation is the estimator's rule: a claim of ε = 3.4 (true ε 4.377) is refuted at a
    # rate both agree on
    low = MechanismClaim(noise_multiplier=2.0, sample_rate=1.0, steps=4, delta=1e-5, epsilon=3.4)
    p_low = false_violation_probability(low, trials=2000, draws=50_000, rng=2)
    k = simulated_false_violations(low, trials=2000, seeds=range(300))
    assert 0.05 < p_low < 0.95
    assert abs(k / 300 - p_low) < 4 * math.sqrt(p_low * (1 - p_low) / 300) + 1e-3, (k, p_low)
    with pytest.raises(ValueError, match="full-batch"):
        false_violation_probability(MechanismClaim.from_accountant(noise_multiplier=1.0, sample_rate=0.1, steps=2,
                                                                   delta=1e-5), trials=100)


def test_a_population_sampler_draws_the_runs_batches_and_keeps_only_the_canaries():
    """With population n the sampler draws from n examples at rate B/n and the canaries are the first members of
    them: each member canary is in a step's batch with probability q, non-members never (σ → 0 shows b itself)."""
    spec = EngineSpec(noise_multiplier=1e-5, sample_rate=7 / 3001, steps=200, canaries=400, population=3001)
    o = engine_observations(spec, seed=0)
    b = np.round(o.x).astype(int)
    assert set(np.unique(b)) <= {0, 1} and not b[~o.members].any()
    k = b[o.members].sum()
    assert abs(k - 200 * 200 * 7 / 3001) < 4 * math.sqrt(200 * 200 * 7 / 3001), k
    with pytest.raises(ValueError, match="population"):
        EngineSpec(noise_multiplier=1.0, sample_rate=0.5, steps=1, canaries=400, population=100)
