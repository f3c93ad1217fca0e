"""benchmarks/gpu_headline.py: the ``--smoke`` run of every stage (slow: the stages run in their own processes),
the refusals that keep toy or CPU figures out of the reference table, and the goals' verdicts from stage results."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_headline.py"
STAGES = ("target", "references", "dp_target", "step_table")


def _load_render():
    spec = importlib.util.spec_from_file_location("_headline_render", ROOT / "benchmarks" / "_headline_render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render


render = _load_render()


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=900)


@pytest.mark.slow
def test_smoke_runs_every_stage_and_writes_its_own_file(tmp_path):
    out = tmp_path / "smoke.md"
    reference = ROOT / "results/reference/gpu_headline.md"
    before = reference.read_text() if reference.exists() else None
    done = _run("--smoke", "--out", str(out), "--work", str(tmp_path / "work"), "--budget", "600")
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert text.startswith("# The audit at the scale") and "Toy run (`--smoke`)" in text
    for stage in STAGES:
        assert f"| {stage} | done |" in text, stage
    assert "| 2 | lira_online |" in text and "| 4 | rmia_offline |" in text  # K = 2, then K = 4
    assert "| processes |" in text and "(sequential)" in text  # probed all ways; trained one after another
    assert "| gradient_canaries | one_run |" in text
    for model in ("ViT (tiny)", "ResNet-20"):
        for mode in ("non-DP", "hooks", "ghost", "bk", "fused"):
            assert f"| {model} | {mode} | " in text
    assert "toy run: not the goal's scale" in text and "| met |" not in text
    assert (reference.read_text() if reference.exists() else None) == before


def test_smoke_never_writes_the_reference_table_and_a_cpu_run_needs_smoke(tmp_path):
    done = _run("--smoke", "--out", str(ROOT / "results/reference/gpu_headline.md"))
    assert done.returncode == 2 and "toy CPU figures" in done.stderr and "Traceback" not in done.stderr
    done = _run("--out", str(tmp_path / "x.md"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2 and "on a CPU run --smoke" in done.stderr
    assert not (tmp_path / "x.md").exists()


def _done(acc, seconds, ref_seconds, auc, tpr, busy, vit_ms):
    attack = {"auc": auc, "auc_ci": [auc - 0.01, auc + 0.01], "n_nonmembers": 22_000,
              "tpr": {"0.01": 0.2, "0.001": tpr, "0.0001": 0.01}, "tpr_ci": {"0.01": None, "0.001": None, "0.0001": None}}
    return [
        {"name": "target", "status": "done", "wall": seconds, "busy": 0.9, "result": {
            "seconds": seconds, "test_accuracy": acc, "train_accuracy": 1.0, "arch": "fastnet", "params": 1,
            "pool": 45_000, "members": 22_500, "steps": 350}},
        {"name": "references", "status": "done", "wall": 1.0, "busy": 0.9, "result": {"runs": [
            {"k": 16, "train_seconds": ref_seconds, "attack_seconds": 1.0, "how": "processes", "queries": 18,
             "attacks": {a: attack for a in ("lira_online", "lira_offline", "rmia_offline")}}]}},
        {"name": "step_table", "status": "done", "wall": 1.0, "result": {"rows": [
            {"model": "ViT-S", "mode": "non-DP", "ms": 10.0, "busy": 0.95},
            {"model": "ViT-S", "mode": "bk", "ms": vit_ms, "busy": busy},
            {"model": "ResNet-20", "mode": "hooks", "error": "RuntimeError: x"}]}},
    ]


def _verdicts(text):
    goals = text.split("## The issue's goals")[1].split("## Re-make")[0]
    return [line.rsplit("|", 2)[-2].strip() for line in goals.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| goal")]


def test_goals_are_met_or_not_met_by_the_measured_numbers():
    good = render(_done(0.93, 60.0, 100.0, 0.70, 0.06, 0.85, 12.0), device="H100", smoke=False, budget=540, command="c")
    assert _verdicts(good) == ["met"] * 6
    bad = render(_done(0.91, 60.0, 130.0, 0.68, 0.05, 0.5, 14.0), device="H100", smoke=False, budget=540, command="c")
    assert _verdicts(bad) == ["not met"] * 6
    assert "| ResNet-20 | hooks | RuntimeError: x |" in bad
    partial = render(_done(0.93, 60.0, 100.0, 0.7, 0.06, 0.9, 12.0)[:1], device="H100", smoke=False, budget=540,
                     command="c")
    assert _verdicts(partial) == ["met"] + ["not measured"] * 5
