"""Tests for the empirical-ε estimators (audit/epsilon): invariants, slow references, bad inputs.
Clopper–Pearson, GDP, result objects and bad inputs here; the one-run audit (ε and f-DP) in
tests/test_epsilon_one_run.py.

Every estimator is a lower confidence bound, so the central checks are
* validity: with no signal (scores independent of membership) the bound is 0 in at least ``1 - alpha`` of seeded
  trials (up to binomial slack computed in the test), and at a known mechanism it does not exceed the truth;
* power: with a strong signal it is positive (so the validity checks are not passed by returning 0);
* exactness: vectorised code equals naive loops, closed forms match, and search results sit on the boundary.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from estimator_common import ALPHA, N_TRIALS, _max_false_positives
from scipy import optimize, stats

from audit.bounds import (
    Bonferroni,
    EpsilonEstimate,
    HeldOut,
    clopper_pearson_interval,
    clopper_pearson_upper,
    counts_at_thresholds,
    eps_from_mu,
    epsilon_clopper_pearson,
    epsilon_from_scores_cp,
    epsilon_from_scores_gdp,
    epsilon_gdp,
    epsilon_multi_run,
    epsilon_one_run,
    epsilon_one_run_fdp,
    epsilon_one_run_from_scores,
    gdp_delta,
    gdp_mu_lower_bound,
    mu_from_eps,
    one_run_fdp_rejects,
    one_run_pvalue,
)

# ----------------------------------------------------------------------------------------------- Clopper–Pearson


@pytest.mark.parametrize("k,n", [(0, 1), (0, 10), (3, 10), (10, 10), (1, 1000), (517, 1000), (1000, 1000)])
@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.3])
def test_cp_interval_matches_beta_quantiles(k: int, n: int, alpha: float) -> None:
    lo, hi = clopper_pearson_interval(k=k, n=n, alpha=alpha)
    want_lo = 0.0 if k == 0 else stats.beta.ppf(alpha / 2, k, n - k + 1)
    want_hi = 1.0 if k == n else stats.beta.ppf(1 - alpha / 2, k + 1, n - k)
    assert lo == pytest.approx(want_lo, rel=1e-9, abs=1e-14)
    assert hi == pytest.approx(want_hi, rel=1e-9, abs=1e-14)
    # Defining property of the exact upper bound: P[Bin(n, hi) <= k] = alpha/2 (for k < n).
    if k < n:
        assert stats.binom.cdf(k, n, hi) == pytest.approx(alpha / 2, rel=1e-6)


def test_cp_upper_vectorised_equals_scalar_loop() -> None:
    ks = np.arange(0, 51)
    vec = clopper_pearson_upper(k=ks, n=50, alpha=0.05)
    loop = [clopper_pearson_upper(k=int(k), n=50, alpha=0.05) for k in ks]
    np.testing.assert_allclose(vec, loop, rtol=0, atol=0)
    assert np.all(np.diff(vec) > 0)


def test_cp_interval_coverage_by_simulation() -> None:
    rng = np.random.default_rng(0)
    p, n, trials = 0.3, 40, 1000
    ks = rng.binomial(n, p, size=trials)
    covered = sum(lo <= p <= hi for lo, hi in (clopper_pearson_interval(k=int(k), n=n, alpha=0.1) for k in ks))
    assert covered >= trials - _max_false_positives(trials, 0.1)


def test_cp_perfect_separation_known_number() -> None:
    # fp = fn = 0: FPR_ub = FNR_ub = 1 - (α/2)^(1/n), ε = ln((1 - u) / u): 5.6006 for n = 1000, α = 0.05.
    est = epsilon_clopper_pearson(fp=0, n_neg=1000, fn=0, n_pos=1000, delta=0.0, alpha=0.05)
    u = 1 - 0.025 ** (1 / 1000)
    assert est.epsilon_lb == pytest.approx(math.log((1 - u) / u), rel=1e-10)
    assert est.epsilon_lb == pytest.approx(5.6006, abs=1e-4)
    assert est.ceiling == est.epsilon_lb
    assert est.counts == {"fp": 0, "tn": 1000, "n_neg": 1000, "fn": 0, "tp": 1000, "n_pos": 1000}


@pytest.mark.parametrize("fp,n_neg,fn,n_pos,delta", [(3, 500, 100, 500, 0.0), (40, 1000, 20, 800, 1e-5),
                                                      (0, 200, 150, 200, 0.01), (250, 500, 250, 500, 0.0)])
def test_cp_epsilon_matches_manual_formula(fp: int, n_neg: int, fn: int, n_pos: int, delta: float) -> None:
    alpha = 0.05
    fpr_ub = stats.beta.ppf(1 - alpha / 2, fp + 1, n_neg - fp)
    fnr_ub = stats.beta.ppf(1 - alpha / 2, fn + 1, n_pos - fn)
    terms = [math.log((1 - delta - a) / b) for a, b in ((fpr_ub, fnr_ub), (fnr_ub, fpr_ub)) if 1 - delta - a > 0]
    want = max([0.0, *terms])
    est = epsilon_clopper_pearson(fp=fp, n_neg=n_neg, fn=fn, n_pos=n_pos, delta=delta, alpha=alpha)
    assert est.epsilon_lb == pytest.approx(want, rel=1e-8, abs=1e-12)
    assert 0.0 <= est.epsilon_lb <= est.ceiling
    swapped = epsilon_clopper_pearson(fp=fn, n_neg=n_pos, fn=fp, n_pos=n_neg, delta=delta, alpha=alpha)
    assert swapped.epsilon_lb == pytest.approx(est.epsilon_lb, rel=1e-12)


def test_counts_at_thresholds_matches_loop() -> None:
    rng = np.random.default_rng(1)
    s_in, s_out = rng.integers(0, 10, 60).astype(float), rng.integers(0, 10, 40).astype(float)
    thr = np.arange(-1, 12, 0.5)
    fp, fn = counts_at_thresholds(scores_in=s_in, scores_out=s_out, thresholds=thr)
    assert fp.tolist() == [int(np.sum(s_out >= t)) for t in thr]
    assert fn.tolist() == [int(np.sum(s_in < t)) for t in thr]


def test_bonferroni_equals_loop_over_grid() -> None:
    rng = np.random.default_rng(2)
    s_in, s_out = rng.normal(2.0, 1.0, 300), rng.normal(0.0, 1.0, 300)
    grid = np.linspace(-1, 4, 11)
    est = epsilon_from_scores_cp(scores_in=s_in, scores_out=s_out, delta=1e-5, alpha=0.05,
                                 threshold_strategy=Bonferroni(grid=grid))
    per = []
    for t in grid:  # naive: every threshold at α / len(grid), keep the best
        e = epsilon_clopper_pearson(fp=int(np.sum(s_out >= t)), n_neg=300, fn=int(np.sum(s_in < t)), n_pos=300,
                                    delta=1e-5, alpha=0.05 / grid.size)
        per.append(e.epsilon_lb)
    assert est.epsilon_lb == pytest.approx(max(per), rel=1e-12)
    assert est.epsilon_lb > 0.5
    assert est.alpha == 0.05 and est.extra["alpha_per_test"] == pytest.approx(0.05 / 11)
    assert est.extra["threshold"] == pytest.approx(grid[int(np.argmax(per))])


def test_held_out_evaluates_on_disjoint_part_and_is_reproducible() -> None:
    rng = np.random.default_rng(3)
    s_in, s_out = rng.normal(3.0, 1.0, 101), rng.normal(0.0, 1.0, 99)
    kw = dict(scores_in=s_in, scores_out=s_out, delta=0.0, alpha=0.05)
    a = epsilon_from_scores_cp(**kw, threshold_strategy=HeldOut(fraction=0.3, rng=7))
    b = epsilon_from_scores_cp(**kw, threshold_strategy=HeldOut(fraction=0.3, rng=7))
    assert a == b
    assert a.counts["n_pos"] == 101 - math.floor(0.3 * 101) and a.counts["n_neg"] == 99 - math.floor(0.3 * 99)
    assert a.extra["n_thresholds"] == 1 and a.extra["alpha_per_test"] == 0.05
    # The bound is exactly the fixed-threshold bound on the evaluation counts.
    ref = epsilon_clopper_pearson(fp=a.counts["fp"], n_neg=a.counts["n_neg"], fn=a.counts["fn"],
                                  n_pos=a.counts["n_pos"], delta=0.0, alpha=0.05)
    assert a.epsilon_lb == ref.epsilon_lb > 1.0


@pytest.mark.parametrize("strategy", ["held_out", "bonferroni"])
def test_cp_and_gdp_are_zero_on_null_scores(strategy: str) -> None:
    rng = np.random.default_rng(4)
    nonzero_cp = nonzero_gdp = 0
    for t in range(N_TRIALS):
        s_in, s_out = rng.normal(size=60), rng.normal(size=60)
        strat = HeldOut(fraction=0.5, rng=t) if strategy == "held_out" else Bonferroni(grid=[-1.0, 0.0, 1.0])
        kw = dict(scores_in=s_in, scores_out=s_out, delta=1e-5, alpha=ALPHA, threshold_strategy=strat)
        nonzero_cp += epsilon_from_scores_cp(**kw).epsilon_lb > 0
        nonzero_gdp += epsilon_from_scores_gdp(**kw).epsilon_lb > 0
    assert nonzero_cp <= _max_false_positives(N_TRIALS, ALPHA)
    assert nonzero_gdp <= _max_false_positives(N_TRIALS, ALPHA)


# ------------------------------------------------------------------------------------------------------------ GDP


def test_gdp_mu_zero_is_eps_zero() -> None:
    assert eps_from_mu(mu=0.0, delta=1e-5) == 0.0
    assert eps_from_mu(mu=0.0, delta=0.0) == 0.0
    assert gdp_delta(mu=0.0, eps=1.0) == 0.0


def test_eps_from_mu_known_value_by_independent_root_finding() -> None:
    def gap(eps: float) -> float:  # δ(ε) − δ for μ = 1, straight from the Dong–Roth–Su formula
        return stats.norm.cdf(-eps + 0.5) - math.exp(eps) * stats.norm.cdf(-eps - 0.5) - 1e-5

    want = optimize.brentq(gap, 0.0, 50.0, xtol=1e-14)
    assert eps_from_mu(mu=1.0, delta=1e-5) == pytest.approx(want, rel=1e-9)
    assert want == pytest.approx(4.3772, abs=1e-4)


@pytest.mark.parametrize("mu", [0.05, 0.5, 1.0, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 1e-2])
def test_eps_mu_round_trip(mu: float, delta: float) -> None:
    eps = eps_from_mu(mu=mu, delta=delta)
    if eps > 0:
        assert gdp_delta(mu=mu, eps=eps) == pytest.approx(delta, rel=1e-7)
        assert mu_from_eps(eps=eps, delta=delta) == pytest.approx(mu, rel=1e-9)
    assert eps_from_mu(mu=mu_from_eps(eps=1.5, delta=delta), delta=delta) == pytest.approx(1.5, rel=1e-9)


def test_eps_from_mu_monotone_and_limits() -> None:
    eps = [eps_from_mu(mu=m, delta=1e-5) for m in (0.1, 0.5, 1, 2, 4)]
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))
    assert eps_from_mu(mu=1.0, delta=1e-3) < eps_from_mu(mu=1.0, delta=1e-6)
    assert eps_from_mu(mu=1.0, delta=0.0) == math.inf
    assert eps_from_mu(mu=math.inf, delta=1e-5) == math.inf
    assert mu_from_eps(eps=2.0, delta=0.0) == 0.0
    assert eps_from_mu(mu=0.1, delta=0.5) == 0.0  # δ above δ(0) = 2Φ(μ/2) − 1


def test_gdp_mu_lower_bound_manual_formula() -> None:
    fpr_ub = stats.beta.ppf(1 - 0.025, 50 + 1, 1000 - 50)
    fnr_ub = stats.beta.ppf(1 - 0.025, 300 + 1, 1000 - 300)
    want = stats.norm.ppf(1 - fpr_ub) - stats.norm.ppf(fnr_ub)
    got = gdp_mu_lower_bound(fp=50, n_neg=1000, fn=300, n_pos=1000, alpha=0.05)
    assert got == pytest.approx(want, rel=1e-8)
    est = epsilon_gdp(fp=50, n_neg=1000, fn=300, n_pos=1000, delta=1e-5, alpha=0.05)
    assert est.extra["mu_lb"] == pytest.approx(want, rel=1e-8)
    assert est.epsilon_lb == pytest.approx(eps_from_mu(mu=want, delta=1e-5), rel=1e-12)
    assert est.assumptions == "Gaussian trade-off curve"
    assert gdp_mu_lower_bound(fp=500, n_neg=1000, fn=500, n_pos=1000, alpha=0.05) == 0.0


def test_gdp_recovers_gaussian_mu_from_scores() -> None:
    # Scores N(μ·member, 1) are exactly μ-GDP: the bound must not exceed μ and should come close to it.
    rng = np.random.default_rng(5)
    mu = 1.0
    s_in, s_out = rng.normal(mu, 1.0, 20000), rng.normal(0.0, 1.0, 20000)
    est = epsilon_from_scores_gdp(scores_in=s_in, scores_out=s_out, delta=1e-5, alpha=0.05,
                                  threshold_strategy=HeldOut(fraction=0.2, rng=0))
    assert 0.85 * mu < est.extra["mu_lb"] <= mu
    assert est.epsilon_lb <= eps_from_mu(mu=mu, delta=1e-5)


def test_multi_run_returns_cp_and_gdp() -> None:
    rng = np.random.default_rng(6)
    with_c, without_c = rng.normal(4.0, 1.0, 256), rng.normal(0.0, 1.0, 256)
    ests = epsilon_multi_run(scores_with=with_c, scores_without=without_c, delta=1e-5, alpha=0.05,
                             threshold_strategy=HeldOut(rng=0))
    assert [e.method for e in ests] == ["clopper_pearson", "gdp"]
    assert all(e.epsilon_lb > 0 and e.extra["setting"] == "multi_run" for e in ests)
    only_cp = epsilon_multi_run(scores_with=with_c, scores_without=without_c, delta=0.0, alpha=0.05,
                                threshold_strategy=HeldOut(rng=0))
    assert [e.method for e in only_cp] == ["clopper_pearson"]


# ------------------------------------------------------------------------------------------------- result objects


def test_estimate_is_frozen_and_serialisable() -> None:
    est = epsilon_one_run(m=1000, r=100, v=95, delta=1e-5, alpha=0.05)
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.epsilon_lb = 10.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        est.counts["v"] = 100  # type: ignore[index]
    d = json.loads(json.dumps(est.to_dict()))
    assert d["method"] == "one_run" and d["counts"] == {"m": 1000, "r": 100, "v": 95}
    assert set(d) == {"method", "epsilon_lb", "alpha", "delta", "counts", "ceiling", "assumptions", "extra"}


# ------------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: clopper_pearson_interval(k=11, n=10, alpha=0.05), r"k must be in \[0, n=10\], got 11"),
        (lambda: clopper_pearson_interval(k=-1, n=10, alpha=0.05), r"k must be an integer >= 0, got -1"),
        (lambda: clopper_pearson_interval(k=1, n=10, alpha=1.5), r"alpha must be in \(0, 1\), got 1.5"),
        (lambda: clopper_pearson_interval(k=1, n=0, alpha=0.05), r"n must be an integer >= 1, got 0"),
        (lambda: epsilon_clopper_pearson(fp=-1, n_neg=10, fn=0, n_pos=10, delta=0.0, alpha=0.05),
         r"fp must be an integer >= 0, got -1"),
        (lambda: epsilon_clopper_pearson(fp=0, n_neg=10, fn=11, n_pos=10, delta=0.0, alpha=0.05),
         r"fn must be in \[0, n_pos=10\], got 11"),
        (lambda: epsilon_clopper_pearson(fp=0, n_neg=10, fn=0, n_pos=10, delta=1.0, alpha=0.05),
         r"delta must be in \[0, 1\), got 1.0"),
        (lambda: epsilon_clopper_pearson(fp=0, n_neg=10, fn=0, n_pos=10, delta=0.0, alpha=0.0),
         r"alpha must be in \(0, 1\), got 0.0"),
        (lambda: epsilon_gdp(fp=0, n_neg=10, fn=0, n_pos=10, delta=0.0, alpha=0.05),
         r"delta must be in \(0, 1\) for this estimator, got 0.0"),
        (lambda: eps_from_mu(mu=-1.0, delta=1e-5), r"mu must be in \[0, inf\], got -1.0"),
        (lambda: mu_from_eps(eps=1.0, delta=-0.1), r"delta must be in \[0, 1\), got -0.1"),
        (lambda: one_run_pvalue(m=10, r=5, v=6, epsilon=1.0, delta=0.0), r"v must be in \[0, r=5\], got 6"),
        (lambda: epsilon_one_run(m=10, r=11, v=5, delta=0.0, alpha=0.05), r"r must be in \[1, m=10\], got 11"),
        (lambda: epsilon_one_run(m=10, r=5, v=6, delta=0.0, alpha=0.05), r"v must be in \[0, r=5\], got 6"),
        (lambda: epsilon_one_run(m=10, r=5, v=-2, delta=0.0, alpha=0.05), r"v must be an integer >= 0, got -2"),
        (lambda: epsilon_one_run(m=10, r=5, v=2, delta=0.0, alpha=-0.1), r"alpha must be in \(0, 1\), got -0.1"),
        (lambda: epsilon_one_run_fdp(m=10, r=5, v=6, delta=1e-5, alpha=0.05), r"v must be in \[0, r=5\], got 6"),
        (lambda: one_run_fdp_rejects(m=10, r=5, v=4, mu=-1.0, alpha=0.05), r"mu must be in \[0, inf\), got -1.0"),
        (lambda: epsilon_one_run_from_scores(scores=np.zeros(10), included=np.zeros(10, bool), delta=0.0,
                                             alpha=0.05, k_pos_grid=[8], k_neg_grid=[5]),
         r"k_pos \+ k_neg must be in \[1, m=10\] for every grid pair, got \(k_pos=8, k_neg=5\)"),
        (lambda: epsilon_one_run_from_scores(scores=np.zeros(10), included=np.zeros(10), delta=0.0, alpha=0.05,
                                             k_pos_grid=[2], k_neg_grid=[0]),
         r"included must be a boolean array, got dtype float64"),
        (lambda: epsilon_one_run_from_scores(scores=np.zeros(10), included=np.zeros(10, bool), delta=0.0,
                                             alpha=0.05, k_pos_grid=[-1], k_neg_grid=[0]),
         r"k_pos_grid entries must be >= 0, got min -1"),
        (lambda: HeldOut(fraction=1.0), r"fraction must be in \(0, 1\), got 1.0"),
        (lambda: Bonferroni(grid=[]), r"grid must hold at least one threshold"),
        (lambda: Bonferroni(grid=[0.0, 0.0]), r"grid thresholds must be distinct"),
        (lambda: epsilon_from_scores_cp(scores_in=[1.0], scores_out=[0.0, np.nan], delta=0.0, alpha=0.05,
                                        threshold_strategy=Bonferroni(grid=[0.5])),
         r"scores_out must be finite"),
        (lambda: epsilon_from_scores_cp(scores_in=[1.0, 2.0], scores_out=[0.0, 1.0], delta=0.0, alpha=0.05,
                                        threshold_strategy=HeldOut(fraction=0.2)),
         r"HeldOut\(fraction=0.2\) leaves an empty part of scores_in"),
        (lambda: EpsilonEstimate(method="x", epsilon_lb=-1.0, alpha=0.05, delta=0.0, counts={}, ceiling=1.0),
         r"epsilon_lb must be in \[0, inf\], got -1.0"),
        (lambda: EpsilonEstimate(method="x", epsilon_lb=1.0, alpha=0.05, delta=0.0, counts={"r": -3}, ceiling=1.0),
         r"counts must be non-negative integers"),
    ],
)
def test_bad_inputs_are_rejected(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_wrong_types_are_rejected() -> None:
    with pytest.raises(TypeError, match=r"k must be an integer"):
        clopper_pearson_interval(k=1.5, n=10, alpha=0.05)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"alpha must be a real number"):
        epsilon_one_run(m=10, r=5, v=2, delta=0.0, alpha="0.05")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"threshold_strategy must be HeldOut or Bonferroni"):
        epsilon_from_scores_cp(scores_in=[1.0], scores_out=[0.0], delta=0.0, alpha=0.05,
                               threshold_strategy=0.5)  # type: ignore[arg-type]
