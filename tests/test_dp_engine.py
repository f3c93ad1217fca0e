"""DP engine invariants against obviously-correct references (batch-size-1 autograd loops, plain SGD).

Tiny models on CPU. With plain SGD (no momentum, no weight decay) the update is θ1 = θ0 − lr·g, so the
gradient the DP optimizer produced is recovered exactly as g = (θ0 − θ1)/lr.
"""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch
from torch import nn

from training.config import OptimConfig
from training.dp.canaries import GradientCanaries, flatten_parameters, trainable_shapes
from training.dp.clipping import automatic_clip_factors, flat_clip_factors, per_layer_norms
from training.dp.engine import StepStats, cross_entropy_per_example, make_stepper
from training.dp.recipe import TrainRecipe
from training.dp.sampling import PoissonSampler, ShuffleSampler, make_sampler
from training.dp.schedules import lr_at
from training.dp.state import join_state, split_state
from foundation.errors import CheckpointError, ConfigError

MODES_STYLES = [("hooks", "flat"), ("hooks", "per_layer"), ("hooks", "automatic"),
                ("functorch", "flat"), ("functorch", "per_layer"), ("functorch", "automatic"),
                ("ghost", "flat")]


def tiny_cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def tiny_mlp(seed: int = 0, d_in: int = 12, d_hidden: int = 16, d_out: int = 3) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(), nn.Linear(d_hidden, d_out))


def cnn_batch(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


def plain_step(x: torch.Tensor, y: torch.Tensor, make_optimizer) -> nn.Module:
    """The reference: :func:`tiny_cnn` after one ordinary step of the mean cross-entropy on the whole batch."""
    ref = tiny_cnn()
    opt = make_optimizer(ref.parameters())
    nn.functional.cross_entropy(ref(x), y).backward()
    opt.step()
    return ref


def zero_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A loss whose gradient is exactly zero for every example."""
    return (logits * 0.0).sum(dim=1)


def stepper_for(model, *, sigma=0.0, C=1.0, clipping="flat", mode="hooks", B=10.0, q=0.1, physical=4, lr=1.0,
                optim=None, seed=0, enabled=True, **kw):
    recipe = TrainRecipe(steps=kw.pop("total_steps", 100), batch_size=int(B),
                         optim=optim or OptimConfig(name="sgd", lr=lr), dp=enabled, noise_multiplier=sigma,
                         max_grad_norm=C, clipping=clipping, grad_sample_mode=mode, auto_gamma=0.01,
                         secure_mode=kw.pop("secure_mode", False), physical_batch_size=physical)
    return make_stepper(model=model, recipe=recipe, sample_rate=q, generator=torch.Generator().manual_seed(seed),
                        device="cpu", **kw)


def params_of(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def per_example_grads(model, x, y, loss_fn=cross_entropy_per_example) -> list[list[torch.Tensor]]:
    """The obviously-correct reference: one autograd pass per example."""
    out = []
    for i in range(len(x)):
        model.zero_grad()
        loss_fn(model(x[i:i + 1]), y[i:i + 1]).sum().backward()
        out.append([p.grad.detach().clone() for p in model.parameters()])
    model.zero_grad()
    return out


def clip_reference(grads, *, style, C, gamma=0.01):
    """Clip each example's gradient list by hand; returns (clipped lists, pre-clip norms, clipped flags)."""
    clipped, norms, flags = [], [], []
    L = len(grads[0])
    for g in grads:
        norm = math.sqrt(sum(float(t.pow(2).sum()) for t in g))
        norms.append(norm)
        if style == "flat":
            f = min(1.0, C / (norm + 1e-6))
            clipped.append([t * f for t in g])
            flags.append(norm > C)
        elif style == "automatic":
            clipped.append([t * (C / (norm + gamma)) for t in g])
            flags.append(norm > C)
        else:
            c_l = C / math.sqrt(L)
            layer_norms = [float(t.norm()) for t in g]
            clipped.append([t * min(1.0, c_l / (n + 1e-6)) for t, n in zip(g, layer_norms)])
            flags.append(any(n > c_l for n in layer_norms))
    return clipped, norms, flags


# ------------------------------------------------------------------------------------------------ clipping


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ghost"])
def test_no_noise_no_clipping_equals_plain_sgd(mode):
    x, y = cnn_batch(8)
    ref = plain_step(x, y, lambda params: torch.optim.SGD(params, lr=0.3))
    model = tiny_cnn()
    stats = stepper_for(model, sigma=0.0, C=1e6, mode=mode, B=8.0, lr=0.3, physical=3).step(x, y)
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
    assert stats.clipped_fraction == 0.0 and stats.batch_size == 8 and stats.noise_std == 0.0


@pytest.mark.parametrize("mode, style", MODES_STYLES)
def test_clipped_sum_matches_per_example_loop(mode, style):
    x, y = cnn_batch(10)
    C, B, lr = 0.5, 12, 1.0  # expected batch size differs from the realised 10
    grads = per_example_grads(tiny_cnn(), x, y)
    clipped, norms, flags = clip_reference(grads, style=style, C=C)
    for g in clipped:  # the reference's own invariant: every clipped gradient has norm ≤ C
        assert math.sqrt(sum(float(t.pow(2).sum()) for t in g)) <= C * (1 + 1e-6)
    expected_sum = [sum(parts) for parts in zip(*clipped)]

    model = tiny_cnn()
    before = params_of(model)
    stats = stepper_for(model, sigma=0.0, C=C, clipping=style, mode=mode, B=B, lr=lr, physical=4).step(x, y)
    got_sum = [(b - a) * B / lr for b, a in zip(before, params_of(model))]
    for got, exp in zip(got_sum, expected_sum):
        torch.testing.assert_close(got, exp, rtol=1e-4, atol=1e-5)
    assert stats.grad_norm_mean == pytest.approx(np.mean(norms), rel=1e-4)
    assert stats.grad_norm_median == pytest.approx(float(torch.tensor(norms).median()), rel=1e-4)
    assert stats.clipped_fraction == pytest.approx(np.mean(flags))
    with torch.no_grad():
        assert stats.loss == pytest.approx(float(cross_entropy_per_example(tiny_cnn()(x), y).mean()), rel=1e-5)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_stray_forward_outside_step_does_not_change_the_step(mode):
    x, y = cnn_batch(6)
    clean, dirty = tiny_cnn(), tiny_cnn()
    stepper_for(clean, sigma=0.0, C=0.5, mode=mode).step(x, y)
    st = stepper_for(dirty, sigma=0.0, C=0.5, mode=mode)
    st.module.train()
    st.module(torch.randn(9, 3, 8, 8))  # recorded by the hooks, never backpropagated
    st.step(x, y)
    for p, r in zip(dirty.parameters(), clean.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)


def test_clip_factors_bound_every_norm():
    norms = torch.cat([torch.rand(1000) * 10, torch.tensor([0.0, 1e-8, 1e6])])
    for C in (0.1, 1.0, 5.0):
        assert bool((norms * flat_clip_factors(norms, max_grad_norm=C) <= C).all())
        assert bool((norms * automatic_clip_factors(norms, max_grad_norm=C, gamma=0.01) <= C).all())
        small = norms < C * 0.5  # flat clipping leaves small gradients untouched
        assert bool((flat_clip_factors(norms, max_grad_norm=C)[small] == 1.0).all())
        assert math.isclose(math.sqrt(sum(c * c for c in per_layer_norms(C, 7))), C, rel_tol=1e-12)


# --------------------------------------------------------------------------------------------------- noise


@pytest.mark.parametrize("mode, secure", [("hooks", False), ("ghost", False), ("hooks", True)])
def test_update_std_is_sigma_C_over_B_with_zero_gradients(mode, secure):
    sigma, C, B, lr = 1.3, 0.7, 16.0, 1.0
    model = tiny_mlp(d_in=200, d_hidden=100, d_out=2)  # 20,302 parameters
    before = torch.cat([p.reshape(-1) for p in params_of(model)])
    st = stepper_for(model, sigma=sigma, C=C, mode=mode, B=B, lr=lr, loss_fn=zero_loss, physical=16,
                     secure_mode=secure)
    stats = st.step(torch.randn(16, 200), torch.zeros(16, dtype=torch.long))
    delta = torch.cat([p.reshape(-1) for p in params_of(model)]) - before
    expected = lr * sigma * C / B
    assert stats.noise_std == pytest.approx(sigma * C / B)
    assert float(delta.std()) == pytest.approx(expected, rel=0.03)
    assert abs(float(delta.mean())) < 4 * expected / math.sqrt(delta.numel())


def test_debug_disable_noise_really_removes_noise():
    x, y = cnn_batch(6)
    quiet, ref = tiny_cnn(), tiny_cnn()
    stats = stepper_for(quiet, sigma=2.0, C=0.5, _debug_disable_noise=True).step(x, y)
    stepper_for(ref, sigma=0.0, C=0.5).step(x, y)
    for p, r in zip(quiet.parameters(), ref.parameters()):
        assert torch.equal(p, r)
    assert stats.noise_std == 0.0
    noisy = tiny_cnn()
    stepper_for(noisy, sigma=2.0, C=0.5).step(x, y)
    assert not all(torch.equal(p, r) for p, r in zip(noisy.parameters(), ref.parameters()))


# ------------------------------------------------------------------------------------------- logical batches


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_physical_chunks_give_the_same_update_as_one_chunk(mode):
    x, y = cnn_batch(11)
    optim = OptimConfig(name="sgd", lr=0.2, momentum=0.9)
    a, b = tiny_cnn(), tiny_cnn()
    sa = stepper_for(a, sigma=0.0, C=0.3, mode=mode, physical=3, optim=optim)
    sb = stepper_for(b, sigma=0.0, C=0.3, mode=mode, physical=11, optim=optim)
    for _ in range(2):
        ra, rb = sa.step(x, y), sb.step(x, y)
    for p, r in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
    assert ra.loss == pytest.approx(rb.loss) and ra.grad_norm_mean == pytest.approx(rb.grad_norm_mean)


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_empty_poisson_batch_takes_a_noise_only_step(mode):
    x, y = cnn_batch(0)
    noisy, quiet = tiny_cnn(), tiny_cnn()
    before = params_of(noisy)
    st = stepper_for(noisy, sigma=1.0, C=1.0, mode=mode)
    stats = st.step(x, y)
    assert stats.batch_size == 0 and math.isnan(stats.loss) and math.isnan(stats.clipped_fraction)
    assert st.step_count == 1
    delta = torch.cat([(a - b).reshape(-1) for a, b in zip(params_of(noisy), before)])
    assert float(delta.std()) == pytest.approx(1.0 * 1.0 / 10.0, rel=0.1)  # 845 parameters
    stepper_for(quiet, sigma=0.0, mode=mode).step(x, y)
    assert all(torch.equal(a, b) for a, b in zip(params_of(quiet), before))


def test_non_dp_step_is_the_mean_gradient_step_over_chunks():
    x, y = cnn_batch(9)
    ref = plain_step(x, y, lambda params: torch.optim.Adam(params, lr=0.01))
    model = tiny_cnn()
    st = stepper_for(model, enabled=False, physical=2, optim=OptimConfig(name="adam", lr=0.01))
    stats = st.step(x, y)
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
    assert stats.grad_norm_mean is None and stats.noise_std == 0.0
    assert not st.dp and st.step(x[:0], y[:0]).batch_size == 0


# ------------------------------------------------------------------------------------------ gradient canaries


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_gradient_canary_projection_matches_times_sampled(mode):
    lr, C, B, q, T = 0.5, 2.0, 4.0, 0.5, 6
    model = tiny_mlp(d_in=100, d_hidden=50, d_out=2)  # P = 5,152
    included = np.array([True, False, True, False, True, True])
    canaries = GradientCanaries.for_model(model, count=6, seed=3, included=included)
    names = list(canaries.param_shapes)
    theta0 = flatten_parameters(model, names)
    st = stepper_for(model, sigma=0.0, C=C, mode=mode, B=B, q=q, lr=lr, loss_fn=zero_loss, gradient_canaries=canaries)
    added = sum(st.step(torch.randn(4, 100), torch.zeros(4, dtype=torch.long)).canaries_added for _ in range(T))
    counts = np.zeros(canaries.count, dtype=np.int64)  # how often each canary was drawn over the T steps
    for t in range(T):
        counts[canaries.sampled(t, sample_rate=q)] += 1
    assert added == counts.sum() > 0 and (counts[~included] == 0).all()

    delta = flatten_parameters(st.base_model, names) - theta0
    proj = canaries.projections(delta)
    U = np.stack([canaries.direction(i).astype(np.float64) for i in range(6)])
    np.testing.assert_allclose(proj, -lr * C / B * (U @ U.T) @ counts, rtol=1e-4, atol=1e-6)  # exact
    # random directions are nearly orthogonal: cross terms are ~ sqrt(total count / P) per unit
    unit, tol = lr * C / B, 5 * math.sqrt(counts.sum() / canaries.dim) * lr * C / B
    assert tol < 0.5 * unit
    np.testing.assert_allclose(proj[included], -unit * counts[included], atol=tol)  # ≈ −lr·C·k/B
    assert np.abs(proj[~included]).max() < tol  # excluded ≈ 0
    scores = canaries.scores(delta)
    assert scores[included & (counts > 0)].min() > scores[~included].max()  # higher = member


def test_canaries_are_deterministic_and_unit_norm():
    shapes = {"a": (7, 5), "b": (5,)}
    c1 = GradientCanaries(param_shapes=shapes, count=4, seed=9)
    c2 = GradientCanaries(param_shapes=shapes, count=4, seed=9, cache_bytes=0)
    for i in range(4):
        assert np.array_equal(c1.direction(i), c2.direction(i))
        assert np.linalg.norm(c1.direction(i).astype(np.float64)) == pytest.approx(1.0, abs=1e-6)
    assert np.array_equal(c1.included, c2.included)
    assert np.array_equal(c1.sampled(5, sample_rate=0.7), c2.sampled(5, sample_rate=0.7))
    with pytest.raises(ValueError, match="included"):
        GradientCanaries(param_shapes=shapes, count=4, seed=0, included=np.ones(3, dtype=bool))
    with pytest.raises(ConfigError, match="canaries"):
        stepper_for(tiny_mlp(), gradient_canaries=c1)


# ---------------------------------------------------------------------------------------------------- resume


def test_state_dict_round_trip_resumes_identically():
    optim = OptimConfig(name="adamw", lr=0.05, weight_decay=0.01, schedule="cosine", warmup_steps=1)
    batches = [cnn_batch(n, seed=s) for s, n in enumerate([7, 5, 9, 6])]

    def fresh(seed_gen):
        return stepper_for(tiny_cnn(), sigma=0.8, C=0.5, optim=optim, physical=3, total_steps=4, seed=seed_gen)

    straight = fresh(0)
    for x, y in batches:
        last = straight.step(x, y)

    first = fresh(0)
    for x, y in batches[:2]:
        first.step(x, y)
    weights = {k: v.clone() for k, v in first.base_model.state_dict().items()}
    buf = io.BytesIO()
    tensors, meta = split_state(first.state_dict())
    torch.save({"tensors": tensors, "meta": meta}, buf)  # what a checkpoint would hold (no pickle on load)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)

    resumed = fresh(123)  # different generator seed: the loaded state must override it
    resumed.base_model.load_state_dict(weights)
    resumed.load_state_dict(join_state(loaded["tensors"], loaded["meta"]))
    assert resumed.step_count == 2
    for x, y in batches[2:]:
        again = resumed.step(x, y)
    for p, r in zip(resumed.base_model.parameters(), straight.base_model.parameters()):
        assert torch.equal(p, r)
    assert again == last


def test_state_from_another_dp_config_is_refused():
    st = stepper_for(tiny_mlp(), sigma=1.0)
    other = stepper_for(tiny_mlp(), sigma=2.0)
    with pytest.raises(CheckpointError, match="noise multiplier"):
        other.load_state_dict(st.state_dict())
    with pytest.raises(CheckpointError):
        other.load_state_dict({"format": "something else"})


# ---------------------------------------------------------------------------------------------- config errors


def test_ghost_rejects_non_flat_clipping_and_dp_rejects_batchnorm():
    with pytest.raises(ConfigError, match="ghost clipping supports"):
        stepper_for(tiny_mlp(), mode="ghost", clipping="per_layer")
    torch.manual_seed(0)
    bn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 5))
    with pytest.raises(ConfigError, match="BatchNorm"):
        stepper_for(bn)


def test_frozen_batchnorm_is_kept_in_eval_mode_under_dp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(144, 5))
    model[1].requires_grad_(False)
    stats_before = model[1].running_mean.clone()
    st = stepper_for(model, sigma=0.5)
    st.step(*cnn_batch(6))
    assert torch.equal(model[1].running_mean, stats_before) and not model[1].training
    assert list(st.base_model.state_dict())[0] == "0.weight"
    plain = st.close()
    assert plain is model and not hasattr(next(model.parameters()), "grad_sample")


# -------------------------------------------------------------------------------------- samplers, schedules


def test_poisson_sampler_is_deterministic_per_step_with_rate_q():
    s = PoissonSampler(2000, 0.05, seed=4)
    assert np.array_equal(s.indices(17), PoissonSampler(2000, 0.05, seed=4).indices(17))
    assert not np.array_equal(s.indices(17), s.indices(18))
    assert not np.array_equal(s.indices(17), PoissonSampler(2000, 0.05, seed=5).indices(17))
    sizes = np.array([len(s.indices(t)) for t in range(200)])
    assert sizes.mean() == pytest.approx(s.expected_batch_size, rel=0.03)
    idx = s.indices(3)
    assert idx.dtype == np.int64 and (np.diff(idx) > 0).all() and idx.max() < 2000
    assert s.sampling == "poisson" and s.sample_rate == 0.05


def test_shuffle_sampler_covers_each_epoch_once_with_fixed_batches():
    s = ShuffleSampler(10, 3, seed=1)
    epoch0 = np.concatenate([s.indices(t) for t in range(3)])
    assert len(np.unique(epoch0)) == 9 and all(len(s.indices(t)) == 3 for t in range(7))
    assert np.array_equal(s.indices(4), ShuffleSampler(10, 3, seed=1).indices(4))
    assert not np.array_equal(epoch0, np.concatenate([s.indices(t) for t in range(3, 6)]))  # new permutation
    assert s.sampling == "shuffle" and s.expected_batch_size == 3 and s.sample_rate == pytest.approx(0.3)
    assert isinstance(make_sampler(sampling="poisson", n=10, batch_size=3, seed=0), PoissonSampler)
    with pytest.raises(ValueError, match="sampling"):
        make_sampler(sampling="uniform", n=10, batch_size=3, seed=0)


def test_lr_schedules():
    total = 11
    for name in ("constant", "cosine", "linear", "step"):
        cfg = OptimConfig(lr=0.4, schedule=name, warmup_steps=2, step_size=3, gamma=0.5, min_lr_ratio=0.1)
        lrs = [lr_at(t, optim=cfg, total_steps=total) for t in range(total)]
        assert lrs[:3] == pytest.approx([0.2, 0.4, 0.4])
        assert all(a >= b - 1e-12 for a, b in zip(lrs[1:], lrs[2:]))  # non-increasing after warm-up
        assert min(lrs[2:]) >= 0.04 - 1e-12
        if name in ("cosine", "linear"):
            assert lrs[-1] == pytest.approx(0.04)
    cfg = OptimConfig(lr=1.0, schedule="step", step_size=2, gamma=0.5)
    assert [lr_at(t, optim=cfg, total_steps=8) for t in range(6)] == [1, 1, 0.5, 0.5, 0.25, 0.25]


def test_stepper_applies_the_schedule():
    optim = OptimConfig(name="sgd", lr=0.2, schedule="linear", min_lr_ratio=0.0)
    st = stepper_for(tiny_mlp(), sigma=0.0, optim=optim, total_steps=3)
    x, y = torch.randn(4, 12), torch.randint(0, 3, (4,))
    got = [st.step(x, y).lr for _ in range(3)]
    assert got == pytest.approx([0.2, 0.1, 0.0])
    assert isinstance(StepStats(step=0, loss=0.0, batch_size=0, lr=0.0, noise_std=0.0), StepStats)
    assert trainable_shapes(tiny_mlp())["0.weight"] == (16, 12)


def test_state_split_join_keeps_every_tensor():
    model = tiny_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 12)).sum().backward()
    opt.step()
    state = {"opt": copy.deepcopy(opt.state_dict()), "gen": torch.Generator().manual_seed(1).get_state(),
             "x": float("inf"), "t": (1, 2)}
    tensors, meta = split_state(state)
    back = join_state(tensors, meta)
    assert torch.equal(back["gen"], state["gen"]) and back["x"] == float("inf") and back["t"] == (1, 2)
    for k, v in state["opt"]["state"][0].items():
        assert torch.equal(back["opt"]["state"][0][k], v)
    import json
    json.dumps(meta)  # the skeleton is plain JSON


# ------------------------------------------------------------------------------------ lr by parameter group


def test_lr_scales_scale_the_head_update_and_keep_the_dp_noise_order():
    """A head learning rate set by parameter group: with SGD and no noise the head's step is exactly `scale` times
    the unscaled one and the rest is unchanged; with noise, scales of 1 everywhere (one group per parameter) give
    the same weights bit for bit as one group (the noise is drawn in the same order)."""
    x, y = cnn_batch(8)
    base = tiny_cnn()
    start = params_of(base)
    stepper_for(base, sigma=0.0, C=1e6, B=8.0, lr=0.3).step(x, y)
    scaled = tiny_cnn()
    stepper_for(scaled, sigma=0.0, C=1e6, B=8.0, optim=OptimConfig(name="sgd", lr=0.3, lr_scales={"4.*": 5.0})
                ).step(x, y)
    names = [n for n, _ in tiny_cnn().named_parameters()]
    for n, s0, a, b in zip(names, start, params_of(base), params_of(scaled)):
        factor = 5.0 if n.startswith("4.") else 1.0
        torch.testing.assert_close(b - s0, factor * (a - s0), rtol=1e-5, atol=1e-7)
    noisy = [tiny_cnn(), tiny_cnn()]
    for m, scales in zip(noisy, ({}, {"*": 1.0})):
        stepper_for(m, sigma=1.0, B=8.0, lr=0.3, optim=OptimConfig(name="adamw", lr=0.01, lr_scales=scales)
                    ).step(x, y)
    assert all(torch.equal(a, b) for a, b in zip(params_of(noisy[0]), params_of(noisy[1])))
    with pytest.raises(ValueError, match="lr_scales"):
        OptimConfig(lr_scales={"*": 0.0})
