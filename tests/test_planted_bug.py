"""A planted DP bug is caught end to end: train -> epsilon.json -> verdict, with white-box gradient canaries.

Both runs train a small MLP on 64 digits images with full-batch DP-SGD (q = 1, 20 steps) and m = 1000 gradient
canaries (Steinke, Nasr, Jagielski 2023). The buggy run skips the Gaussian noise (``_debug_disable_noise``) while
its manifest still claims ε = 1: the one-run audit must report VIOLATION. The honest run claims ε = 2 and must be
CONSISTENT (its bound is a valid lower bound, so this fails with probability at most α over the seeds).
"""

from __future__ import annotations

import warnings

import pytest
from threadpoolctl import threadpool_limits

from audit.config import EpsilonConfig
from audit.bounds.runner import run_epsilon
from training.config import TrainConfig
from foundation.io import read_json


def _train(run_dir, *, epsilon: float, disable_noise: bool):
    from training.trainer import train

    cfg = TrainConfig.model_validate({
        "name": run_dir.name,
        "data": {"dataset": "digits", "test_split": None, "pool_size": 64, "audit_split": False},
        "model": {"arch": "mlp", "kwargs": {"hidden": [64]}},
        "privacy": {"target_epsilon": epsilon, "delta": 1e-5},
        "optim": {"lr": 0.5},
        "training": {"steps": 20, "batch_size": 64, "progress": False, "log_every": 20,
                     "gradient_canaries": {"count": 1000, "seed": 1}},
    })
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train(cfg, run_dir=run_dir, progress=False, _debug_disable_noise=disable_noise)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    out = {}
    with threadpool_limits(1):  # numpy BLAS threads only; the canary projections are many small dot products
        for name, eps, bug in (("bug", 1.0, True), ("honest", 2.0, False)):
            result = _train(root / name, epsilon=eps, disable_noise=bug)
            report = run_epsilon(run_dir=result.run_dir, config=EpsilonConfig(sources=("gradient_canaries",)))
            out[name] = (result, report, read_json(result.run_dir / "epsilon.json"))
    return out


def test_noise_free_run_claiming_epsilon_1_is_a_violation(audited):
    result, report, data = audited["bug"]
    privacy = result.manifest.privacy
    assert privacy.dp and privacy.epsilon == pytest.approx(1.0, abs=0.01)
    assert privacy.phases[0].sample_rate == 1.0 and privacy.phases[0].noise_multiplier > 1.0
    assert data["verdict"]["status"] == "VIOLATION" == report.verdict.status
    one_run = next(e for e in data["estimates"] if e["method"] == "one_run")
    assert one_run["source"] == "gradient_canaries" and one_run["extra"]["in_verdict"]
    assert one_run["epsilon_lb"] > privacy.epsilon  # the assumption-free bound alone refutes the claim
    assert one_run["counts"]["m"] == 1000 and one_run["alpha"] == pytest.approx(0.025)


def test_honest_run_at_epsilon_2_is_consistent(audited):
    result, report, data = audited["honest"]
    assert result.manifest.privacy.epsilon == pytest.approx(2.0, abs=0.02)
    assert data["verdict"]["status"] == "CONSISTENT" == report.verdict.status
    assert data["verdict"]["inconclusive_above"] is None  # the ceiling was above the claim: a real test
    assert 0.0 <= data["verdict"]["best_epsilon_lb"] <= 2.0
    assert data["delta"] == pytest.approx(1e-5)
