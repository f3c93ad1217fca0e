"""Book-keeping clipping (``grad_sample_mode: bk``) against Opacus's hooks mode and batch-size-1 loops.

Every comparison is per parameter, max abs difference ≤ 1e-5: the clipped summed gradient of one step (plain SGD
with lr = 1 and B = 1, so θ0 − θ1 is that sum) and the weights after a few steps, noise off (and one run with
noise on: bk draws the same noise as hooks from the same generator).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from training.config import AugmentConfig, ModelConfig, OptimConfig
from training.dp import bk_layers as L
from training.dp.bk import BKModule
from training.dp.engine import cross_entropy_per_example, make_stepper
from training.dp.recipe import TrainRecipe
from foundation.errors import ConfigError
from training.models import build_model

TOL = 1e-5


class Mixed(nn.Module):
    """Conv2d (plain and grouped), GroupNorm, Embedding, LayerNorm, Linear on a sequence and flat, and PReLU
    (no bk rule and no Opacus grad sampler: the torch.func fallback)."""

    def __init__(self, seed: int = 0, padding_mode: str = "zeros", padding_idx: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.gn = nn.GroupNorm(2, 6)
        self.act = nn.PReLU(6)
        self.conv2 = nn.Conv2d(6, 6, 3, stride=2, groups=3, bias=False, padding=1, padding_mode=padding_mode)
        self.emb = nn.Embedding(5, 8, padding_idx=padding_idx)
        self.ln = nn.LayerNorm(8)
        self.seq = nn.Linear(8, 8)
        self.head = nn.Linear(6 * 4 * 4 + 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv2(self.act(self.gn(self.conv(x))))                   # (n, 6, 4, 4)
        tokens = (x[:, 0, :2, :2].reshape(len(x), 4) * 5).long().clamp(0, 4)  # 4 tokens per example
        s = torch.tanh(self.seq(self.ln(self.emb(tokens) + h.mean((2, 3)).repeat(1, 2)[:, None, :8])))
        return self.head(torch.cat([h.flatten(1), s.mean(1)], dim=1))


class Shared(nn.Module):
    """One Linear applied twice (weight sharing by module reuse)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(12, 6)
        self.mid = nn.Linear(6, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)[:, :12]
        return self.out(torch.tanh(self.mid(torch.tanh(self.mid(torch.tanh(self.inp(x)))))))


def batch(n: int, shape=(3, 8, 8), seed: int = 1, classes: int = 5):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g)


def stepper(model, *, mode, clipping="flat", C=0.05, sigma=0.0, B=1, physical=4, seed=0, augment=None):
    recipe = TrainRecipe(steps=100, batch_size=B, optim=OptimConfig(name="sgd", lr=1.0), noise_multiplier=sigma,
                         max_grad_norm=C, clipping=clipping, grad_sample_mode=mode, physical_batch_size=physical,
                         augment=augment or AugmentConfig())
    return make_stepper(model=model, recipe=recipe, sample_rate=0.1, generator=torch.Generator().manual_seed(seed),
                        device="cpu")


def trainable(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b))
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def run_both(make, x, y, *, steps=1, **kw):
    """(clipped sum of the first step, weights after ``steps`` steps, first step's stats) for hooks and bk."""
    out = {}
    for mode in ("hooks", "bk"):
        model = make()
        st = stepper(model, mode=mode, **kw)
        before = trainable(model)
        first = st.step(x, y, augment_generator=torch.Generator().manual_seed(0))
        summed = [b - a for b, a in zip(before, trainable(model))]
        for s in range(steps - 1):
            st.step(x, y, augment_generator=torch.Generator().manual_seed(s + 1))
        out[mode] = (summed, trainable(model), first, st)
    return out


def per_example_grads(model, x, y) -> list[list[torch.Tensor]]:
    """The obviously-correct reference: one autograd pass per example, trainable parameters only."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads = []
    for i in range(len(x)):
        loss = cross_entropy_per_example(model(x[i:i + 1]), y[i:i + 1]).sum()
        grads.append([g.detach() for g in torch.autograd.grad(loss, params, allow_unused=True)])
    return grads


# ----------------------------------------------------------------------------------------------- the math


@pytest.mark.parametrize("T, p, d", [(5, 2, 4), (1, 3, 3), (7, 16, 9)])
def test_ghost_and_materialised_norms_agree(T, p, d):
    g0 = torch.Generator().manual_seed(T)
    a, g = torch.randn(4, 2, T, d, generator=g0), torch.randn(4, 2, T, p, generator=g0)
    ref = torch.einsum("ngtp,ngtd->ngpd", g, a).pow(2).sum((1, 2, 3))
    for ghost in (True, False):
        torch.testing.assert_close(L.matmul_sq_norms(a, g, ghost=ghost), ref, rtol=1e-4, atol=1e-5)
    assert L.use_ghost(T=65, p=384, d=384) and not L.use_ghost(T=1024, p=16, d=144)  # ViT tokens / CIFAR conv


@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=2, groups=3, padding=1, padding_mode="reflect"),
                                dict(dilation=2, padding="same", padding_mode="circular"), dict(padding="valid")])
def test_conv_grad_samples_equal_a_per_example_loop_and_the_kept_sum_equals_the_plain_one(kw):
    """The batch-folded grouped weight-gradient kernel gives each example's Conv2d weight gradient (a layer
    called twice: summed over its calls), its squared norms are the materialised ones, and the clipped sum from
    the kept gradients is the ordinary weight gradient with rescaled output gradients."""
    torch.manual_seed(0)
    layer = nn.Conv2d(6, 9, 3, **kw)
    x1, x2 = torch.randn(5, 6, 9, 9), torch.randn(5, 6, 9, 9)
    y1, y2 = layer(x1), layer(x2)
    g1, g2 = torch.randn_like(y1), torch.randn_like(y2)
    ref = []
    for i in range(5):
        out = (layer(x1[i:i + 1]) * g1[i:i + 1]).sum() + (layer(x2[i:i + 1]) * g2[i:i + 1]).sum()
        ref.append(torch.autograd.grad(out, layer.weight)[0].reshape(9, -1))
    got = L.conv2d_grad_samples(layer, [x1, x2], [g1, g2])
    torch.testing.assert_close(got, torch.stack(ref), rtol=1e-4, atol=1e-5)
    keep: dict = {}
    norms = L.conv2d_norms(layer, [x1, x2], [g1, g2], keep=keep)
    assert set(keep) == {"weight"}  # these shapes take the materialised path (2T² >= p·d)
    torch.testing.assert_close(norms["weight"], torch.stack(ref).pow(2).sum((1, 2)), rtol=1e-4, atol=1e-4)
    c = {"weight": torch.rand(5), "bias": torch.rand(5)}
    kept, plain = (L.conv2d_sums(layer, [x1, x2], [g1, g2], c, kept=k) for k in (keep, None))
    torch.testing.assert_close(kept["weight"], plain["weight"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kept["weight"], torch.einsum("i,ioj->oj", c["weight"], torch.stack(ref)).reshape(
        layer.weight.shape), rtol=1e-4, atol=1e-4)


def test_per_sample_norms_equal_a_batch_size_one_loop():
    x, y = batch(6)
    model = Mixed(padding_mode="reflect", padding_idx=0)
    ref = per_example_grads(model, x, y)
    bk = BKModule(model)
    bk.train()
    params = [p for p in model.parameters() if p.requires_grad]
    cross_entropy_per_example(bk(x), y).mean().backward()
    sq = bk.sq_norms(params)
    expected = torch.tensor([[float(g.pow(2).sum()) for g in gs] for gs in ref])
    torch.testing.assert_close(sq, expected, rtol=1e-4, atol=1e-7)
    assert all(p.grad is None for p in params), "bk computes no unclipped parameter gradient"
    assert bk.fallback_layers == ["act (PReLU)"]


@pytest.mark.parametrize("padding_mode", ["reflect", "circular"])
def test_clipped_sum_equals_the_loop_with_padding_modes_and_padding_idx(padding_mode):
    """Where Opacus 1.6's hooks mode is wrong, bk is exact: its conv grad sampler unfolds with zero padding
    whatever the padding mode, and its embedding grad sampler gives the ``padding_idx`` row a gradient."""
    x, y = batch(6)
    C = 0.05
    clipped = []
    for gs in per_example_grads(Mixed(padding_mode=padding_mode, padding_idx=0), x, y):
        norm = math.sqrt(sum(float(g.pow(2).sum()) for g in gs))
        clipped.append([g * min(1.0, C / (norm + 1e-6)) for g in gs])
    expected = [sum(parts) for parts in zip(*clipped)]
    model = Mixed(padding_mode=padding_mode, padding_idx=0)
    before = trainable(model)
    stepper(model, mode="bk", C=C).step(x, y)
    assert max_diff([b - a for b, a in zip(before, trainable(model))], expected) <= TOL


# ------------------------------------------------------------------------------------------- against hooks


@pytest.mark.parametrize("clipping", ["flat", "automatic", "per_layer"])
def test_bk_equals_hooks_on_a_mixed_model(clipping):
    x, y = batch(10)
    res = run_both(Mixed, x, y, steps=3, clipping=clipping, physical=4)
    (s_h, w_h, st_h, _), (s_b, w_b, st_b, bk_stepper) = res["hooks"], res["bk"]
    assert max_diff(s_h, s_b) <= TOL and max_diff(w_h, w_b) <= TOL
    assert max(float(t.abs().max()) for t in s_b) > 1e-3, "the test would pass with zero gradients"
    assert st_b.clipped_fraction == st_h.clipped_fraction and st_b.clipped_fraction > 0
    assert st_b.grad_norm_mean == pytest.approx(st_h.grad_norm_mean, rel=1e-5)
    assert bk_stepper.fallback_layers == ["act (PReLU)"]


def test_physical_batches_accumulate_like_one_batch_and_noise_matches_hooks():
    x, y = batch(11)
    one = run_both(Mixed, x, y, physical=11)["bk"]
    chunked = run_both(Mixed, x, y, physical=3)["bk"]
    assert max_diff(one[0], chunked[0]) <= TOL
    noisy = run_both(Mixed, x, y, steps=2, sigma=1.0, physical=3)  # same generator, same noise order
    assert max_diff(noisy["hooks"][1], noisy["bk"][1]) <= TOL
    assert max_diff(noisy["bk"][1], chunked[1]) > 1e-3


def test_augmentation_multiplicity_averages_the_copies_like_hooks():
    """K = 3 augmented copies per example (crop + flip, De et al. 2022): each copy is one more call per layer."""
    x, y = batch(7)
    res = run_both(Mixed, x, y, steps=2, physical=3, augment=AugmentConfig(crop_padding=2, flip=True, multiplicity=3))
    assert max_diff(res["hooks"][0], res["bk"][0]) <= TOL and max_diff(res["hooks"][1], res["bk"][1]) <= TOL
    assert res["bk"][2].clipped_fraction == res["hooks"][2].clipped_fraction > 0
    single = run_both(Mixed, x, y, physical=3, augment=AugmentConfig(crop_padding=2, flip=True))["bk"]
    assert max_diff(single[0], res["bk"][0]) > 1e-4  # the copies changed the gradient


def test_frozen_parameters_stay_frozen_and_the_rest_matches_hooks():
    def make():
        m = Mixed()
        m.conv.weight.requires_grad_(False)
        m.ln.bias.requires_grad_(False)
        m.act.weight.requires_grad_(False)  # the fallback layer is then frozen entirely
        return m
    x, y = batch(8)
    res = run_both(make, x, y, steps=2)
    assert max_diff(res["hooks"][1], res["bk"][1]) <= TOL
    model = make()
    stepper(model, mode="bk").step(x, y)
    assert torch.equal(model.conv.weight, Mixed().conv.weight) and torch.equal(model.ln.bias, Mixed().ln.bias)
    assert stepper(make(), mode="bk").fallback_layers == []


def test_a_module_used_twice_is_summed_correctly():
    x, y = batch(7, classes=3)
    res = run_both(Shared, x, y, steps=2, C=0.3)
    assert max_diff(res["hooks"][0], res["bk"][0]) <= TOL and max_diff(res["hooks"][1], res["bk"][1]) <= TOL
    model = Shared()
    ref = per_example_grads(model, x, y)
    bk = BKModule(model)
    bk.train()
    cross_entropy_per_example(bk(x), y).mean().backward()
    expected = torch.tensor([[float(g.pow(2).sum()) for g in gs] for gs in ref])
    torch.testing.assert_close(bk.sq_norms(list(model.parameters())), expected, rtol=1e-4, atol=1e-7)


def test_a_parameter_owned_by_two_layers_is_refused():
    tied = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    tied[1].weight = tied[0].weight
    with pytest.raises(ConfigError, match="shared by layers '0' and '1'"):
        stepper(tied, mode="bk")


def test_resnet20_groupnorm_matches_hooks():
    def make():
        return build_model(ModelConfig(arch="resnet20_cifar"), num_classes=10, input_shape=(3, 8, 8),
                           seed=0).module
    x, y = batch(5, classes=10)
    res = run_both(make, x, y, steps=2, C=0.5, physical=3)
    assert max_diff(res["hooks"][0], res["bk"][0]) <= TOL and max_diff(res["hooks"][1], res["bk"][1]) <= TOL
    assert res["bk"][2].clipped_fraction > 0 and res["bk"][3].fallback_layers == []


def test_tiny_timm_vit_matches_hooks():
    pytest.importorskip("timm")
    cfg = ModelConfig(arch="vit_tiny_patch16_224",
                      kwargs={"depth": 1, "embed_dim": 32, "num_heads": 2, "drop_path_rate": 0.0})

    def make():
        return build_model(cfg, num_classes=10, input_shape=(3, 16, 16), seed=0).module
    x, y = batch(5, shape=(3, 16, 16), classes=10)
    res = run_both(make, x, y, steps=2, C=0.5, physical=3)
    assert max_diff(res["hooks"][0], res["bk"][0]) <= TOL and max_diff(res["hooks"][1], res["bk"][1]) <= TOL
    assert res["bk"][3].fallback_layers == ["net.token_embed (TokenEmbedding)"]


def test_closing_removes_the_hooks_and_eval_forward_records_nothing():
    model = Mixed()
    x, _ = batch(3)
    with torch.no_grad():
        ref = model(x)
    st = stepper(model, mode="bk")
    with torch.no_grad():
        assert torch.equal(st.module(x), ref) and st.module._calls == {}
    plain = st.close()
    assert plain is model and all(not m._forward_hooks for m in model.modules())
    assert math.isfinite(float(plain(x).detach().sum()))


def test_a_bk_run_equals_a_hooks_run_and_its_manifest_says_so(tmp_path):
    """End to end (Poisson sampling, physical chunks, noise, accounting): the same seeds give the same weights."""
    from fixtures_runs import TINY_TRAIN
    from training.config import TrainConfig, apply_overrides
    from foundation.io import load_safetensors
    from training.run import open_run
    from training.trainer import train

    runs = {}
    for mode in ("hooks", "bk"):
        cfg = TrainConfig.model_validate(apply_overrides(TINY_TRAIN, {
            "output_dir": str(tmp_path / mode), "privacy.grad_sample_mode": mode, "training.steps": 3}))
        runs[mode] = train(cfg)
    w = {m: load_safetensors(r.run_dir / "model.safetensors") for m, r in runs.items()}
    assert max(float((w["hooks"][k] - w["bk"][k]).abs().max()) for k in w["hooks"]) <= TOL
    phase = open_run(runs["bk"].run_dir).manifest.privacy.phases[0]
    assert phase.grad_sample_mode == "bk" and phase.fallback_layers == []
    assert open_run(runs["hooks"].run_dir).manifest.privacy.phases[0].fallback_layers is None
    assert runs["bk"].manifest.privacy.epsilon == runs["hooks"].manifest.privacy.epsilon
