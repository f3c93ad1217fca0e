"""The fused fixed-shape DP step (training.dp.fused) against the eager Opacus stepper it replaces: same clipped
sums, same noise for the same generator state, same update, same statistics; the device sampler against the
host Poisson sampler (same batches through ``indices``, same sample rate and expected batch size, so the same
accounting); the padded batch's truncation is never silent."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from training.config import OptimConfig
from training.dp.canaries import GradientCanaries
from training.dp.engine import make_stepper
from training.dp.fused import DevicePoissonSampler, FusedDPStep, poisson_capacity
from training.dp.recipe import TrainRecipe
from training.dp.sampling import make_sampler

N, B, C = 40, 10, 1.0


def tiny_cnn(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def data(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, 3, 8, 8, generator=g), torch.randint(0, 5, (N,), generator=g)


def eager(model, *, mode, clipping, sigma, seed, canaries=None, loss_fn=None):
    recipe = TrainRecipe(steps=100, batch_size=B, optim=OptimConfig(name="sgd", lr=1.0), dp=True,
                         noise_multiplier=sigma, max_grad_norm=C, clipping=clipping, grad_sample_mode=mode,
                         auto_gamma=0.01, physical_batch_size=4)
    return make_stepper(model=model, recipe=recipe, sample_rate=B / N, generator=torch.Generator().manual_seed(seed),
                        device="cpu", gradient_canaries=canaries, loss_fn=loss_fn)


def fused(model, *, clipping, sigma, seed, physical=8, loss_fn=None):
    params = [p for p in model.parameters() if p.requires_grad]
    return FusedDPStep(model, optimizer=torch.optim.SGD(params, lr=1.0), noise_multiplier=sigma, max_grad_norm=C,
                       expected_batch_size=B, generator=torch.Generator().manual_seed(seed), clipping=clipping,
                       physical_batch_size=physical, loss_fn=loss_fn)


def update(before, model):
    return [b - p.detach() for b, p in zip(before, model.parameters())]


def batch(step: int = 2):
    sampler = DevicePoissonSampler(n=N, sample_rate=B / N, seed=5, capacity=24)
    idx, valid = sampler.padded(step)
    return sampler, idx, valid


@pytest.mark.parametrize("mode", ["hooks", "functorch", "bk"])
@pytest.mark.parametrize("clipping", ["flat", "automatic"])
def test_clipped_sums_and_statistics_equal_the_eager_steppers(mode, clipping):
    x, y = data()
    sampler, idx, valid = batch()
    real = torch.as_tensor(sampler.indices(2))
    assert 0 < len(real) < sampler.capacity and torch.equal(idx[valid], real)
    ref = tiny_cnn()
    before = [p.detach().clone() for p in ref.parameters()]
    stats = eager(ref, mode=mode, clipping=clipping, sigma=0.0, seed=0).step(x[real], y[real])
    expected = update(before, ref)  # lr 1, plain SGD: the clipped sum / B
    model = tiny_cnn()
    f = fused(model, clipping=clipping, sigma=0.0, seed=0)
    sums = f.clipped_sums(x[idx], y[idx], valid)
    for s, e in zip(sums, expected):
        assert torch.allclose(s / B, e, atol=1e-6, rtol=0)
    got = f.stats()
    assert got["examples"] == stats.batch_size == len(real)
    assert got["clipped_fraction"] == pytest.approx(stats.clipped_fraction, abs=1e-12)
    assert got["grad_norm_mean"] == pytest.approx(stats.grad_norm_mean, rel=1e-5)
    assert got["loss"] == pytest.approx(stats.loss, rel=1e-5)


def test_noise_is_the_eager_steppers_noise_for_the_same_generator_state():
    zero = lambda logits, targets: (logits * 0.0).sum(dim=1)  # noqa: E731 - every gradient is exactly zero
    x, y = data()
    ref = tiny_cnn()
    before = [p.detach().clone() for p in ref.parameters()]
    eager(ref, mode="hooks", clipping="flat", sigma=1.3, seed=11, loss_fn=zero).step(x[:7], y[:7])
    f = fused(tiny_cnn(), clipping="flat", sigma=1.3, seed=11)
    for z, e in zip(f.noise(), update(before, ref)):
        assert torch.allclose(z / B, e, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_one_noisy_step_with_canaries_updates_like_the_eager_stepper(mode):
    x, y = data()
    sampler, idx, valid = batch(step=4)
    real = torch.as_tensor(sampler.indices(4))
    ref = tiny_cnn()
    canaries = GradientCanaries.for_model(ref, count=6, seed=3, included=np.ones(6, dtype=bool))
    before = [p.detach().clone() for p in ref.parameters()]
    st = eager(ref, mode=mode, clipping="flat", sigma=0.7, seed=9, canaries=canaries)
    st.step(x[real], y[real])
    drawn = canaries.sampled(0, sample_rate=B / N)
    assert len(drawn)  # the comparison covers the canaries' C·u_i
    model = tiny_cnn()
    f = fused(model, clipping="flat", sigma=0.7, seed=9)
    f.step(x[idx], y[idx], valid, canary_grad=canaries.gradient(drawn, scale=C, device="cpu"))
    for a, b in zip(update(before, ref), update(before, model)):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_an_empty_batch_takes_the_noise_only_step():
    x, y = data()
    ref, model = tiny_cnn(), tiny_cnn()
    before = [p.detach().clone() for p in ref.parameters()]
    eager(ref, mode="hooks", clipping="flat", sigma=1.0, seed=2).step(x[:0], y[:0])
    f = fused(model, clipping="flat", sigma=1.0, seed=2)
    f.step(x[:16], y[:16], torch.zeros(16, dtype=torch.bool))
    for a, b in zip(update(before, ref), update(before, model)):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    assert f.stats()["examples"] == 0


def test_chunking_does_not_change_the_sums():
    x, y = data()
    _, idx, valid = batch()
    one = fused(tiny_cnn(), clipping="flat", sigma=0.0, seed=0, physical=24).clipped_sums(x[idx], y[idx], valid)
    many = fused(tiny_cnn(), clipping="flat", sigma=0.0, seed=0, physical=5).clipped_sums(x[idx], y[idx], valid)
    for a, b in zip(one, many):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_device_sampler_has_the_host_samplers_accounting_and_poisson_frequencies():
    host = make_sampler(sampling="poisson", n=1000, batch_size=50, seed=3)
    dev = DevicePoissonSampler(n=1000, sample_rate=host.sample_rate, seed=3)
    assert dev.sample_rate == host.sample_rate and dev.expected_batch_size == host.expected_batch_size
    counts = np.zeros(1000)
    sizes = []
    for t in range(400):
        i = dev.indices(t)
        counts[i] += 1
        sizes.append(len(i))
        assert np.array_equal(i, dev.indices(t))  # a pure function of (seed, step)
    # every example joins with probability q: 400 draws of Bernoulli(0.05) each, pooled over 1,000 examples
    assert abs(counts.mean() / 400 - 0.05) < 0.002
    assert abs(np.var(sizes) - 1000 * 0.05 * 0.95) < 0.25 * 1000 * 0.05 * 0.95
    assert not np.array_equal(dev.indices(0), DevicePoissonSampler(n=1000, sample_rate=0.05, seed=4).indices(0))


def test_capacity_is_the_binomial_tail_and_truncation_is_reported():
    from scipy.stats import binom

    c = poisson_capacity(50_000, 0.02, tail=1e-12)
    assert binom.sf(c, 50_000, 0.02) <= 1e-12 < binom.sf(c - 8, 50_000, 0.02) and c % 8 == 0
    x, y = data()
    f = fused(tiny_cnn(), clipping="flat", sigma=1.0, seed=0)
    small = DevicePoissonSampler(n=N, sample_rate=0.5, seed=0, capacity=4)
    f.sampled_step(small, 0, x, y)
    with pytest.raises(RuntimeError, match="exceeded the padded capacity"):
        f.check()
    ok = fused(tiny_cnn(), clipping="flat", sigma=1.0, seed=0)
    ok.sampled_step(DevicePoissonSampler(n=N, sample_rate=0.25, seed=0), 0, x, y)
    ok.check()


def test_bad_arguments_are_refused():
    m = tiny_cnn()
    with pytest.raises(ValueError, match="compile must be one of"):
        FusedDPStep(m, optimizer=torch.optim.SGD(m.parameters(), lr=1), noise_multiplier=1, max_grad_norm=1,
                    expected_batch_size=4, generator=torch.Generator(), compile="max")
    with pytest.raises(ValueError, match="exactly the model's trainable parameters"):
        FusedDPStep(m, optimizer=torch.optim.SGD(list(m.parameters())[:1], lr=1), noise_multiplier=1,
                    max_grad_norm=1, expected_batch_size=4, generator=torch.Generator())
    with pytest.raises(ValueError, match="no secure mode"):
        DevicePoissonSampler(n=10, sample_rate=0.5, seed=None)


@pytest.mark.slow
def test_the_compiled_step_equals_the_eager_one():
    """``compile`` traces the fixed-shape chunk with torch.compile (``aot_eager`` here: the capture without code
    generation, seconds on a CPU; the GPU run uses inductor): same sums over two steps, no fallback."""
    x, y = data()
    _, idx, valid = batch()
    warnings = []
    runs = {}
    for mode in ("off", "default"):
        model = tiny_cnn()
        params = [p for p in model.parameters() if p.requires_grad]
        f = FusedDPStep(model, optimizer=torch.optim.SGD(params, lr=1.0), noise_multiplier=0.5, max_grad_norm=C,
                        expected_batch_size=B, generator=torch.Generator().manual_seed(3), physical_batch_size=8,
                        compile=mode, compile_backend="aot_eager", warn=warnings.append)
        before = [p.detach().clone() for p in model.parameters()]
        f.step(x[idx], y[idx], valid)
        f.step(x[idx.flip(0)], y[idx.flip(0)], valid.flip(0))
        runs[mode] = (update(before, model), f.stats())
    assert not warnings
    for a, b in zip(runs["off"][0], runs["default"][0]):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    assert runs["off"][1] == pytest.approx(runs["default"][1], rel=1e-6)


def test_a_compiled_step_that_fails_falls_back_to_eager_once():
    model = tiny_cnn()
    warnings = []
    f = fused(model, clipping="flat", sigma=0.0, seed=0)
    f._warn = warnings.append

    def broken(*args):
        raise RuntimeError("no compiler")

    f._chunk = broken
    x, y = data()
    _, idx, valid = batch()
    sums = f.clipped_sums(x[idx], y[idx], valid)
    ref = fused(tiny_cnn(), clipping="flat", sigma=0.0, seed=0).clipped_sums(x[idx], y[idx], valid)
    assert all(torch.equal(a, b) for a, b in zip(sums, ref)) and len(warnings) == 1 and "eagerly" in warnings[0]


# ------------------------------------------------------------------ grad_sample_mode: fused in the stepper


def _stepper(mode, *, clipping="flat", sigma=0.8, seed=4, canaries=None, **kw):
    recipe = TrainRecipe(steps=100, batch_size=B, optim=OptimConfig(name="sgd", lr=0.5, momentum=0.9), dp=True,
                         noise_multiplier=sigma, max_grad_norm=C, clipping=clipping, grad_sample_mode=mode,
                         auto_gamma=0.01, physical_batch_size=4, **kw)
    return make_stepper(model=tiny_cnn(), recipe=recipe, sample_rate=B / N,
                        generator=torch.Generator().manual_seed(seed), device="cpu", gradient_canaries=canaries)


@pytest.mark.parametrize("clipping", ["flat", "automatic"])
def test_fused_mode_steps_like_the_hooks_stepper_over_several_steps(clipping):
    from training.config import AugmentConfig
    from training.dp.rng import augment_generator, seed_noise

    x, y = data()
    sampler = make_sampler(sampling="poisson", n=N, batch_size=B, seed=2)
    augment = AugmentConfig(crop_padding=1, flip=True)
    runs = {}
    for mode in ("hooks", "fused"):
        canaries = GradientCanaries.for_model(tiny_cnn(), count=8, seed=1)
        st = _stepper(mode, clipping=clipping, canaries=canaries, augment=augment)
        stats = []
        for t in range(4):
            idx = torch.as_tensor(sampler.indices(t))
            seed_noise(st.generator, 9, t)
            stats.append(st.step(x[idx], y[idx], augment_generator=augment_generator(9, t)))
        runs[mode] = ([p.detach().clone() for p in st.close().parameters()], stats, st.precision)
    for a, b in zip(runs["hooks"][0], runs["fused"][0]):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)
    for s, f in zip(runs["hooks"][1], runs["fused"][1]):
        assert (s.batch_size, s.canaries_added, s.lr) == (f.batch_size, f.canaries_added, f.lr)
        for k in ("loss", "clipped_fraction", "grad_norm_mean", "grad_norm_median", "noise_std"):
            assert getattr(f, k) == pytest.approx(getattr(s, k), rel=1e-5, abs=1e-9), k
    assert runs["fused"][2] == "fp32"


def test_fused_mode_takes_the_noise_only_step_of_an_empty_batch_and_oversized_batches():
    x, y = data()
    ref, st = _stepper("hooks"), _stepper("fused")
    assert st.capacity < N  # the Poisson tail bound for n = 40, q = 0.25
    for s in (ref, st):
        s.step(x[:0], y[:0])
    st_big = _stepper("fused")
    ref_big = _stepper("hooks")
    ref_big.step(x, y)
    st_big.step(x, y)  # the whole pool: above the capacity, one larger step
    assert st_big.oversized_steps == 1
    for a, b in zip(ref.base_model.parameters(), st.base_model.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    for a, b in zip(ref_big.base_model.parameters(), st_big.base_model.parameters()):
        assert torch.allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw, match", [({"clipping": "per_layer"}, "per_layer"),
                                       ({"secure_mode": True}, "secure_mode")])
def test_fused_mode_refuses_what_it_does_not_implement(kw, match):
    from foundation.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        _stepper("fused", **kw)


def test_audit_train_under_fused_equals_hooks_weights_accounting_and_canary_scores(tmp_path):
    """A whole DP run (Poisson sampling, σ calibrated to ε, augmentation, gradient canaries) under fused and under
    hooks: the same weights, the same ε and the same one-run canary evidence."""
    from safetensors.torch import load_file

    from audit.bounds.sources import gradient_canary_evidence
    from foundation.files import WEIGHTS_FILE
    from training.config import TrainConfig
    from training.run import open_run
    from training.trainer import train

    runs = {}
    for mode in ("hooks", "fused"):
        cfg = TrainConfig.model_validate({
            "name": mode, "output_dir": str(tmp_path),
            "data": {"dataset": "synthetic", "split": "train:n=64,classes=3,size=8",
                     "test_split": "test:n=30,classes=3,size=8"},
            "model": {"arch": "small_cnn", "kwargs": {"channels": [4, 8]}},
            "privacy": {"target_epsilon": 4.0, "delta": 1e-3, "grad_sample_mode": mode},
            "optim": {"name": "sgd", "lr": 0.5},
            "training": {"steps": 5, "batch_size": 8, "physical_batch_size": 8, "progress": False, "seed": 3,
                         "augment": {"crop_padding": 1, "flip": True},
                         "gradient_canaries": {"count": 20, "seed": 1}}})
        result = train(cfg, progress=False)
        run = open_run(result.run_dir)
        runs[mode] = (load_file(result.run_dir / WEIGHTS_FILE), result.manifest,
                      gradient_canary_evidence(run=run).scores)
    (wh, mh, sh), (wf, mf, sf) = runs["hooks"], runs["fused"]
    assert sorted(wh) == sorted(wf)
    for k in wh:
        assert torch.allclose(wh[k], wf[k], atol=1e-5, rtol=0), k
    assert mh.privacy.epsilon == mf.privacy.epsilon and mh.privacy.phases[0].noise_multiplier == \
        mf.privacy.phases[0].noise_multiplier
    assert mf.privacy.phases[0].grad_sample_mode == "fused"
    assert np.allclose(sh, sf, atol=1e-4)


def test_fused_mode_keeps_frozen_batchnorm_in_eval_mode_like_hooks():
    """A frozen BatchNorm (running statistics, no trainable parameters) must stay in eval mode in a DP step: in
    train mode it would mix the examples of a batch (and the padding rows in)."""
    x, y = data()

    def model():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
        m[1].running_mean.uniform_(-0.5, 0.5)
        m[1].requires_grad_(False)
        return m

    out = {}
    for mode in ("hooks", "fused"):
        recipe = TrainRecipe(steps=10, batch_size=B, optim=OptimConfig(name="sgd", lr=0.5), dp=True,
                             noise_multiplier=0.5, max_grad_norm=C, grad_sample_mode=mode, physical_batch_size=4)
        st = make_stepper(model=model(), recipe=recipe, sample_rate=B / N, generator=torch.Generator().manual_seed(1),
                          device="cpu")
        st.step(x[:9], y[:9])
        out[mode] = [p.detach().clone() for p in st.close().parameters()]
    for a, b in zip(out["hooks"], out["fused"]):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
