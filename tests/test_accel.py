"""The GPU path on the CPU (training.accel, training.device): every code path runs with ``device: cpu``.

* No device is chosen outside training/device.py: no ``.cuda(``, no ``torch.cuda.`` call and no hard-coded
  ``"cuda"`` string anywhere else in the package code (config ``Literal`` choices excepted).
* Resident batches equal the host path's; channels-last and bf16 autocast train on the CPU; DP phases run in strict
  fp32 whatever ``training.precision`` says (the weights are bit-identical to an fp32 run), and the manifest says
  what ran; ``training.compile`` falls back to eager with a warning when compiling fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from training.accel import Accel, ResidentImages
from training.config import TrainConfig, apply_overrides
from training.data import to_float_tensor
from foundation.io import load_safetensors
from training.trainer import train

from fixtures_runs import TINY_TRAIN as TINY

ROOT = Path(__file__).resolve().parents[1]
CUDA_PATTERNS = (re.compile(r"\.cuda\("), re.compile(r"torch\.cuda\."), re.compile(r"""["']cuda(:\d+)?["']"""))


def test_no_device_choice_outside_the_resolver():
    offenders = []
    for folder in ("foundation", "training", "attacks", "audit", "experiments", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "training" / "device.py":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0]
                if "Literal[" in code:  # a config's allowed values, resolved by training.device
                    continue
                if any(p.search(code) for p in CUDA_PATTERNS):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "device choices outside training/device.py:\n" + "\n".join(offenders)


def test_the_grep_catches_what_it_should():
    for bad in ('x = x.cuda()', 'torch.cuda.synchronize()', 'dev = "cuda"', "torch.device('cuda:0')"):
        assert any(p.search(bad) for p in CUDA_PATTERNS), bad
    assert not any(p.search('device.type == _CUDA') for p in CUDA_PATTERNS)


def test_resident_batches_equal_the_host_conversion():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (20, 5, 5, 3), dtype=np.uint8)
    y = rng.integers(0, 10, 20)
    x.setflags(write=False)  # pools are read-only arrays
    images = ResidentImages(x, y, device=torch.device("cpu"))
    idx = np.array([3, 3, 19, 0])
    xb, yb = images.batch(idx)
    assert images.resident and torch.equal(xb, to_float_tensor(x[idx])) and yb.tolist() == y[idx].tolist()
    assert images.x.data_ptr() == x.__array_interface__["data"][0]  # on the CPU the pool is shared, not copied


def tiny(tmp_path: Path, **over) -> TrainConfig:
    base = {"output_dir": str(tmp_path), "model.arch": "small_cnn", "training.steps": 4}
    return TrainConfig.model_validate(apply_overrides(TINY, {**base, **over}))


def test_dp_phases_run_in_fp32_whatever_the_precision_setting(tmp_path):
    fp32 = train(tiny(tmp_path / "a"))
    bf16 = train(tiny(tmp_path / "b", **{"training.precision": "bf16"}))
    a, b = load_safetensors(fp32.run_dir / "model.safetensors"), load_safetensors(bf16.run_dir / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rec = bf16.manifest.training["precision"]
    assert rec["setting"] == "bf16" and rec["phases"] == {"private": "fp32"} and rec["evaluation"] == "bf16"


def test_channels_last_and_bf16_train_on_the_cpu(tmp_path):
    over = {"privacy.enabled": False, "privacy.noise_multiplier": None, "training.augment.flip": True}
    ref = train(tiny(tmp_path / "a", **over))
    fast = train(tiny(tmp_path / "b", **over, **{"training.channels_last": True, "training.precision": "bf16"}))
    rec = fast.manifest.training["precision"]
    assert rec["phases"] == {"non-private": "bf16"} and fast.manifest.training["channels_last"] is True
    a, b = load_safetensors(ref.run_dir / "model.safetensors"), load_safetensors(fast.run_dir / "model.safetensors")
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert 0 < diff < 0.05  # bf16 moved the numbers a little, not the training


def test_channels_last_dp_step_equals_contiguous(tmp_path):
    a = train(tiny(tmp_path / "a"))
    b = train(tiny(tmp_path / "b", **{"training.channels_last": True}))
    wa, wb = load_safetensors(a.run_dir / "model.safetensors"), load_safetensors(b.run_dir / "model.safetensors")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5


@pytest.mark.parametrize("where", ["build", "call"])
def test_compile_failure_falls_back_to_eager_with_a_warning(tmp_path, monkeypatch, where):
    over = {"privacy.enabled": False, "privacy.noise_multiplier": None}
    ref = train(tiny(tmp_path / "a", **over))

    def broken_compile(model, *args, **kwargs):
        if where == "build":
            raise RuntimeError("no compiler here")

        def fail(*a, **k):
            raise RuntimeError("inductor failed")

        return fail

    monkeypatch.setattr(torch, "compile", broken_compile)
    seen: list[str] = []
    res = train(tiny(tmp_path / "b", **over, **{"training.compile": True}), warn=seen.append)
    assert any("training.compile" in w and "eagerly" in w for w in seen), seen
    a, b = load_safetensors(ref.run_dir / "model.safetensors"), load_safetensors(res.run_dir / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_compiled_module_is_used_when_compiling_works(monkeypatch):
    calls = []

    def fake_compile(model, *args, **kwargs):
        def run(*a, **k):
            calls.append(1)
            return model(*a, **k)
        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = torch.nn.Linear(3, 2)
    wrapped = Accel(compile=True).compiled(model)
    x = torch.rand(4, 3)
    assert torch.equal(wrapped(x), model(x)) and calls == [1]
    assert Accel().compiled(model) is model


def test_what_runs_for_each_setting_phase_and_device():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")  # a device name only: nothing runs on it here
    for setting in ("fp32", "tf32", "bf16"):
        assert Accel(precision=setting).ran(dp=True, device=gpu) == "fp32"  # DP: strict fp32 always
    assert Accel(precision="tf32").ran(dp=False, device=gpu) == "tf32"
    assert Accel(precision="tf32").ran(dp=False, device=cpu) == "fp32"  # TF32 is a CUDA feature
    assert Accel(precision="bf16").ran(dp=False, device=cpu) == "bf16"
    with pytest.raises(ValueError, match="precision"):
        Accel(precision="fp16")


def test_bf16_autocast_on_the_cpu_and_strict_fp32_for_dp():
    lin = torch.nn.Linear(4, 3)
    x = torch.rand(2, 4)
    with Accel(precision="bf16").compute(dp=False, device=torch.device("cpu")) as ran:
        assert ran == "bf16" and lin(x).dtype == torch.bfloat16
    with Accel(precision="bf16").compute(dp=True, device=torch.device("cpu")) as ran:
        assert ran == "fp32" and lin(x).dtype == torch.float32
