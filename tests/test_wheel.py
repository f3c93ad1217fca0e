"""An installed wheel works outside the checkout: ``audit transfer RUN`` finds its default suite in the wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fixtures_runs import TINY_TRAIN

ROOT = Path(__file__).resolve().parents[1]
_NOT_SOURCE = shutil.ignore_patterns(".venv", ".git", "results", "build", "*.egg-info", "__pycache__", "data",
                                     ".pytest_cache")


@pytest.mark.slow
def test_an_installed_wheel_runs_transfer_with_its_default_suite(tmp_path):
    from training.config import TrainConfig, apply_overrides
    from training.trainer import train

    src, wheels, site, elsewhere = (tmp_path / d for d in ("src", "wheels", "site", "elsewhere"))
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)  # a clean copy: no stale build/ in the wheel
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(wheels)], check=True,
                   timeout=300)
    wheel = next(wheels.glob("dp_audit-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    assert (site / "eval_configs" / "transfer" / "default.yaml").is_file()

    run = train(TrainConfig.model_validate(apply_overrides(TINY_TRAIN, {"output_dir": str(elsewhere / "runs")}))).run_dir
    rng = np.random.default_rng(0)  # the default suite's first dataset, where it looks: data/cifar10 of the cwd
    (elsewhere / "data" / "cifar10").mkdir(parents=True)
    for split, n in (("train", 120), ("test", 60)):
        np.savez(elsewhere / "data" / "cifar10" / f"{split}.npz", x=rng.integers(0, 256, (n, 32, 32, 3), np.uint8),
                 y=(np.arange(n) % 10).astype(np.int64))
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    where = subprocess.run([sys.executable, "-c", "import audit; print(audit.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site)  # the wheel's code, not the checkout's
    out = subprocess.run([sys.executable, "-m", "audit", "transfer", str(run), "--quiet"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads((run / "transfer.json").read_text())
    assert result["suite"]["name"] == "default"
    assert {r["name"]: r["status"] for r in result["datasets"]}["cifar10"] == "ok"
