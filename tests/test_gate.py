"""Tests of `audit gate`: each rule passes and fails on constructed runs; exit codes 0/1/2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from audit.cli import main
from audit.gating import evaluate_gate, load_policy, parse_policy
from fixtures_runs import make_run, update_json
from foundation.errors import ConfigError, UserError
from foundation.io import read_json

REPO = Path(__file__).resolve().parents[1]
DEFAULT_POLICY = REPO / "eval_configs" / "gates" / "default.yaml"


def _policy(*rules: dict) -> object:
    return parse_policy({"rules": list(rules)})


def _gate(base: Path, cand: Path, *rules: dict):
    result = evaluate_gate(baseline=base, candidate=cand, policy=_policy(*rules))
    assert len(result.rules) == len(rules)
    return result


def _set_tpr(run: Path, attack: str, level: str, tpr: float, lo: float, hi: float) -> None:
    def mutate(d: dict) -> None:
        m = d["attacks"][attack]["metrics"]
        m["tpr_at_fpr"][level] = tpr
        m["tpr_at_fpr_ci"][level] = [lo, hi]

    update_json(run, "attack.json", mutate)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return make_run(tmp_path / "base", seed=1), make_run(tmp_path / "cand", seed=2)


def test_max_claimed_epsilon(tmp_path: Path, pair) -> None:
    base, cand = pair
    rule = {"rule": "max_claimed_epsilon", "budget": 8.0}
    assert _gate(base, cand, rule).passed  # 8 <= 8
    assert not _gate(base, make_run(tmp_path / "big", epsilon=8.5), rule).passed
    nodp = _gate(base, make_run(tmp_path / "nodp", dp=False), rule)
    assert not nodp.passed and "no DP claim" in nodp.rules[0].detail


def test_no_violation(tmp_path: Path, pair) -> None:
    base, cand = pair
    rule = {"rule": "no_violation"}
    assert _gate(base, cand, rule).passed
    bad = make_run(tmp_path / "viol", epsilon=2.0, epsilon_lb=2.5)
    assert read_json(bad / "epsilon.json")["verdict"]["status"] == "VIOLATION"
    assert not _gate(base, bad, rule).passed
    # a lower bound above the claim fails even if the file's status says otherwise
    update_json(bad, "epsilon.json", lambda d: d["verdict"].__setitem__("status", "CONSISTENT"))
    assert not _gate(base, bad, rule).passed
    with pytest.raises(UserError, match="epsilon.json is missing"):
        _gate(base, make_run(tmp_path / "noeps", with_epsilon=False), rule)


def test_tpr_at_fpr_uses_confidence_intervals(pair) -> None:
    base, cand = pair
    rule = {"rule": "tpr_at_fpr", "attack": "lira_online", "fpr": 0.001, "tolerance": 0.0}
    _set_tpr(base, "lira_online", "0.001", 0.05, 0.03, 0.07)
    cases = [  # (candidate tpr, lo, hi, tolerance, passes)
        (0.06, 0.04, 0.08, 0.0, True),     # overlapping intervals
        (0.09, 0.07, 0.11, 0.0, True),     # lo == baseline hi: not strictly above
        (0.10, 0.0701, 0.13, 0.0, False),  # lo just above baseline hi
        (0.10, 0.0701, 0.13, 0.01, True),  # ... within the tolerance
        (0.20, 0.0801, 0.30, 0.01, False),  # beyond the tolerance
    ]
    for tpr, lo, hi, tol, passes in cases:
        _set_tpr(cand, "lira_online", "0.001", tpr, lo, hi)
        result = _gate(base, cand, {**rule, "tolerance": tol})
        assert result.passed is passes, (tpr, lo, hi, tol)
        assert result.rules[0].values["limit"] == pytest.approx(0.07 + tol)


def test_tpr_at_fpr_without_intervals_compares_point_values(pair) -> None:
    base, cand = pair

    def strip(tpr: float):
        def mutate(d: dict) -> None:
            m = d["attacks"]["lira_online"]["metrics"]
            m["tpr_at_fpr_ci"] = {}  # what audit attack writes without bootstrap
            m["tpr_at_fpr"]["0.001"] = tpr
        return mutate

    update_json(base, "attack.json", strip(0.05))
    rule = {"rule": "tpr_at_fpr", "attack": "lira_online", "fpr": 0.001}
    update_json(cand, "attack.json", strip(0.05))
    assert _gate(base, cand, rule).passed
    update_json(cand, "attack.json", strip(0.0501))
    assert not _gate(base, cand, rule).passed
    assert _gate(base, cand, {**rule, "tolerance": 0.001}).passed


def test_tpr_at_fpr_max_picks_the_strongest_attack(pair) -> None:
    base, cand = pair
    for name in ("loss", "lira_online", "rmia_online"):
        _set_tpr(base, name, "0.01", 0.02, 0.01, 0.03)
        _set_tpr(cand, name, "0.01", 0.02, 0.01, 0.03)
    _set_tpr(cand, "loss", "0.01", 0.5, 0.4, 0.6)  # only the weakest attack got strong
    rule = {"rule": "tpr_at_fpr", "attack": "max", "fpr": 0.01}
    result = _gate(base, cand, rule)
    assert not result.passed and result.rules[0].values["candidate"]["attack"] == "loss"
    assert _gate(base, cand, {**rule, "attack": "rmia_online"}).passed


def test_tpr_at_fpr_bad_inputs(tmp_path: Path, pair) -> None:
    base, cand = pair
    with pytest.raises(UserError, match="no TPR at FPR 0.05"):
        _gate(base, cand, {"rule": "tpr_at_fpr", "fpr": 0.05})
    with pytest.raises(UserError, match="attack 'lira_offline' is not in"):
        _gate(base, cand, {"rule": "tpr_at_fpr", "attack": "lira_offline"})
    with pytest.raises(UserError, match="attack.json is missing"):
        _gate(base, make_run(tmp_path / "noatt", with_attack=False), {"rule": "tpr_at_fpr"})


def test_min_accuracy_delta(tmp_path: Path) -> None:
    base = make_run(tmp_path / "b", test_accuracy=0.9)
    rule = {"rule": "min_accuracy_delta", "tolerance": 0.01}
    assert _gate(base, make_run(tmp_path / "same", test_accuracy=0.9), rule).passed
    assert _gate(base, make_run(tmp_path / "edge", test_accuracy=0.89), rule).passed  # exactly b - tol
    assert not _gate(base, make_run(tmp_path / "low", test_accuracy=0.889), rule).passed
    assert _gate(base, make_run(tmp_path / "better", test_accuracy=0.95), rule).passed
    with pytest.raises(UserError, match="test accuracy"):
        _gate(base, make_run(tmp_path / "nom", with_metrics=False, with_attack=False), rule)


def test_max_auc(pair, tmp_path: Path) -> None:
    base, cand = pair
    aucs = {k: v["metrics"]["auc"] for k, v in read_json(cand / "attack.json")["attacks"].items()}
    top = max(aucs.values())
    assert _gate(base, cand, {"rule": "max_auc", "threshold": top}).passed
    failed = _gate(base, cand, {"rule": "max_auc", "threshold": top - 1e-6})
    assert not failed.passed and failed.rules[0].values["candidate"] == top
    assert _gate(base, cand, {"rule": "max_auc", "attack": "loss", "threshold": aucs["loss"]}).passed
    # the baseline's attacks are only shown, not required
    assert _gate(make_run(tmp_path / "noatt", with_attack=False), cand,
                 {"rule": "max_auc", "threshold": 0.99}).passed


def test_policy_validation() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'rules.0.tolerence' \(valid keys there: attack, fpr"):
        parse_policy({"rules": [{"rule": "tpr_at_fpr", "tolerence": 0.1}]})
    with pytest.raises(ConfigError, match="unknown key 'budgett'"):
        parse_policy({"budgett": 1, "rules": [{"rule": "no_violation"}]})
    with pytest.raises(ConfigError, match="unknown rule 'max_tpr'"):
        parse_policy({"rules": [{"rule": "max_tpr"}]})
    with pytest.raises(ConfigError, match="attack must be 'max' or one of"):
        parse_policy({"rules": [{"rule": "max_auc", "attack": "lira", "threshold": 0.6}]})
    with pytest.raises(ConfigError, match="budget"):
        parse_policy({"rules": [{"rule": "max_claimed_epsilon"}]})
    with pytest.raises(ConfigError, match="rules"):
        parse_policy({"rules": []})
    policy = load_policy(DEFAULT_POLICY)
    assert [r.rule for r in policy.rules] == ["max_claimed_epsilon", "no_violation", "tpr_at_fpr",
                                              "min_accuracy_delta", "max_auc"]


def test_mismatched_runs_are_refused(tmp_path: Path) -> None:
    base = make_run(tmp_path / "b")
    with pytest.raises(UserError, match="not comparable: dataset"):
        _gate(base, make_run(tmp_path / "c", dataset="cifar10"), {"rule": "no_violation"})
    with pytest.raises(UserError, match="not comparable: number of classes"):
        _gate(base, make_run(tmp_path / "d", num_classes=100), {"rule": "no_violation"})


def _write_policy(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_exit_codes(tmp_path: Path, pair) -> None:
    base, cand = pair
    out = tmp_path / "gate.json"
    runner = CliRunner()
    ok = runner.invoke(main, ["gate", str(base), str(cand), "--policy", str(DEFAULT_POLICY), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert "PASS" in ok.output and "FAIL" not in ok.output
    data = read_json(out)
    assert data["passed"] is True and data["status"] == "PASS" and len(data["rules"]) == 5

    strict = _write_policy(tmp_path, {"rules": [{"rule": "max_claimed_epsilon", "budget": 4.0},
                                                {"rule": "no_violation"}]})
    fail = runner.invoke(main, ["gate", str(base), str(cand), "--policy", str(strict), "--out", str(out)])
    assert fail.exit_code == 1, fail.output
    assert "FAIL" in fail.output and "max_claimed_epsilon" in fail.output
    data = read_json(out)
    assert data["passed"] is False and [r["passed"] for r in data["rules"]] == [False, True]

    typo = _write_policy(tmp_path, {"rules": [{"rule": "max_auc", "threshold": 0.6, "treshold": 0.5}]})
    bad = runner.invoke(main, ["gate", str(base), str(cand), "--policy", str(typo)])
    assert bad.exit_code == 2 and "unknown key 'rules.0.treshold'" in bad.output
    missing = runner.invoke(main, ["gate", str(base), str(tmp_path / "absent"), "--policy", str(DEFAULT_POLICY)])
    assert missing.exit_code == 2 and "run directory not found" in missing.output
    no_policy = runner.invoke(main, ["gate", str(base), str(cand), "--policy", str(tmp_path / "none.yaml")])
    assert no_policy.exit_code == 2 and "not found" in no_policy.output
    other = make_run(tmp_path / "other", dataset="svhn")
    mismatch = runner.invoke(main, ["gate", str(base), str(other), "--policy", str(DEFAULT_POLICY)])
    assert mismatch.exit_code == 2 and "not comparable" in mismatch.output
