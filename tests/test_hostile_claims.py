"""Hostile inputs: derived evidence and claims a dishonest vendor hands to the auditor (issue 37).

Scores the auditor did not sign (randomised, ±inf, rows duplicated, another run's) are refused in one line naming
the command that re-makes them; vendor signals are recomputed; a claim the run's own record does not support
(edited ε, phases, metrics, command, config) is a ``VIOLATION`` with the reason; θ_0 = θ_T (a zero update) is a
finding; a pickled gradient-canary mask is never loaded. See tests/test_hostile_runs.py for the suite's index.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from fixtures_runs import write_signed
from hostile_common import ATTACK_ARGS, Payload, assert_error, cli, edit_json, rehash, write_cfg
from hostile_runs_common import first_float, manifest_edit, run_fixtures, weights_edit

from foundation.evidence import read_signed_npz
from foundation.io import write_npz

base, run = run_fixtures()


# ------------------------------------------------------------------------------------------ epsilon and scores


def _rewrite_scores(run_dir: Path, change) -> None:
    """scores.npz with its arrays changed by ``change`` and its evidence record kept, as a forger would."""
    with np.load(run_dir / "scores.npz") as z:
        arrays = dict(z)
    write_npz(run_dir / "scores.npz", **change(arrays))


def _randomised(a: dict) -> dict:
    rng = np.random.default_rng(0)
    return a | {k: rng.normal(size=v.shape) for k, v in a.items() if k.startswith("score_")}


def _infinite(a: dict) -> dict:
    return a | {k: np.where(a["membership"], np.inf, -np.inf) for k in a if k.startswith("score_")}


def _duplicated(a: dict) -> dict:
    top = np.flatnonzero(a["membership"])[:5]
    rows = np.concatenate([np.arange(a["pool_index"].size), np.repeat(top, 20)])
    return {k: (v[rows] if v.shape == a["pool_index"].shape else v) for k, v in a.items()}


STALE_SCORES = [
    ("weights-swapped", weights_edit(lambda s: first_float(s, lambda t: t + 0.01)), "scores.npz is stale"),
    ("no-identity", lambda r: write_npz(r / "scores.npz", **{k: v for k, v in np.load(r / "scores.npz").items()
                                                           if not k.startswith(("inputs_digest", "evidence_"))}),
     "carries no evidence signature"),
    ("other-run", lambda r: _rewrite_scores(r, lambda a: a | {"inputs_digest": np.array("0" * 64)}),
     "not signed by this auditor's evidence key"),
    ("randomised", lambda r: _rewrite_scores(r, _randomised), "not signed by this auditor's evidence key"),
    ("infinite", lambda r: _rewrite_scores(r, _infinite), "not signed by this auditor's evidence key"),
    ("rows-duplicated", lambda r: _rewrite_scores(r, _duplicated), "not signed by this auditor's evidence key"),
    ("rows-duplicated-signed", lambda r: write_signed(r, "scores.npz", **{
        k: v for k, v in _duplicated(read_signed_npz(r / "scores.npz", remake="x")).items()}), "repeated"),
    ("not-npz", lambda r: (r / "scores.npz").write_bytes(b"PK\x03\x04"), r"not a readable \.npz"),
    ("pickled", lambda r: np.savez(r / "scores.npz", inputs_digest=np.array([Payload(r.parent / "PWNED")],
                                                                           dtype=object)), r"not a readable \.npz"),
    ("missing", lambda r: (r / "scores.npz").unlink(), "scores.npz not found: run 'audit attack"),
]


@pytest.mark.parametrize("damage, pattern", [(d, p) for _, d, p in STALE_SCORES], ids=[i for i, _, _ in STALE_SCORES])
def test_epsilon_refuses_scores_not_made_from_this_run(run, damage, pattern):
    damage(run)
    assert_error(cli("epsilon", run, "--sources", "pool", "--attack", "loss"), pattern)
    assert not (run / "epsilon.json").exists() and not (run.parent / "PWNED").exists()


def test_truncated_or_edited_signals_are_recomputed(run):
    honest = np.load(run / "scores.npz")["score_loss"]
    with np.load(run / "signals.npz") as z:
        arrays = dict(z)
    arrays["pool"] = arrays["pool"][:, ::-1].copy()  # the vendor's "improvement"
    write_npz(run / "signals.npz", **arrays)  # content_sha256 no longer matches
    assert cli("attack", run, *ATTACK_ARGS).exit_code == 0
    np.testing.assert_allclose(np.load(run / "scores.npz")["score_loss"], honest, rtol=1e-6)

    from attacks.signal_cache import content_sha256

    arrays.pop("content_sha256")
    write_npz(run / "signals.npz", **arrays, content_sha256=np.array(content_sha256(arrays)))  # a forged hash
    assert cli("attack", run, *ATTACK_ARGS).exit_code == 0  # caught by recomputing the target's own signals
    np.testing.assert_allclose(np.load(run / "scores.npz")["score_loss"], honest, rtol=1e-6)

    (run / "signals.npz").write_bytes((run / "signals.npz").read_bytes()[:200])
    r = cli("attack", run, *ATTACK_ARGS)
    assert r.exit_code == 0 and "BadZipFile" not in r.output, r.output
    np.testing.assert_allclose(np.load(run / "scores.npz")["score_loss"], honest, rtol=1e-6)

    np.savez(run / "signals.npz", pool=np.array([Payload(run.parent / "PWNED")], dtype=object))
    assert cli("attack", run, *ATTACK_ARGS).exit_code == 0 and not (run.parent / "PWNED").exists()
    np.testing.assert_allclose(np.load(run / "scores.npz")["score_loss"], honest, rtol=1e-6)


# ----------------------------------------------------------------------------------------- forged claims


@pytest.mark.parametrize("forge, pattern", [
    (manifest_edit("privacy.epsilon", 0.5), r"claim does not follow from the stated mechanism: ε\(PLD\) = [\d.]+ > "
                                             r"claimed ε = 0\.5"),
    (lambda r: edit_json(r / "manifest.json", lambda m: [p.__setitem__("dp", False) for p in m["privacy"]["phases"]]),
     "no phase is DP"),
    (lambda r: edit_json(r / "metrics.json", lambda m: m.__setitem__("epsilon_spent", None)),
     "metrics.json contradicts the claim: epsilon_spent = None"),
    (manifest_edit("provenance.command", "audit train q.yaml --set privacy.enabled=false"),
     "the recorded command contradicts the claim"),
    (lambda r: (r / "config.yaml").write_text((r / "config.yaml").read_text().replace(
        "enabled: true", "enabled: false", 1)), "config.yaml contradicts the claim"),
], ids=["epsilon-edited", "phases-not-dp", "metrics-null", "command-no-dp", "config-no-dp"])
def test_forged_claims_are_violations(run, forge, pattern):
    forge(run)
    r = cli("epsilon", run, "--sources", "pool", "--attack", "loss")
    assert r.exit_code == 0, r.output
    data = json.loads((run / "epsilon.json").read_text())
    assert data["verdict"]["status"] == "VIOLATION" and r.output.lstrip().count("VIOLATION") >= 1
    assert any(re.search(pattern, n) for n in data["verdict"]["notes"]), data["verdict"]["notes"]
    assert data["verdict"]["findings"][0]["severity"] == "error"


def test_a_claim_at_delta_one_half_is_a_violation_and_fails_the_default_gate(tmp_path):
    """δ = 0.5 (σ tuned for it: ε = 0 follows from the mechanism) lets a model publish whole training examples:
    audit epsilon says VIOLATION with the finding claim_delta_above_1_over_n (printed), the default gate FAILs."""
    r = cli("train", write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs", **{"privacy.delta": 0.5}), "--no-progress")
    assert r.exit_code == 0 and "privacy.delta=0.5 >= 1/n" in r.output, r.output
    loose = tmp_path / "runs" / "tiny"
    assert cli("attack", loose, *ATTACK_ARGS).exit_code == 0
    r = cli("epsilon", loose, "--sources", "pool", "--attack", "loss")
    assert r.exit_code == 0, r.output
    verdict = json.loads((loose / "epsilon.json").read_text())["verdict"]
    assert verdict["status"] == "VIOLATION"
    assert [f["kind"] for f in verdict["findings"]] == ["claim_delta_above_1_over_n"]
    assert re.search(r"finding \(error, claim_delta_above_1_over_n\): claimed δ = 0\.5 exceeds 1/n",
                     r.output), r.output
    policy = Path(__file__).resolve().parents[1] / "eval_configs" / "gates" / "default.yaml"
    r = cli("gate", loose, loose, "--policy", policy, "--out", tmp_path / "gate.json")
    assert r.exit_code == 1 and json.loads((tmp_path / "gate.json").read_text())["status"] == "FAIL", r.output


def test_honest_claim_passes_the_claim_check(run):
    r = cli("epsilon", run, "--sources", "pool", "--attack", "loss")
    assert r.exit_code == 0, r.output
    data = json.loads((run / "epsilon.json").read_text())
    assert data["verdict"]["findings"] == [] and data["verdict"]["status"] == "CONSISTENT"


# ------------------------------------------------------------------------ white-box evidence (gradient canaries)


@pytest.fixture(scope="module")
def gc_base(tmp_path_factory) -> Path:
    """The tiny DP run trained with 50 gradient canaries (model_init.safetensors is θ_0)."""
    root = tmp_path_factory.mktemp("hostile_gc")
    r = cli("train", write_cfg(root / "cfg.yaml", root / "runs", **{"training.gradient_canaries.count": 50}),
            "--no-progress")
    assert r.exit_code == 0, r.output
    return root / "runs" / "tiny"


def _gc_record_rehash(run: Path, key: str, file: str) -> None:
    from foundation.io import sha256_file

    digest = sha256_file(run / file)
    edit_json(run / "manifest.json", lambda m: m["training"]["gradient_canaries"].__setitem__(key, digest))


def test_zero_update_is_a_finding(gc_base, tmp_path):
    """model_init replaced by the final weights (θ_0 = θ_T, hashes fixed): every canary score would be 0. The
    gradient canaries are skipped and the verdict is VIOLATION with the finding zero_update."""
    run = tmp_path / "tiny"
    shutil.copytree(gc_base, run)
    shutil.copy(run / "model.safetensors", run / "model_init.safetensors")
    _gc_record_rehash(run, "init_weights_sha256", "model_init.safetensors")
    r = cli("epsilon", run, "--sources", "gradient_canaries")
    assert r.exit_code == 0, r.output
    data = json.loads((run / "epsilon.json").read_text())
    assert data["verdict"]["status"] == "VIOLATION"
    assert [f["kind"] for f in data["verdict"]["findings"]][:1] == ["zero_update"]
    assert data["skipped"][0]["source"] == "gradient_canaries" and "zero update" in data["skipped"][0]["reason"]


def test_pickled_gradient_canary_mask_is_never_loaded(gc_base, tmp_path):
    run = tmp_path / "tiny"
    shutil.copytree(gc_base, run)
    np.save(run / "gradient_canaries.npy", np.array([Payload(tmp_path / "PWNED")], dtype=object), allow_pickle=True)
    _gc_record_rehash(run, "included_sha256", "gradient_canaries.npy")
    assert_error(cli("epsilon", run, "--sources", "gradient_canaries"), r"gradient_canaries\.npy is not a plain \.npy")
    assert not (tmp_path / "PWNED").exists() and not (run / "epsilon.json").exists()


def test_an_empty_received_config_is_a_finding_not_a_traceback(gc_base, tmp_path):
    run = tmp_path / "tiny"
    shutil.copytree(gc_base, run)
    (run / "config.yaml").write_text("")
    rehash(run, "config.yaml")
    r = cli("epsilon", run, "--sources", "gradient_canaries")
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    verdict = json.loads((run / "epsilon.json").read_text())["verdict"]
    assert verdict["status"] == "VIOLATION" and verdict["findings"] == [
        {"kind": "claim_vs_config", "severity": "error", "message": "config.yaml is not a mapping of sections"}]
    assert "finding (error, claim_vs_config): config.yaml is not a mapping of sections" in r.output
