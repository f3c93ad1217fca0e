"""Power of a canary kit before the audit (audit/bounds/power.py) against Monte Carlo runs of the estimator itself.

The references simulate the one-run game (m canaries in w.p. 1/2, guesses each correct w.p. a) and run the
audit's own estimator (:func:`epsilon_one_run_from_scores` on simulated scores, :func:`epsilon_one_run` on simulated
guess counts), then compare the share of draws whose ε_lb exceeds the claim with the closed form.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import special

from audit.bounds.one_run import epsilon_one_run, epsilon_one_run_from_scores
from audit.bounds.power import canaries_for_claim, detection_probability, guess_totals, kit_power, min_correct
from audit.bounds.runner import k_grids
from audit.canaries import read_secret
from audit.cli import main
from hostile_common import assert_error, cli


def _mc_scores(*, m: int, accuracy: float, claim: float, delta: float, alpha: float, points: int, n: int,
               seed: int) -> float:
    """Share of simulated audits (scores -> the audit's estimator) whose ε_lb exceeds ``claim``.

    Each canary's signal equals its inclusion bit w.p. ``accuracy``; the score is the signal plus noise in [0, 0.5),
    so a top-k guess (k below the signal-1 group's size) is correct w.p. ``accuracy``, independently.
    """
    rng = np.random.default_rng(seed)
    kp, kn = k_grids(m, points=points, guesses="in_out")
    hits = 0
    for _ in range(n):
        included = rng.random(m) < 0.5
        signal = np.where(rng.random(m) < accuracy, included, ~included)
        scores = signal + 0.5 * rng.random(m)
        est = epsilon_one_run_from_scores(scores=scores, included=included, delta=delta, alpha=alpha,
                                          k_pos_grid=kp, k_neg_grid=kn, rng=0)
        hits += est.epsilon_lb > claim
    return hits / n


def _tol(p: float, n: int) -> float:
    return 4.0 * math.sqrt(max(p * (1 - p), 0.01) / n)


@pytest.mark.parametrize("accuracy", [0.8, 0.9])
def test_detection_probability_matches_monte_carlo_of_the_estimator_on_scores(accuracy: float) -> None:
    # one grid point: k = 10 IN and 10 OUT of 300 canaries, far below each signal group's size (exact model)
    m, claim, delta, alpha, n = 300, 0.5, 1e-5, 0.05, 600
    exact = detection_probability(m=m, claim=claim, accuracy=accuracy, delta=delta, alpha=alpha, points=1)
    mc = _mc_scores(m=m, accuracy=accuracy, claim=claim, delta=delta, alpha=alpha, points=1, n=n, seed=1)
    assert 0.05 < exact < 0.95  # the comparison is informative
    assert abs(mc - exact) <= _tol(exact, n)


def test_detection_probability_is_a_lower_bound_for_the_whole_grid() -> None:
    m, claim, delta, alpha, n, accuracy = 200, 0.5, 1e-5, 0.05, 300, 0.75
    exact = detection_probability(m=m, claim=claim, accuracy=accuracy, delta=delta, alpha=alpha, points=2)
    mc = _mc_scores(m=m, accuracy=accuracy, claim=claim, delta=delta, alpha=alpha, points=2, n=n, seed=2)
    assert exact > 0.1
    assert mc >= exact - _tol(exact, n)


def test_min_correct_is_the_first_count_whose_bound_exceeds_the_claim() -> None:
    m, delta, alpha, claim = 300, 1e-5, 0.01, 0.7
    for r in (20, 57, 150):
        lbs = [epsilon_one_run(m=m, r=r, v=v, delta=delta, alpha=alpha).epsilon_lb for v in range(r + 1)]
        brute = next((v for v, e in enumerate(lbs) if e > claim), r + 1)
        assert int(min_correct(m=m, r=np.array([r]), claim=claim, delta=delta, alpha=alpha)[0]) == brute
        assert all(e > claim for e in lbs[brute:])  # monotone in v: the event is V >= v*


def test_detectable_epsilon_is_where_the_monte_carlo_detection_rate_crosses_the_power() -> None:
    m, claim, delta, alpha, power = 1000, 1.0, 1e-5, 0.05, 0.5
    p = kit_power(m=m, claim=claim, delta=delta, alpha=alpha, power=power)
    assert p.epsilon_detectable is not None and claim < p.epsilon_detectable < p.ceiling
    assert p.accuracy_needed == pytest.approx(special.expit(p.epsilon_detectable))
    # guess-level Monte Carlo of the estimator at the kit's best guess total, per-pair level α / n_pairs
    r_all, n_pairs = guess_totals(m)
    assert p.guesses in r_all.tolist()
    rng = np.random.default_rng(3)
    n = 400
    for eps_true, expect_above in ((p.epsilon_detectable + 0.08, True), (p.epsilon_detectable - 0.08, False)):
        v = rng.binomial(p.guesses, special.expit(eps_true), size=n)
        lbs = {int(u): epsilon_one_run(m=m, r=p.guesses, v=int(u), delta=delta, alpha=alpha / n_pairs).epsilon_lb
               for u in np.unique(v)}
        rate = np.mean([lbs[int(u)] > claim for u in v])
        assert (rate > power) == expect_above, (eps_true, rate)
    # the closed form (inverse incomplete beta) against the binomial tail at the same point
    at = detection_probability(m=m, claim=claim, accuracy=p.accuracy_needed, delta=delta, alpha=alpha)
    assert at == pytest.approx(power, abs=1e-6)


def test_ceiling_and_claims_no_kit_can_refute() -> None:
    m, delta, alpha = 500, 1e-5, 0.05
    r_all, n_pairs = guess_totals(m)
    p = kit_power(m=m, claim=8.0, delta=delta, alpha=alpha)
    ceiling = max(epsilon_one_run(m=m, r=int(r), v=int(r), delta=delta, alpha=alpha / n_pairs).epsilon_lb
                  for r in r_all)
    assert p.ceiling == pytest.approx(ceiling, abs=1e-6)
    assert p.ceiling < 8.0 and p.epsilon_detectable is None and not p.detects(100.0)
    assert "cannot be refuted" in p.summary()


def test_stated_accuracy_gives_probability_and_the_largest_refutable_claim() -> None:
    m, delta, alpha, acc = 300, 1e-5, 0.05, 0.85
    p = kit_power(m=m, claim=1.0, delta=delta, alpha=alpha, accuracy=acc)
    assert p.probability == pytest.approx(detection_probability(m=m, claim=1.0, accuracy=acc, delta=delta,
                                                                alpha=alpha))
    assert p.probability > 0.5 and p.refutable_claim > 1.0
    # the refutable claim is refuted w.p. >= power just below it, and is not refuted w.p. >= power just above it
    below = detection_probability(m=m, claim=p.refutable_claim - 1e-3, accuracy=acc, delta=delta, alpha=alpha)
    above = detection_probability(m=m, claim=p.refutable_claim + 0.05, accuracy=acc, delta=delta, alpha=alpha)
    assert below >= 0.5 > above


def test_sizing_for_a_claim_picks_the_fewest_canaries_that_detect() -> None:
    k = canaries_for_claim(claim=1.0, factor=2.0, delta=1e-5, alpha=0.05)
    assert k is not None and k.detects(2.0)
    assert not kit_power(m=k.m - 1, claim=1.0, delta=1e-5, alpha=0.05).detects(2.0)
    a = canaries_for_claim(claim=1.0, accuracy=0.9, delta=1e-5, alpha=0.05)
    assert a is not None and a.probability >= 0.5
    assert detection_probability(m=a.m - 1, claim=1.0, delta=1e-5, alpha=0.05, accuracy=0.9) < 0.5
    assert canaries_for_claim(claim=8.0, factor=2.0, delta=1e-5, alpha=0.05, max_count=300) is None
    with pytest.raises(ValueError, match="factor"):
        canaries_for_claim(claim=1.0, factor=1.0, delta=1e-5, alpha=0.05)
    with pytest.raises(ValueError, match="accuracy"):
        kit_power(m=100, claim=1.0, delta=1e-5, alpha=0.05, accuracy=0.3)


def test_cli_states_the_power_and_sizes_the_kit(tmp_path) -> None:
    base = ["canaries", "make", "--num-classes", "10", "--image-size", "4", "--seed", "1"]
    res = CliRunner().invoke(main, base + ["--count", "200", "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    expect = kit_power(m=200, claim=1.0, delta=1e-5, alpha=0.05)
    assert f"true ε >= {expect.epsilon_detectable:.3f}" in res.output
    assert "claim ε = 8: cannot be refuted by 200 canaries" in res.output
    res = CliRunner().invoke(main, base + ["--claim", "1", "--factor", "2", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    sized = canaries_for_claim(claim=1.0, factor=2.0, delta=1e-5, alpha=0.05)
    assert f"--claim 1: {sized.m} canaries" in res.output
    assert read_secret(tmp_path / "b" / "canary_secret.npz").count == sized.m
    assert_error(cli(*base, "--claim", "8", "--max-count", "300", "--out", tmp_path / "c"),
                 r"no kit of up to 300 canaries can refute ε = 8")
    assert not (tmp_path / "c").exists()
    # with --count the claim's power is stated for that kit (a kit too small for it says so)
    res = CliRunner().invoke(main, base + ["--claim", "8", "--count", "100", "--out", str(tmp_path / "d")])
    assert res.exit_code == 0 and "power: claim ε = 8: cannot be refuted by 100 canaries" in res.output


def test_the_epsilon_plan_states_the_power_of_each_deciding_one_run_bound() -> None:
    """plan_power (what epsilon.json records under 'power' and audit epsilon prints): one statement per deciding
    one_run bound, at its own m, level and guess grid; none for a bound that does not decide or for no claim;
    a source over POWER_MAX_M examples is recorded as not computed."""
    from types import SimpleNamespace

    from audit.bounds.power_record import POWER_MAX_M, plan_power

    def ev(source: str, m: int) -> SimpleNamespace:
        return SimpleNamespace(source=source, m=m)

    plans = [(ev("auditor_canaries", 300), [("one_run", True), ("one_run_fdp", False)]),
             (ev("input_canaries", 300), [("one_run_fdp", True)]),  # no deciding one_run bound: no statement
             (ev("pool", POWER_MAX_M + 1), [("one_run", True), ("clopper_pearson", False)])]
    entries = plan_power(plans=plans, claimed_epsilon=1.0, delta=1e-5, alpha_deciding=0.025, points=2,
                         guesses="in")
    expect = kit_power(m=300, claim=1.0, delta=1e-5, alpha=0.025, points=2, guesses="in")
    assert [e.source for e in entries] == ["auditor_canaries", "pool"]
    first, pool = entries
    assert first.computed and (first.m, first.alpha, first.delta, first.power) == (300, 0.025, 1e-5, 0.5)
    assert first.epsilon_detectable == pytest.approx(expect.epsilon_detectable)
    assert first.accuracy_needed == pytest.approx(expect.accuracy_needed) and first.guesses == expect.guesses
    assert first.statement == ("power of auditor_canaries (m = 300; what it could detect, whatever it found): "
                               f"{expect.summary()}")
    # the grid it was given is the one used: guessing IN only with 2 points detects less than the default grid
    assert first.epsilon_detectable > kit_power(m=300, claim=1.0, delta=1e-5, alpha=0.025).epsilon_detectable
    assert not pool.computed and pool.epsilon_detectable is None and "not computed" in pool.statement
    for claim in (float("inf"), 0.0):
        assert plan_power(plans=plans, claimed_epsilon=claim, delta=1e-5, alpha_deciding=0.025, points=2,
                          guesses="in") == ()
