"""An installed wheel works outside the checkout: ``audit transfer RUN`` finds its default suite in the wheel.

The shipped configs are found through :mod:`importlib.resources` (:func:`foundation.config_io.shipped_config`), not
beside ``foundation/``'s own file: the test installs the wheel, then puts its ``eval_configs`` package on another
``sys.path`` entry than the code, where only an import-system lookup finds it (a path computed from ``__file__``
names a folder that is not there, and the command fails).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
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
                                     ".pytest_cache", ".device_data")


def _offline_build_missing() -> str | None:
    """Why no wheel can be built here without the network (no build isolation: the backend must be installed)."""
    if importlib.util.find_spec("pip") is None:
        return "pip is not installed in this interpreter"
    try:  # the version from its metadata: importing setuptools here would replace the loaded distutils
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools (the build backend) is not installed and building offline cannot fetch it"
    major, minor = (int(p) for p in version.split(".")[:2])
    if (major, minor) < (70, 1) and importlib.util.find_spec("wheel") is None:
        return f"setuptools {version} needs the 'wheel' package to build a wheel, and it is missing"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_offline_build_missing() is not None, reason=f"cannot build a wheel offline: "
                                                               f"{_offline_build_missing()}")
def test_an_installed_wheel_runs_transfer_with_its_default_suite(tmp_path):
    from training.config import TrainConfig, apply_overrides
    from training.trainer import train

    src, wheels, site, data_site, elsewhere = (tmp_path / d for d in ("src", "wheels", "site", "data_site",
                                                                      "elsewhere"))
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE)  # a clean copy: no stale build/ in the wheel
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(wheels)], check=True,
                   timeout=300)
    wheel = next(wheels.glob("dp_audit-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    for shipped in ("__init__.py", "transfer/default.yaml", "gates/default.yaml", "quickstart.yaml",
                    "experiments/continual_pretrain.yaml"):
        assert (site / "eval_configs" / shipped).is_file(), shipped
    data_site.mkdir()
    shutil.move(site / "eval_configs", data_site / "eval_configs")  # reachable by import only, not beside the code

    run = train(TrainConfig.model_validate(apply_overrides(TINY_TRAIN, {"output_dir": str(elsewhere / "runs")}))).run_dir
    rng = np.random.default_rng(0)  # the default suite's first dataset, where it looks: data/cifar10 of the cwd
    (elsewhere / "data" / "cifar10").mkdir(parents=True)
    for split, n in (("train", 120), ("test", 60)):
        np.savez(elsewhere / "data" / "cifar10" / f"{split}.npz", x=rng.integers(0, 256, (n, 32, 32, 3), np.uint8),
                 y=(np.arange(n) % 10).astype(np.int64))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(data_site)]), "OMP_NUM_THREADS": "1"}
    where = subprocess.run([sys.executable, "-c", "import audit, foundation.config_io as c; print(audit.__file__); "
                            "print(c.shipped_config('transfer', 'default.yaml')); "
                            "print(c.resolve_config_path('eval_configs/quickstart.yaml'))"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True, timeout=120)
    code, suite, quickstart = (Path(line) for line in where.stdout.split())
    assert code.is_relative_to(site)  # the wheel's code, not the checkout's
    assert suite == data_site / "eval_configs" / "transfer" / "default.yaml"  # found by importlib.resources
    assert quickstart == data_site / "eval_configs" / "quickstart.yaml"  # `audit run eval_configs/...` likewise
    out = subprocess.run([sys.executable, "-m", "audit", "transfer", str(run), "--quiet"], cwd=elsewhere, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads((run / "transfer.json").read_text())
    assert result["suite"]["name"] == "default"
    assert {r["name"]: r["status"] for r in result["datasets"]}["cifar10"] == "ok"
