"""The two DP-SGD engines agree: Opacus's stepper (training.dp.engine) and the batched trainer (training.dp.batched).

"Reference models trained with the target's own recipe" rests on this: the target is trained by the Opacus
engine, its reference models by the batched one, from the same :class:`TrainRecipe`.

* Exact: same initial weights, same recipe, same seed → the same weights to 1e-6 after several steps, with
  σ = 0 and q = 1 (no randomness at all), and also with Poisson sampling and noise (both engines draw batches
  from the same sampler and noise from the same per-step generator, in the same parameter order).
* In distribution: one step of a tiny model over 200 seeds per engine, disjoint seeds: the per-coordinate
  noise of the update has std σ·C/B (analytic), mean zero around the σ = 0 update, and the two engines' noise
  samples pass a two-sample Kolmogorov–Smirnov test against each other.

The Opacus side replays :func:`training.loop.run_phase`'s per-step calls: batch ``sampler.indices(t)``,
``seed_noise(generator, seed, t)``, ``stepper.step``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from training.config import AugmentConfig, EMAConfig, OptimConfig
from training.dp.batched import train_many, train_one
from training.dp.engine import make_stepper
from training.dp.recipe import TrainRecipe
from training.dp.rng import seed_noise
from training.dp.sampling import make_sampler

N = 24


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 2 * 2, 3))


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.rand(N, 3, 4, 4, generator=g), torch.randint(0, 3, (N,), generator=g)


def opacus_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, recipe: TrainRecipe, *, seed: int,
                 physical: int | None = None, mode: str | None = None,
                 augment: bool = False) -> dict[str, torch.Tensor]:
    """The Opacus engine over all N examples, step by step as the training loop drives it (``mode``: the
    grad-sample mode, None: the recipe's; ``augment``: the loop's per-step augmentation stream); returns the model
    as the loop saves it (``stepper.close()``: the EMA weights when the recipe averages them)."""
    import dataclasses

    from training.dp.rng import augment_generator

    recipe = dataclasses.replace(recipe, grad_sample_mode=mode or recipe.grad_sample_mode,
                                 physical_batch_size=physical or recipe.physical_batch_size)
    sampler = make_sampler(sampling=recipe.sampling, n=len(y), batch_size=recipe.batch_size, seed=seed)
    generator = torch.Generator()
    stepper = make_stepper(model=model, recipe=recipe, sample_rate=sampler.sample_rate, generator=generator,
                           device="cpu")
    for t in range(recipe.steps):
        idx = torch.from_numpy(sampler.indices(t))
        seed_noise(generator, seed, t)
        stepper.step(x[idx], y[idx], augment_generator=augment_generator(seed, t) if augment else None)
    return {k: v.detach().clone() for k, v in stepper.close().state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


OPTIMS = {"sgd": OptimConfig(name="sgd", lr=0.5, momentum=0.9, weight_decay=1e-3),
          "adamw": OptimConfig(name="adamw", lr=0.05, weight_decay=0.1, schedule="cosine")}


@pytest.mark.parametrize("mode", ["hooks", "functorch", "ghost"])
@pytest.mark.parametrize("opt", list(OPTIMS))
def test_engines_agree_exactly_without_noise_and_sampling(data, opt, mode):
    x, y = data
    model0 = tiny_model()
    recipe = TrainRecipe(steps=5, batch_size=N, optim=OPTIMS[opt], noise_multiplier=0.0, max_grad_norm=0.05,
                         physical_batch_size=5)
    a = opacus_train(copy.deepcopy(model0), x, y, recipe, seed=3, physical=7, mode=mode)
    b = train_many(model_factory=functools.partial(copy.deepcopy, model0), x=x, y=y,
                   masks=np.ones((1, N), dtype=bool), seeds=[3], recipe=recipe, executor="batched")[0]
    moved = max_diff(a, model0.state_dict())
    print(f"\n[agreement sigma=0 q=1 {opt}/{mode}] max |opacus - batched| = {max_diff(a, b):.2e}, "
          f"max |update| = {moved:.2e}")
    assert moved > 1e-2  # training moved the weights
    assert max_diff(a, b) < 1e-6
    # clipping is active: a much larger C gives other weights
    loose = opacus_train(copy.deepcopy(model0), x, y, TrainRecipe(**{**recipe.__dict__, "max_grad_norm": 100.0}),
                         seed=3)
    assert max_diff(a, loose) > 1e-3


@pytest.mark.parametrize("sampling, batch", [("poisson", N // 2), ("shuffle", 8)])
def test_engines_agree_exactly_with_sampling_and_noise_for_the_same_seed(data, sampling, batch):
    x, y = data
    model0 = tiny_model()
    recipe = TrainRecipe(steps=6, batch_size=batch, optim=OPTIMS["sgd"], noise_multiplier=0.8, max_grad_norm=0.5,
                         sampling=sampling)
    a = opacus_train(copy.deepcopy(model0), x, y, recipe, seed=11, physical=5)
    factory = functools.partial(copy.deepcopy, model0)
    b = train_one(model_factory=factory, x=x, y=y, mask=np.ones(N, dtype=bool), seed=11, recipe=recipe,
                  per_example="loop")
    other = opacus_train(copy.deepcopy(model0), x, y, recipe, seed=12)
    print(f"\n[agreement sigma=0.8 {sampling}] max |opacus - batched| = {max_diff(a, b):.2e}, "
          f"another seed differs by {max_diff(a, other):.2e}")
    assert max_diff(a, b) < 1e-6
    assert max_diff(a, other) > 1e-2  # the seed matters: noise and batches are really there


def test_engines_give_the_same_distribution_of_noisy_updates(data):
    """One SGD step (lr 1, q = 1) over 200 disjoint seeds per engine: update = −(clipped sum + N(0, σ²C²))/B."""
    x, y = data
    sigma, C, B, n_seeds = 1.5, 0.2, N, 200
    model0 = tiny_model()
    recipe = TrainRecipe(steps=1, batch_size=B, optim=OptimConfig(name="sgd", lr=1.0), noise_multiplier=sigma,
                         max_grad_norm=C)
    flat = lambda sd: torch.cat([sd[k].reshape(-1) for k in sd])  # noqa: E731
    theta0 = flat(model0.state_dict())
    noiseless = flat(opacus_train(copy.deepcopy(model0), x, y, TrainRecipe(**{**recipe.__dict__,
                                                                            "noise_multiplier": 0.0}), seed=0))
    ua = torch.stack([flat(opacus_train(copy.deepcopy(model0), x, y, recipe, seed=s)) for s in range(n_seeds)])
    sds = train_many(model_factory=functools.partial(copy.deepcopy, model0), x=x, y=y,
                     masks=np.ones((n_seeds, N), dtype=bool), seeds=list(range(10_000, 10_000 + n_seeds)),
                     recipe=recipe, executor="batched")
    ub = torch.stack([flat(sd) for sd in sds])
    std = sigma * C / B  # the analytic noise std per coordinate of the update (lr = 1)
    za = ((ua - noiseless) / std).numpy().ravel()  # standardised noise, N(0, 1) if the engine is right
    zb = ((ub - noiseless) / std).numpy().ravel()
    d = theta0.numel()
    ks_ab = stats.ks_2samp(za, zb)
    ks_a, ks_b = stats.kstest(za, "norm"), stats.kstest(zb, "norm")
    var_a, var_b = ua.var(0).mean().item() / std**2, ub.var(0).mean().item() / std**2
    print(f"\n[agreement in distribution] {n_seeds} seeds x {d} coordinates per engine: analytic std "
          f"sigma*C/B = {std:.4g}; empirical std / analytic: opacus {np.sqrt(var_a):.4f}, batched "
          f"{np.sqrt(var_b):.4f}; mean z: opacus {za.mean():+.4f}, batched {zb.mean():+.4f}; "
          f"KS two-sample p = {ks_ab.pvalue:.3f}; KS vs N(0,1) p = {ks_a.pvalue:.3f} / {ks_b.pvalue:.3f}")
    assert not torch.equal(ua[0], ua[1])  # noise differs between seeds
    for z, var in ((za, var_a), (zb, var_b)):
        assert abs(np.sqrt(var) - 1) < 0.03  # per-coordinate std over seeds = σC/B
        assert abs(z.mean()) < 4 / np.sqrt(z.size)  # centred on the noiseless update
    assert ks_ab.pvalue > 1e-3 and ks_a.pvalue > 1e-3 and ks_b.pvalue > 1e-3


AUGMENTED = {
    "crop+flip": dict(augment=AugmentConfig(crop_padding=1, flip=True)),
    "crop+flip, zeros, x3 copies": dict(augment=AugmentConfig(crop_padding=1, padding_mode="zeros", flip=True,
                                                             multiplicity=3)),
    "smoothing + EMA": dict(label_smoothing=0.1, ema=EMAConfig(decay=0.9)),
    "all": dict(augment=AugmentConfig(crop_padding=2, flip=True, multiplicity=2), label_smoothing=0.2,
                ema=EMAConfig(decay=0.8, warmup=False)),
}


@pytest.mark.parametrize("dp", [True, False], ids=["dp", "non-dp"])
@pytest.mark.parametrize("name", list(AUGMENTED))
def test_engines_agree_with_augmentation_smoothing_and_ema(data, name, dp):
    """σ = 0, Poisson batches: the Opacus engine (as the loop drives it) and both batched-engine executors give the
    same model for the same seed with the recipe's augmentation, multiplicity, label smoothing and EMA."""
    x, y = data
    model0 = tiny_model()
    recipe = TrainRecipe(steps=5, batch_size=N // 2, optim=OPTIMS["sgd"], noise_multiplier=0.0, max_grad_norm=0.05,
                         dp=dp, physical_batch_size=4, **AUGMENTED[name])
    a = opacus_train(copy.deepcopy(model0), x, y, recipe, seed=5, physical=5, augment=True)
    factory = functools.partial(copy.deepcopy, model0)
    b = train_many(model_factory=factory, x=x, y=y, masks=np.ones((2, N), dtype=bool), seeds=[5, 6], recipe=recipe,
                   executor="batched")[0]
    c = train_one(model_factory=factory, x=x, y=y, mask=np.ones(N, dtype=bool), seed=5, recipe=recipe,
                  per_example="loop")
    plain = opacus_train(copy.deepcopy(model0), x, y, dataclasses.replace(
        recipe, augment=AugmentConfig(), label_smoothing=0.0, ema=EMAConfig()), seed=5, physical=5, augment=True)
    print(f"\n[agreement {name} dp={dp}] max |opacus - batched| = {max_diff(a, b):.2e}, |opacus - loop| = "
          f"{max_diff(a, c):.2e}, effect of the options {max_diff(a, plain):.2e}")
    assert max_diff(a, b) < 1e-6 and max_diff(a, c) < 1e-6
    assert max_diff(a, plain) > 1e-4  # the options change the model: they really ran in all three


def test_multiplicity_averages_copies_before_clipping(data):
    """One DP step, lr 1, σ = 0, q = 1, M = 2 identical copies (no transform): the update equals M = 1's (an example's
    gradient is the mean of its copies' gradients, not their sum, so clipping and the sensitivity C are unchanged).
    That the mean is taken *before* clipping with distinct copies is the agreement above with ``train_one``'s
    ``per_example="loop"`` reference, which clips the gradient of each example's mean loss over its copies."""
    x, y = data
    model0 = tiny_model()
    base = TrainRecipe(steps=1, batch_size=N, optim=OptimConfig(name="sgd", lr=1.0), noise_multiplier=0.0,
                       max_grad_norm=0.01)
    one = opacus_train(copy.deepcopy(model0), x, y, base, seed=0, physical=7, augment=True)
    two = opacus_train(copy.deepcopy(model0), x, y, dataclasses.replace(
        base, augment=AugmentConfig(multiplicity=2)), seed=0, physical=7, augment=True)
    assert max_diff(one, two) < 1e-6
    assert max_diff(one, model0.state_dict()) > 1e-4


def test_functorch_per_sample_gradients_average_copies_alike(data):
    """Multiplicity with ``grad_sample_mode: functorch``: the same model as the hooks mode and the batched engine."""
    x, y = data
    model0 = tiny_model()
    recipe = TrainRecipe(steps=3, batch_size=N // 2, optim=OPTIMS["sgd"], noise_multiplier=0.0, max_grad_norm=0.05,
                         physical_batch_size=4, **AUGMENTED["all"])
    hooks = opacus_train(copy.deepcopy(model0), x, y, recipe, seed=2, physical=5, augment=True)
    func = opacus_train(copy.deepcopy(model0), x, y, dataclasses.replace(
        recipe, grad_sample_mode="functorch"), seed=2, physical=5, augment=True)
    batched = train_one(model_factory=functools.partial(copy.deepcopy, model0), x=x, y=y,
                        mask=np.ones(N, dtype=bool), seed=2, recipe=recipe)
    assert max_diff(hooks, func) < 1e-6 and max_diff(func, batched) < 1e-6
