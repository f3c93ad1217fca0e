"""Tests for training.models, part 3: weights files (refused, unwrapped, loaded into a built model) and the
real external CIFAR ResNet-20 checkpoint. Part 1: tests/test_models.py."""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch
from models_common import (
    CIFAR10_EXACT_TEST,
    IMAGENET_MEAN,
    IMAGENET_STD,
    NUM_CLASSES,
    RESNET20_WEIGHTS,
    SHARED,
    TINY_VIT,
    _build,
)
from torch import nn

from training.config import ModelConfig
from foundation.errors import CheckpointError
from foundation.shared_root import missing_reason
from foundation.io import save_safetensors
from training.models import (
    build_model,
    count_parameters,
    load_weights_file,
)

# ---------------------------------------------------------------- weights files


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_load_weights_file_refuses_missing_corrupt_and_unsafe_files(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_weights_file(tmp_path / "missing.pt")
    for name in ("bad.pt", "bad.th", "bad.safetensors"):
        (tmp_path / name).write_bytes(b"\x80\x04 this is not a checkpoint")
        with pytest.raises(CheckpointError, match="corrupt"):
            load_weights_file(tmp_path / name)
    (tmp_path / "w.npz").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="unsupported suffix"):
        load_weights_file(tmp_path / "w.npz")
    torch.save({"weight": torch.ones(1), "cfg": _Unsafe()}, tmp_path / "unsafe.pt")
    with pytest.raises(CheckpointError, match="never unpickles"):
        load_weights_file(tmp_path / "unsafe.pt")
    torch.save({"weight": torch.ones(1), "step": 3}, tmp_path / "mixed.pt")
    with pytest.raises(CheckpointError, match="non-tensor"):
        load_weights_file(tmp_path / "mixed.pt")


class _Unsafe:
    """An arbitrary object: weights_only=True must refuse to unpickle it."""


def test_load_weights_file_unwraps_and_strips_prefixes(tmp_path):
    t = torch.arange(3.0)
    torch.save({"model": {"module.a.weight": t}}, tmp_path / "m.pth")
    assert list(load_weights_file(tmp_path / "m.pth")) == ["a.weight"]
    save_safetensors(tmp_path / "m.safetensors", {"a.weight": t})
    assert torch.equal(load_weights_file(tmp_path / "m.safetensors")["a.weight"], t)


def test_pretrained_round_trip_head_mismatch_and_key_mismatch(tmp_path):
    built, shape = _build("small_cnn")
    save_safetensors(tmp_path / "model.safetensors", built.module.state_dict())  # our own net.-prefixed file
    again = build_model(ModelConfig(arch="small_cnn", pretrained=str(tmp_path / "model.safetensors")),
                        num_classes=NUM_CLASSES, input_shape=shape, seed=123)
    for k, v in built.module.state_dict().items():
        assert torch.equal(v, again.module.state_dict()[k])
    other = build_model(ModelConfig(arch="small_cnn", pretrained=str(tmp_path / "model.safetensors")),
                        num_classes=2, input_shape=shape, seed=0)
    assert any("classifier head not loaded" in n for n in other.notes)
    assert torch.equal(other.module.net.blocks[0][0].weight, built.module.net.blocks[0][0].weight)
    with pytest.raises(CheckpointError, match=r"missing key\(s\).*unexpected key\(s\)") as exc:
        build_model(ModelConfig(arch="mlp", pretrained=str(tmp_path / "model.safetensors")),
                    num_classes=NUM_CLASSES, input_shape=shape)
    assert "\n" not in str(exc.value)


def test_timm_named_vit_weights_load_before_the_token_patch(tmp_path):
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", num_classes=3, img_size=8, patch_size=2, **TINY_VIT)
    torch.save(ref.state_dict(), tmp_path / "vit.pth")
    built = build_model(ModelConfig(arch="vit_tiny_patch16_224", kwargs=TINY_VIT, pretrained=str(tmp_path / "vit.pth")),
                        num_classes=3, input_shape=(3, 8, 8), seed=5)
    assert torch.equal(built.module.net.token_embed.cls_token, ref.cls_token)
    x = torch.rand(2, 3, 8, 8)
    built.module.eval(), ref.eval()
    with torch.no_grad():
        assert torch.equal(built.module(x), ref(x))


# ---------------------------------------------------------------- the real external ResNet-20


@pytest.mark.skipif(not RESNET20_WEIGHTS.is_file() or not CIFAR10_EXACT_TEST.is_file(),
                    reason=missing_reason("weights/resnet20-cifar10-12fca82f.th and data/cifar10_exact"))
def test_real_resnet20_checkpoint_loads_strictly_and_is_accurate():
    state = load_weights_file(RESNET20_WEIGHTS)
    assert len(state) == 97 and not any(k.startswith("module.") for k in state)
    cfg = ModelConfig(arch="resnet20_cifar", pretrained=str(RESNET20_WEIGHTS), fix_batchnorm=False,
                      normalize_mean=IMAGENET_MEAN, normalize_std=IMAGENET_STD)
    built = build_model(cfg, num_classes=10, input_shape=(3, 32, 32))
    model = built.module.eval()
    result = model.net.load_state_dict(state, strict=True)  # the file's keys are exactly the network's
    assert not result.missing_keys and not result.unexpected_keys
    data = np.load(CIFAR10_EXACT_TEST)
    x = torch.from_numpy(data["x"][:256]).permute(0, 3, 1, 2).float() / 255.0
    y = torch.from_numpy(data["y"][:256])
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    assert acc > 0.85, acc
    assert count_parameters(model) == (269722, 269722)


@pytest.mark.skipif(not RESNET20_WEIGHTS.is_file(), reason=missing_reason("weights/resnet20-cifar10-12fca82f.th"))
def test_real_resnet20_batchnorm_weights_carry_over_to_groupnorm():
    built = build_model(ModelConfig(arch="resnet20_cifar", pretrained=str(RESNET20_WEIGHTS)), num_classes=10,
                        input_shape=(3, 32, 32))
    state = load_weights_file(RESNET20_WEIGHTS)
    gn = built.module.net.layer2[1].bn1
    assert isinstance(gn, nn.GroupNorm) and torch.equal(gn.weight, state["layer2.1.bn1.weight"])
    assert any("carried over to GroupNorm" in n for n in built.notes)
