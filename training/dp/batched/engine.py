"""Train K small models at once: parameters stacked on a model axis, per-example gradients by nested vmap.

The per-model state (parameters, optimizer moments) is stacked along a leading axis of size K
(``torch.func.stack_module_state``). One step gathers each model's own batch (drawn from its members only by
the shared sampler contract, :func:`training.dp.sampling.make_sampler` over the model's n_k members) into a
(K, B_max, ...) tensor, padded with an all-zero example of weight 0, and computes ``vmap`` over models of
``vmap`` over examples of ``grad`` of the loss (``torch.func.functional_call``). DP-SGD (Abadi et al. 2016):
clip each example's flat gradient to C (Opacus's factor min(1, C / (‖g‖ + 1e-6))), sum, add N(0, (σC)²) noise
drawn per trainable tensor, in :func:`training.dp.optim.trainable_names` order, from the model's own
generator for the step (:func:`training.dp.rng.noise_generator`, exactly as the Opacus engine draws it), and
divide by the expected batch size B. Without DP the gradient of the mean loss over the model's actual batch
is used (zero for an empty batch). The stacked optimizer comes from :func:`training.dp.optim.build_optimizer`:
its update is coordinate-wise, so it is exactly each model's own update.

The recipe's augmentation, label smoothing and EMA apply exactly as in the Opacus engine: model k's batch at step
t is transformed by the choices :func:`training.augment.draw` makes from ``augment_generator(seeds[k], t)``; with
multiplicity M every example's loss is the mean over its M copies, so its per-example gradient is the mean of the
copies' gradients before it is clipped (:func:`augmented_batch`); the EMA (:mod:`training.dp.ema`) runs over
every floating tensor of each model's state, and :meth:`BatchedTrainer.state_dicts` returns it.

Only models without BatchNorm and without dropout are accepted (see :func:`check_model`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, stack_module_state, vmap

from training.augment import apply, draw
from training.dp.clipping import flat_clip_factors
from training.dp.ema import ema_tensors_
from training.dp.optim import build_optimizer, set_lr, trainable_names
from training.dp.recipe import TrainRecipe
from training.dp.rng import augment_generator, noise_generator, seeded_init
from training.dp.sampling import BatchSampler, make_sampler
from foundation.errors import ConfigError

__all__ = ["BatchedTrainer", "check_model", "check_recipe", "member_samplers", "draw_noise", "augmented_batch",
           "copies_loss"]


def check_model(model: nn.Module) -> None:
    """Refuse modules whose per-example gradients are not independent or not reproducible.

    Raises:
        ConfigError: the model has BatchNorm (mixes examples; use GroupNorm) or active dropout (random per
            call, so batched and one-at-a-time training could not agree).
    """
    bad = [name or type(model).__name__ for name, m in model.named_modules()
           if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm))]
    if bad:
        raise ConfigError(f"batched training needs models without BatchNorm (found it at {', '.join(bad[:3])}); "
                          "use GroupNorm (e.g. model.fix_batchnorm=true) or no normalisation")
    drop = [name for name, m in model.named_modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    if drop:
        raise ConfigError(f"batched training needs models without dropout (found p>0 at {', '.join(drop[:3])}); "
                          "set the dropout rate to 0")


def check_recipe(recipe: TrainRecipe) -> None:
    """Refuse recipes the batched engine does not implement (use the Opacus engine for them).

    Raises:
        ConfigError: non-flat clipping, or secure mode (batched training is reproducible by design).
    """
    if not isinstance(recipe, TrainRecipe):
        raise TypeError(f"recipe must be a TrainRecipe, got {type(recipe).__name__}")
    if recipe.dp and recipe.clipping != "flat":
        raise ConfigError(f"batched training clips flat only, got clipping={recipe.clipping!r}; "
                          "train with the regular trainer (executor sequential or process)")
    if recipe.secure_mode:
        raise ConfigError("batched training derives every random stream from the model's seed; secure mode is "
                          "not supported (train reference models with secure_mode off)")


def member_samplers(masks: np.ndarray, seeds: Sequence[int], recipe: TrainRecipe
                    ) -> list[tuple[np.ndarray, BatchSampler]]:
    """(members, sampler) of each model: the shared sampler over the model's n_k members, q = B / n_k."""
    out = []
    for m, s in zip(masks, seeds):
        members = np.flatnonzero(m)
        out.append((members, make_sampler(sampling=recipe.sampling, n=len(members), batch_size=recipe.batch_size,
                                          seed=int(s))))
    return out


def draw_noise(seed: int, step: int, shapes: Sequence[torch.Size], *, std: float, device: torch.device,
               dtype: torch.dtype) -> list[Tensor]:
    """N(0, std²) noise of one model's step, one tensor per trainable parameter, drawn as Opacus draws it."""
    gen = noise_generator(seed, step, device)
    return [torch.normal(mean=0.0, std=std, size=tuple(s), generator=gen, device=device, dtype=dtype)
            for s in shapes]


def augmented_batch(x: Tensor, recipe: TrainRecipe, *, seed: int, step: int) -> Tensor:
    """One model's batch ``x`` (n, C, H, W) as it trains at ``step``: (n, M, C, H, W), the M augmented copies of
    every example (M = ``recipe.augment.multiplicity``; unchanged copies without active transforms)."""
    spec = recipe.augment
    if spec.active:
        out = apply(x, draw(spec, len(x), generator=augment_generator(seed, step)), pad_mode=spec.padding_mode)
    else:
        out = x.repeat_interleave(spec.multiplicity, dim=0) if spec.multiplicity > 1 else x
    return out.reshape(len(x), spec.multiplicity, *x.shape[1:])


def copies_loss(logits: Tensor, y: Tensor, *, label_smoothing: float) -> Tensor:
    """Per-example loss (n,) from logits (n, M, classes) of M copies: mean over the copies of the cross-entropy."""
    n, m = logits.shape[:2]
    losses = F.cross_entropy(logits.reshape(n * m, -1), y.repeat_interleave(m), reduction="none",
                             label_smoothing=label_smoothing)
    return losses.view(n, m).mean(1)


class BatchedTrainer:
    """K models of one architecture trained in lock-step, each on its own members, seed and noise.

    Args:
        model_factory: builds one fresh model (called once per seed, under :func:`seeded_init`).
        x: float pool (N, C, H, W) in [0, 1].
        y: int64 labels (N,).
        masks: bool (K, N); ``masks[k]`` are the pool examples model k may train on.
        seeds: K non-negative ints, one per model.
        recipe: the shared :class:`TrainRecipe`.
        device: where to train.

    Raises:
        ConfigError: the model has BatchNorm, active dropout or no trainable parameter.
    """

    def __init__(self, *, model_factory: Callable[[], nn.Module], x: Tensor, y: Tensor, masks: np.ndarray,
                 seeds: Sequence[int], recipe: TrainRecipe, device: torch.device | str = "cpu") -> None:
        masks = np.asarray(masks, dtype=bool)
        if masks.ndim != 2 or masks.shape[1] != x.shape[0] or len(seeds) != masks.shape[0]:
            raise ValueError(f"masks must be (K, N) = ({len(seeds)}, {x.shape[0]}) for {len(seeds)} seeds and "
                             f"{x.shape[0]} pool examples, got {masks.shape}")
        check_recipe(recipe)
        self.recipe = recipe
        self.device = torch.device(device)
        self.seeds = [int(s) for s in seeds]
        self.models: list[nn.Module] = []
        for seed in self.seeds:
            with seeded_init(seed):
                model = model_factory()
            check_model(model)
            self.models.append(model)
        self.names = trainable_names(self.models[0])
        for model in self.models[1:]:
            if trainable_names(model) != self.names:
                raise ValueError("model_factory must build the same architecture every call")
        params, buffers = stack_module_state(self.models)
        self.params = {n: params[n].detach().to(self.device) for n in self.names}
        # frozen parameters and buffers: per-model constants, vmapped like the trainable parameters
        self.consts = {n: t.detach().to(self.device) for n, t in {**params, **buffers}.items()
                       if n not in self.params}
        self.base = copy.deepcopy(self.models[0]).to("meta")
        self.base.train()
        self.shapes = [self.params[n].shape[1:] for n in self.names]
        self.optimizer = build_optimizer(list(self.params.values()), recipe.optim, names=list(self.params),
                                         foreach=False)
        n = x.shape[0]
        # one extra all-zero example (index n) pads every model's batch to a common size
        dtype = self.params[self.names[0]].dtype
        self.x = torch.cat([x, x.new_zeros((1, *x.shape[1:]))]).to(self.device, dtype)
        self.y = torch.cat([y, y.new_zeros(1)]).to(self.device)
        self.pad_index = n
        self.samplers = member_samplers(masks, self.seeds, recipe)
        self.step_count = 0
        # EMA over every floating tensor of each model's state, in state_dict order (as the Opacus engine does)
        self.state_names = list(self.models[0].state_dict())
        self.ema = ({n: self._current(n).clone() for n in self.state_names} if recipe.ema.decay is not None
                    else None)
        self._dp_fn = vmap(self._clipped_sum, in_dims=(0, 0, 0, 0, 0))
        self._sum_fn = vmap(self._sum_grad, in_dims=(0, 0, 0, 0, 0))

    # -- per-model functions (vmapped over the model axis) -------------------------------------------------
    def _current(self, name: str) -> Tensor:
        return self.params[name] if name in self.params else self.consts[name]

    def _example_loss(self, params: dict[str, Tensor], consts: dict[str, Tensor], xi: Tensor, yi: Tensor) -> Tensor:
        """Loss of one example given as its M copies (M, C, H, W): the mean over the copies."""
        logits = functional_call(self.base, {**params, **consts}, (xi,))
        return copies_loss(logits.unsqueeze(0), yi.unsqueeze(0), label_smoothing=self.recipe.label_smoothing)[0]

    def _clipped_sum(self, params: dict[str, Tensor], consts: dict[str, Tensor], xb: Tensor, yb: Tensor,
                     wb: Tensor) -> dict[str, Tensor]:
        per_example = vmap(grad(self._example_loss), in_dims=(None, None, 0, 0))(params, consts, xb, yb)
        sq = sum(torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1).square() for g in per_example.values())
        factor = flat_clip_factors(sq.sqrt(), max_grad_norm=self.recipe.max_grad_norm) * wb
        return {n: torch.tensordot(factor, g, dims=1) for n, g in per_example.items()}

    def _sum_grad(self, params: dict[str, Tensor], consts: dict[str, Tensor], xb: Tensor, yb: Tensor,
                  wb: Tensor) -> dict[str, Tensor]:
        def batch_loss(p: dict[str, Tensor]) -> Tensor:
            n, m = xb.shape[:2]
            logits = functional_call(self.base, {**p, **consts}, (xb.reshape(n * m, *xb.shape[2:]),))
            losses = copies_loss(logits.view(n, m, -1), yb, label_smoothing=self.recipe.label_smoothing)
            return (losses * wb).sum()

        return grad(batch_loss)(params)

    # -- one logical step ------------------------------------------------------------------------------------
    def _batch_matrix(self, step: int) -> tuple[Tensor, Tensor, np.ndarray]:
        """(K, B_max) pool indices (pad = zero example) and 0/1 weights of every model's batch."""
        batches = [members[sampler.indices(step)] for members, sampler in self.samplers]
        sizes = np.array([len(b) for b in batches], dtype=np.int64)
        width = int(sizes.max(initial=0))
        idx = np.full((len(batches), width), self.pad_index, dtype=np.int64)
        for k, b in enumerate(batches):
            idx[k, :len(b)] = b
        weights = torch.from_numpy(idx != self.pad_index).to(self.device, self.x.dtype)
        return torch.from_numpy(idx).to(self.device), weights, sizes

    def _noise(self, step: int) -> list[Tensor]:
        """(K, *shape) noise per trainable parameter; model k's rows drawn from its own generator for ``step``."""
        r = self.recipe
        dtype = self.params[self.names[0]].dtype
        per_model = [draw_noise(s, step, self.shapes, std=r.noise_multiplier * r.max_grad_norm, device=self.device,
                                dtype=dtype) for s in self.seeds]
        return [torch.stack(z) for z in zip(*per_model)]

    def step(self) -> np.ndarray:
        """Run one logical step for every model; return the K actual batch sizes."""
        r, t = self.recipe, self.step_count
        idx, weights, sizes = self._batch_matrix(t)
        k = len(self.seeds)
        summed = {n: torch.zeros_like(p) for n, p in self.params.items()}
        fn = self._dp_fn if r.dp else self._sum_fn
        xs = self._augmented(idx, sizes, t)
        for start in range(0, idx.shape[1], r.physical_batch_size):
            cols = slice(start, start + r.physical_batch_size)
            part = fn(self.params, self.consts, xs[:, cols], self.y[idx[:, cols]], weights[:, cols])
            for n in self.names:
                summed[n].add_(part[n])
        if r.dp:
            grads = {n: (summed[n] + z) / r.batch_size for n, z in zip(self.names, self._noise(t))}
        else:
            denom = torch.from_numpy(np.maximum(sizes, 1)).to(self.device, self.x.dtype)
            grads = {n: summed[n] / denom.view(k, *([1] * len(s))) for n, s in zip(self.names, self.shapes)}
        for n, p in self.params.items():
            p.grad = grads[n]
        set_lr(self.optimizer, r.lr_at(t))
        self.optimizer.step()
        if self.ema is not None:
            ema_tensors_([self.ema[n] for n in self.state_names], [self._current(n) for n in self.state_names],
                         decay=r.ema_decay_at(t))
        self.step_count += 1
        return sizes

    def _augmented(self, idx: Tensor, sizes: np.ndarray, step: int) -> Tensor:
        """(K, B_max, M, C, H, W): every model's batch as it trains at ``step`` (pads left as they are)."""
        xs = self.x[idx]
        k, width = idx.shape
        if not self.recipe.augment.active and self.recipe.augment.multiplicity == 1:
            return xs.unsqueeze(2)
        rows = [augmented_batch(xs[j, :sizes[j]], self.recipe, seed=self.seeds[j], step=step) for j in range(k)]
        m = self.recipe.augment.multiplicity
        out = xs.new_zeros((k, width, m, *xs.shape[2:]))
        for j, r in enumerate(rows):
            out[j, :sizes[j]] = r
        return out

    def run(self) -> list[dict[str, Tensor]]:
        """Train the remaining steps and return one CPU state dict per model (``state_dict()`` names)."""
        while self.step_count < self.recipe.steps:
            self.step()
        return self.state_dicts()

    def state_dicts(self) -> list[dict[str, Tensor]]:
        """Current weights, one CPU state dict per model with the names of ``model_factory().state_dict()``."""
        out = []
        with torch.no_grad():
            for k, model in enumerate(self.models):
                if self.ema is not None:  # the EMA of the weights is the model (as the Opacus engine saves it)
                    out.append({n: self.ema[n][k].detach().cpu().clone() for n in self.state_names})
                    continue
                for n in self.names:
                    model.get_parameter(n).copy_(self.params[n][k].detach().cpu())
                out.append({n: v.detach().cpu().clone() for n, v in model.state_dict().items()})
        return out
