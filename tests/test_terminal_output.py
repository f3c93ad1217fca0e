"""What the terminal shows: `training.progress: false` draws no bar even under `audit run` (whose --no-progress is
off by default); a counted attack stage is one line with its total, elapsed time and ETA when piped (not one
line per model)."""

from __future__ import annotations

import io
import json

import yaml
from rich.console import Console

from attacks.stage_log import StageLog
from audit.config import load_run_config
from audit.pipeline import run_pipeline

TINY = {
    "name": "quiet",
    "data": {"dataset": "digits", "pool_size": 120, "test_size": 60},
    "model": {"arch": "mlp"},
    "privacy": {"noise_multiplier": 1.0, "delta": 1e-4},
    "optim": {"name": "sgd", "lr": 0.5},
    "training": {"steps": 3, "batch_size": 32, "progress": False},
}


def test_progress_false_in_the_config_draws_no_bar_under_audit_run(tmp_path, monkeypatch) -> None:
    import training.trainer as trainer

    shown = []
    real = trainer.TrainLogger

    def spy(*a, **kw):
        shown.append(kw.get("show"))
        return real(*a, **kw)

    monkeypatch.setattr(trainer, "TrainLogger", spy)
    data = {**json.loads(json.dumps(TINY)), "output_dir": str(tmp_path / "r")}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    run_pipeline(config=load_run_config(tmp_path / "cfg.yaml"), steps=("train",), progress=True, log=lambda m: None)
    assert shown == [False]
    data["training"]["progress"] = True
    data["name"] = "loud"
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(data))
    run_pipeline(config=load_run_config(tmp_path / "cfg.yaml"), steps=("train",), progress=True, log=lambda m: None)
    assert shown == [False, True]


def test_a_counted_stage_is_one_piped_line_with_total_and_eta() -> None:
    buf = io.StringIO()
    log = StageLog(show=True, console=Console(file=buf, width=160, force_terminal=False))
    tick = log.stage("signals (target + references)", 17)
    for i in range(1, 18):
        tick(i)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "17/17" in lines[0] and "ETA" in lines[0] and "elapsed" in lines[0]
    silent = io.StringIO()
    StageLog(show=False, console=Console(file=silent)).stage("x", 3)(3)
    assert silent.getvalue() == ""
