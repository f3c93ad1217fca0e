"""The mechanism audit's math: exact per-trial scores, the family's trade-off curves, the ε bound and its verdict."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from audit.bounds.verdict import verdict
from audit.mechanism import family
from audit.mechanism.estimate import MechanismClaim, mechanism_estimate, threshold_grid
from audit.mechanism.scoring import simulate_observations, step_llr, trial_scores

warnings.filterwarnings("ignore", category=UserWarning)


def test_scores_equal_the_log_likelihood_ratio_of_a_slow_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7))
    for q in (1.0, 0.3, 0.01):
        slow = [sum(math.log(((1 - q) * stats.norm.pdf(v, 0, 0.9) + q * stats.norm.pdf(v, 1, 0.9))
                             / stats.norm.pdf(v, 0, 0.9)) for v in row) for row in x]
        np.testing.assert_allclose(trial_scores(x, noise_multiplier=0.9, sample_rate=q), slow, rtol=1e-9)
    with pytest.raises(ValueError, match="sample_rate"):
        step_llr(x, noise_multiplier=1.0, sample_rate=0.0)
    with pytest.raises(ValueError, match="non-finite"):
        trial_scores(np.array([[np.nan]]), noise_multiplier=1.0, sample_rate=1.0)


def test_reused_noise_cancels_in_the_alternating_sum():
    x = simulate_observations(members=np.zeros(3, bool), steps=4, noise_multiplier=2.0, sample_rate=1.0, rng=0,
                              reuse_noise=True)
    np.testing.assert_allclose(x.sum(1), 0.0, atol=1e-12)  # x_t = s_t·y_t = b + σ·z·s_t: the noise cancels
    honest = simulate_observations(members=np.ones(20_000, bool), steps=3, noise_multiplier=2.0,
                                   sample_rate=0.25, rng=1)
    assert abs(honest.mean() - 0.25) < 0.03 and abs(honest.std() - math.sqrt(4 + 0.1875)) < 0.05


def test_full_batch_curve_is_gdp_and_poisson_curve_is_monotone_in_sigma():
    x = np.array([0.01, 0.2, 0.5])
    np.testing.assert_allclose(family.tradeoff(x, sigma=2.0, sample_rate=1.0, steps=4),
                               stats.norm.cdf(stats.norm.ppf(1 - x) - 1.0))
    lo = family.tradeoff(x, sigma=0.8, sample_rate=0.05, steps=20)
    hi = family.tradeoff(x, sigma=1.6, sample_rate=0.05, steps=20)
    assert np.all(hi >= lo) and np.all(lo <= 1 - x + 1e-12) and np.all(lo >= 0)


def test_sigma_upper_bound_is_the_refutation_boundary():
    fpr, fnr, q, T = 0.05, 0.7, 0.05, 20
    s = family.sigma_upper_bound(fpr=fpr, fnr=fnr, sample_rate=q, steps=T, start=1.0, rel_tol=5e-3)
    assert family.refutes(sigma=s * 1.01, fpr=fpr, fnr=fnr, sample_rate=q, steps=T)
    assert not family.refutes(sigma=s / 1.01, fpr=fpr, fnr=fnr, sample_rate=q, steps=T)
    assert family.sigma_upper_bound(fpr=0.5, fnr=0.5, sample_rate=q, steps=T, start=1.0) == math.inf


def _audit(*, eps_noise=1.0, rate=1.0, reuse=False, q=1.0, T=10, n=10_000, seed=0):
    claim = MechanismClaim.from_accountant(noise_multiplier=2.0 if q == 1.0 else 1.0, sample_rate=q, steps=T,
                                           delta=1e-5)
    members = np.arange(2 * n) < n
    x = simulate_observations(members=members, steps=T, noise_multiplier=claim.noise_multiplier, sample_rate=q,
                              rng=seed, noise_scale=eps_noise, rate_scale=rate, reuse_noise=reuse)
    s = trial_scores(x, noise_multiplier=claim.noise_multiplier, sample_rate=q)
    est = mechanism_estimate(scores_in=s[members], scores_out=s[~members], claim=claim)
    return claim, est, verdict(claimed_epsilon=claim.epsilon, estimates=[est], claimed_delta=claim.delta)


def test_honest_full_batch_is_consistent_and_tight():
    claim, est, v = _audit()
    assert str(v.status) == "CONSISTENT" and not est.extra["claim_refuted"]
    assert 0.8 * claim.epsilon < est.epsilon_lb <= claim.epsilon
    assert est.extra["mu_lb"] <= math.sqrt(10) / 2.0


@pytest.mark.parametrize("bug", [dict(eps_noise=0.8), dict(reuse=True)])
def test_full_batch_bugs_are_violations(bug):
    claim, est, v = _audit(**bug)
    assert str(v.status) == "VIOLATION" and est.extra["claim_refuted"]


def test_poisson_honest_consistent_and_double_rate_caught():
    claim, est, v = _audit(q=0.05, T=40, n=6000)
    assert str(v.status) == "CONSISTENT" and est.epsilon_lb > 0.5 * claim.epsilon
    _, bad, v_bad = _audit(q=0.05, T=40, n=6000, rate=2.0)
    assert str(v_bad.status) == "VIOLATION" and bad.epsilon_lb > claim.epsilon


def test_grid_is_fixed_by_the_claim_not_the_scores():
    claim = MechanismClaim.from_accountant(noise_multiplier=1.0, sample_rate=0.05, steps=10, delta=1e-5)
    assert np.array_equal(threshold_grid(claim, n_out=1000), threshold_grid(claim, n_out=1000))
    with pytest.raises(ValueError, match="noise_multiplier"):
        MechanismClaim(noise_multiplier=0.0, sample_rate=1.0, steps=1, delta=1e-5, epsilon=1.0)
