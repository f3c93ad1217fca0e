"""Tests for training.models, part 1: the registry and its errors, every model runs and splits into
features/head, BatchNorm replacement, freezing, normalisation and import paths.

Part 2 (tests/test_models_dp.py): every model is exactly DP-trainable (per-sample gradients equal a
batch-size-1 loop). Part 3 (tests/test_models_weights.py): weights files and the real CIFAR ResNet-20.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from models_common import (
    CASES,
    IMAGENET_MEAN,
    IMAGENET_STD,
    NUM_CLASSES,
    TINY_VIT,
    _batch,
    _build,
    _loop_grads,
    _opacus_grads,
)
from torch import nn

from training.config import ModelConfig
from foundation.errors import ConfigError
from training.models import (
    MODELS,
    ModelRegistry,
    build_model,
    count_parameters,
)

# ---------------------------------------------------------------- registry and errors


def test_registry_rejects_duplicates_and_unknown_names():
    reg = ModelRegistry()
    reg.register("a", lambda **kw: nn.Linear(1, 1))
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", lambda **kw: nn.Linear(1, 1))
    with pytest.raises(ValueError, match="unknown model name 'b'"):
        reg.get("b")
    with pytest.raises(ValueError, match="no ':'"):
        reg.register("pkg.mod:f", lambda **kw: None)
    assert {"small_cnn", "mlp", "resnet20_cifar"} <= set(MODELS.names())


def test_unknown_arch_is_config_error_listing_alternatives():
    with pytest.raises(ConfigError) as exc:
        build_model(ModelConfig(arch="no_such_net_xyz"), num_classes=2, input_shape=(3, 8, 8))
    msg = str(exc.value)
    assert "small_cnn" in msg and "resnet20_cifar" in msg and "timm" in msg and "package.module:factory" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("cfg,match", [
    (ModelConfig(arch="small_cnn", kwargs={"widht": 3}), "not accepted by 'small_cnn'"),
    (ModelConfig(arch="small_cnn", kwargs={"act": "swish9"}), "act must be one of"),
    (ModelConfig(arch="resnet18", kwargs={"pretrained": True}), "never downloads"),
    (ModelConfig(arch="small_cnn", normalize_mean=(0.5, 0.5, 0.5)), "normalize_mean and model.normalize_std"),
    (ModelConfig(arch="small_cnn", normalize_mean=(0.5,) * 3, normalize_std=(0.1, 0.0, 0.1)), "> 0"),
    (ModelConfig(arch="small_cnn", freeze=("net.nothing.*",)), "matches no parameter"),
    (ModelConfig(arch="torch.nn:Flatten"), "end in an nn.Linear"),
    (ModelConfig(arch="no_such_pkg_xyz.mod:f"), "cannot import"),
    (ModelConfig(arch="vit_tiny_patch16_224", kwargs={**TINY_VIT, "img_size": 16}), "cannot run on input"),
    (ModelConfig(arch="deit_tiny_distilled_patch16_224", kwargs=TINY_VIT), "several classifier heads"),
    (ModelConfig(arch="small_cnn", kwargs={"channels": 5}), "invalid"),
])
def test_bad_configs_raise_one_line_config_errors(cfg, match):
    with pytest.raises(ConfigError, match=match) as exc:
        build_model(cfg, num_classes=3, input_shape=(3, 8, 8), trust_code=True)  # the test's own configs
    assert "\n" not in str(exc.value)


def test_input_shape_must_be_chw():
    with pytest.raises(ValueError, match="input_shape"):
        build_model(ModelConfig(arch="small_cnn"), num_classes=3, input_shape=(32, 32, 3))


# ---------------------------------------------------------------- every model: forward, backward, split


@pytest.mark.parametrize("case", list(CASES))
def test_forward_backward_every_parameter_gets_a_finite_gradient(case):
    built, shape = _build(case)
    model = built.module.float()
    x, y = _batch(shape, dtype=torch.float32)
    logits = model(x)
    assert logits.shape == (3, NUM_CLASSES) and torch.isfinite(logits).all()
    F.cross_entropy(logits, y).backward()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    assert trainable
    for n, p in trainable:
        assert p.grad is not None, f"{n} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{n} has a non-finite gradient"
    assert sum(float(p.grad.abs().sum()) for _, p in trainable) > 0
    assert all(n.startswith("net.") for n, _ in model.named_parameters())


@pytest.mark.parametrize("case", list(CASES))
def test_features_and_head_compose_to_forward(case):
    built, shape = _build(case)
    model = built.module.double()
    x, _ = _batch(shape)
    feats = model.forward_features(x)
    assert feats.ndim == 2 and feats.shape[0] == 3
    assert model.head.in_features == feats.shape[1]
    torch.testing.assert_close(model.forward_head(feats), model(x), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", list(CASES))
def test_reset_classifier_changes_outputs_and_head(case):
    built, shape = _build(case)
    model = built.module
    model.reset_classifier(7)
    x, _ = _batch(shape, dtype=torch.float32)
    assert model(x).shape == (3, 7)
    assert isinstance(model.head, nn.Linear) and model.head.out_features == 7 and model.num_classes == 7
    assert model.net.get_submodule(model.head_prefix()) is model.head


@pytest.mark.parametrize("case", list(CASES))
def test_feature_blocks_are_ordered_submodules_that_run(case):
    built, shape = _build(case)
    model = built.module
    blocks = model.feature_blocks()
    assert len(blocks) >= 1
    owned = {id(m) for m in model.modules()}
    assert all(id(b) in owned for b in blocks)
    seen: list[int] = []
    handles = [b.register_forward_hook(lambda m, i, o, k=k: seen.append(k)) for k, b in enumerate(blocks)]
    model(_batch(shape, dtype=torch.float32)[0])
    for h in handles:
        h.remove()
    assert seen == sorted(seen) and set(seen) == set(range(len(blocks)))


def test_feature_blocks_are_stages_and_vit_blocks():
    resnet = _build("timm_resnet")[0].module
    assert resnet.feature_blocks() == [resnet.net.layer1, resnet.net.layer2, resnet.net.layer3, resnet.net.layer4]
    vit = _build("timm_vit")[0].module
    assert vit.feature_blocks() == list(vit.net.blocks)
    r20 = _build("resnet20_cifar")[0].module
    assert r20.feature_blocks() == [r20.net.layer1, r20.net.layer2, r20.net.layer3]


# ---------------------------------------------------------------- BatchNorm, freezing, normalisation


def test_batchnorm_is_replaced_and_noted():
    built, _ = _build("resnet20_cifar")
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in built.module.modules())
    assert "BatchNorm2d(16) -> GroupNorm(16, 16) at net.bn1 (DP-incompatible batch statistics)" in built.notes
    assert sum("-> GroupNorm" in n for n in built.notes) == 19  # 1 stem + 3 stages x 3 blocks x 2
    kept, _ = _build("resnet20_cifar", fix_batchnorm=False)
    assert any(isinstance(m, nn.BatchNorm2d) for m in kept.module.modules())
    assert any("BatchNorm" in n and "fix_batchnorm" in n for n in kept.notes)


def test_freeze_globs_freeze_and_list_parameters():
    built, shape = _build("resnet20_cifar", freeze=("net.conv1.*", "net.layer1.*"))
    model = built.module
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen == built.frozen and "net.conv1.weight" in frozen and "net.layer1.0.bn1.bias" in frozen
    assert all(n.startswith(("net.conv1.", "net.layer1.")) for n in frozen)
    total, trainable = count_parameters(model)
    assert trainable == total - sum(p.numel() for p in model.parameters() if not p.requires_grad) < total
    x, y = _batch(shape, dtype=torch.float32)
    F.cross_entropy(model(x), y).backward()
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    got = _opacus_grads(model.double(), x.double(), y, "hooks")
    assert set(got) == {n for n, p in model.named_parameters() if p.requires_grad}


def test_normalisation_is_inside_the_model_and_not_in_the_state_dict():
    built = build_model(ModelConfig(arch="small_cnn", normalize_mean=IMAGENET_MEAN, normalize_std=IMAGENET_STD),
                        num_classes=3, input_shape=(3, 8, 8), seed=0)
    model = built.module
    assert all(k.startswith("net.") for k in model.state_dict())
    x = torch.rand(2, 3, 8, 8)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(model(x), model.net((x - mean) / std))
    assert count_parameters(model) == count_parameters(model.net)


def test_seed_makes_builds_reproducible_and_leaves_global_rng_alone():
    state = torch.get_rng_state()
    a = build_model(ModelConfig(arch="resnet18", kwargs=CASES["timm_resnet"][1]), num_classes=3,
                    input_shape=(3, 16, 16), seed=7).module.state_dict()
    b = build_model(ModelConfig(arch="resnet18", kwargs=CASES["timm_resnet"][1]), num_classes=3,
                    input_shape=(3, 16, 16), seed=7).module.state_dict()
    c = build_model(ModelConfig(arch="resnet18", kwargs=CASES["timm_resnet"][1]), num_classes=3,
                    input_shape=(3, 16, 16), seed=8).module.state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_count_parameters_counts_shared_parameters_once():
    lin = nn.Linear(4, 3)
    shared = nn.Sequential(lin, nn.ReLU(), lin.__class__(3, 3))
    shared[2].weight = nn.Parameter(torch.zeros(3, 3), requires_grad=False)
    assert count_parameters(shared) == (15 + 12, 15 + 3)
    tied = nn.ModuleList([lin, lin])
    assert count_parameters(tied) == (15, 15)


# ---------------------------------------------------------------- import paths and small-image defaults


def test_import_path_factory_matches_registry_names():
    via_path, _ = _build("import_path_resnet20")
    via_registry, _ = _build("resnet20_cifar")
    assert [n for n, _ in via_path.module.named_parameters()] == \
        [n for n, _ in via_registry.module.named_parameters()]
    assert via_path.module.head is via_path.module.net.linear


def test_import_path_without_timm_protocol_uses_its_final_linear():
    pytest.importorskip("torchvision")
    built = build_model(ModelConfig(arch="torchvision.models:resnet18"), num_classes=3, input_shape=(3, 16, 16),
                        seed=0, trust_code=True)
    model = built.module
    assert model.head_name == "fc" and model.head is model.net.fc
    x = torch.rand(2, 3, 16, 16)
    model.eval()
    torch.testing.assert_close(model.forward_head(model.forward_features(x)), model(x))
    assert [type(b).__name__ for b in model.feature_blocks()][-4:] == ["Sequential"] * 4
    assert any("BasicBlock) rewritten without in-place ops" in n for n in built.notes)  # torchvision's out += identity
    model.train().double()
    xb, yb = _batch((3, 16, 16), n=2)
    expected, got = _loop_grads(model, xb, yb), _opacus_grads(model, xb, yb, "hooks")
    assert set(got) == set(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-7, atol=1e-10)
    model.reset_classifier(6)
    assert model(xb).shape == (2, 6)


def test_cifar_defaults_are_applied_and_noted():
    r, _ = _build("timm_resnet")
    assert r.module.net.conv1.kernel_size == (3, 3) and r.module.net.conv1.stride == (1, 1)
    assert isinstance(r.module.net.maxpool, nn.Identity)
    assert any("cifar_stem" in n for n in r.notes)
    v, _ = _build("timm_vit")
    assert v.module.net.patch_embed.patch_size == (2, 2) and any("patch_size=2" in n for n in v.notes)
    big = build_model(ModelConfig(arch="vit_tiny_patch16_224", kwargs=TINY_VIT), num_classes=3,
                      input_shape=(3, 32, 32), seed=0)
    assert big.module.net.patch_embed.patch_size == (4, 4)
    off = build_model(ModelConfig(arch="resnet18", kwargs=CASES["timm_resnet"][1], cifar_stem=False),
                      num_classes=3, input_shape=(3, 32, 32), seed=0)
    assert off.module.net.conv1.kernel_size == (7, 7) and not any("cifar_stem" in n for n in off.notes)
