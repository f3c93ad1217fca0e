"""Tests for training.models, part 2: every model is exactly DP-trainable.

The central invariant (as in opacus/tests/grad_samples/common.py): the per-sample gradients Opacus computes
for EVERY trainable parameter equal an obviously correct batch-size-1 loop, in the ``hooks`` and
``functorch`` modes, and the per-sample gradient norms of ``ghost`` mode equal the loop's norms; the ViT token
patch and the parameters frozen for Opacus keep that true. Part 1: tests/test_models.py; weights files:
tests/test_models_weights.py.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import timm
import torch
import torch.nn.functional as F
from models_common import (
    CASES,
    NUM_CLASSES,
    TINY_VIT,
    _batch,
    _build,
    _loop_grads,
    _opacus_grads,
)
from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import GradSampleModuleFastGradientClipping
from torch import nn

from training.config import ModelConfig
from training.models import (
    build_model,
    patch_vit_tokens,
)
from training.models.opacus_compat import contiguous_conv_inputs, make_out_of_place
from training.models.vit_tokens import TokenEmbedding

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
