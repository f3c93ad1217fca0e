"""Training options of the GPU-scale recipe (augmentation, label smoothing, EMA) through `audit train`.

* Strict config: defaults leave ``config.yaml`` byte-identical to earlier versions (its sha256 is what resume and
  completed-run checks compare); bad values and impossible combinations are one-line errors.
* EMA: the saved model is the average (a decay of ~0 gives the raw weights, a real decay other weights), it is what
  was evaluated, the manifest says so, and an interrupted run resumes to exactly the uninterrupted model (EMA and
  augmentation streams included).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from audit.cli import main
from training.config import TrainConfig, apply_overrides, dump_config
from foundation.errors import ConfigError
from training.evaluate import accuracy
from foundation.io import load_safetensors
from training.run import open_run
from training.trainer import train

from fixtures_runs import TINY_TRAIN as TINY

OPTIONS = {"training.augment.crop_padding": 1, "training.augment.flip": True, "training.augment.multiplicity": 2,
           "training.label_smoothing": 0.1, "training.ema.decay": 0.9}


def tiny(tmp_path: Path, **over) -> TrainConfig:
    return TrainConfig.model_validate(apply_overrides(TINY, {"output_dir": str(tmp_path), **over}))


def weights(res) -> dict[str, torch.Tensor]:
    return load_safetensors(res.run_dir / "model.safetensors")


def max_diff(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_defaults_leave_the_resolved_config_unchanged(tmp_path):
    text = dump_config(tiny(tmp_path))
    for key in ("augment", "label_smoothing", "ema", "channels_last", "precision", "compile"):
        assert f"\n  {key}:" not in text
    on = tiny(tmp_path, **OPTIONS)
    assert "\n  augment:" in dump_config(on) and "\n  ema:" in dump_config(on)
    assert TrainConfig.model_validate(yaml.safe_load(dump_config(on))) == on  # the dump is the config


@pytest.mark.parametrize("over, pattern", [
    ({"training.augment.crop_padding": -1}, r"training\.augment\.crop_padding"),
    ({"training.augment.padding_mode": "edge"}, r"training\.augment\.padding_mode"),
    ({"training.augment.flipp": True}, r"unknown key 'training\.augment\.flipp'.*did you mean 'flip'"),
    ({"training.label_smoothing": 1.0}, r"training\.label_smoothing"),
    ({"training.ema.decay": 1.0}, r"training\.ema\.decay"),
    ({"training.precision": "fp16"}, r"training\.precision"),
    ({"training.ema.decay": 0.9, "training.recipe": "continual_pretrain"}, r"training\.ema applies to"),
    ({"training.ema.decay": 0.9, "training.gradient_canaries.count": 4}, r"gradient_canaries"),
])
def test_bad_options_are_one_line_errors(tmp_path, over, pattern):
    data = apply_overrides(TINY, {"output_dir": str(tmp_path), **over})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(main, ["train", str(path)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in res.output
    import re
    assert re.search(pattern, lines[0]), lines[0]


def test_multiplicity_needs_materialised_per_sample_gradients(tmp_path):
    with pytest.raises(ConfigError, match="multiplicity"):
        train(tiny(tmp_path, **{"training.augment.multiplicity": 2, "privacy.grad_sample_mode": "ghost"}))


def test_ema_model_is_what_is_saved_evaluated_and_recorded(tmp_path):
    raw = train(tiny(tmp_path / "raw"))
    near = train(tiny(tmp_path / "near", **{"training.ema.decay": 1e-9, "training.ema.warmup": False}))
    ema = train(tiny(tmp_path / "ema", **{"training.ema.decay": 0.9}))
    assert max_diff(weights(raw), weights(near)) < 1e-6  # d -> 0: the average is the last iterate
    assert max_diff(weights(raw), weights(ema)) > 1e-3
    opened = open_run(ema.run_dir)
    acc = accuracy(opened.model(), opened.population, device=torch.device("cpu"))
    assert acc == pytest.approx(ema.metrics["test_accuracy"])  # the EMA weights were evaluated
    record = ema.manifest.training["ema"]
    assert record["decay"] == 0.9 and "EMA" in record["weights"]
    assert "ema" not in raw.manifest.training and raw.manifest.training["precision"]["phases"] == {"private": "fp32"}


@pytest.mark.parametrize("stop", [3, 8])
def test_interrupted_run_with_options_resumes_exactly(tmp_path, stop):
    ref = train(tiny(tmp_path / "a", **OPTIONS))
    cfg = tiny(tmp_path / "b", **OPTIONS)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, stop_after=stop) if stop < 8 else _kill_before_manifest(cfg)
    res = train(cfg, resume=True)
    assert res.resumed_from == stop
    a, b = weights(ref), weights(res)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert res.manifest.training["augment"]["multiplicity"] == 2 and res.manifest.training["label_smoothing"] == 0.1


def _kill_before_manifest(cfg: TrainConfig) -> None:
    """Stop after the last step's state is saved but before the run is finalised (the phase-end resume path)."""
    import training.trainer as trainer

    original = trainer._finalize

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    trainer._finalize = boom
    try:
        train(cfg)
    finally:
        trainer._finalize = original


def test_secure_mode_augments_from_the_secret_seed(tmp_path):
    """Secure mode: no seed exists; the augmentation stream derives from the run's in-memory secret (as the other
    non-noise streams do): training completes with every option, nothing seeds it, two runs differ."""
    over = {"privacy.secure_mode": True, **OPTIONS}
    data = apply_overrides(TINY, {"output_dir": str(tmp_path / "a"), **over})
    data["training"].pop("seed", None)
    a = train(TrainConfig.model_validate(data))
    data["output_dir"] = str(tmp_path / "b")
    b = train(TrainConfig.model_validate(data))
    assert a.manifest.provenance.seed is None and a.manifest.training["augment"]["flip"] is True
    assert max_diff(weights(a), weights(b)) > 1e-3
