"""Tests of `audit gate`: each rule passes and fails on constructed runs; exit codes 0/1/2."""

from __future__ import annotations

import json
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
    """Two runs whose audits could have refuted their claim (the best bound's ceiling 12 > the claimed ε 8)."""
    return make_run(tmp_path / "base", seed=1, ceiling=12.0), make_run(tmp_path / "cand", seed=2, ceiling=12.0)


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
    bad = make_run(tmp_path / "viol", epsilon=2.0, epsilon_lb=2.5, ceiling=12.0)
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


def test_gate_follows_the_one_strongest_attack_definition(tmp_path: Path, pair) -> None:
    """Per-rule maxima and the strongest attack disagree: loss has the highest AUC and the highest TPR at 10 % FPR,
    rmia_online the highest TPR at the reference FPR (1 %: make_run's ~107 non-members do not resolve 0.1 %). The
    gate, like `audit run`'s summary and the report, uses rmia_online for every rule that says strongest/max."""
    from attacks.strongest import DEFINITION
    from audit.pipeline import summarize

    base, cand = pair
    for run in (base, cand):
        def mutate(d: dict) -> None:
            a = d["attacks"]
            a["loss"]["metrics"]["auc"] = 0.99
            for name, t01, t10 in (("loss", 0.02, 0.9), ("lira_online", 0.03, 0.2), ("rmia_online", 0.3, 0.4)):
                m = a[name]["metrics"]
                m["tpr_at_fpr"]["0.01"], m["tpr_at_fpr_ci"]["0.01"] = t01, [t01 / 2, t01 * 1.5]
                m["tpr_at_fpr"]["0.1"], m["tpr_at_fpr_ci"]["0.1"] = t10, [t10 - 0.05, t10 + 0.05]
        update_json(run, "attack.json", mutate)
    # the old per-rule maximum would have been loss for both rules below; the one definition says rmia_online
    assert summarize(cand)["strongest_attack"] == "rmia_online"
    rmia_auc = read_json(cand / "attack.json")["attacks"]["rmia_online"]["metrics"]["auc"]
    for attack in ("strongest", "max"):
        auc = _gate(base, cand, {"rule": "max_auc", "attack": attack, "threshold": 0.9})
        assert auc.passed, auc.rules[0].detail  # rmia_online's AUC (< 0.9) decides, not loss's 0.99
        v = auc.rules[0].values
        assert v["candidate_attack"] == v["baseline_attack"] == "rmia_online" and v["candidate"] == rmia_auc
        assert v["attack_selection"] == "strongest" and v["strongest_definition"] == DEFINITION
        assert auc.rules[0].label == "attack AUC (strongest attack)"
        assert auc.strongest_attack == {"definition": DEFINITION, "baseline": "rmia_online",
                                        "candidate": "rmia_online"}
    tpr = _gate(base, cand, {"rule": "tpr_at_fpr", "fpr": 0.1})  # default attack: the strongest
    assert tpr.rules[0].values["candidate"]["attack"] == "rmia_online"
    assert tpr.rules[0].values["candidate"]["tpr"] == pytest.approx(0.4)
    # a named attack is used as named (and recorded so)
    named = _gate(base, cand, {"rule": "max_auc", "attack": "loss", "threshold": 0.9})
    assert not named.passed and named.rules[0].values["candidate_attack"] == "loss"
    assert named.rules[0].values["attack_selection"] == "named" and named.strongest_attack is None
    # the CLI states the definition and gate.json records the choice
    out = tmp_path / "gate.json"
    pol = _write_policy(tmp_path, {"rules": [{"rule": "max_auc", "threshold": 0.9}]})
    res = CliRunner().invoke(main, ["gate", str(base), str(cand), "--policy", str(pol), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"strongest attack ({DEFINITION}): baseline rmia_online, candidate rmia_online" in " ".join(
        res.output.split())
    data = read_json(out)
    assert data["strongest_attack"]["candidate"] == "rmia_online"
    assert data["rules"][0]["values"]["candidate_attack"] == "rmia_online"


def test_tpr_at_fpr_table_never_prints_an_unresolvable_rate(pair) -> None:
    """make_run's pools hold ~100 non-members: TPR at 0.1 % FPR is below 1/N, so the table's cells say so
    (the value stays in gate.json's values for the record)."""
    base, cand = pair
    r = _gate(base, cand, {"rule": "tpr_at_fpr", "attack": "max", "fpr": 0.001}).rules[0]
    assert r.baseline.startswith("not resolvable with ") and " non-members (" in r.baseline
    assert r.candidate.startswith("not resolvable with ")
    assert r.values["candidate"]["tpr"] is not None
    fine = _gate(base, cand, {"rule": "tpr_at_fpr", "attack": "max", "fpr": 0.01}).rules[0]
    n = json.loads((cand / "attack.json").read_text())["attacks"][fine.values["candidate"]["attack"]]["metrics"]
    assert fine.candidate.startswith("not resolvable") is (n["n_nonmembers"] * 0.01 < 1)


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
    # no attack.json: the gate measures the accuracy itself (here the fixture's weights are not a model)
    with pytest.raises(UserError, match="model.safetensors is corrupt"):
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
    with pytest.raises(ConfigError, match=r"attack must be 'strongest' \(or 'max'\) or one of"):
        parse_policy({"rules": [{"rule": "max_auc", "attack": "lira", "threshold": 0.6}]})
    with pytest.raises(ConfigError, match="budget"):
        parse_policy({"rules": [{"rule": "max_claimed_epsilon"}]})
    with pytest.raises(ConfigError, match="rules"):
        parse_policy({"rules": []})
    policy = load_policy(DEFAULT_POLICY)
    assert [r.rule for r in policy.rules] == ["max_claimed_epsilon", "no_violation", "tpr_at_fpr",
                                              "min_accuracy_delta", "max_auc", "mechanism_consistent"]
    with pytest.raises(ConfigError, match=r"unknown key 'rules.0.requried' \(valid keys there: required, rule\)"):
        parse_policy({"rules": [{"rule": "mechanism_consistent", "requried": True}]})


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
    assert data["passed"] is True and data["status"] == "PASS" and len(data["rules"]) == 6

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


def test_unverifiable_claim_is_its_own_outcome(tmp_path: Path, pair) -> None:
    """CONSISTENT with every deciding ceiling below the claim: the audit could not have refuted it. The gate says
    UNVERIFIABLE (exit 3, recorded in gate.json), not PASS, unless the policy accepts it."""
    base, _ = pair
    blind = make_run(tmp_path / "blind", seed=3, epsilon=8.0, epsilon_lb=0.0, ceiling=0.93)
    result = _gate(base, blind, {"rule": "no_violation"})
    assert not result.passed and result.status == "UNVERIFIABLE" and result.exit_code == 3
    assert result.rules[0].outcome == "UNVERIFIABLE" and "could not have detected" in result.rules[0].detail
    accepted = evaluate_gate(baseline=base, candidate=blind, policy=parse_policy(
        {"accept_unverifiable": True, "rules": [{"rule": "no_violation"}]}))
    assert accepted.passed and accepted.exit_code == 0 and "accept_unverifiable" in accepted.notes[-1]
    # a failing rule beside it makes the gate FAIL (exit 1)
    both = _gate(base, blind, {"rule": "max_claimed_epsilon", "budget": 4.0}, {"rule": "no_violation"})
    assert both.status == "FAIL" and both.exit_code == 1
    out = tmp_path / "gate.json"
    res = CliRunner().invoke(main, ["gate", str(base), str(blind), "--policy", str(DEFAULT_POLICY), "--out",
                                    str(out)])
    assert res.exit_code == 3, res.output
    data = read_json(out)
    assert data["status"] == "UNVERIFIABLE" and data["exit_code"] == 3 and data["passed"] is False
    assert [r["outcome"] for r in data["rules"]][1] == "UNVERIFIABLE" and "evidence" in data  # signed


def test_claim_unverifiable_finding_does_not_pass(tmp_path: Path, pair) -> None:
    base, _ = pair
    forged = make_run(tmp_path / "forged", seed=4, ceiling=12.0)

    def add_finding(d: dict) -> None:
        d["verdict"]["findings"].append({"kind": "claim_unverifiable", "severity": "warning",
                                         "message": "the claim lists no training phase"})

    update_json(forged, "epsilon.json", add_finding)
    result = _gate(base, forged, {"rule": "no_violation"})
    assert result.status == "UNVERIFIABLE" and "claim_unverifiable" in result.rules[0].detail


def test_delta_above_one_over_n_fails(tmp_path: Path, pair) -> None:
    """δ = 0.5 lets a mechanism publish whole training examples: the default policy fails it."""
    base, _ = pair
    loose = make_run(tmp_path / "loose", seed=5, delta=0.5, ceiling=12.0)
    result = _gate(base, loose, {"rule": "no_violation"})
    assert result.status == "FAIL" and "exceeds 1/n" in result.rules[0].detail
    assert result.rules[0].values["delta_limit"] == pytest.approx(1 / read_json(
        loose / "manifest.json")["data"]["membership"]["n_members"])


@pytest.mark.parametrize("name, edit", [
    ("attack.json", lambda d: d["attacks"]["lira_online"]["metrics"].__setitem__("auc", 0.5)),
    ("epsilon.json", lambda d: d["verdict"].__setitem__("best_epsilon_lb", 0.0)),
])
def test_edited_evidence_is_refused(tmp_path: Path, pair, name: str, edit) -> None:
    """An attack.json whose AUCs were edited down, or an epsilon.json edited from VIOLATION to CONSISTENT, no
    longer carries this auditor's signature: the gate refuses it (exit 2) naming the file and the command."""
    base, cand = pair
    update_json(cand, name, edit, resign=False)
    with pytest.raises(UserError, match=f"{name} is not signed by this auditor's evidence key.*re-run 'audit "):
        _gate(base, cand, {"rule": "max_auc", "threshold": 0.6})


def test_claim_edited_after_epsilon_makes_it_stale(tmp_path: Path, pair) -> None:
    base, cand = pair
    update_json(cand, "manifest.json", lambda d: d["privacy"].__setitem__("epsilon", 0.5))
    with pytest.raises(UserError, match=r"epsilon.json is stale: .*claim_sha256.*re-run 'audit epsilon"):
        _gate(base, cand, {"rule": "no_violation"})


def test_accuracy_comes_from_the_auditors_measurement(tmp_path: Path, pair) -> None:
    """The vendor's metrics.json edited from 0.54 to 0.99 does not move the gate: it reads attack.json."""
    base, cand = pair
    update_json(cand, "attack.json", lambda d: d["utility"].__setitem__("test_accuracy", 0.54))
    update_json(cand, "metrics.json", lambda d: d.__setitem__("test_accuracy", 0.99))
    result = _gate(base, cand, {"rule": "min_accuracy_delta", "tolerance": 0.01})
    assert not result.passed and result.rules[0].values["candidate"] == pytest.approx(0.54)
