"""One model at a time: the reference for :class:`training.dp.batched.engine.BatchedTrainer`.

Same recipe, sampler, noise streams and optimizer factory as the batched trainer (:mod:`training.dp`), written
directly over an ``nn.Module`` and ``torch.optim``: per-example gradients either by a plain autograd loop
over the batch (``per_example="loop"``, obviously correct, slow) or by ``torch.func.vmap`` over the examples
of this one model (``per_example="vmap"``, the fast one-at-a-time baseline used by the sequential executor).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from training.dp.batched.engine import (augmented_batch, check_model, check_recipe, copies_loss, draw_noise,
                                        member_samplers)
from training.dp.ema import ema_update_
from training.dp.clipping import flat_clip_factors
from training.dp.optim import build_optimizer, set_lr, trainable_names
from training.dp.recipe import TrainRecipe
from training.dp.rng import seeded_init

__all__ = ["train_single"]


def _loss(model: nn.Module, x: Tensor, y: Tensor, label_smoothing: float) -> Tensor:
    """Per-example losses of examples given as M copies each, x (n, M, C, H, W): mean over the copies."""
    n, m = x.shape[:2]
    return copies_loss(model(x.reshape(n * m, *x.shape[2:])).view(n, m, -1), y, label_smoothing=label_smoothing)


def _clipped_sum_loop(model: nn.Module, params: dict[str, nn.Parameter], x: Tensor, y: Tensor,
                      clip: float, label_smoothing: float = 0.0) -> dict[str, Tensor]:
    """Sum over examples (x: (n, M, C, H, W), M copies each) of per-example gradients clipped to norm ``clip``:
    one backward per example."""
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(x.shape[0]):
        model.zero_grad(set_to_none=True)
        _loss(model, x[i:i + 1], y[i:i + 1], label_smoothing).sum().backward()
        g = {n: p.grad.detach().clone() for n, p in params.items()}
        norm = torch.sqrt(sum(v.pow(2).sum() for v in g.values()))
        factor = flat_clip_factors(norm, max_grad_norm=clip)
        for n in total:
            total[n].add_(factor * g[n])
    model.zero_grad(set_to_none=True)
    return total


def _clipped_sum_vmap(model: nn.Module, params: dict[str, nn.Parameter], x: Tensor, y: Tensor,
                      clip: float, label_smoothing: float = 0.0) -> dict[str, Tensor]:
    """Same as :func:`_clipped_sum_loop`, with per-example gradients from ``vmap(grad(...))``."""
    detached = {n: p.detach() for n, p in params.items()}

    def loss(p: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        logits = functional_call(model, p, (xi,))
        return copies_loss(logits.unsqueeze(0), yi.unsqueeze(0), label_smoothing=label_smoothing)[0]

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))(detached, x, y)
    sq = sum(torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).square() for g in per_example.values())
    factor = flat_clip_factors(sq.sqrt(), max_grad_norm=clip)
    return {n: torch.tensordot(factor, g, dims=1) for n, g in per_example.items()}


def train_single(*, model_factory: Callable[[], nn.Module], x: Tensor, y: Tensor, mask: np.ndarray, seed: int,
                 recipe: TrainRecipe, device: torch.device | str = "cpu",
                 per_example: Literal["loop", "vmap"] = "vmap") -> dict[str, Tensor]:
    """Train one model on the members ``mask`` with ``recipe``; return its CPU state dict.

    Args:
        model_factory: builds the model (called once, under :func:`seeded_init` ``(seed)``).
        x: float pool (N, C, H, W) in [0, 1].
        y: int64 labels (N,).
        mask: bool (N,), the pool examples this model may train on.
        seed: non-negative int; fixes initialisation, batches and noise.
        recipe: the :class:`TrainRecipe`.
        device: where to train.
        per_example: "loop" (autograd, one backward per example) or "vmap" (torch.func).

    Returns:
        The trained model's state dict on CPU.

    Raises:
        ConfigError: the model has BatchNorm, active dropout or no trainable parameter.
    """
    if per_example not in ("loop", "vmap"):
        raise ValueError(f"per_example must be 'loop' or 'vmap', got {per_example!r}")
    check_recipe(recipe)
    device = torch.device(device)
    with seeded_init(seed):
        model = model_factory()
    check_model(model)
    model.to(device).train()
    names = trainable_names(model)
    named = dict(model.named_parameters())
    params = {n: named[n] for n in names}
    optimizer = build_optimizer(list(params.values()), recipe.optim, names=names, foreach=False)
    x, y = x.to(device, params[names[0]].dtype), y.to(device)
    ema_model = None
    if recipe.ema.decay is not None:
        ema_model = copy.deepcopy(model).requires_grad_(False)
    [(members, sampler)] = member_samplers(np.asarray(mask, dtype=bool).reshape(1, -1), [seed], recipe)
    clipped_sum = _clipped_sum_loop if per_example == "loop" else _clipped_sum_vmap
    r = recipe
    for t in range(r.steps):
        idx = torch.from_numpy(members[sampler.indices(t)]).to(device)
        xs = augmented_batch(x[idx], r, seed=seed, step=t)  # (n, M, C, H, W)
        chunks = [c for c in torch.split(torch.arange(len(idx), device=device), r.physical_batch_size) if len(c)]
        if r.dp:
            summed = {n: torch.zeros_like(p) for n, p in params.items()}
            for part in chunks:
                for n, g in clipped_sum(model, params, xs[part], y[idx[part]], r.max_grad_norm,
                                        r.label_smoothing).items():
                    summed[n].add_(g)
            noise = draw_noise(seed, t, [p.shape for p in params.values()], std=r.noise_multiplier * r.max_grad_norm,
                               device=device, dtype=params[names[0]].dtype)
            grads = {n: (summed[n] + z) / r.batch_size for n, z in zip(names, noise)}
        else:
            model.zero_grad(set_to_none=True)
            for part in chunks:
                loss = _loss(model, xs[part], y[idx[part]], r.label_smoothing).sum() / max(len(idx), 1)
                loss.backward()
            grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                     for n, p in params.items()}
        for n, p in params.items():
            p.grad = grads[n]
        set_lr(optimizer, r.lr_at(t))
        optimizer.step()
        if ema_model is not None:
            ema_update_(ema_model, model, decay=r.ema_decay_at(t))
    model.zero_grad(set_to_none=True)
    final = ema_model if ema_model is not None else model  # with EMA on, the average is the model
    return {n: v.detach().cpu().clone() for n, v in final.state_dict().items()}
