"""The multi-run ε source: 2n re-trained models, n with one canary, Clopper–Pearson and GDP in epsilon.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from audit.config import EpsilonConfig
from audit.bounds.multi_run_source import make_canary
from audit.bounds.runner import run_epsilon
from training.config import TrainConfig, apply_overrides
from training.trainer import train

from fixtures_runs import TINY_TRAIN

TINY = apply_overrides(TINY_TRAIN, {"data.pool_size": 120, "data.test_size": 40, "optim.momentum": 0.0,
                                    "training.steps": 4, "training.batch_size": 16, "training.physical_batch_size": 32,
                                    "training.checkpoint_every": 50})


def _run(tmp_path: Path, **over) -> Path:
    return train(TrainConfig.model_validate(apply_overrides(TINY, {"output_dir": str(tmp_path), **over}))).run_dir


def test_dp_run_gets_multi_run_cp_and_gdp(tmp_path):
    run = _run(tmp_path)
    cfg = EpsilonConfig(sources=("multi_run",), multi_run_models=16)
    report = run_epsilon(run_dir=run, config=cfg)
    saved = json.loads((run / "epsilon.json").read_text())
    multi = [e for e in saved["estimates"] if e["source"] == "multi_run"]
    assert sorted(e["method"] for e in multi) == ["clopper_pearson", "gdp"]
    for e in multi:
        assert e["counts"]["n_pos"] == 4 and e["counts"]["n_neg"] == 4  # 8 per side, half to pick the threshold
        assert 0.0 <= e["epsilon_lb"] <= e["ceiling"] + 1e-12
        assert e["delta"] == pytest.approx(1e-4) and not e["extra"]["in_verdict"]
        info = e["extra"]["multi_run"]
        assert info["n_per_side"] == 8 and info["canary"]["kind"] == "ood" and info["training_seconds"] >= 0
        assert info["dp"] and info["noise_multiplier"] == pytest.approx(1.0)
    assert report.verdict.status == "CONSISTENT" and report.verdict.notes[0].startswith("no evidence")


def test_multi_run_not_in_default_sources_and_validation():
    assert "multi_run" not in EpsilonConfig().sources
    with pytest.raises(ValueError, match="even"):
        EpsilonConfig(multi_run_models=15)


def test_noise_free_canary_separates_and_too_few_models_skip(tmp_path):
    run = _run(tmp_path, **{"privacy.enabled": False, "privacy.noise_multiplier": None, "privacy.delta": None,
                            "optim.lr": 0.5, "training.steps": 30, "training.batch_size": 40})
    cfg = EpsilonConfig(sources=("multi_run",), multi_run_models=64, multi_run_canary="mislabel")
    report = run_epsilon(run_dir=run, config=cfg, write=False)
    assert math.isinf(report.claimed_epsilon) and report.verdict.status == "NO_CLAIM"
    ests = {e.estimate.method: e.estimate for e in report.estimates}
    assert set(ests) == {"clopper_pearson", "gdp"}
    info = ests["clopper_pearson"].extra["multi_run"]
    assert info["canary"]["kind"] == "mislabel" and info["canary"]["label"] != info["canary"]["true_label"]
    assert info["mean_score_with"] > info["mean_score_without"] + 1.0
    # without noise the mislabelled canary is memorised: 16 + 16 held-out models separate, so ε_lb > 0
    cp = ests["clopper_pearson"]
    assert cp.counts["n_pos"] == cp.counts["n_neg"] == 16 and 0.0 < cp.epsilon_lb <= cp.ceiling + 1e-12
    skipped = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("multi_run",), multi_run_models=4,
                                                            holdout_fraction=0.2), write=False)
    assert not skipped.estimates and skipped.skipped[0].source == "multi_run"
    assert "too few models" in skipped.skipped[0].reason


def test_make_canary_is_seeded_and_mislabels():
    a = make_canary("ood", image_shape=(4, 4, 3), num_classes=5, rng=[1, 2])
    b = make_canary("ood", image_shape=(4, 4, 3), num_classes=5, rng=[1, 2])
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]
    tx = np.zeros((6, 4, 4, 3), np.uint8)
    ty = np.arange(6) % 3
    for seed in range(20):
        _, label, d = make_canary("mislabel", image_shape=(4, 4, 3), num_classes=3, test_x=tx, test_y=ty, rng=seed)
        assert label != int(ty[d["test_index"]]) and 0 <= label < 3
    with pytest.raises(ValueError, match="test set"):
        make_canary("mislabel", image_shape=(4, 4, 3), num_classes=3, rng=0)
