"""Train many small reference (shadow) models at once, each on its own subset of a pool.

Membership-inference attacks such as LiRA (Carlini et al. 2022, "Membership Inference Attacks From First
Principles") and RMIA (Zarifzadeh et al. 2024) need many reference models trained with the target's recipe
(DP-SGD included) on random halves of the pool. For small models one model per process leaves the machine
idle: :func:`train_many` stacks K models' parameters and runs them in lock-step with ``torch.func``
(``stack_module_state`` + ``functional_call`` + ``vmap`` over models of ``vmap`` over examples of ``grad``).

Every model k sees only the examples of ``masks[k]``; its batches, initialisation and DP noise depend only
on ``seeds[k]`` and the step (the shared blocks of :mod:`training.dp`: :func:`~training.dp.sampling.make_sampler`,
:func:`~training.dp.rng.derive_seed`), so :func:`train_one` with the same seed gives the same model, whatever
the executor and whichever other models share its batch. Both take the :class:`~training.dp.recipe.TrainRecipe`
the Opacus engine takes (flat clipping only).

>>> import torch, numpy as np
>>> from torch import nn
>>> from training.config import OptimConfig
>>> x, y = torch.rand(16, 3, 4, 4), torch.arange(16) % 2
>>> masks = np.ones((2, 16), dtype=bool)
>>> recipe = TrainRecipe(steps=2, batch_size=4, optim=OptimConfig(lr=0.1), noise_multiplier=1.0)
>>> sds = train_many(model_factory=lambda: nn.Sequential(nn.Flatten(), nn.Linear(48, 2)), x=x, y=y,
...                  masks=masks, seeds=[0, 1], recipe=recipe, executor="batched")
>>> [sorted(sd) for sd in sds]
[['1.bias', '1.weight'], ['1.bias', '1.weight']]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from training.device import free_memory_bytes, is_cuda
from training.dp.batched.engine import BatchedTrainer, check_model, check_recipe
from training.dp.batched.single import train_single
from training.dp.recipe import TrainRecipe
from training.dp.rng import seeded_init
from foundation.errors import DataError

__all__ = ["train_many", "train_one", "fits_batched", "batched_memory_bytes", "TrainRecipe", "BatchedTrainer"]

Executor = Literal["auto", "batched", "sequential"]
_BYTES = 4


def _check_pool(x: Tensor, y: Tensor) -> None:
    if not isinstance(x, Tensor) or x.ndim != 4 or not x.is_floating_point():
        raise ValueError(f"x must be a float tensor (N, C, H, W) in [0, 1], got "
                         f"{type(x).__name__} {getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}")
    if not isinstance(y, Tensor) or y.ndim != 1 or y.dtype != torch.int64 or len(y) != len(x):
        raise ValueError(f"y must be an int64 tensor of shape ({len(x)},), got "
                         f"{type(y).__name__} {getattr(y, 'dtype', '')} {tuple(getattr(y, 'shape', ()))}")


def _as_masks(masks: Tensor | np.ndarray, n: int) -> np.ndarray:
    m = masks.detach().cpu().numpy() if isinstance(masks, Tensor) else np.asarray(masks)
    if m.ndim != 2 or m.shape[1] != n or m.dtype != np.bool_:
        raise ValueError(f"masks must be bool of shape (K, {n}), got {m.dtype} {m.shape}")
    empty = np.flatnonzero(~m.any(axis=1))
    if empty.size:
        raise DataError(f"masks[{int(empty[0])}] selects no pool example; every model needs at least one member")
    return m


def _as_seeds(seeds: Sequence[int], k: int) -> list[int]:
    out = [int(s) for s in seeds]
    if len(out) != k or any(s < 0 or s != t for s, t in zip(out, seeds)):
        raise ValueError(f"seeds must be {k} non-negative integers (one per mask row), got {list(seeds)!r}")
    return out


def batched_memory_bytes(model: nn.Module, num_models: int, physical_batch_size: int, *,
                         input_shape: tuple[int, ...] | None = None) -> int:
    """Rough peak memory of one batched step: per-example gradients, activations, parameters and moments.

    ``4 * K * (P * (2 D + 3 A) + 6 D)`` bytes for K models, P examples per model, D trainable parameters and
    A activation values per example (counted with one zero input of ``input_shape``; D if not given).
    """
    d = sum(p.numel() for p in model.parameters() if p.requires_grad)
    a = d if input_shape is None else _activation_count(model, input_shape)
    return _BYTES * num_models * (physical_batch_size * (2 * d + 3 * a) + 6 * d)


def _activation_count(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    count = [0]

    def hook(_m: nn.Module, _i: Any, out: Any) -> None:
        if isinstance(out, Tensor):
            count[0] += out.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if not list(m.children())]
    try:
        p = next(model.parameters(), None)
        dev = p.device if p is not None and p.device.type != "meta" else torch.device("cpu")
        with torch.no_grad():
            model(torch.zeros((1, *input_shape), device=dev))
    finally:
        for h in handles:
            h.remove()
    return count[0]


def _memory_budget(device: torch.device) -> int:
    if is_cuda(device):
        return int(0.7 * free_memory_bytes(device))
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in fh}
        return int(0.5 * info["MemAvailable"])
    except (OSError, KeyError, ValueError, IndexError):
        return int(0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def fits_batched(model: nn.Module, num_models: int, physical_batch_size: int, *,
                 input_shape: tuple[int, ...] | None = None, device: torch.device | str = "cpu",
                 budget_bytes: int | None = None) -> bool:
    """Whether K copies of ``model`` should fit one batched step on ``device`` (rough estimate).

    Args:
        model: one instance of the architecture.
        num_models: K, models per batch.
        physical_batch_size: examples per model per chunk.
        input_shape: (C, H, W) of one example, to count activations (parameter count used if None).
        device: target device; its free memory (CUDA: 70% of free, CPU: 50% of MemAvailable) is the budget.
        budget_bytes: explicit budget instead of the device's free memory.

    Returns:
        True when :func:`batched_memory_bytes` is within the budget.
    """
    budget = _memory_budget(torch.device(device)) if budget_bytes is None else int(budget_bytes)
    return batched_memory_bytes(model, num_models, physical_batch_size, input_shape=input_shape) <= budget


def _run_batched(factory: Callable[[], nn.Module], x: Tensor, y: Tensor, masks: np.ndarray, seeds: list[int],
                 recipe: TrainRecipe, device: torch.device, chunk: int) -> list[dict[str, Tensor]]:
    out: list[dict[str, Tensor]] = []
    for s in range(0, len(seeds), chunk):
        out += BatchedTrainer(model_factory=factory, x=x, y=y, masks=masks[s:s + chunk], seeds=seeds[s:s + chunk],
                              recipe=recipe, device=device).run()
    return out


def _run_sequential(factory: Callable[[], nn.Module], x: Tensor, y: Tensor, masks: np.ndarray, seeds: list[int],
                    recipe: TrainRecipe, device: torch.device) -> list[dict[str, Tensor]]:
    return [train_single(model_factory=factory, x=x, y=y, mask=m, seed=s, recipe=recipe, device=device)
            for m, s in zip(masks, seeds)]


def train_many(*, model_factory: Callable[[], nn.Module], x: Tensor, y: Tensor, masks: Tensor | np.ndarray,
               seeds: Sequence[int], recipe: TrainRecipe, device: torch.device | str = "cpu",
               executor: Executor = "auto", max_models_per_batch: int | None = None) -> list[dict[str, Tensor]]:
    """Train K models of one architecture, model k on the pool examples ``masks[k]`` with seed ``seeds[k]``.

    Args:
        model_factory: builds one fresh model (no BatchNorm, no dropout); called under a per-seed RNG.
        x: float pool (N, C, H, W) in [0, 1].
        y: int64 labels (N,).
        masks: bool (K, N) membership; model k trains only on ``masks[k]``.
        seeds: K non-negative ints; seed k fixes model k's initialisation, batches and noise.
        recipe: how every model is trained (flat clipping, no secure mode); model k's Poisson rate is
            ``recipe.batch_size / masks[k].sum()``.
        device: where to train.
        executor: "batched" (vmap over models, in chunks of ``max_models_per_batch``), "sequential"
            (:func:`train_one` per model) or "auto" (batched when at least two models fit in memory by
            :func:`fits_batched`, else sequential). Spreading models over processes or machines is the
            ``ray`` executor of :mod:`attacks.shadow_ray`, whose tasks call this function.
        max_models_per_batch: most models stacked at once (None: all K, or as many as fit for "auto").

    Returns:
        K state dicts on CPU, in mask order, with the names of ``model_factory().state_dict()``.

    Raises:
        ConfigError: the model has BatchNorm, active dropout or no trainable parameters; the recipe clips
            other than flat or asks for secure mode.
        DataError: a mask row selects no example.
        ValueError: a malformed argument (the message names it).
    """
    _check_pool(x, y)
    check_recipe(recipe)
    m = _as_masks(masks, len(x))
    seeds = _as_seeds(seeds, len(m))
    if executor not in ("auto", "batched", "sequential"):
        raise ValueError(f"executor must be 'auto', 'batched' or 'sequential', got {executor!r}")
    if max_models_per_batch is not None and (not isinstance(max_models_per_batch, int) or max_models_per_batch < 1):
        raise ValueError(f"max_models_per_batch must be an integer >= 1 or None, got {max_models_per_batch!r}")
    device = torch.device(device)
    chunk = max_models_per_batch or len(seeds)
    if executor == "auto":
        with seeded_init(seeds[0]):
            probe = model_factory()
        check_model(probe)
        per_model = batched_memory_bytes(probe, 1, min(recipe.physical_batch_size, 2 * recipe.batch_size),
                                         input_shape=tuple(x.shape[1:]))
        chunk = max(1, min(chunk, _memory_budget(device) // max(per_model, 1)))
        executor = "batched" if chunk >= 2 or len(seeds) == 1 else "sequential"
    if executor == "batched":
        return _run_batched(model_factory, x, y, m, seeds, recipe, device, chunk)
    return _run_sequential(model_factory, x, y, m, seeds, recipe, device)


def train_one(*, model_factory: Callable[[], nn.Module], x: Tensor, y: Tensor, mask: Tensor | np.ndarray, seed: int,
              recipe: TrainRecipe, device: torch.device | str = "cpu",
              per_example: Literal["loop", "vmap"] = "vmap") -> dict[str, Tensor]:
    """Train one model exactly as :func:`train_many` trains the model with the same mask and seed.

    Args:
        mask: bool (N,), the pool examples this model trains on.
        seed: non-negative int.
        per_example: "loop" (one autograd backward per example: the obviously correct reference) or
            "vmap" (torch.func per-example gradients of this one model).
        Other arguments: as :func:`train_many`.

    Returns:
        The trained model's state dict on CPU.
    """
    _check_pool(x, y)
    m = _as_masks(mask.reshape(1, -1) if isinstance(mask, Tensor) else np.asarray(mask).reshape(1, -1), len(x))[0]
    seed = _as_seeds([seed], 1)[0]
    return train_single(model_factory=model_factory, x=x, y=y, mask=m, seed=seed, recipe=recipe, device=device,
                        per_example=per_example)
