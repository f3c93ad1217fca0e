"""experiments.stats against slow, obviously correct references (scipy, explicit loops)."""

import itertools
import math
import statistics

import numpy as np
import pytest
from scipy import stats as sps

from experiments.stats import (bonferroni, chance_test, fmt_mean_sd, holm, linear_fit, mean_ci, mean_sd, pooled_sd,
                         verdict, welch)


def test_welch_matches_scipy_on_random_groups():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.normal(0, rng.uniform(0.5, 2), size=rng.integers(2, 8))
        b = rng.normal(0.5, rng.uniform(0.5, 2), size=rng.integers(2, 8))
        ref = sps.ttest_ind(a, b, equal_var=False)
        got = welch(list(a), list(b))
        assert got.t == pytest.approx(ref.statistic) and got.p == pytest.approx(ref.pvalue)
        ci = ref.confidence_interval(0.95)
        assert (got.ci_low, got.ci_high) == pytest.approx((ci.low, ci.high))
        assert got.diff == pytest.approx(a.mean() - b.mean())


def test_welch_from_summary_matches_scipy_from_stats():
    from experiments.stats import welch_from_summary

    ref = sps.ttest_ind_from_stats(18.6, 0.5, 3, 12.3, 2.5, 3, equal_var=False)
    got = welch_from_summary(18.6, 0.5, 3, 12.3, 2.5, 3)
    assert (got.t, got.p) == pytest.approx((ref.statistic, ref.pvalue))
    with pytest.raises(ValueError):
        welch_from_summary(1.0, 0.1, 1, 2.0, 0.1, 3)


def test_welch_degenerate_groups():
    assert welch([1.0], [2.0, 3.0]) is None
    assert welch([1.0, 1.0], [1.0, 1.0]).p == 1.0
    assert welch([1.0, 1.0], [2.0, 2.0]).p == 0.0


def test_holm_matches_reference_and_is_monotone():
    rng = np.random.default_rng(1)
    for m in (1, 2, 3, 5):
        for _ in range(10):
            p = list(rng.uniform(0, 0.3, size=m))
            got = holm(p)
            assert all(g >= q - 1e-15 for g, q in zip(got, p))
            assert all(g <= b + 1e-15 for g, b in zip(got, bonferroni(p)))
    # rejection sets agree with the textbook step-down procedure at alpha = 0.05
    for p in itertools.product([0.001, 0.02, 0.03, 0.2], repeat=3):
        order = sorted(range(3), key=lambda i: p[i])
        rejected = set()
        for rank, i in enumerate(order):
            if p[i] > 0.05 / (3 - rank):
                break
            rejected.add(i)
        assert {i for i, a in enumerate(holm(list(p))) if a <= 0.05} == rejected


def test_best_of_three_bonferroni_is_the_issue_correction():
    assert bonferroni([0.021, 0.4, 0.3])[0] == pytest.approx(0.063)
    assert holm([0.021, 0.4, 0.3])[0] == pytest.approx(0.063)


def test_pooled_sd_is_within_group_not_overall():
    a, b = [22.0, 23.0, 22.7], [21.4, 22.0, 19.7]
    ref = math.sqrt(((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b)) / 4)
    assert pooled_sd(a, b) == pytest.approx(ref)
    assert statistics.stdev(a + b) == pytest.approx(1.2, abs=0.06)  # the old, wrong number
    assert pooled_sd([1.0, 1.0], [5.0, 5.0]) == 0.0  # groups far apart but no spread within
    assert math.isnan(pooled_sd([1.0], [2.0]))
    with pytest.raises(ValueError):
        pooled_sd()


def test_mean_sd_and_format():
    assert mean_sd([1.0, 2.0, 3.0, None, float("nan")]) == (2.0, 1.0, 3)
    assert fmt_mean_sd([0.1, 0.3], ".1f", 100) == "20.0 ± 14.1"
    lo, hi = mean_ci([1.0, 2.0, 3.0, 4.0])
    ref = sps.t.interval(0.95, 3, loc=2.5, scale=statistics.stdev([1, 2, 3, 4]) / 2)
    assert (lo, hi) == pytest.approx(ref)


def test_verdict_needs_the_test_and_the_sign():
    assert verdict(diff=0.07, p=0.063) == "inconclusive"
    assert verdict(diff=0.07, p=0.049) == "reproduced"
    assert verdict(diff=-0.07, p=0.01) == "not reproduced"
    assert verdict(diff=0.07, p=float("nan")) == "inconclusive"


def test_chance_test_matches_binomial_tail():
    r = chance_test(0.123, n=1000, chance=0.1)
    ref = sum(math.comb(1000, k) * 0.1 ** k * 0.9 ** (1000 - k) for k in range(123, 1001))
    assert r.p_above == pytest.approx(ref, rel=1e-6)
    assert r.near and not chance_test(0.25, n=1000, chance=0.1).near
    with pytest.raises(ValueError):
        chance_test(0.5, n=10, chance=1.0)


def test_linear_fit_matches_linregress_and_reports_dof():
    rng = np.random.default_rng(2)
    x = np.arange(6.0)
    y = 0.5 * x + rng.normal(0, 0.3, 6)
    ref = sps.linregress(x, y)
    f = linear_fit(x, y)
    assert (f.slope, f.intercept, f.r_squared, f.slope_se, f.p_slope) == pytest.approx(
        (ref.slope, ref.intercept, ref.rvalue ** 2, ref.stderr, ref.pvalue))
    assert f.dof == 4
    three = linear_fit([0, 1, 2], [2.0, 1.1, 0.4])
    assert three.dof == 1 and three.r_squared > 0.98
    assert math.isnan(linear_fit([0, 1], [1.0, 2.0]).p_slope)
    with pytest.raises(ValueError):
        linear_fit([1, 1, 1], [1, 2, 3])


def test_three_point_fits_have_one_dof_and_r2_at_least_three_quarters_when_monotone():
    """Why transfer.md calls a 3-block geometric fit inconclusive: every monotone 3-point sequence has R² >= 0.75."""
    from audit.transfer.separability import fit_geometric_decay

    rng = np.random.default_rng(3)
    for _ in range(200):
        y = np.sort(rng.uniform(0.1, 10, size=3))[::-1]
        assert linear_fit([0, 1, 2], np.log(y)).r_squared >= 0.75 - 1e-12
        assert fit_geometric_decay(list(y)).dof == 1
    assert linear_fit([0, 1, 2], [0.0, 0.0, 1.0]).r_squared == pytest.approx(0.75)


# --- the two-sided rule and the equivalence rule (issue 36), on synthetic data with a known answer ---

def test_compare_is_two_sided_and_says_not_reproduced_when_the_data_show_the_opposite():
    from experiments.stats import compare

    rng = np.random.default_rng(1)
    paper_dir = compare(list(rng.normal(1.0, 0.1, 6)), list(rng.normal(0.0, 0.1, 6)))
    opposite = compare(list(rng.normal(0.0, 0.1, 6)), list(rng.normal(1.0, 0.1, 6)))
    noise = compare(list(rng.normal(0.0, 1.0, 3)), list(rng.normal(0.1, 1.0, 3)))
    assert (paper_dir.verdict, opposite.verdict, noise.verdict) == ("reproduced", "not reproduced", "inconclusive")
    # the p is two-sided (scipy's) before the correction, and the correction can turn a verdict inconclusive
    a, b = [1.0, 1.3, 0.8, 1.1], [0.6, 0.9, 0.4, 0.7]
    ref = sps.ttest_ind(a, b, equal_var=False).pvalue
    one, five = compare(a, b), compare(a, b, family=5)
    assert one.p_corrected == pytest.approx(ref) and five.p_corrected == pytest.approx(min(1.0, 5 * ref))
    assert one.verdict == "reproduced" and ref < 0.05 < 5 * ref and five.verdict == "inconclusive"
    assert compare([1.0], [2.0, 3.0]) is None
    with pytest.raises(ValueError, match="family"):
        compare(a, b, family=0)


def _tost_reference(a, b, margin, alpha=0.05):
    """TOST the slow way: the two one-sided Welch tests by scipy against shifted data (a − δ and a + δ)."""
    a = np.asarray(a, float)
    lower = sps.ttest_ind(a + margin, b, equal_var=False, alternative="greater").pvalue  # H0: diff <= -δ
    upper = sps.ttest_ind(a - margin, b, equal_var=False, alternative="less").pvalue     # H0: diff >= +δ
    return max(lower, upper)


def test_tost_matches_two_shifted_one_sided_scipy_tests_and_its_interval():
    from experiments.stats import tost

    rng = np.random.default_rng(2)
    for _ in range(25):
        a = rng.normal(0, rng.uniform(0.2, 1), size=rng.integers(3, 9))
        b = rng.normal(rng.uniform(-0.5, 0.5), rng.uniform(0.2, 1), size=rng.integers(3, 9))
        margin = rng.uniform(0.1, 1.0)
        r = tost(list(a), list(b), margin=margin)
        assert r.p_equivalent == pytest.approx(_tost_reference(a, b, margin))
        ci = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.90)
        assert (r.ci_low, r.ci_high) == pytest.approx((ci.low, ci.high))
        # equivalence shown exactly when the 90 % interval lies inside the margin
        assert (r.p_equivalent < 0.05) == (-margin < r.ci_low and r.ci_high < margin)


def test_equivalence_rule_on_synthetic_data_equivalent_different_and_undecided():
    from experiments.stats import all_equivalent, equivalence_verdict, tost

    rng = np.random.default_rng(3)
    same = tost(list(rng.normal(0.83, 0.005, 8)), list(rng.normal(0.83, 0.005, 8)), margin=0.02)
    far = tost(list(rng.normal(0.80, 0.005, 8)), list(rng.normal(0.86, 0.005, 8)), margin=0.02)
    noisy = tost(list(rng.normal(0.83, 0.05, 3)), list(rng.normal(0.83, 0.05, 3)), margin=0.02)
    assert equivalence_verdict(same) == "reproduced"          # the claim of sameness holds
    assert equivalence_verdict(far) == "not reproduced"       # the difference exceeds the margin
    assert equivalence_verdict(noisy) == "inconclusive"       # too noisy to say either
    # a difference test would call 'same' nothing at all: failing to reject is not equivalence
    assert welch(list(rng.normal(0.83, 0.05, 3)), list(rng.normal(0.83, 0.05, 3))).p > 0.05
    # a significant but tiny difference, inside the margin, is still equivalent
    a, b = [1.000, 1.001, 1.002, 1.001, 1.000], [1.010, 1.011, 1.012, 1.011, 1.010]
    assert welch(a, b).p < 0.001 and equivalence_verdict(tost(a, b, margin=0.05)) == "reproduced"
    assert all_equivalent([same, same]) == "reproduced"
    assert all_equivalent([same, noisy]) == "inconclusive"    # every pair must be shown equivalent
    assert all_equivalent([same, far]) == "not reproduced"
    assert equivalence_verdict(None) == "inconclusive" and tost([1.0], [1.0, 2.0], margin=1) is None


def test_tost_bad_input_and_exact_groups():
    from experiments.stats import tost

    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="margin"):
            tost([1.0, 2.0], [1.0, 2.0], margin=bad)
    with pytest.raises(ValueError, match="alpha"):
        tost([1.0, 2.0], [1.0, 2.0], margin=1.0, alpha=0.5)
    exact_in, exact_out = tost([1.0, 1.0], [1.1, 1.1], margin=0.2), tost([1.0, 1.0], [1.5, 1.5], margin=0.2)
    assert (exact_in.p_equivalent, exact_in.p_beyond) == (0.0, 1.0)
    assert (exact_out.p_equivalent, exact_out.p_beyond) == (1.0, 0.0)
