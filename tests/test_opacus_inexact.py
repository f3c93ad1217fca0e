"""Layers whose per-sample gradients Opacus's own grad samplers get wrong are refused in hooks/ghost modes.

The reference is autograd on one example at a time. The first test shows why the guard exists (it fails, and the
guard can be relaxed, once an Opacus release computes these exactly); the others check the guard and that the
exact modes (functorch, bk) still train such models to the same weights.
"""

from __future__ import annotations

import pytest
import torch
from opacus import GradSampleModule
from torch import nn

from tests.test_dp_engine import stepper_for
from foundation.errors import ConfigError
from training.models.dp_compat import opacus_inexact_layers


def reflect_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), nn.Flatten(), nn.Linear(4 * 36, 2))


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(6, 3, padding_idx=0), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: float images; tokens from the first pixels
        tokens = (x[:, 0, 0, :2] * 5).long().clamp(0, 5)
        return self.head(self.emb(tokens).flatten(1))


def loop_grads(model: nn.Module, param: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = []
    for i in range(len(x)):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1], reduction="sum").backward()
        out.append(param.grad.clone())
    return torch.stack(out)


@pytest.mark.parametrize("force_functorch, exact", [(False, False), (True, True)])
def test_opacus_hooks_are_inexact_for_reflect_padding_and_functorch_is_exact(force_functorch, exact):
    net = reflect_net()
    x, y = torch.randn(5, 3, 6, 6, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 1, 0, 1])
    ref = loop_grads(net, net[0].weight, x, y)
    gsm = GradSampleModule(net, loss_reduction="sum", force_functorch=force_functorch)
    try:
        gsm.zero_grad()
        nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
        err = float((net[0].weight.grad_sample - ref).abs().max())
    finally:
        gsm._close()
    assert (err < 1e-5) == exact, err


def test_inexact_layers_are_named_and_frozen_ones_ignored():
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"), nn.Conv2d(4, 4, 3, padding=1),
                        nn.Embedding(4, 2, padding_idx=1), nn.Embedding(4, 2))
    assert opacus_inexact_layers(net) == ["0 (Conv2d padding_mode='circular')", "2 (Embedding padding_idx=1)"]
    for p in net[0].parameters():
        p.requires_grad_(False)
    assert opacus_inexact_layers(net) == ["2 (Embedding padding_idx=1)"]


@pytest.mark.parametrize("make", [reflect_net, Tokens])
@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_hooks_and_ghost_refuse_them_with_the_fix(make, mode):
    with pytest.raises(ConfigError, match=r"grad_sample_mode: (hooks|ghost): Opacus computes wrong per-sample "
                                          r"gradients for .*use grad_sample_mode: bk or functorch"):
        stepper_for(make(), mode=mode)


@pytest.mark.parametrize("make", [reflect_net, Tokens])
def test_exact_modes_train_them_alike(make):
    x = torch.rand(8, 3, 6, 6, generator=torch.Generator().manual_seed(2))
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    weights = {}
    for mode in ("functorch", "bk"):
        model = make()
        stepper = stepper_for(model, mode=mode, sigma=0.0, C=0.05, B=8, q=1.0, physical=8)
        for _ in range(2):
            stepper.step(x, y)
        weights[mode] = [p.detach().clone() for p in model.parameters()]
    for a, b in zip(weights["functorch"], weights["bk"]):
        assert torch.allclose(a, b, atol=1e-6), float((a - b).abs().max())
