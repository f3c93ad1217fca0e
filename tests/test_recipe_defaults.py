"""Defaults follow the recipe. Attack queries follow the target's training augmentation: a model trained without flips is
queried as it is (identity), so the default attack equals `attack.flip=false` (issue 34's MLP: the flip query had cut
LOSS AUC from 0.915 to 0.737); one trained with flips and crops is queried with them; attack.json records which and
why. A non-DP phase shuffles (nothing needs Poisson batches without DP) unless `privacy.sampling` says otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.config import AttackConfig
from attacks.runner import run_attack
from training.config import TrainConfig
from training.trainer import train


def _train(tmp_path, name: str, augment: dict) -> object:
    return train(TrainConfig.model_validate({
        "name": name, "output_dir": str(tmp_path),
        "data": {"dataset": "digits", "pool_size": 300, "test_size": 100, "audit_split": True},
        "model": {"arch": "mlp"},
        "privacy": {"enabled": False},
        "optim": {"name": "adam", "lr": 0.01},
        "training": {"steps": 60, "batch_size": 64, "progress": False, "augment": augment}}))


def _attack(run_dir, **kw):
    cfg = AttackConfig(attacks=("loss",), n_reference=0, evaluation="target", n_bootstrap=10, population=0, **kw)
    return run_attack(run_dir=run_dir, config=cfg, progress=False).report


def test_model_trained_without_flips_is_attacked_with_the_identity_query(tmp_path) -> None:
    run = _train(tmp_path, "noflip", {})
    default = _attack(run.run_dir)
    assert default.setup.augmentations == ["identity"]
    assert "auto" in default.setup.queries_from and "training.augment" in default.setup.queries_from
    identity = _attack(run.run_dir, flip=False, shifts=0)
    assert default.attacks["loss"].metrics.auc == identity.attacks["loss"].metrics.auc
    flipped = _attack(run.run_dir, flip=True, shifts=0)
    assert flipped.setup.augmentations == ["identity", "hflip"]
    assert flipped.attacks["loss"].metrics.auc != pytest.approx(identity.attacks["loss"].metrics.auc, abs=1e-9)
    assert flipped.setup.queries_from == "set (attack.flip, attack.shifts)"


def test_model_trained_with_flips_and_crops_is_queried_with_them(tmp_path) -> None:
    run = _train(tmp_path, "flip", {"flip": True, "crop_padding": 1})
    report = _attack(run.run_dir)
    assert report.setup.augmentations[:2] == ["identity", "hflip"] or "hflip" in report.setup.augmentations
    assert len(report.setup.augmentations) == 2 * 9   # flip x (dy, dx) in {-1, 0, 1}^2


def test_non_dp_phases_shuffle_unless_told(tmp_path) -> None:
    from audit.config import load_run_config, select_variant

    assert TrainConfig.model_validate({"privacy": {"enabled": False}}).privacy.sampling == "shuffle"
    assert TrainConfig.model_validate({"privacy": {"noise_multiplier": 1.0}}).privacy.sampling == "poisson"
    assert TrainConfig.model_validate({"privacy": {"enabled": False, "sampling": "poisson"}}).privacy.sampling \
        == "poisson"
    cfg = load_run_config("eval_configs/quickstart.yaml")   # a variant that turns DP off shuffles too
    assert select_variant(cfg, "nondp").train_config().privacy.sampling == "shuffle"
    assert select_variant(cfg, "dp-eps8").train_config().privacy.sampling == "poisson"
    run = _train(tmp_path, "nondp", {})
    assert [ph.sampling for ph in run.manifest.privacy.phases] == ["shuffle"]


def test_pool_selection_first_takes_the_splits_first_rows(tmp_path) -> None:
    """`data.pool_selection: first` reproduces a peer's "first N rows" setup; random stays the seeded subset."""
    from training.config import DataConfig
    from training.data import load_dataset
    from training.data.pool import load_pool

    full = load_dataset("digits", split="train")
    first = load_pool(DataConfig(dataset="digits", pool_size=50, pool_selection="first"))
    assert np.array_equal(first.x, full.x[:50]) and np.array_equal(first.y, full.y[:50])
    rand = load_pool(DataConfig(dataset="digits", pool_size=50))
    assert not np.array_equal(rand.x, full.x[:50])
    run = train(TrainConfig.model_validate({
        "name": "first", "output_dir": str(tmp_path), "model": {"arch": "mlp"}, "privacy": {"enabled": False},
        "data": {"dataset": "digits", "pool_size": 50, "test_size": 20, "pool_selection": "first"},
        "training": {"steps": 2, "batch_size": 16, "progress": False}}))
    assert run.manifest.data.pool_selection == "first"
