"""``fastnet`` (training.models.fastnet): the whitening layer against its definition, the members-only
initialisation hook of the standard recipe, and its refusal under DP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foundation.errors import ConfigError
from training.config import ModelConfig, TrainConfig
from training.models import build_model
from training.models.fastnet import FastNet, patch_whitening


def test_whitening_filters_give_identity_covariance_of_patches():
    g = torch.Generator().manual_seed(0)
    mix = torch.tensor([[1.0, 0.5, 0.2], [0.0, 1.0, 0.3], [0.0, 0.0, 0.4]])
    x = torch.einsum("dc,nchw->ndhw", mix, torch.rand(200, 3, 8, 8, generator=g))  # correlated channels
    filters, mean = patch_whitening(x, kernel=2, eps=0.0)
    half = filters[: len(filters) // 2].flatten(1).double()  # the directions; the rest are their negatives
    assert torch.equal(filters[len(filters) // 2:], -filters[: len(filters) // 2])
    patches = torch.nn.functional.unfold(x.double(), 2).transpose(1, 2).reshape(-1, 12)
    z = (patches - mean.double()) @ half.T
    cov = z.T @ z / (len(z) - 1)
    assert torch.allclose(cov, torch.eye(12, dtype=torch.float64), atol=2e-3)


def test_init_from_data_centres_the_first_layer_and_keeps_it_frozen():
    net = FastNet(num_classes=3, widths=(4, 4, 4))
    x = torch.rand(64, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    net.init_from_data(x)
    out = net.whiten(x)  # centred: the mean response of every filter over the patches is 0
    assert out.mean(dim=(0, 2, 3)).abs().max() < 1e-3
    assert not net.whiten.weight.requires_grad and net.whiten.bias.requires_grad
    with pytest.raises(ValueError, match="side >= kernel"):
        patch_whitening(torch.rand(2, 3, 1, 1), kernel=2)


def _setup(dp: bool, whiten_images: int):
    from types import SimpleNamespace

    from training.recipes.common import RunSetup

    rng = np.random.default_rng(0)
    cfg = TrainConfig.model_validate({
        "model": {"arch": "fastnet", "kwargs": {"widths": [4, 4, 4], "whiten_images": whiten_images}},
        "privacy": {"enabled": dp, **({"noise_multiplier": 1.0} if dp else {})}})
    pool = SimpleNamespace(images=SimpleNamespace(x=rng.integers(0, 256, (40, 16, 16, 3), dtype=np.uint8)))
    return RunSetup(cfg=cfg, pool=pool, members=np.arange(0, 40, 2), delta=None, device=torch.device("cpu"))


def test_standard_recipe_whitens_from_a_seeded_sample_of_members_only():
    from training.recipes.common import init_from_members

    setup = _setup(dp=False, whiten_images=8)
    model = build_model(setup.cfg.model, num_classes=3, input_shape=(3, 16, 16), seed=0).module
    before = model.net.whiten.weight.clone()
    assert "8 member images" in init_from_members(setup, model)
    w1 = model.net.whiten.weight.clone()
    assert not torch.equal(before, w1)
    # only members are read: changing every non-member image changes nothing
    setup.pool.images.x[1::2] = 0
    init_from_members(setup, model)
    assert torch.equal(model.net.whiten.weight, w1)
    off = _setup(dp=False, whiten_images=0)
    assert init_from_members(off, build_model(off.cfg.model, num_classes=3, input_shape=(3, 16, 16)).module) is None


def test_whitening_from_members_is_refused_under_dp():
    from training.recipes.common import init_from_members

    setup = _setup(dp=True, whiten_images=8)
    cfg = ModelConfig(arch="fastnet", kwargs={"widths": [4, 4, 4], "whiten_images": 8}, fix_batchnorm=True)
    model = build_model(cfg, num_classes=3, input_shape=(3, 16, 16), seed=0).module
    with pytest.raises(ConfigError, match="whiten_images: 0 under DP"):
        init_from_members(setup, model)
