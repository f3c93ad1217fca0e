"""Secure mode (privacy.secure_mode): a seed is refused, noise comes from the OS CSPRNG, the manifest says so,
and resuming draws fresh randomness (documented in training.loop) without storing any secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from training.run import STATE_FILE
from training.config import TrainConfig, dump_config, validate_config
from foundation.errors import ConfigError
from foundation.io import load_safetensors
from training.trainer import SECURE_MODE_NOTE, train

TINY = {
    "name": "secure",
    "data": {"dataset": "digits", "pool_size": 200, "test_size": 50},
    "model": {"arch": "mlp"},
    "privacy": {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-4, "secure_mode": True},
    "optim": {"name": "sgd", "lr": 0.5},
    "training": {"steps": 6, "batch_size": 32, "physical_batch_size": 32, "checkpoint_every": 2,
                 "progress": False, "log_every": 2},
}


def cfg(tmp_path: Path, name: str = "secure", **privacy) -> TrainConfig:
    data = json.loads(json.dumps(TINY))
    data.update(output_dir=str(tmp_path), name=name)
    data["privacy"].update(privacy)
    return validate_config(data)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_safetensors(run_dir / "model.safetensors")


def test_a_seed_is_refused_in_secure_mode_with_one_line():
    data = json.loads(json.dumps(TINY))
    data["training"]["seed"] = 3
    with pytest.raises(ConfigError, match=r"privacy.secure_mode: a seed is prohibited in secure mode") as err:
        validate_config(data)
    assert "\n" not in str(err.value)
    data["privacy"]["secure_mode"] = False
    assert validate_config(data).training.seed == 3
    data["training"]["seed"] = None
    with pytest.raises(ConfigError, match="only secure mode allows"):
        validate_config(data)


def test_the_resolved_secure_config_records_no_seed_and_reloads():
    c = validate_config(json.loads(json.dumps(TINY)))
    assert c.training.seed is None
    again = validate_config(yaml.safe_load(dump_config(c)))
    assert again == c and again.training.seed is None


def test_two_secure_runs_with_the_same_config_differ_and_say_so(tmp_path):
    a = train(cfg(tmp_path / "a"))
    b = train(cfg(tmp_path / "b"))
    wa, wb = weights(a.run_dir), weights(b.run_dir)
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)
    for res in (a, b):
        m = res.manifest
        assert m.provenance.seed is None
        assert any(n.startswith(SECURE_MODE_NOTE) for n in m.privacy.notes)
        assert yaml.safe_load((res.run_dir / "config.yaml").read_text())["training"]["seed"] is None
    # the control: the same config without secure mode is reproducible, so the test above can fail
    c = train(cfg(tmp_path / "c", secure_mode=False))
    d = train(cfg(tmp_path / "d", secure_mode=False))
    wc, wd = weights(c.run_dir), weights(d.run_dir)
    assert all(torch.equal(wc[k], wd[k]) for k in wc)
    assert not any(n.startswith(SECURE_MODE_NOTE) for n in c.manifest.privacy.notes)


def test_secure_resume_stores_no_secret_draws_fresh_noise_and_counts_every_step(tmp_path):
    config = cfg(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        train(config, stop_after=3)
    state = torch.load(config.run_dir() / STATE_FILE, map_location="cpu", weights_only=True)
    assert state["stepper"]["generator"] is None  # no generator state (it would reveal the noise)
    flat = json.dumps({k: v for k, v in state.items() if k not in ("stepper", "model")}, default=str)
    assert "seed" not in flat
    res = train(config, resume=True)
    assert res.resumed_from == 3
    m = res.manifest
    assert m.privacy.phases[0].steps == 6
    assert any("resumed at step 3" in n for n in m.privacy.notes)
    full = train(cfg(tmp_path, name="uninterrupted"))
    assert m.privacy.epsilon == pytest.approx(full.manifest.privacy.epsilon)  # the accountant counts all 6 steps
    assert any(not torch.equal(a, b) for a, b in zip(weights(res.run_dir).values(),
                                                     weights(full.run_dir).values()))
