"""The CIFAR-10 recipes of eval_configs/ (cifar10_resnet.yaml, cifar10_resnet_dp.yaml): they validate as written,
say what they promise (augmentation, label smoothing, EMA, multiplicity, GroupNorm under DP), and train a few steps
on the CPU on a small slice of the real data in ../shared (skipped without it), end to end through `audit train`."""

from __future__ import annotations

from pathlib import Path
from foundation.shared_root import missing_reason, shared_root

import pytest

from training.config import load_config
from training.trainer import train

ROOT = Path(__file__).resolve().parents[1]
CIFAR = shared_root() / "data" / "cifar10"  # $DP_AUDIT_SHARED, default ../shared
CONFIGS = {"nondp": ROOT / "eval_configs" / "cifar10_resnet.yaml", "dp": ROOT / "eval_configs" / "cifar10_resnet_dp.yaml"}
SMALL = ["data.pool_size=96", "data.test_size=32", "training.epochs=null", "training.steps=2",
         "training.batch_size=16", "training.physical_batch_size=8", "training.progress=false",
         "training.device=cpu", f"data.root={CIFAR}"]


def test_recipes_validate_and_say_what_they_promise():
    nondp, dp = load_config(CONFIGS["nondp"]), load_config(CONFIGS["dp"])
    for cfg in (nondp, dp):
        tc = cfg.training
        assert cfg.data.dataset == "cifar10" and tc.augment.crop_padding == 4 and tc.augment.flip
        assert tc.ema.decay == 0.999 and tc.channels_last and tc.precision == "bf16"
    assert not nondp.privacy.enabled and nondp.optim.momentum == 0.9 and nondp.optim.schedule == "cosine"
    assert nondp.training.label_smoothing == 0.1
    assert dp.privacy.enabled and dp.privacy.target_epsilon == 8.0 and dp.model.fix_batchnorm
    assert dp.training.augment.multiplicity == 16 and dp.training.batch_size == 4096


@pytest.mark.skipif(not (CIFAR / "train.npz").is_file(), reason=missing_reason("data/cifar10/train.npz"))
@pytest.mark.parametrize("which", ["nondp", "dp"])
def test_recipes_train_a_few_steps_on_the_cpu(tmp_path, which):
    extra = ["training.augment.multiplicity=2"] if which == "dp" else []
    cfg = load_config(CONFIGS[which], [*SMALL, *extra, f"output_dir={tmp_path}"])
    res = train(cfg)
    rec = res.manifest.training
    assert res.metrics["steps"] == 2 and 0.0 <= res.metrics["test_accuracy"] <= 1.0
    assert rec["ema"]["decay"] == 0.999 and rec["augment"]["crop_padding"] == 4
    phase = "private" if which == "dp" else "non-private"
    assert rec["precision"]["phases"] == {phase: "fp32" if which == "dp" else "bf16"}
    if which == "dp":
        assert res.manifest.privacy.dp and res.manifest.privacy.epsilon == pytest.approx(8.0, rel=0.02)
        assert "GroupNorm" in " ".join(res.manifest.model.notes) or any(
            "group" in n.lower() for n in res.manifest.model.notes)
