"""Tests for the one-run audit (Steinke, Nasr, Jagielski 2023) in audit/epsilon: its p-value and ε bound, and the
f-DP variant against a Gaussian trade-off curve. Exactness against naive loops, validity on null scores, power
on a strong signal (see tests/test_epsilon_estimators.py for the conventions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from estimator_common import ALPHA, N_TRIALS, _max_false_positives
from scipy import stats

from audit.bounds import (
    eps_from_mu,
    epsilon_one_run,
    epsilon_one_run_fdp,
    epsilon_one_run_fdp_from_scores,
    epsilon_one_run_from_scores,
    mu_one_run_fdp,
    one_run_fdp_rejects,
    one_run_guess_counts,
    one_run_pvalue,
)

# -------------------------------------------------------------------------------------------------------- one run


def _naive_pvalue(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The Steinke–Nasr–Jagielski bound with the maximum over i = 1..m as the paper writes it."""
    q = math.exp(eps) / (1 + math.exp(eps))
    beta = stats.binom.sf(v - 1, r, q)
    if delta == 0:
        return float(beta)
    a = max((stats.binom.sf(v - i - 1, r, q) - beta) / i for i in range(1, m + 1))
    return float(min(1.0, beta + 2 * m * delta * a))


def test_one_run_pvalue_matches_naive_loop() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        m = int(rng.integers(1, 120))
        r = int(rng.integers(1, m + 1))
        v = int(rng.integers(0, r + 1))
        eps = float(rng.uniform(0, 4))
        delta = float(rng.choice([0.0, 1e-5, 1e-3, 0.05]))
        got = one_run_pvalue(m=m, r=r, v=v, epsilon=eps, delta=delta)
        assert got == pytest.approx(_naive_pvalue(m, r, v, eps, delta), rel=1e-9, abs=1e-15)
    # Vectorised call over an ε grid equals the scalar calls.
    grid = np.linspace(0, 3, 7)
    vec = one_run_pvalue(m=100, r=50, v=40, epsilon=grid, delta=1e-4)
    assert vec.tolist() == [one_run_pvalue(m=100, r=50, v=40, epsilon=float(e), delta=1e-4) for e in grid]


@pytest.mark.parametrize("r", [10, 100, 1000, 10000])
def test_one_run_perfect_separation_ceiling(r: int) -> None:
    # δ = 0, v = r: p = q^r <= α  ⇔  ε <= -ln(α^(-1/r) - 1) = ln(r / ln(1/α)) - ln(1 + x/2 + ...), x = ln(1/α)/r.
    # The approximation's relative error is ~ x / (2 ln(r / ln(1/α))): 13% at r = 10, < 1% for r >= 100.
    est = epsilon_one_run(m=r, r=r, v=r, delta=0.0, alpha=ALPHA)
    exact = -math.log(ALPHA ** (-1 / r) - 1)
    assert est.epsilon_lb == pytest.approx(exact, abs=2e-7)
    assert est.epsilon_lb == pytest.approx(math.log(r / math.log(1 / ALPHA)), rel=0.15 if r == 10 else 0.01)
    assert est.ceiling == est.epsilon_lb


def test_one_run_bound_sits_on_the_rejection_boundary() -> None:
    for (m, r, v, delta) in [(1000, 100, 90, 1e-5), (1000, 1000, 700, 1e-5), (500, 200, 150, 0.0)]:
        est = epsilon_one_run(m=m, r=r, v=v, delta=delta, alpha=ALPHA)
        assert est.epsilon_lb > 0
        assert one_run_pvalue(m=m, r=r, v=v, epsilon=est.epsilon_lb, delta=delta) <= ALPHA
        assert one_run_pvalue(m=m, r=r, v=v, epsilon=est.epsilon_lb + 1e-5, delta=delta) > ALPHA
        assert est.epsilon_lb <= epsilon_one_run(m=m, r=r, v=v, delta=0.0, alpha=ALPHA).epsilon_lb
        assert est.epsilon_lb < epsilon_one_run(m=m, r=r, v=min(v + 5, r), delta=delta, alpha=ALPHA).epsilon_lb


def test_one_run_at_epsilon_zero_is_the_exact_binomial_test() -> None:
    # A mechanism that ignores its data is 0-DP: correct guesses are Bin(r, 1/2), so ε_lb > 0 must need
    # P[Bin(r, 1/2) >= v] <= α.
    r = 200
    for v in range(100, 201):
        positive = epsilon_one_run(m=r, r=r, v=v, delta=0.0, alpha=ALPHA).epsilon_lb > 0
        assert positive == (stats.binom.sf(v - 1, r, 0.5) <= ALPHA)


def _naive_guess_counts(scores, included, k_pos, k_neg, keys):
    order = sorted(range(len(scores)), key=lambda j: (-scores[j], keys[j]))
    top, bottom = order[:k_pos], order[len(order) - k_neg:] if k_neg else []
    return sum(bool(included[j]) for j in top) + sum(not included[j] for j in bottom)


def test_one_run_from_scores_equals_naive_loop_with_bonferroni() -> None:
    rng = np.random.default_rng(8)
    m = 300
    inc = rng.random(m) < 0.5
    scores = np.round(1.5 * inc + rng.normal(size=m), 1)  # rounding creates ties
    kp_grid, kn_grid = [10, 30, 100], [0, 30, 100]
    est = epsilon_one_run_from_scores(scores=scores, included=inc, delta=1e-5, alpha=ALPHA, k_pos_grid=kp_grid,
                                      k_neg_grid=kn_grid, rng=11)
    keys = np.random.default_rng(11).random(m)
    pairs = [(kp, kn) for kp in kp_grid for kn in kn_grid]
    best = max(
        (epsilon_one_run(m=m, r=kp + kn, v=_naive_guess_counts(scores, inc, kp, kn, keys), delta=1e-5,
                         alpha=ALPHA / len(pairs)).epsilon_lb, kp, kn)
        for kp, kn in pairs
    )
    assert est.epsilon_lb == pytest.approx(best[0], abs=1e-9)
    assert est.epsilon_lb > 0.3
    assert est.counts["n_pairs"] == 9 and est.extra["alpha_per_pair"] == pytest.approx(ALPHA / 9)
    assert (est.counts["k_pos"], est.counts["k_neg"]) == best[1:]
    assert est.counts["v"] == est.counts["v_pos"] + est.counts["v_neg"]
    assert est.epsilon_lb <= est.ceiling
    again = epsilon_one_run_from_scores(scores=scores, included=inc, delta=1e-5, alpha=ALPHA, k_pos_grid=kp_grid,
                                        k_neg_grid=kn_grid, rng=11)
    assert again == est  # reproducible for a fixed tie-breaking seed


def test_guess_counts_vectorised_equals_loop() -> None:
    rng = np.random.default_rng(9)
    scores, inc = rng.integers(0, 5, 50).astype(float), rng.random(50) < 0.5
    c = one_run_guess_counts(scores=scores, included=inc, k_pos_grid=[0, 5, 20], k_neg_grid=[1, 10, 30], rng=3)
    keys = np.random.default_rng(3).random(50)
    for kp, kn, v in zip(c.k_pos, c.k_neg, c.v, strict=True):
        assert v == _naive_guess_counts(scores, inc, int(kp), int(kn), keys)


def test_ties_do_not_leak_canary_order() -> None:
    # All scores equal and members listed first: index-order tie-breaking would make every guess correct.
    m = 400
    inc = np.arange(m) < m // 2
    for fn in (epsilon_one_run_from_scores, epsilon_one_run_fdp_from_scores):
        est = fn(scores=np.zeros(m), included=inc, delta=1e-5, alpha=ALPHA, k_pos_grid=[200], k_neg_grid=[0],
                 rng=0)
        assert est.epsilon_lb == 0.0
        assert est.counts["v"] < 150


def test_one_run_bounds_are_zero_on_null_scores() -> None:
    rng = np.random.default_rng(10)
    m, nonzero, nonzero_fdp = 100, 0, 0
    for t in range(N_TRIALS):
        inc = rng.random(m) < 0.5
        scores = rng.normal(size=m)
        kw = dict(scores=scores, included=inc, alpha=ALPHA, k_pos_grid=[10, 25, 50], k_neg_grid=[0, 25], rng=t)
        nonzero += epsilon_one_run_from_scores(delta=0.0, **kw).epsilon_lb > 0
        nonzero_fdp += epsilon_one_run_fdp_from_scores(delta=1e-5, **kw).epsilon_lb > 0
    assert nonzero <= _max_false_positives(N_TRIALS, ALPHA)
    assert nonzero_fdp <= _max_false_positives(N_TRIALS, ALPHA)


def test_one_run_has_power_on_strong_signal() -> None:
    rng = np.random.default_rng(11)
    inc = rng.random(1000) < 0.5
    scores = 4.0 * inc + rng.normal(size=1000)
    kw = dict(scores=scores, included=inc, alpha=ALPHA, k_pos_grid=[50, 200], k_neg_grid=[0, 200], rng=0)
    assert epsilon_one_run_from_scores(delta=1e-5, **kw).epsilon_lb > 2.0
    assert epsilon_one_run_fdp_from_scores(delta=1e-5, **kw).epsilon_lb > 2.0


# ---------------------------------------------------------------------------------------------------- one run f-DP


def _naive_fdp_rejects(m: int, r: int, v: int, mu: float, alpha: float) -> bool:
    big_r, big_h = alpha * v / m, alpha * (r - v) / m
    for i in range(v - 1, -1, -1):
        h_new = max(big_h, stats.norm.cdf(stats.norm.ppf(big_r) - mu))
        big_r = min(big_r + i / (r - i) * (h_new - big_h), 1.0)
        big_h = h_new
    return big_r + big_h > r / m


def test_fdp_recursion_matches_naive_loop() -> None:
    rng = np.random.default_rng(12)
    for _ in range(60):
        m = int(rng.integers(2, 300))
        r = int(rng.integers(1, m + 1))
        v = int(rng.integers(r // 2, r + 1))
        mu = float(rng.uniform(0, 3))
        alpha = float(rng.choice([0.01, 0.05, 0.2]))
        assert one_run_fdp_rejects(m=m, r=r, v=v, mu=mu, alpha=alpha) == _naive_fdp_rejects(m, r, v, mu, alpha)


def test_fdp_mu_bound_sits_on_boundary_and_converts_to_epsilon() -> None:
    for (m, r, v) in [(1000, 100, 100), (1000, 100, 90), (1000, 1000, 700)]:
        mu = mu_one_run_fdp(m=m, r=r, v=v, alpha=ALPHA)
        assert mu > 0
        assert one_run_fdp_rejects(m=m, r=r, v=v, mu=mu, alpha=ALPHA)
        assert not one_run_fdp_rejects(m=m, r=r, v=v, mu=mu + 1e-5, alpha=ALPHA)
        est = epsilon_one_run_fdp(m=m, r=r, v=v, delta=1e-5, alpha=ALPHA)
        assert est.extra["mu_lb"] == pytest.approx(mu, abs=1e-9)
        assert est.epsilon_lb == pytest.approx(eps_from_mu(mu=mu, delta=1e-5), rel=1e-12)
        assert est.assumptions == "Gaussian trade-off curve" and est.epsilon_lb <= est.ceiling


def test_fdp_at_mu_zero_never_rejects_more_than_the_exact_binomial_test() -> None:
    # Data-independent output is 0-GDP and gives C ~ Bin(r, 1/2): rejecting μ = 0 at v needs P[C >= v] <= α.
    r = 200
    for v in range(100, 201):
        if one_run_fdp_rejects(m=r, r=r, v=v, mu=0.0, alpha=ALPHA):
            assert stats.binom.sf(v - 1, r, 0.5) <= ALPHA


def test_fdp_test_is_valid_and_powerful_on_a_gaussian_mechanism() -> None:
    # Scores N(μ·included, 1) make the release μ-GDP in each canary. At the true μ the rejection rate must stay
    # below α (+ binomial slack); at a quarter of the true μ the test should reject almost always.
    rng = np.random.default_rng(13)
    m, mu, trials = 500, 3.0, 100
    false_rej = power = 0
    for _ in range(trials):
        inc = rng.random(m) < 0.5
        order = np.argsort(-(mu * inc + rng.normal(size=m)))
        v = int(inc[order[:100]].sum() + (~inc[order[-100:]]).sum())
        false_rej += one_run_fdp_rejects(m=m, r=200, v=v, mu=mu, alpha=ALPHA)
        power += one_run_fdp_rejects(m=m, r=200, v=v, mu=mu / 4, alpha=ALPHA)
    assert false_rej <= _max_false_positives(trials, ALPHA)
    assert power >= 0.9 * trials
