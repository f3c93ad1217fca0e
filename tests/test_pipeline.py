"""`audit run`: the whole pipeline on a tiny config, skipping complete steps and resuming interrupted ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from audit.cli import main
from audit.config import load_run_config
from audit.pipeline import run_pipeline

TINY = {
    "name": "pipe",
    "data": {"dataset": "digits", "pool_size": 200, "test_size": 120},
    "model": {"arch": "mlp"},
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-4},
    "optim": {"name": "sgd", "lr": 0.5, "momentum": 0.9},
    "training": {"steps": 6, "batch_size": 32, "checkpoint_every": 2, "progress": False},
    "attack": {"n_reference": 2, "attacks": ["loss", "lira_online", "rmia_offline"], "population": 50,
               "n_bootstrap": 20, "executor": "sequential"},
    "epsilon": {"sources": ["pool"], "attack": "lira_online"},
    "variants": {"dp": {}, "nondp": {"privacy.enabled": False, "privacy.noise_multiplier": None}},
}


def write(tmp_path: Path) -> Path:
    data = json.loads(json.dumps(TINY))
    data["output_dir"] = str(tmp_path / "results")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def statuses(results):
    return [{s.step: s.status for s in r.steps} for r in results]


def test_pipeline_runs_every_step_then_skips_them(tmp_path):
    cfg = load_run_config(write(tmp_path))
    first = run_pipeline(config=cfg, progress=False, log=lambda m: None)
    assert [r.run_dir.name for r in first] == ["pipe-dp", "pipe-nondp"]
    for r in first:
        st = {s.step: s.status for s in r.steps}
        assert st["train"] == "ran" and st["attack"] == "ran" and st["epsilon"] == "ran" and st["report"] == "ran"
        assert st["transfer"] == "not configured"
        for name in ("manifest.json", "attack.json", "scores.npz", "epsilon.json", "report.html"):
            assert (r.run_dir / name).is_file(), name
    assert first[0].summary["claimed_epsilon"] < float("inf")
    assert first[1].summary["claimed_epsilon"] == float("inf") and first[1].summary["verdict"] == "NO_CLAIM"
    summary = json.loads((tmp_path / "results" / "pipe.summary.json").read_text())
    assert len(summary["variants"]) == 2

    # everything complete: nothing is redone
    again = run_pipeline(config=cfg, progress=False, log=lambda m: None)
    for st in statuses(again):
        assert all(v.startswith("skipped") or v == "not configured" for v in st.values()), st

    # a lost output is remade, and only it (and what depends on it)
    (first[0].run_dir / "epsilon.json").unlink()
    third = run_pipeline(config=cfg, variants=["dp"], progress=False, log=lambda m: None)
    st = statuses(third)[0]
    assert st["train"].startswith("skipped") and st["attack"].startswith("skipped")
    assert st["epsilon"] == "ran"
    # the recomputed epsilon.json is identical, so the report stays valid; a lost report is remade
    assert st["report"].startswith("skipped")
    (first[0].run_dir / "report.html").unlink()
    fourth = run_pipeline(config=cfg, variants=["dp"], progress=False, log=lambda m: None)
    st = statuses(fourth)[0]
    assert st["epsilon"].startswith("skipped") and st["report"] == "ran"
    assert (first[0].run_dir / "report.html").is_file()


def test_interrupted_training_resumes_inside_the_pipeline(tmp_path):
    from training.trainer import train

    cfg = load_run_config(write(tmp_path))
    from audit.config import select_variant

    dp = select_variant(cfg, "dp")
    with pytest.raises(KeyboardInterrupt):
        train(dp.train_config(), stop_after=4, progress=False)
    res = run_pipeline(config=cfg, variants=["dp"], steps=("train",), progress=False, log=lambda m: None)
    assert res[0].steps[0].status == "ran" and "resumed at step 4" in res[0].steps[0].detail


def test_cli_run_prints_summary_and_rejects_bad_steps(tmp_path):
    path = write(tmp_path)
    r = CliRunner().invoke(main, ["run", str(path), "--steps", "train,attakc"])
    assert r.exit_code == 2 and "unknown step" in r.output
    r = CliRunner().invoke(main, ["run", str(path), "--variant", "nondp", "--steps", "train", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "pipe-nondp" in r.output
