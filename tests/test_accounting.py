"""Accountants: golden numbers, the ordering RDP ≥ PLD ≈ PRV, composition, σ calibration, validation, CLI."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from training.accounting import (
    ACCOUNTANTS,
    WEAK_PRIVACY_EPSILON,
    DPPhase,
    check_delta,
    cross_check,
    default_delta,
    epsilon_for,
    epsilons_for,
    noise_multiplier_for,
    steps_for_epochs,
)
from foundation.errors import UserError

# Golden values computed with opacus 1.6.0 (PRV, RDP) and dp-accounting 0.6.0 (PLD, interval 1e-4).
GOLDEN = {
    (1.0, 0.01, 1000, 1e-5): {"prv": 1.838371637, "rdp": 2.101365272, "pld": 1.828243646},
    (2.0, 0.1, 100, 1e-6): {"prv": 2.685178373, "rdp": 2.914173458, "pld": 2.675035741},
}


@pytest.mark.parametrize("key", sorted(GOLDEN))
@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_golden_epsilons(key, accountant):
    sigma, q, steps, delta = key
    eps = epsilon_for(phases=[DPPhase(sigma, q, steps)], delta=delta, accountant=accountant)
    assert eps == pytest.approx(GOLDEN[key][accountant], rel=1e-4)


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_accountants_agree_in_the_expected_order(key):
    sigma, q, steps, delta = key
    eps = epsilons_for(phases=[DPPhase(sigma, q, steps)], delta=delta)
    # RDP is a looser upper bound; PRV's certified upper bound is within its ε error (0.01) + 1% of PLD.
    assert eps["rdp"] >= eps["pld"]
    assert eps["rdp"] <= 1.3 * eps["pld"]
    assert abs(eps["prv"] - eps["pld"]) <= 0.01 + 0.01 * eps["pld"]


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_two_identical_phases_compose_like_one_long_phase(accountant):
    half = DPPhase(1.5, 0.02, 150)
    whole = DPPhase(1.5, 0.02, 300)
    split = epsilon_for(phases=[half, half], delta=1e-5, accountant=accountant)
    single = epsilon_for(phases=[whole], delta=1e-5, accountant=accountant)
    assert split == pytest.approx(single, rel=2e-3, abs=2e-3)


def test_heterogeneous_phases_compose_between_max_and_sum():
    a, b = DPPhase(1.0, 0.01, 300), DPPhase(2.0, 0.05, 200)
    for acc in ("rdp", "prv"):
        ea = epsilon_for(phases=[a], delta=1e-5, accountant=acc)
        eb = epsilon_for(phases=[b], delta=1e-5, accountant=acc)
        eab = epsilon_for(phases=[a, b], delta=1e-5, accountant=acc)
        assert max(ea, eb) < eab < ea + eb
        assert eab == pytest.approx(epsilon_for(phases=[b, a], delta=1e-5, accountant=acc), rel=1e-6)


def test_epsilon_decreases_with_noise_and_zero_steps_cost_nothing():
    eps = [epsilon_for(phases=[DPPhase(s, 0.05, 200)], delta=1e-5, accountant="rdp") for s in (0.8, 1.0, 1.5, 3.0)]
    assert all(x > y for x, y in zip(eps, eps[1:]))
    assert epsilon_for(phases=[DPPhase(1.0, 0.05, 0)], delta=1e-5, accountant="prv") == 0.0
    assert epsilon_for(phases=[], delta=1e-5, accountant="pld") == 0.0


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_noise_multiplier_round_trips(accountant):
    sigma = noise_multiplier_for(target_epsilon=3.0, sample_rate=0.02, steps=300, delta=1e-5, accountant=accountant)
    eps = epsilon_for(phases=[DPPhase(sigma, 0.02, 300)], delta=1e-5, accountant=accountant)
    assert 3.0 - 0.01 <= eps <= 3.0
    # a slightly smaller sigma must overshoot the target (sigma is not needlessly large)
    eps_less = epsilon_for(phases=[DPPhase(0.97 * sigma, 0.02, 300)], delta=1e-5, accountant=accountant)
    assert eps_less > 3.0 - 0.01


def test_noise_multiplier_round_trips_pld_with_coarse_tolerance():
    sigma = noise_multiplier_for(target_epsilon=2.7, sample_rate=0.1, steps=100, delta=1e-6, accountant="pld",
                                 epsilon_tolerance=0.05)
    eps = epsilon_for(phases=[DPPhase(sigma, 0.1, 100)], delta=1e-6, accountant="pld")
    assert 2.7 - 0.05 <= eps <= 2.7
    assert sigma == pytest.approx(2.0, rel=0.03)  # the golden (2.0, 0.1, 100, 1e-6) pld value is ≈ 2.675


def test_tighter_accountant_needs_less_noise():
    kw = dict(target_epsilon=2.0, sample_rate=0.01, steps=1000, delta=1e-5)
    assert noise_multiplier_for(**kw, accountant="prv") < noise_multiplier_for(**kw, accountant="rdp")


def test_unreachable_target_is_a_clear_user_error():
    with pytest.raises(UserError, match="unreachable"):
        noise_multiplier_for(target_epsilon=1e-4, sample_rate=1.0, steps=100_000, delta=1e-5, accountant="rdp")


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_target_met_without_meaningful_noise_is_refused(accountant):
    """ε = 1e9 used to calibrate to the search's floor σ ≈ 0.001 and train an all-but-noiseless "DP" model."""
    with pytest.raises(UserError, match=r"target epsilon 1e\+09 needs no meaningful noise .* train without DP"):
        noise_multiplier_for(target_epsilon=1e9, sample_rate=0.01, steps=1000, delta=1e-5, accountant=accountant)
    # the largest target a config accepts still calibrates to real noise
    sigma = noise_multiplier_for(target_epsilon=100.0, sample_rate=0.01, steps=1000, delta=1e-5, accountant=accountant)
    assert 0.1 < sigma < 1.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(noise_multiplier=0.0, sample_rate=0.1, steps=1), "noise_multiplier"),
    (dict(noise_multiplier=-1.0, sample_rate=0.1, steps=1), "noise_multiplier"),
    (dict(noise_multiplier=float("nan"), sample_rate=0.1, steps=1), "noise_multiplier"),
    (dict(noise_multiplier=1.0, sample_rate=0.0, steps=1), "sample_rate"),
    (dict(noise_multiplier=1.0, sample_rate=1.5, steps=1), "sample_rate"),
    (dict(noise_multiplier=1.0, sample_rate=0.1, steps=-1), "steps"),
    (dict(noise_multiplier=1.0, sample_rate=0.1, steps=2.5), "steps"),
])
def test_phase_validation(kwargs, match):
    with pytest.raises(UserError, match=match):
        DPPhase(**kwargs)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 2.0])
def test_bad_delta_and_accountant_are_user_errors(delta):
    with pytest.raises(UserError, match=r"delta must be in \(0, 1\)"):
        epsilon_for(phases=[DPPhase(1.0, 0.1, 10)], delta=delta, accountant="rdp")
    with pytest.raises(ValueError):  # UserError is a ValueError
        epsilon_for(phases=[DPPhase(1.0, 0.1, 10)], delta=1e-5, accountant="gdp")
    with pytest.raises(UserError, match="target epsilon"):
        noise_multiplier_for(target_epsilon=0.0, sample_rate=0.1, steps=10, delta=1e-5, accountant="rdp")


def test_weak_privacy_falls_back_to_the_rdp_bound_with_a_warning():
    phase = DPPhase(0.3, 0.1, 1000)
    rdp = epsilon_for(phases=[phase], delta=1e-5, accountant="rdp")
    assert rdp > WEAK_PRIVACY_EPSILON
    with pytest.warns(RuntimeWarning, match="RDP upper bound"):
        assert epsilon_for(phases=[phase], delta=1e-5, accountant="prv") == rdp


def test_cross_check_reports_claim_and_pld():
    phases = [DPPhase(1.0, 0.01, 1000)]
    out = cross_check(phases=phases, delta=1e-5, accountant="rdp")
    assert out["accountant"] == "rdp" and out["reference_accountant"] == "pld"
    assert out["epsilon"] == pytest.approx(GOLDEN[(1.0, 0.01, 1000, 1e-5)]["rdp"], rel=1e-4)
    assert out["epsilon_pld"] == out["reference_epsilon"] == pytest.approx(
        GOLDEN[(1.0, 0.01, 1000, 1e-5)]["pld"], rel=1e-4)
    assert out["relative_difference"] == pytest.approx(out["epsilon"] / out["epsilon_pld"] - 1.0)
    assert 0.0 < out["relative_difference"] < 0.3


def test_default_delta_and_checks():
    assert default_delta(1) == 0.1
    assert default_delta(10) == 0.01
    assert default_delta(1000) == 1e-4
    assert default_delta(1001) == 1e-5
    assert default_delta(50_000) == 1e-6
    for n in (1, 7, 999, 1000, 12345, 10**7):
        d = default_delta(n)
        assert d <= 1 / (10 * n) < 10 * d * (1 + 1e-12)
        assert check_delta(d, n) == []
    assert "1/n" in check_delta(1e-3, 1000)[0]
    assert "1/(10 n)" in check_delta(5e-4, 1000)[0]
    with pytest.raises(UserError):
        default_delta(0)


def test_steps_for_epochs():
    assert steps_for_epochs(epochs=1, sample_rate=0.01) == 100
    assert steps_for_epochs(epochs=2, sample_rate=256 / 50_000) == 391
    assert steps_for_epochs(epochs=0.001, sample_rate=0.5) == 1
    with pytest.raises(UserError):
        steps_for_epochs(epochs=0, sample_rate=0.5)


# ------------------------------------------------------------------------------------------------------- CLI


def _invoke(args):
    from click.testing import CliRunner

    from audit.cli import main

    return CliRunner().invoke(main, ["accountant", *args])


def test_cli_prints_epsilon_of_every_accountant():
    res = _invoke(["--sigma", "1.0", "--sample-rate", "0.01", "--steps", "1000", "--delta", "1e-5"])
    assert res.exit_code == 0, res.output
    for name, value in GOLDEN[(1.0, 0.01, 1000, 1e-5)].items():
        assert name in res.output and f"{value:.4f}" in res.output


def test_cli_target_epsilon_from_batch_dataset_epochs_json():
    res = _invoke(["--target-epsilon", "4", "--batch-size", "100", "--dataset-size", "5000", "--epochs", "5",
                   "--accountant", "rdp", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["sample_rate"] == 0.02 and out["steps"] == 250 and out["delta"] == 1e-5
    assert 3.99 <= out["epsilons"]["rdp"] <= 4.0
    assert math.isclose(out["epsilon"], out["epsilons"]["rdp"])


@pytest.mark.parametrize("args, match", [
    (["--sigma", "1", "--sample-rate", "0.01", "--steps", "10", "--delta", "2"], "delta must be in (0, 1)"),
    (["--sigma", "1", "--sample-rate", "0.01", "--steps", "10"], "--delta"),
    (["--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5"], "--sigma"),
    (["--sigma", "1", "--sample-rate", "3", "--steps", "10", "--delta", "1e-5"], "sample_rate must be in (0, 1]"),
    (["--sigma", "-1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5"], "noise_multiplier"),
])
def test_cli_bad_values_exit_2_with_one_line(args, match):
    res = _invoke(args)
    assert res.exit_code == 2
    err = res.stderr.strip()
    assert err.startswith("error: ") and match in err and "\n" not in err


def test_rdp_accounting_is_warning_free():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning raised inside fails the test
        eps = epsilon_for(phases=[DPPhase(1.0, 0.01, 100)], delta=1e-5, accountant="rdp")
    assert 0.0 < eps < float("inf")


def test_schedule_and_account_without_a_shell():
    from audit.accountant import Schedule, account, dp_sgd_schedule

    assert dp_sgd_schedule(sample_rate=0.01, steps=10) == Schedule(sample_rate=0.01, steps=10)
    assert dp_sgd_schedule(batch_size=100, dataset_size=5000, epochs=5) == Schedule(sample_rate=0.02, steps=250)
    assert dp_sgd_schedule(batch_size=100, dataset_size=5000, steps=7).steps == 7
    for kw, match in [({"sample_rate": 0.1, "batch_size": 3, "steps": 1}, "not both"),
                      ({"batch_size": 10, "dataset_size": 5, "steps": 1}, "larger than"),
                      ({"steps": 1}, "give the sample rate"),
                      ({"sample_rate": 0.1}, "--steps T or --epochs E"),
                      ({"sample_rate": 0.1, "steps": 0}, ">= 1")]:
        with pytest.raises(UserError, match=match):
            dp_sgd_schedule(**kw)
    r = account(sigma=1.0, sample_rate=0.01, steps=1000, delta=1e-5)
    assert r.epsilons == pytest.approx(GOLDEN[(1.0, 0.01, 1000, 1e-5)], rel=1e-4) and r.epsilon == r.epsilons["prv"]
    assert list(r.to_dict()) == ["noise_multiplier", "sample_rate", "steps", "delta", "accountant",
                                 "target_epsilon", "epsilon", "epsilons", "warnings"]
    s = account(target_epsilon=r.epsilons["rdp"], sample_rate=0.01, steps=1000, delta=1e-5, accountant="rdp")
    assert s.noise_multiplier == pytest.approx(1.0, rel=1e-3)
    assert account(sigma=1.0, sample_rate=0.5, steps=10, dataset_size=10).delta == default_delta(10)
    with pytest.raises(UserError, match="exactly one of --sigma"):
        account(sample_rate=0.01, steps=10, delta=1e-5)
