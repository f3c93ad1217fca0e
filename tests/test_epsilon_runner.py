"""Tests for `audit epsilon`: the pool source, the runner's epsilon.json and verdict, completeness, config and CLI.

Run directories come from tests/epsilon_runs.py (no training). The input- and gradient-canary sources are tested
in tests/test_epsilon_canary_sources.py, the recorded power statement in tests/test_epsilon_power.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from epsilon_runs import ESTIMATE_KEYS, TOP_KEYS, VERDICT_KEYS, identity_digest, make_run, read, write_scores
from fixtures_runs import write_signed

from audit.bounds.epsilon_file import EPSILON_FORMAT
from audit.bounds.runner import claim_is_gaussian, epsilon_is_complete, k_grids, run_epsilon
from audit.bounds.sources import Skipped, finite_scores, pool_evidence
from audit.config import EpsilonConfig
from foundation.errors import CheckpointError, ConfigError, DataError, UserError
from foundation.io import sha256_file, write_text
from training.run import open_run
from training.run.manifest import read_manifest, write_manifest


# ----------------------------------------------------------------------------------------------- pool source


def test_strong_pool_attack_gives_violation_with_exact_schema(tmp_path):
    run = make_run(tmp_path / "r", epsilon=1.0)
    write_scores(run, signal=6.0)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    data = read(run)
    assert list(data) == TOP_KEYS
    assert data["format"] == EPSILON_FORMAT and data["run"] == "r"
    assert list(data["verdict"]) == VERDICT_KEYS
    assert set(data["inputs"]) == {"weights_sha256", "membership_sha256", "pool_fingerprint", "scores_sha256",
                                   "config_sha256", "claim_sha256"}
    assert data["inputs"]["scores_sha256"] == sha256_file(run / "scores.npz")
    assert [list(e) for e in data["estimates"]] == [ESTIMATE_KEYS] * len(data["estimates"])
    assert [(e["method"], e["source"]) for e in data["estimates"]] == [
        ("one_run", "pool"), ("one_run_fdp", "pool"), ("clopper_pearson", "pool"), ("gdp", "pool")]
    assert {"status", "best_epsilon_lb", "best_method", "tightness", "inconclusive_above", "notes"} <= set(
        data["verdict"])
    v = data["verdict"]
    assert v["status"] == "VIOLATION" and report.verdict.status == "VIOLATION"
    # q < 1: only the assumption-free one-run bound decides, at the full alpha
    deciding = [e for e in data["estimates"] if e["extra"]["in_verdict"]]
    assert [e["method"] for e in deciding] == ["one_run"]
    assert deciding[0]["alpha"] == 0.05 and deciding[0]["delta"] == 1e-5
    assert v["best_method"] == "one_run" and v["best_source"] == "pool"
    assert v["best_epsilon_lb"] == pytest.approx(deciding[0]["epsilon_lb"])
    assert v["best_epsilon_lb"] > 1.0
    assert v["tightness"] == pytest.approx(v["best_epsilon_lb"] / 1.0)
    assert deciding[0]["counts"]["m"] == 600 and deciding[0]["counts"]["v"] <= deciding[0]["counts"]["r"]
    assert deciding[0]["ceiling"] >= deciding[0]["epsilon_lb"]
    cp = data["estimates"][2]
    assert "independent trials" in cp["assumptions"] and cp["extra"]["threshold_strategy"] == "held_out"
    assert any(n.startswith("not in the verdict: pool/clopper_pearson") for n in v["notes"])


def test_null_scores_rarely_violate_even_a_zero_claim(tmp_path):
    """No signal: the deciding bound is 0 in at least 1 - alpha of seeded trials (claim 0: any bound > 0 violates)."""
    violations, bounds = 0, []
    for seed in range(20):
        run = make_run(tmp_path / f"r{seed}", epsilon=0.0, pool=400, seed=seed)
        write_scores(run, signal=0.0, seed=100 + seed)
        report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), fdp=False), write=False)
        violations += report.verdict.status == "VIOLATION"
        bounds.append(report.verdict.best_epsilon_lb)
    assert violations <= 3  # Binomial(20, 0.05) exceeds 3 with probability 0.016
    assert np.median(bounds) == 0.0


def test_gaussian_claim_brings_fdp_into_the_verdict_and_splits_alpha(tmp_path):
    run = make_run(tmp_path / "r", epsilon=8.0, sample_rate=1.0)
    assert claim_is_gaussian(read_manifest(run))
    write_scores(run, signal=0.5)
    data = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), alpha=0.1)).to_file().model_dump()
    deciding = {e["method"]: e["alpha"] for e in data["estimates"] if e["extra"]["in_verdict"]}
    assert deciding == {"one_run": pytest.approx(0.05), "one_run_fdp": pytest.approx(0.05)}
    assert data["verdict"]["status"] == "CONSISTENT"
    unsplit = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), split_alpha=False,
                                                            gaussian_in_verdict="never"), write=False)
    assert [(e.estimate.method, e.estimate.alpha) for e in unsplit.estimates if e.in_verdict] == [("one_run", 0.05)]


def test_pool_source_needs_scores_and_the_configured_attack(tmp_path):
    run = make_run(tmp_path / "r")
    with pytest.raises(UserError, match="audit attack"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    write_scores(run, signal=1.0, attacks=("loss",))
    with pytest.raises(UserError, match="no scores for attack 'lira_online'.*loss"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), attack="lira_online"))
    assert run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",), attack="loss"), write=False).estimates
    assert not (run / "epsilon.json").exists()


def test_default_attack_is_the_strongest_the_scores_hold(tmp_path):
    """No --attack: the first of rmia_online, lira_online, ..., loss that scores.npz holds (a fixed order)."""
    run = make_run(tmp_path / "r")
    write_scores(run, signal=1.0, attacks=("loss", "attack_p"))
    rep = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)), write=False)
    assert {e.provenance["attack"] for e in rep.estimates} == {"attack_p"}
    write_scores(run, signal=1.0, attacks=("loss", "lira_online", "rmia_online"))
    rep = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)), write=False)
    assert {e.provenance["attack"] for e in rep.estimates} == {"rmia_online"}


def test_scores_of_another_run_and_nan_scores_are_refused(tmp_path):
    run = make_run(tmp_path / "r")
    write_scores(run, signal=1.0, flip_membership=True)
    with pytest.raises(CheckpointError, match="differs from the run's membership"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    mem = np.load(run / "membership.npy")
    scores = np.where(mem, 1.0, 0.0)
    scores[3] = np.nan
    write_signed(run, "scores.npz", pool_index=np.arange(mem.size), membership=mem, score_lira_online=scores,
                 inputs_digest=np.array(identity_digest(run)))
    with pytest.raises(DataError, match="NaN"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    write_text(run / "scores.npz", "not an npz")
    with pytest.raises(CheckpointError, match="not a readable .npz"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))


def test_infinite_scores_keep_their_order():
    s = finite_scores(np.array([np.inf, 0.0, -np.inf, 3.0, np.inf]), what="t")
    assert np.all(np.isfinite(s)) and np.argsort(s, kind="stable").tolist() == [2, 1, 3, 0, 4]


def test_pool_is_skipped_unless_members_were_drawn_with_half_probability(tmp_path):
    run = make_run(tmp_path / "p3", p=0.3)
    write_scores(run, signal=3.0)
    ev = pool_evidence(run=open_run(run, verify=False), attack="lira_online")
    assert isinstance(ev, Skipped) and "p = 0.5" in ev.reason
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool", "input_canaries")))
    assert [s.source for s in report.skipped] == ["pool", "input_canaries"]
    assert report.estimates == () and report.verdict.status == "CONSISTENT"
    assert report.verdict.inconclusive_above == 0.0 and report.verdict.notes[0].startswith("no evidence")
    assert read(run)["skipped"][1] == {"source": "input_canaries",
                                       "reason": "the run has no input canaries (training.canaries.count = 0)"}


def test_tampered_weights_are_refused(tmp_path):
    run = make_run(tmp_path / "r")
    write_scores(run, signal=1.0)
    write_text(run / "model.safetensors", "other weights")
    with pytest.raises(CheckpointError, match="does not match the manifest"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))


def test_non_dp_run_gets_no_claim_and_a_default_delta(tmp_path):
    run = make_run(tmp_path / "r", epsilon=None, pool=400)
    write_scores(run, signal=4.0)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    data = read(run)
    assert data["claimed_epsilon"] == "inf" and data["verdict"]["status"] == "NO_CLAIM"
    n = int(np.load(run / "membership.npy").sum())
    assert report.delta == pytest.approx(1e-4 if n <= 1000 else 1e-5)
    assert data["verdict"]["tightness"] is None and report.verdict.best_epsilon_lb > 1.0
    assert any("no δ" in note for note in data["verdict"]["notes"])



# ------------------------------------------------------------------------------------ completeness, config, CLI


def test_epsilon_is_complete_tracks_config_scores_and_weights(tmp_path):
    run = make_run(tmp_path / "r")
    cfg = EpsilonConfig(sources=("pool",))
    assert not epsilon_is_complete(run, cfg)
    write_scores(run, signal=1.0)
    run_epsilon(run_dir=run, config=cfg)
    assert epsilon_is_complete(run, cfg)
    assert not epsilon_is_complete(run, EpsilonConfig(sources=("pool",), alpha=0.01))
    write_scores(run, signal=1.0, seed=7)
    assert not epsilon_is_complete(run, cfg)


def test_k_grid_and_config_validation():
    kp, kn = k_grids(1000, points=8, guesses="in_out")
    assert kp[0] == 10 and kp[-1] == 500 and np.array_equal(kp, kn) and kp.max() + kn.max() <= 1000
    assert k_grids(6, points=8, guesses="in")[0].tolist() == [3]
    with pytest.raises(ValueError, match="m must be >= 2"):
        k_grids(1, points=3, guesses="in")
    with pytest.raises(ValueError, match="unknown attack"):
        EpsilonConfig(attack="nope")
    with pytest.raises(ValueError, match="duplicates"):
        EpsilonConfig(sources=("pool", "pool"))


def test_cli_prints_table_and_verdict_and_rejects_bad_options(tmp_path):
    from audit.cli import main

    run = make_run(tmp_path / "r", epsilon=1.0)
    write_scores(run, signal=6.0)
    result = CliRunner().invoke(main, ["epsilon", str(run), "--sources", "pool", "--alpha", "0.1"])
    assert result.exit_code == 0, result.output
    assert "VIOLATION: best ε_lb" in result.output and "one_run" in result.output
    assert read(run)["alpha"] == 0.1
    bad = CliRunner().invoke(main, ["epsilon", str(run), "--sources", "pool,bogus"])
    assert bad.exit_code == 2 and "error:" in bad.output and "sources" in bad.output
    missing = CliRunner().invoke(main, ["epsilon", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "run directory not found" in missing.output


def test_config_error_type_is_user_error():
    assert issubclass(ConfigError, UserError)


def test_epsilon_options_are_merged_onto_the_config_without_a_shell(tmp_path):
    from audit.config import resolve_epsilon_config

    path = tmp_path / "exp.yaml"
    path.write_text("name: exp\nepsilon: {alpha: 0.2, attack: loss, k_grid_points: 2}\n")
    cfg = resolve_epsilon_config(config_path=path, sources="pool, input_canaries", guesses="in")
    assert (cfg.alpha, cfg.attack, cfg.k_grid_points, cfg.guesses) == (0.2, "loss", 2, "in")
    assert cfg.sources == ("pool", "input_canaries")
    assert resolve_epsilon_config(config_path=path, alpha=0.01, attack="rmia_online").alpha == 0.01
    assert resolve_epsilon_config() == EpsilonConfig()
    with pytest.raises(ConfigError, match="sources"):
        resolve_epsilon_config(sources="pool,telepathy")
    with pytest.raises(ConfigError, match="unknown attack 'lira'"):
        resolve_epsilon_config(attack="lira")


def test_forged_claim_is_a_violation_whatever_the_evidence(tmp_path):
    """Weak evidence (CONSISTENT on its own), but the manifest's ε was edited below what σ, q, T support."""
    run = make_run(tmp_path / "r", epsilon=4.0)
    write_scores(run, signal=0.0)
    honest = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    assert honest.verdict.status == "CONSISTENT" and honest.verdict.findings == ()
    manifest = read_manifest(run)
    write_manifest(run, manifest.model_copy(update={"privacy": manifest.privacy.model_copy(update={"epsilon": 0.5})}))
    assert not epsilon_is_complete(run, EpsilonConfig(sources=("pool",)))  # the claim changed: recompute
    forged = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    assert forged.verdict.status == "VIOLATION" and forged.verdict.best_epsilon_lb < 0.5
    assert forged.verdict.notes[0].startswith("claim does not follow from the stated mechanism: ε(PLD) = ")
    assert read(run)["verdict"]["findings"][0]["severity"] == "error"
    assert read(run)["verdict"]["findings"][0]["kind"] == "claim_not_from_mechanism"
    from audit.reporting.build import build_report
    from audit.reporting.inputs import load_run

    glance = build_report(load_run(run)).glance
    assert glance.status == "VIOLATION" and "not supported by the run's own record" in glance.summary
