"""`audit attack`: verification of the target, the attack.json schema, scores.npz, caching and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attacks.metrics import auc, tpr_at_fpr
from attacks.config import AttackConfig, fit_to_run
from attacks.registry import ATTACK_SPECS, attack_names
from attacks.results import banded_roc, roc_grid
from attacks.runner import attack_is_complete, run_attack
from training.run import open_run
from audit.cli import main
from audit.config import resolve_attack_config
from training.config import TrainConfig
from foundation.errors import CheckpointError, UserError
from foundation.io import read_json, write_json, write_npz

K = 4
LEVELS = ("0.01", "0.001", "0.0001")


def _config(**kw) -> AttackConfig:
    base = dict(n_reference=K, n_bootstrap=20, population=20, evaluation="both", flip=True, shifts=0,
                executor="batched", device="cpu", top_vulnerable=5)
    return AttackConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def target_run(tmp_path_factory) -> Path:
    """A non-DP model that memorises noisy synthetic labels (members: a Bernoulli(1/2) half of 96 images)."""
    from training.trainer import train

    cfg = TrainConfig.model_validate({
        "name": "overfit", "output_dir": str(tmp_path_factory.mktemp("runs")),
        "data": {"dataset": "synthetic", "split": "train:n=96,classes=4,noise=250",
                 "test_split": "test:n=40,classes=4,noise=250"},
        "privacy": {"enabled": False}, "optim": {"name": "adam", "lr": 0.01},
        "training": {"steps": 30, "batch_size": 16, "progress": False, "log_every": 100, "checkpoint_every": 100}})
    return train(cfg, progress=False).run_dir


@pytest.fixture(scope="module")
def attacked(target_run: Path):
    return run_attack(run_dir=target_run, config=_config(), progress=False)


@pytest.fixture
def run_copy(attacked, tmp_path: Path) -> Path:
    dst = tmp_path / attacked.run_dir.name
    shutil.copytree(attacked.run_dir, dst)
    return dst


def test_attack_json_has_the_documented_schema(attacked) -> None:
    report = read_json(attacked.run_dir / "attack.json")
    manifest = json.loads((attacked.run_dir / "manifest.json").read_text())
    assert set(report) == {"format", "run", "inputs", "setup", "attacks", "utility", "code", "evidence"}
    assert report["code"] == {"trust_code": False, "names_code": []}
    assert report["format"] == "dp-audit-attack/1" and report["run"] == "overfit"
    assert report["inputs"]["weights_sha256"] == manifest["model"]["weights_sha256"]
    assert report["inputs"]["membership_sha256"] == manifest["data"]["membership_sha256"]
    assert report["inputs"]["pool_fingerprint"] == manifest["data"]["pool_fingerprint"]
    assert set(report["setup"]) == {"n_reference", "augmentations", "queries_from", "pool_size", "n_members",
                                    "n_population",
                                    "population_rule", "population", "evaluation", "recipe_hash", "executor",
                                    "shadow_train_seconds"}
    setup = report["setup"]
    assert (setup["n_reference"], setup["pool_size"], setup["n_population"], setup["evaluation"]) == (K, 96, 20, "both")
    assert setup["augmentations"] == ["identity", "hflip"] and setup["executor"] == "batched"
    pop = setup["population"]   # the whole split is the pool here: the test split is the only source
    assert (pop["requested"], pop["available"], pop["capped"]) == (20, 40, False)
    assert [(s["source"], s["available"], s["used"]) for s in pop["sources"]] == [
        ("synthetic/test:n=40,classes=4,noise=250 (test split)", 40, 20)]
    assert setup["n_members"] == manifest["data"]["membership"]["n_members"]
    assert set(report["attacks"]) == set(attack_names()) == set(ATTACK_SPECS)
    for name, entry in report["attacks"].items():
        assert set(entry) == {"params", "info", "metrics", "roc", "per_class", "most_vulnerable",
                              "leave_one_out"}, name
        m = entry["metrics"]
        assert set(m) == {"auc", "auc_ci", "tpr_at_fpr", "tpr_at_fpr_ci", "balanced_accuracy", "n_members",
                          "n_nonmembers"}
        assert m["auc_ci"][0] <= m["auc"] <= m["auc_ci"][1]
        assert set(m["tpr_at_fpr"]) == set(m["tpr_at_fpr_ci"]) == set(LEVELS)
        assert m["n_members"] + m["n_nonmembers"] == 96
        roc = entry["roc"]
        assert set(roc) == {"fpr", "tpr", "tpr_lo", "tpr_hi"} and len(roc["fpr"]) <= 201
        fpr, tpr, lo, hi = (np.asarray(roc[k]) for k in ("fpr", "tpr", "tpr_lo", "tpr_hi"))
        assert fpr[0] == 0 and fpr[-1] == 1 and (np.diff(fpr) > 0).all() and (np.diff(tpr) >= 0).all()
        assert (lo <= tpr + 1e-12).all() and (tpr <= hi + 1e-12).all()
        assert set(entry["per_class"]) == {"0", "1", "2", "3"}
        assert sum(v["n"] for v in entry["per_class"].values()) == 96
        assert set(entry["leave_one_out"]) >= {"auc_mean", "auc_std", "tpr_at_fpr_mean"}
        assert entry["params"]["attack"] == ATTACK_SPECS[name][0]
    assert report["attacks"]["lira_online_fixed_var"]["params"]["fix_variance"] is True
    assert {report["attacks"][n]["params"]["location"] for n in ATTACK_SPECS if n.startswith("lira")} == {"median"}
    offline = report["attacks"]["rmia_offline"]
    assert offline["params"]["a"] == "auto" and offline["info"]["a"] in offline["info"]["a_tuning"]["grid"]
    assert "pseudo-target" in offline["info"]["a_tuning"]["chosen_on"]
    assert offline["info"]["ties"] == "likelihood_ratio" and offline["info"]["n_population"] == 20
    assert set(offline["info"]["ties_before_breaking"]) == {"tied", "largest", "top"}
    assert set(report["utility"]) == {"test_accuracy", "train_accuracy"}


def test_scores_npz_rebuilds_every_metric(attacked) -> None:
    report = read_json(attacked.run_dir / "attack.json")
    target = open_run(attacked.run_dir)
    with np.load(attacked.run_dir / "scores.npz", allow_pickle=False) as z:
        assert (z["pool_index"] == np.arange(96)).all() and (z["membership"] == target.membership).all()
        assert (z["labels"] == target.pool.y).all()
        for name, entry in report["attacks"].items():
            s = z[f"score_{name}"]
            assert s.shape == (96,) and np.isfinite(s).all()
            assert entry["metrics"]["auc"] == pytest.approx(auc(s, z["membership"]))
            direct = tpr_at_fpr(s, z["membership"], (0.01,))[0.01]
            assert entry["metrics"]["tpr_at_fpr"]["0.01"] == pytest.approx(direct)
            members = set(np.flatnonzero(z["membership"]).tolist())
            assert set(entry["most_vulnerable"]) <= members and len(entry["most_vulnerable"]) == 5


@pytest.mark.parametrize("name", attack_names())
def test_members_score_higher_on_an_overfit_target(attacked, name: str) -> None:
    s, y = attacked.scores[name], attacked.membership
    assert np.median(s[y]) > np.median(s[~y])          # robust to LiRA's heavy tails with K = 4
    assert attacked.report.attacks[name].metrics.auc > 0.6


def test_banded_roc_reads_the_exact_roc() -> None:
    rng = np.random.default_rng(0)
    y = rng.random(300) < 0.5
    s = rng.normal(size=300) + 1.5 * y
    roc = banded_roc(s, y, n_boot=50, rng=1)
    grid = roc_grid(int((~y).sum()))
    assert roc["fpr"] == grid.tolist()
    direct = tpr_at_fpr(s, y, tuple(grid))
    assert np.allclose(roc["tpr"], [direct[t] for t in grid])
    assert roc_grid(5000).size <= 200 and roc_grid(3).tolist() == [0, 1 / 3, 2 / 3, 1]


def test_bootstrap_band_equals_the_weighted_roc_reference() -> None:
    from attacks.metrics import weighted_roc_metrics
    from attacks.results import _boot_counts, _tpr_at_grid

    rng = np.random.default_rng(2)
    y = rng.random(120) < 0.4
    s = np.round(rng.normal(size=120) + y, 1)          # rounding creates ties
    w = _boot_counts(y, 7, rng)
    assert (w[:, y].sum(axis=1) == y.sum()).all() and (w[:, ~y].sum(axis=1) == (~y).sum()).all()
    grid = roc_grid(int((~y).sum()))
    ref = weighted_roc_metrics(s, y, w, fpr_targets=tuple(grid))["tpr_at"]
    assert np.allclose(_tpr_at_grid(s, y, w, grid), ref)


def test_attack_is_complete_tracks_inputs_and_settings(run_copy: Path) -> None:
    assert attack_is_complete(run_copy, _config())
    assert attack_is_complete(run_copy, _config(executor="sequential", workers=3))  # execution-only settings
    assert not attack_is_complete(run_copy, _config(n_bootstrap=21))
    with np.load(run_copy / "scores.npz") as z:
        scores = dict(z)
    write_npz(run_copy / "scores.npz", **(scores | {"inputs_digest": np.array("0" * 64)}))  # another run's scores
    assert not attack_is_complete(run_copy, _config())
    write_npz(run_copy / "scores.npz", **scores)
    assert attack_is_complete(run_copy, _config())
    report = read_json(run_copy / "attack.json")
    report["inputs"]["pool_fingerprint"] = "0" * 64
    write_json(run_copy / "attack.json", report)
    assert not attack_is_complete(run_copy, _config())
    (run_copy / "attack.json").unlink()
    assert not attack_is_complete(run_copy, _config())


def test_signals_and_shadows_are_reused(run_copy: Path, monkeypatch) -> None:
    """Only the target's own signals are recomputed (to verify the cache), never the reference models'."""
    import attacks.signal_cache as cache

    calls = []
    real = cache.compute_signals

    def count(model, *a, **k):
        calls.append(model)
        return real(model, *a, **k)

    monkeypatch.setattr("attacks.signal_cache.compute_signals", count)
    again = run_attack(run_dir=run_copy, config=_config(attacks=("loss", "lira_online")), progress=False)
    assert again.shadows_trained == 0 and set(again.scores) == {"loss", "lira_online"}
    assert len(calls) == 2 and calls[0] is calls[1]  # the target, on the pool and on the population


def _edit_manifest(run: Path, section: str, key: str, value) -> None:
    data = json.loads((run / "manifest.json").read_text())
    data[section][key] = value
    write_json(run / "manifest.json", data)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda r: _edit_manifest(r, "data", "pool_fingerprint", "0" * 64), "does not match the manifest"),
    (lambda r: (r / "model.safetensors").write_bytes(b"x" + (r / "model.safetensors").read_bytes()[1:]),
     "does not match the manifest"),
    (lambda r: np.save(r / "membership.npy", ~np.load(r / "membership.npy")), "does not match the manifest's sha256"),
    (lambda r: (r / "config.yaml").write_text((r / "config.yaml").read_text().replace("lr: 0.01", "lr: 0.02")),
     "recipe was edited"),
])
def test_a_target_that_does_not_verify_is_refused(run_copy: Path, damage, message: str) -> None:
    damage(run_copy)
    with pytest.raises(CheckpointError, match=message):
        run_attack(run_dir=run_copy, config=_config(attacks=("loss",), evaluation="target"), progress=False)


def test_reference_attacks_need_reference_models(run_copy: Path) -> None:
    """K is checked once, where the settings are built: 0 with a reference attack, or odd, is refused there."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="lira_online.*attack.n_reference is 0"):
        _config(n_reference=0, evaluation="target")
    with pytest.raises(ValidationError, match=r"leave-one-out evaluation\) need reference models"):
        _config(n_reference=0, attacks=("loss",), evaluation="both")
    for k in (1, 3, 5):
        with pytest.raises(ValidationError, match=f"even number >= 2.*got {k}"):
            _config(n_reference=k, attacks=("loss",), evaluation="target")
    with pytest.raises(UserError, match="attack.n_reference must be an even number"):
        resolve_attack_config(run_dir=run_copy, overrides={"attack.n_reference": 0})
    out = run_attack(run_dir=run_copy, config=_config(n_reference=0, evaluation="target",
                                                      attacks=("loss", "attack_p")), progress=False)
    assert out.report.setup.n_reference == 0 and out.report.setup.recipe_hash is None


def test_cli_attack_exit_codes(run_copy: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(main, ["attack", str(run_copy), "--set", f"attack.n_reference={K}", "--set",
                              "attack.attacks=[loss,lira_online]", "--set", "attack.n_bootstrap=10", "--no-progress"])
    assert ok.exit_code == 0, ok.output
    assert "lira_online" in ok.output and "TPR@1%" in ok.output
    odd = runner.invoke(main, ["attack", str(run_copy), "--set", "attack.n_reference=3", "--no-progress"])
    assert odd.exit_code == 2 and "error:" in odd.output and "even" in odd.output
    missing = runner.invoke(main, ["attack", str(run_copy / "nope")])
    assert missing.exit_code == 2 and "run directory not found" in missing.output
    bad_key = runner.invoke(main, ["attack", str(run_copy), "--set", "privacy.target_epsilon=1"])
    assert bad_key.exit_code == 2 and "attack.* settings" in bad_key.output


def test_attack_settings_come_from_the_runs_variant(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("name: exp\nattack: {n_reference: 8}\n"
                    "variants:\n  a: {attack.n_reference: 4}\n  b: {privacy.enabled: false}\n")
    assert resolve_attack_config(run_dir=tmp_path / "exp-a", config_path=str(path)).n_reference == 4
    assert resolve_attack_config(run_dir=tmp_path / "exp-b", config_path=str(path)).n_reference == 8
    assert resolve_attack_config(run_dir=tmp_path / "x", config_path=str(path), variant="a",
                                 overrides=("attack.seed=3",)).seed == 3
    assert resolve_attack_config(run_dir=tmp_path / "x", overrides=("attack.population=7",)).population == 7
    with pytest.raises(UserError, match="n_refs"):
        resolve_attack_config(run_dir=tmp_path / "x", overrides=("attack.n_refs=7",))


def test_attack_config_is_strict_and_its_hash_is_stable() -> None:
    # pinned: a change here makes every earlier attack.json stale (re-made by audit attack / audit run). It changed
    # last when the defaults changed results: population 'all', offline RMIA's a tuned, ties broken, LiRA median
    # last when the defaults changed results: population 'all', offline RMIA's a tuned, ties broken, LiRA median.
    # attack.flip/shifts default to 'auto' (the target's augmentation); what attack.json records is the resolved
    # config, whose hash for a flip-trained target is the earlier default's, so those files stay current
    flip_trained = AttackConfig(flip=True, shifts=0)
    assert flip_trained.sha256() == "4a8eabccd32738e4ff1eb884ac68355ef8dc525a67cf384a007bbbed44e508b5"
    assert AttackConfig().sha256() == "188ad70407716629d4947a3af6bed5d744f017378c2c47c06aeacf06d4f4d0ff"
    cfg = AttackConfig(n_reference=4, attacks=("loss", "rmia_offline"), flip=True, shifts=1, seed=3, workers=4)
    assert cfg.sha256() == "1e96105e78fa6b9c7fd821445d98c4730649f6b0f4bd55b7220fb248e8270b71"
    assert AttackConfig().attacks == attack_names()
    with pytest.raises(ValueError, match="n_refs"):
        AttackConfig.model_validate({"n_refs": 4})  # a renamed field is an error, never a silent default
    with pytest.raises(ValueError, match="unknown attack"):
        AttackConfig(attacks=("lira",))
    with pytest.raises(TypeError, match="AttackConfig"):
        run_attack(run_dir="nowhere", config={"n_reference": 4}, progress=False)


def test_reference_free_fallback_for_a_run_without_recipe() -> None:
    cfg = AttackConfig(evaluation="both")
    same, note = fit_to_run(cfg, has_recipe=True, attacks_chosen=False)
    assert same is cfg and note is None
    assert fit_to_run(cfg, has_recipe=False, attacks_chosen=True) == (cfg, None)
    narrowed, note = fit_to_run(cfg, has_recipe=False, attacks_chosen=False)
    assert narrowed.attacks == ("loss", "attack_p") and narrowed.evaluation == "target"
    assert not narrowed.needs_references and "loss, attack_p" in note
