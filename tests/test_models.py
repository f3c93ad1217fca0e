"""Tests for training.models: every model runs, splits into features/head, and is exactly DP-trainable.

The central invariant (as in opacus/tests/grad_samples/common.py): the per-sample gradients Opacus computes
for EVERY trainable parameter equal an obviously correct batch-size-1 loop, in the ``hooks`` and
``functorch`` modes, and the per-sample gradient norms of ``ghost`` mode equal the loop's norms. That is
what makes every trainable parameter clippable and noisable.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import GradSampleModuleFastGradientClipping
from torch import nn

from training.config import ModelConfig
from training.errors import CheckpointError, ConfigError
from training.io import save_safetensors
from training.models import (
    MODELS,
    ModelRegistry,
    build_model,
    count_parameters,
    load_weights_file,
    patch_vit_tokens,
)
from training.models.opacus_compat import contiguous_conv_inputs, make_out_of_place
from training.models.vit_tokens import TokenEmbedding

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
RESNET20_WEIGHTS = SHARED / "weights" / "resnet20-cifar10-12fca82f.th"
CIFAR10_EXACT_TEST = SHARED / "data" / "cifar10_exact" / "test.npz"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

TINY_VIT = {"embed_dim": 16, "depth": 1, "num_heads": 2}
# name -> (arch, kwargs, input_shape); tiny sizes so each case takes well under a second
CASES = {
    "small_cnn": ("small_cnn", {}, (3, 8, 8)),
    "mlp": ("mlp", {"hidden": (16,)}, (3, 8, 8)),
    "resnet20_cifar": ("resnet20_cifar", {}, (3, 8, 8)),
    "import_path_resnet20": ("training.models.cifar_resnet:resnet20", {}, (3, 8, 8)),
    "timm_resnet": ("resnet18", {"layers": (1, 1, 1, 1), "channels": (8, 8, 16, 16)}, (3, 16, 16)),
    "timm_vit": ("vit_tiny_patch16_224", TINY_VIT, (3, 8, 8)),
    "timm_vit_reg_tokens": ("vit_tiny_patch16_224", {**TINY_VIT, "reg_tokens": 2, "no_embed_class": True},
                            (3, 8, 8)),
    "timm_convnext": ("convnext_atto", {"depths": (1, 1, 1, 1), "dims": (8, 8, 16, 16)}, (3, 32, 32)),
}
NUM_CLASSES = 5


def _build(case: str, **overrides):
    arch, kwargs, shape = CASES[case]
    cfg = ModelConfig(arch=arch, kwargs=kwargs, **overrides)
    return build_model(cfg, num_classes=NUM_CLASSES, input_shape=shape, seed=0, trust_code=True), shape


def _batch(shape, n=3, *, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g, dtype=dtype), torch.arange(n) % NUM_CLASSES


def _loop_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-example gradients of the summed cross-entropy, one example at a time (the reference)."""
    out: dict[str, list[torch.Tensor]] = {n: [] for n, p in model.named_parameters() if p.requires_grad}
    for i in range(len(x)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        for n, p in model.named_parameters():
            if p.requires_grad:
                out[n].append(p.grad.detach().clone())
    model.zero_grad(set_to_none=True)
    return {n: torch.stack(g) for n, g in out.items()}


def _opacus_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mode: str) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(model)
    gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=True,
                           force_functorch=mode == "functorch")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "full backward hook is firing ... no inputs require gradients"
            F.cross_entropy(gsm(x), y, reduction="sum").backward()
        return {n: p.grad_sample.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    finally:
        gsm._close()


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


# ---------------------------------------------------------------- DP: exact per-sample gradients


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
@pytest.mark.parametrize("case", list(CASES))
def test_opacus_per_sample_gradients_equal_batch_of_one_loop(case, mode):
    built, shape = _build(case)
    model = built.module.double()
    x, y = _batch(shape)
    expected = _loop_grads(model, x, y)
    got = _opacus_grads(model, x, y, mode)
    assert set(got) == set(expected)  # every trainable parameter has per-sample gradients
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-7, atol=1e-10, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("case", ["small_cnn", "resnet20_cifar", "timm_resnet", "timm_vit", "timm_convnext"])
def test_opacus_ghost_clipping_norms_equal_batch_of_one_loop(case):
    built, shape = _build(case)
    model = copy.deepcopy(built.module.double())
    x, y = _batch(shape)
    expected = _loop_grads(model, x, y)
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in expected.values()))
    gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum", max_grad_norm=1.0,
                                               use_ghost_clipping=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            F.cross_entropy(gsm(x), y, reduction="sum").backward()
        torch.testing.assert_close(gsm.get_norm_sample(), norms, rtol=1e-7, atol=1e-10)
    finally:
        gsm._close()


def test_vit_token_parameters_are_trainable_leaf_parameters():
    built, _ = _build("timm_vit")
    names = {n for n, p in built.module.named_parameters() if p.requires_grad}
    assert {"net.token_embed.cls_token", "net.token_embed.pos_embed"} <= names
    assert built.frozen == []
    for m in built.module.modules():  # Opacus-friendly: no module owns params *and* has param-owning children
        own = any(True for _ in m.parameters(recurse=False))
        assert not (own and any(True for c in m.children() for _ in c.parameters())), type(m).__name__


@pytest.mark.parametrize("kwargs", [
    {},
    {"reg_tokens": 2, "no_embed_class": True},
    {"class_token": False, "global_pool": "avg"},
    {"dynamic_img_size": True},
])
def test_vit_patch_is_numerically_identical_to_timm(kwargs):
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", num_classes=4, img_size=8, patch_size=2, **TINY_VIT, **kwargs)
    patched = copy.deepcopy(ref)
    assert patch_vit_tokens(patched)
    assert isinstance(patched.token_embed, TokenEmbedding)
    x = torch.randn(3, 3, 8, 8)
    ref.eval(), patched.eval()
    with torch.no_grad():
        assert torch.equal(ref(x), patched(x))


def test_built_vit_equals_unpatched_timm_with_same_weights():
    built, _ = _build("timm_vit")
    ref = timm.create_model("vit_tiny_patch16_224", num_classes=NUM_CLASSES, img_size=8, patch_size=2, **TINY_VIT)
    state = {k.removeprefix("net.").replace("token_embed.", ""): v for k, v in built.module.state_dict().items()}
    ref.load_state_dict(state, strict=True)
    x, _ = _batch((3, 8, 8), dtype=torch.float32)
    built.module.eval(), ref.eval()
    with torch.no_grad():
        assert torch.equal(built.module(x), ref(x))


ROPE_VIT = ("vit_small_patch16_rope_224", {**TINY_VIT, "img_size": 8, "patch_size": 2})


def test_parameters_opacus_would_get_wrong_are_frozen_and_the_rest_is_exact():
    """timm's rotary ViT: its root-level cls_token and its blocks' gamma (forward(x, rope=...)) are frozen."""
    arch, kwargs = ROPE_VIT
    built = build_model(ModelConfig(arch=arch, kwargs=kwargs), num_classes=NUM_CLASSES, input_shape=(3, 8, 8),
                        seed=0)
    assert built.frozen == ["net.cls_token", "net.blocks.0.gamma_1", "net.blocks.0.gamma_2"]
    assert sum("frozen:" in n for n in built.notes) == 2
    model = built.module.double()
    x, y = _batch((3, 8, 8))
    expected = _loop_grads(model, x, y)
    got = _opacus_grads(model, x, y, "hooks")
    assert set(got) == set(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-7, atol=1e-10)
    # Without the freeze, Opacus's functorch re-run of EvaBlock drops the rope input: silently wrong.
    model.net.blocks[0].gamma_1.requires_grad_(True)
    wrong = _opacus_grads(model, x, y, "hooks")["net.blocks.0.gamma_1"]
    right = _loop_grads(model, x, y)["net.blocks.0.gamma_1"]
    assert ((wrong - right).norm() / right.norm()).item() > 1e-6  # float64 round-off is ~1e-14


def test_block_parameters_next_to_drop_path_are_frozen():
    arch, kwargs, shape = CASES["timm_convnext"]
    built = build_model(ModelConfig(arch=arch, kwargs={**kwargs, "drop_path_rate": 0.1}), num_classes=3,
                        input_shape=shape, seed=0)
    assert built.frozen == [f"net.stages.{i}.blocks.0.gamma" for i in (1, 2, 3)]  # stage 0 has drop rate 0
    assert all("drop-path" in n for n in built.notes if "frozen:" in n)


def test_opacus_conv_grad_sampler_needs_contiguous_inputs():
    """Opacus's conv grad sampler is wrong on channels-last inputs; our pre-hook makes it exact."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 6, 6, dtype=torch.float64).to(memory_format=torch.channels_last)
    y = torch.tensor([0, 1, 0])

    def make():
        torch.manual_seed(1)
        return nn.Sequential(nn.Conv2d(4, 6, 2, stride=2), nn.Flatten(), nn.Linear(54, 2)).double()

    plain, guarded = make(), make()
    assert contiguous_conv_inputs(guarded)
    expected = _loop_grads(plain, x, y)["0.weight"]
    wrong = _opacus_grads(plain, x, y, "hooks")["0.weight"]
    right = _opacus_grads(guarded, x, y, "hooks")["0.weight"]
    assert not torch.allclose(wrong, expected)  # the upstream behaviour this guard exists for
    torch.testing.assert_close(right, expected, rtol=1e-9, atol=1e-12)


def test_make_out_of_place_keeps_timm_resnet_function_and_names():
    torch.manual_seed(0)
    net = timm.create_model("resnet18", num_classes=3, layers=(1, 1, 1, 1), channels=(8, 8, 16, 16)).eval()
    names = [n for n, _ in net.named_parameters()]
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        before = net(x)
    notes = make_out_of_place(net)
    assert notes and "rewritten without in-place ops" in notes[0]
    with torch.no_grad():
        assert torch.equal(before, net(x))
    assert [n for n, _ in net.named_parameters()] == names


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
                    reason=f"shared weights/data not found under {SHARED}")
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


@pytest.mark.skipif(not RESNET20_WEIGHTS.is_file(), reason=f"shared weights not found under {SHARED}")
def test_real_resnet20_batchnorm_weights_carry_over_to_groupnorm():
    built = build_model(ModelConfig(arch="resnet20_cifar", pretrained=str(RESNET20_WEIGHTS)), num_classes=10,
                        input_shape=(3, 32, 32))
    state = load_weights_file(RESNET20_WEIGHTS)
    gn = built.module.net.layer2[1].bn1
    assert isinstance(gn, nn.GroupNorm) and torch.equal(gn.weight, state["layer2.1.bn1.weight"])
    assert any("carried over to GroupNorm" in n for n in built.notes)
