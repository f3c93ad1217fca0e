"""Hutchinson's tr(H) estimator against Hessians computed directly, and the decelerator formula."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from training.hessian import (HessianMonitor, decelerator, hutchinson_trace, model_hessian_trace,
                              rademacher_like)


def _tiny_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3))


def _data(seed: int = 1, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g), torch.randint(0, 3, (n,), generator=g)


def _exact_hessian(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names: list[str]) -> torch.Tensor:
    """The full Hessian of the mean cross-entropy over the flattened parameters ``names`` (slow, obvious)."""
    params = dict(model.named_parameters())
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]
    flat = torch.cat([params[n].detach().reshape(-1) for n in names])

    def loss(w: torch.Tensor) -> torch.Tensor:
        parts = torch.split(w, sizes)
        p = {n: t.reshape(s) for n, t, s in zip(names, parts, shapes)}
        return nn.functional.cross_entropy(functional_call(model, p, (x,)), y)

    return torch.autograd.functional.hessian(loss, flat)


def test_quadratic_trace_is_exact_for_diagonal_and_unbiased_otherwise():
    a = torch.tensor([[2.0, 1.0], [1.0, 3.0]])
    w = torch.zeros(2, requires_grad=True)
    est = hutchinson_trace(lambda: 0.5 * w @ a @ w, [w], probes=64, generator=torch.Generator().manual_seed(0))
    # vᵀAv = 2 + 3 + 2·v0·v1·1 ∈ {3, 7}: mean over probes is 5 ± the sampling error of the cross term
    assert set(round(v, 6) for v in est.values) <= {3.0, 7.0}
    assert abs(est.mean - 5.0) <= 4 * est.stderr + 1e-9
    diag = torch.diag(torch.tensor([1.5, -0.5, 4.0]))
    u = torch.ones(3, requires_grad=True)
    est = hutchinson_trace(lambda: 0.5 * u @ diag @ u, [u], probes=3, generator=torch.Generator().manual_seed(1))
    assert est.values == pytest.approx((5.0, 5.0, 5.0)) and est.stderr == pytest.approx(0.0)


def test_each_probe_equals_the_quadratic_form_of_the_exact_hessian():
    model = _tiny_mlp()
    x, y = _data()
    names = [n for n, _ in model.named_parameters()]
    h = _exact_hessian(model, x, y, names)
    est = model_hessian_trace(model, x, y, probes=5, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)  # replay the same probes
    params = list(model.parameters())
    for value in est.values:
        v = torch.cat([rademacher_like(p, gen).reshape(-1) for p in params])
        assert value == pytest.approx(float(v @ h @ v), rel=1e-4, abs=1e-5)


def test_hutchinson_converges_to_the_exact_trace():
    model = _tiny_mlp(3)
    x, y = _data(4)
    names = [n for n, _ in model.named_parameters()]
    exact = float(torch.trace(_exact_hessian(model, x, y, names)))
    small = model_hessian_trace(model, x, y, probes=20, generator=torch.Generator().manual_seed(0))
    big = model_hessian_trace(model, x, y, probes=2000, generator=torch.Generator().manual_seed(0))
    assert abs(big.mean - exact) <= 4 * big.stderr
    assert big.stderr < small.stderr / 5  # ~1/sqrt(m): 10x more precise for 100x more probes
    assert abs(big.mean - exact) <= 0.05 * abs(exact) + 4 * big.stderr


def test_trace_is_over_trainable_parameters_only_and_mode_is_restored():
    model = _tiny_mlp(5)
    x, y = _data(6)
    for p in model[0].parameters():
        p.requires_grad_(False)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    exact = float(torch.trace(_exact_hessian(model, x, y, names)))
    model.train()
    est = model_hessian_trace(model, x, y, probes=1500, generator=torch.Generator().manual_seed(2))
    assert model.training
    assert abs(est.mean - exact) <= 4 * est.stderr + 1e-6


def test_same_generator_seed_same_estimate():
    model = _tiny_mlp()
    x, y = _data()
    a = model_hessian_trace(model, x, y, probes=4, generator=torch.Generator().manual_seed(11))
    b = model_hessian_trace(model, x, y, probes=4, generator=torch.Generator().manual_seed(11))
    c = model_hessian_trace(model, x, y, probes=4, generator=torch.Generator().manual_seed(12))
    assert a == b and a.values != c.values


def test_hutchinson_rejects_bad_input():
    w = torch.zeros(2, requires_grad=True)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="probes"):
        hutchinson_trace(lambda: (w ** 2).sum(), [w], probes=0, generator=gen)
    with pytest.raises(ValueError, match="requires_grad"):
        hutchinson_trace(lambda: (w ** 2).sum(), [torch.zeros(2)], probes=1, generator=gen)
    with pytest.raises(ValueError, match="scalar"):
        hutchinson_trace(lambda: w ** 2, [w], probes=1, generator=gen)
    with pytest.raises(ValueError, match="not finite"):
        hutchinson_trace(lambda: (w ** 2).sum() * float("nan"), [w], probes=1, generator=gen)
    est = hutchinson_trace(lambda: (3 * w).sum(), [w], probes=2, generator=gen)  # linear: H = 0
    assert est.mean == 0.0
    assert math.isnan(hutchinson_trace(lambda: (w ** 2).sum(), [w], probes=1, generator=gen).stderr)


def test_decelerator_formula():
    assert decelerator(sigma=2.0, trace_h=10.0, batch_size=5, clip_norm=1.0) == pytest.approx(8.0)
    assert decelerator(sigma=1.0, trace_h=10.0, batch_size=5, clip_norm=2.0) == pytest.approx(0.5)
    assert decelerator(sigma=0.0, trace_h=10.0, batch_size=5, clip_norm=1.0) == 0.0
    # linear in tr(H), quadratic in sigma, inverse in B and c^2
    base = decelerator(sigma=1.3, trace_h=7.0, batch_size=64, clip_norm=0.5)
    assert decelerator(sigma=2.6, trace_h=7.0, batch_size=64, clip_norm=0.5) == pytest.approx(4 * base)
    assert decelerator(sigma=1.3, trace_h=14.0, batch_size=128, clip_norm=0.5) == pytest.approx(base)
    assert decelerator(sigma=1.3, trace_h=7.0, batch_size=64, clip_norm=1.0) == pytest.approx(base / 4)
    for bad in (dict(sigma=-1.0), dict(batch_size=0), dict(clip_norm=0.0), dict(trace_h=float("inf"))):
        kwargs = dict(sigma=1.0, trace_h=1.0, batch_size=1, clip_norm=1.0) | bad
        with pytest.raises(ValueError, match=next(iter(bad))):
            decelerator(**kwargs)


def test_monitor_reads_live_weights_and_is_reproducible_per_step():
    live = _tiny_mlp(0)
    template = _tiny_mlp(9)  # other weights: the monitor must overwrite them
    x, y = _data()
    mon = HessianMonitor(template, x, y, probes=4, sigma=1.0, batch_size=32, clip_norm=1.0, seed=5)
    a = mon.measure(live, step=10)
    b = mon.measure(live, step=10)
    direct = model_hessian_trace(_tiny_mlp(0), x, y, probes=1500, generator=torch.Generator().manual_seed(0))
    assert a == b
    assert abs(a["trace_h"] - direct.mean) < 6 * a["trace_h_stderr"] + 4 * direct.stderr
    assert a["decelerator"] == pytest.approx(a["trace_h"] / 32)
    mon.sigma = None  # no DP: no decelerator
    assert "decelerator" not in mon.measure(live, step=10)
