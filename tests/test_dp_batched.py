"""Batched training of many small models (training.dp.batched) against one-at-a-time references.

Tiny synthetic data (N=64 images of 3x8x8), K=3 models, a few steps: every test runs in seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from training.config import OptimConfig
from training.dp.batched import batched_memory_bytes, fits_batched, train_many, train_one
from training.dp.batched.engine import member_samplers
from training.dp.recipe import TrainRecipe
from training.dp.rng import seeded_init
from training.dp.sampling import make_sampler
from foundation.errors import ConfigError, DataError

N, K = 64, 3


def tiny_cnn() -> nn.Module:
    """Conv + GroupNorm + tanh, strided conv, linear: the kind of shadow model train_many is for."""
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.Tanh(),
                         nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 16, 5))


def tiny_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 12), nn.Tanh(), nn.Linear(12, 5))


class ZeroGrad(nn.Module):
    """Logits independent of the parameter ``w``: its gradient is exactly zero, so DP updates are pure noise."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :5] + 0.0 * self.w.sum()


class WithBuffersAndFrozen(nn.Module):
    """A persistent buffer, a non-persistent buffer and a frozen parameter beside trainable ones."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((1,), 2.0))
        self.register_buffer("offset", torch.full((1,), 0.1), persistent=False)
        self.frozen = nn.Linear(3 * 8 * 8, 8).requires_grad_(False)
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.frozen(x.flatten(1) * self.scale - self.offset)))


@pytest.fixture(scope="module")
def pool() -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, 3, 8, 8, generator=g)
    y = torch.randint(0, 5, (N,), generator=g)
    masks = np.random.default_rng(1).random((K, N)) < 0.5
    return x, y, masks


def _max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n]).abs().max() / max(1.0, float(b[n].abs().max()))) for n in b)


def _initial(factory, seed: int) -> dict[str, torch.Tensor]:
    with seeded_init(seed):
        return {n: v.clone() for n, v in factory().state_dict().items()}


def recipe(*, steps: int, batch_size: int, lr: float = 0.1, optimizer: str = "sgd", momentum: float = 0.0,
           weight_decay: float = 0.0, schedule: str = "constant", noise_multiplier: float = 1.0,
           **kw) -> TrainRecipe:
    """A TrainRecipe from flat keywords (σ = 1 unless given, as the batched trainer's old default)."""
    optim = OptimConfig(name=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay, schedule=schedule)
    return TrainRecipe(steps=steps, batch_size=batch_size, optim=optim, noise_multiplier=noise_multiplier, **kw)


RECIPES = {
    "sgd": dict(optimizer="sgd", lr=0.3, momentum=0.9, weight_decay=1e-3),
    "adam": dict(optimizer="adam", lr=0.02),
}


@pytest.mark.parametrize("dp", [True, False], ids=["dp", "nodp"])
@pytest.mark.parametrize("opt", list(RECIPES))
def test_batched_equals_one_at_a_time_autograd_loop(pool, opt, dp):
    x, y, masks = pool
    common = dict(recipe=recipe(steps=4, batch_size=8, dp=dp, noise_multiplier=0.8, max_grad_norm=0.5,
                                physical_batch_size=5, **RECIPES[opt]))
    batched = train_many(model_factory=tiny_cnn, x=x, y=y, masks=masks, seeds=[3, 4, 5], executor="batched",
                         **common)
    for k, seed in enumerate([3, 4, 5]):
        ref = train_one(model_factory=tiny_cnn, x=x, y=y, mask=masks[k], seed=seed, per_example="loop", **common)
        assert batched[k].keys() == ref.keys() == tiny_cnn().state_dict().keys()
        assert _max_rel_diff(batched[k], ref) < 1e-5
        assert _max_rel_diff(ref, _initial(tiny_cnn, seed)) > 1e-3  # training moved the weights
    assert _max_rel_diff(batched[0], batched[1]) > 1e-3  # different seeds and masks, different models


def test_sequential_executor_and_schedule_match_batched(pool):
    x, y, masks = pool
    r = recipe(steps=5, batch_size=10, optimizer="adamw", lr=0.05, weight_decay=0.1, dp=True,
               noise_multiplier=1.0, max_grad_norm=1.0, schedule="cosine")
    common = dict(recipe=r)
    a = train_many(model_factory=tiny_mlp, x=x, y=y, masks=masks, seeds=[0, 1, 2], executor="batched",
                   max_models_per_batch=2, **common)
    b = train_many(model_factory=tiny_mlp, x=x, y=y, masks=masks, seeds=[0, 1, 2], executor="sequential", **common)
    c = train_many(model_factory=tiny_mlp, x=x, y=y, masks=masks, seeds=[0, 1, 2], executor="batched",
                   recipe=recipe(steps=5, batch_size=10, optimizer="adamw", lr=0.05, weight_decay=0.1))
    for k in range(K):
        assert _max_rel_diff(a[k], b[k]) < 1e-5
        assert _max_rel_diff(a[k], c[k]) > 1e-4  # the schedule is applied


def test_buffers_and_frozen_parameters(pool):
    x, y, masks = pool
    common = dict(recipe=recipe(steps=3, batch_size=8, lr=0.5, momentum=0.5, dp=True, noise_multiplier=0.5))
    out = train_many(model_factory=WithBuffersAndFrozen, x=x, y=y, masks=masks, seeds=[7, 8, 9],
                     executor="batched", **common)
    ref = train_one(model_factory=WithBuffersAndFrozen, x=x, y=y, mask=masks[1], seed=8, per_example="loop",
                    **common)
    init = _initial(WithBuffersAndFrozen, 8)
    assert list(out[1]) == list(init) == ["scale", "frozen.weight", "frozen.bias", "head.weight", "head.bias"]
    assert _max_rel_diff(out[1], ref) < 1e-5
    assert torch.equal(out[1]["frozen.weight"], init["frozen.weight"])
    assert not torch.equal(out[1]["head.weight"], init["head.weight"])


@pytest.mark.parametrize("dp", [True, False], ids=["dp", "nodp"])
def test_model_ignores_examples_outside_its_mask(pool, dp):
    x, y, masks = pool
    common = dict(recipe=recipe(steps=4, batch_size=8, lr=0.2, momentum=0.9, dp=dp, noise_multiplier=1.0),
                  executor="batched")
    before = train_many(model_factory=tiny_cnn, x=x, y=y, masks=masks, seeds=[0, 1, 2], **common)
    outside = ~masks[0]
    assert (outside & masks[1]).any()  # model 1 trains on some of the examples we change
    x2, y2 = x.clone(), y.clone()
    x2[torch.from_numpy(outside)] = torch.rand(int(outside.sum()), 3, 8, 8)
    y2[torch.from_numpy(outside)] = (y2[torch.from_numpy(outside)] + 1) % 5
    after = train_many(model_factory=tiny_cnn, x=x2, y=y2, masks=masks, seeds=[0, 1, 2], **common)
    assert all(torch.equal(before[0][n], after[0][n]) for n in before[0])
    assert _max_rel_diff(before[1], after[1]) > 1e-4


@pytest.mark.parametrize("executor", ["batched", "sequential"])
def test_dp_noise_std_matches_lr_sigma_c_over_b(pool, executor):
    x, y, masks = pool
    lr, sigma, clip, b = 0.5, 2.0, 0.5, 8
    expected = lr * sigma * clip / b
    out = {}
    for steps in (1, 4):
        sds = train_many(model_factory=ZeroGrad, x=x, y=y, masks=masks, seeds=[0, 1, 2], executor=executor,
                         recipe=recipe(steps=steps, batch_size=b, lr=lr, noise_multiplier=sigma, max_grad_norm=clip))
        out[steps] = torch.stack([sd["w"] for sd in sds])
    w1 = out[1]
    assert abs(float(w1.std()) / expected - 1) < 0.03
    assert abs(float(w1.mean())) < 4 * expected / np.sqrt(w1.numel())
    assert abs(float(out[4].std()) / (2 * expected) - 1) < 0.03  # independent noise per step: std grows as sqrt(T)
    corr = np.corrcoef(w1.numpy())
    assert np.abs(corr[np.triu_indices(K, 1)]).max() < 0.1  # independent noise per model


@pytest.mark.parametrize("dp", [True, False], ids=["dp", "nodp"])
def test_empty_poisson_batches(pool, dp):
    x, y, _ = pool
    masks = np.zeros((2, N), dtype=bool)
    masks[0, :10], masks[1, 10:20] = True, True
    seed = next(s for s in range(100)
                if any(len(make_sampler(sampling="poisson", n=10, batch_size=1, seed=s).indices(t)) == 0
                       for t in range(4)))
    common = dict(recipe=recipe(steps=4, batch_size=1, lr=0.2, momentum=0.9, dp=dp, noise_multiplier=0.5))
    out = train_many(model_factory=tiny_mlp, x=x, y=y, masks=masks, seeds=[0, seed], executor="batched", **common)
    for per_example in ("loop", "vmap"):
        ref = train_one(model_factory=tiny_mlp, x=x, y=y, mask=masks[1], seed=seed, per_example=per_example,
                        **common)
        assert _max_rel_diff(out[1], ref) < 1e-5


def test_dp_without_noise_or_clipping_is_plain_minibatch_sgd(pool):
    x, y, masks = pool
    common = dict(steps=6, batch_size=8, lr=0.3, momentum=0.9, sampling="shuffle")
    run = dict(model_factory=tiny_cnn, x=x, y=y, masks=masks, seeds=[0, 1, 2], executor="batched")
    dp = train_many(**run, recipe=recipe(dp=True, noise_multiplier=0.0, max_grad_norm=1e6, **common))
    plain = train_many(**run, recipe=recipe(dp=False, **common))
    clipped = train_many(**run, recipe=recipe(dp=True, noise_multiplier=0.0, max_grad_norm=1e-3, **common))
    for k in range(K):
        assert _max_rel_diff(dp[k], plain[k]) < 1e-5
        assert _max_rel_diff(clipped[k], plain[k]) > 1e-3


def test_each_model_samples_its_members_with_the_shared_sampler():
    masks = np.random.default_rng(0).random((2, 200)) < 0.5
    r = recipe(steps=1, batch_size=10)
    (members, sampler), _ = member_samplers(masks, [4, 5], r)
    np.testing.assert_array_equal(members, np.flatnonzero(masks[0]))
    same = make_sampler(sampling="poisson", n=len(members), batch_size=10, seed=4)
    np.testing.assert_array_equal(sampler.indices(7), same.indices(7))
    sizes = [len(sampler.indices(t)) for t in range(400)]
    assert abs(np.mean(sizes) - 10) < 0.6
    (members, shuffle), _ = member_samplers(masks, [4, 5], recipe(steps=1, batch_size=10, sampling="shuffle"))
    per_epoch = len(members) // 10
    epoch = np.concatenate([members[shuffle.indices(t)] for t in range(per_epoch)])
    assert len(epoch) == len(set(epoch)) == per_epoch * 10 and set(epoch) <= set(members)


def test_fits_batched_and_auto(pool):
    x, y, masks = pool
    model = tiny_cnn()
    small = batched_memory_bytes(model, 2, 16, input_shape=(3, 8, 8))
    assert batched_memory_bytes(model, 4, 16, input_shape=(3, 8, 8)) > small
    assert fits_batched(model, 2, 16, input_shape=(3, 8, 8), budget_bytes=small)
    assert not fits_batched(model, 2, 16, input_shape=(3, 8, 8), budget_bytes=small - 1)
    common = dict(recipe=recipe(steps=2, batch_size=8, lr=0.1), seeds=[0, 1, 2])
    auto = train_many(model_factory=tiny_cnn, x=x, y=y, masks=masks, executor="auto", **common)
    batched = train_many(model_factory=tiny_cnn, x=x, y=y, masks=masks, executor="batched", **common)
    assert all(_max_rel_diff(a, b) < 1e-6 for a, b in zip(auto, batched))


def test_rejects_batchnorm_dropout_and_bad_inputs(pool):
    x, y, masks = pool
    one = recipe(steps=1, batch_size=8, lr=0.1)
    common = dict(x=x, y=y, masks=masks, seeds=[0, 1, 2], recipe=one, executor="batched")

    def bn() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 36, 5))

    def dropout() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(192, 5))

    with pytest.raises(ConfigError, match="BatchNorm.*GroupNorm"):
        train_many(model_factory=bn, **common)
    with pytest.raises(ValueError, match="BatchNorm"):  # ConfigError is a ValueError
        train_one(model_factory=bn, x=x, y=y, mask=masks[0], seed=0, recipe=one)
    with pytest.raises(ConfigError, match="dropout"):
        train_many(model_factory=dropout, **common)
    with pytest.raises(DataError, match=r"masks\[1\]"):
        train_many(model_factory=tiny_mlp, **{**common, "masks": np.stack([masks[0], ~masks[0] & masks[0],
                                                                            masks[2]])})
    with pytest.raises(ValueError, match="masks must be bool"):
        train_many(model_factory=tiny_mlp, **{**common, "masks": masks[:, :10]})
    with pytest.raises(ValueError, match="seeds"):
        train_many(model_factory=tiny_mlp, **{**common, "seeds": [0, 1]})
    with pytest.raises(ConfigError, match="flat only"):
        train_many(model_factory=tiny_mlp, **{**common, "recipe": recipe(steps=1, batch_size=8, clipping="per_layer")})
    with pytest.raises(ConfigError, match="secure mode"):
        train_many(model_factory=tiny_mlp, **{**common, "recipe": recipe(steps=1, batch_size=8, secure_mode=True)})
    with pytest.raises(ValueError, match="steps"):
        recipe(steps=0, batch_size=8)
    with pytest.raises(ValueError, match="executor"):
        train_many(model_factory=tiny_mlp, **{**common, "executor": "threads"})
    with pytest.raises(ValueError, match="executor"):
        train_many(model_factory=tiny_mlp, **{**common, "executor": "process"})  # gone: the ray executor spreads
    with pytest.raises(ValueError, match="y must be"):
        train_many(model_factory=tiny_mlp, **{**common, "y": y.int()})
    with pytest.raises(ValueError, match="sampling"):
        TrainRecipe(steps=1, batch_size=1, sampling="uniform")
