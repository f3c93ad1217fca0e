"""Book-keeping clipping (``grad_sample_mode: bk``): per-sample norms and the clipped sum from ONE backward pass.

Bu, Wang, Zha, Karypis, "Differentially Private Optimization on Large Model at Small Cost" (ICML 2023).
:class:`BKModule` wraps the model. In a training forward pass it

1. runs the model with its trainable parameters *detached* (``torch.func.functional_call``), so the backward
   pass computes no (unclipped) parameter gradient at all, only the gradients flowing between layers;
2. taps the output of every layer that owns trainable parameters: a forward hook keeps the layer's input
   (``a``) and wraps its output in an identity autograd function that keeps the output gradient (``g``) on
   the way back. A small leaf tensor joins that function so the backward pass reaches layers whose input
   needs no gradient (the first layer).

After the one backward pass, :class:`BKDPOptimizer` asks for each example's squared gradient norm per
parameter (:meth:`BKModule.sq_norms`, from ``a`` and ``g`` by :mod:`training.dp.bk_layers`: ghost norm or
materialised gradient by the paper's hybrid rule), turns them into clipping factors with the project's own
clipping styles (:mod:`training.dp.clipping`: flat, per-layer, automatic), and asks for the clipped sums
(:meth:`BKModule.clipped_sums`: ``Σ_i c_i a_iᵀ g_i`` as one product). Noise, canaries, scaling by the expected
batch size and accumulation over physical chunks are the Opacus ``DPOptimizer`` path every mode shares.

Supported layers: ``nn.Linear``, ``nn.Conv2d``, ``nn.LayerNorm``, ``nn.GroupNorm``, ``nn.Embedding`` (and timm's
LayerNorm/GroupNorm subclasses, which compute the same function). Any other layer with trainable parameters
falls back to exact per-sample gradients for that layer alone (Opacus's registered grad sampler, else
torch.func over the layer, as Opacus's hooks mode does); :attr:`BKModule.fallback_layers` names them and the
manifest records them. A layer used several times in one forward pass is handled (its calls are summed per
example); one parameter owned by two different layers is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient, prepare_layer
from opacus.optimizers import DPOptimizer
from torch import nn

from training.dp import bk_layers as L
from training.dp.clipping import _StepperHooks, automatic_clip_factors, flat_clip_factors, per_layer_norms
from foundation.errors import ConfigError

__all__ = ["BKModule", "BKDPOptimizer", "supported_kind"]

Norms = Callable[[nn.Module, list, list], dict[str, torch.Tensor]]


def _norm_layer_types() -> tuple[type, ...]:
    types: list[type] = [nn.LayerNorm, nn.GroupNorm]
    try:  # timm's subclasses only add a fused kernel option; the function is F.layer_norm / F.group_norm
        from timm.layers import norm as timm_norm

        types += [getattr(timm_norm, n) for n in ("LayerNorm", "GroupNorm", "GroupNorm1") if hasattr(timm_norm, n)]
    except ImportError:  # pragma: no cover - timm is a dependency
        pass
    return tuple(types)


_NORM_TYPES = _norm_layer_types()


def supported_kind(module: nn.Module) -> str | None:
    """The book-keeping rule for ``module`` (exact type match, as Opacus's registries), or None: fallback."""
    t = type(module)
    if t is nn.Linear:
        return "linear"
    if t is nn.Conv2d:
        return "conv2d"
    if t in _NORM_TYPES:
        return "norm"
    if t is nn.Embedding and module.max_norm is None and not module.scale_grad_by_freq and not module.sparse:
        return "embedding"
    return None


class _Tap(torch.autograd.Function):
    """Identity on a layer's output that stores the gradient arriving at it in ``slot[1]``."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, anchor: torch.Tensor, slot: list) -> torch.Tensor:
        ctx.slot = slot
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.slot[1] = grad.detach()
        return grad, None, None


def _copy(t: torch.Tensor, k: int, copies: int) -> torch.Tensor:
    """Rows k, k + K, k + 2K, ... of ``t``: copy ``k`` of every example (a strided view)."""
    return t.reshape(t.shape[0] // copies, copies, *t.shape[1:])[:, k]


def _has_trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters(recurse=False))


class BKModule(nn.Module):
    """The model wrapped for book-keeping clipping (see the module docstring).

    Args:
        model: the model; its trainable parameters are those with ``requires_grad`` when this is built.
        copies: augmentation multiplicity K (De et al. 2022): the rows of a chunk are K consecutive augmented
            copies of each example, and an example's gradient is the mean over its copies (the loss averages
            them). Each copy is book-kept as one more call of the layer, so the copies are summed per example.

    Attributes:
        fallback_layers: names of the layers whose per-sample gradients are computed exactly per layer
            instead (type in parentheses).

    Raises:
        ConfigError: a parameter owned by two layers, or a fallback layer with buffers and no Opacus grad sampler.
    """

    def __init__(self, model: nn.Module, *, copies: int = 1) -> None:
        super().__init__()
        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies!r}")
        self._module = model
        self.copies = int(copies)
        self._layers: list[tuple[str, nn.Module, str | None]] = []
        self._trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._walk(model, "", set())
        owner: dict[int, str] = {}
        for name, layer, _ in self._layers:
            for p in layer.parameters():
                if p.requires_grad and owner.setdefault(id(p), name) != name:
                    raise ConfigError(f"grad_sample_mode bk: a parameter is shared by layers '{owner[id(p)]}' and "
                                      f"'{name}' (tied weights); use privacy.grad_sample_mode: hooks")
        self.fallback_layers = [f"{name} ({type(m).__name__})" for name, m, kind in self._layers if kind is None]
        for name, layer, kind in self._layers:  # before our hooks exist: prepare_layer deep-copies the layer
            if kind is None and type(layer) not in GradSampleModule.GRAD_SAMPLERS:
                try:
                    prepare_layer(layer)
                except NotImplementedError as exc:
                    raise ConfigError(f"grad_sample_mode bk: layer '{name}' ({type(layer).__name__}) has no "
                                      f"per-sample gradient rule: {exc}") from None
        self._calls: dict[int, list[list]] = {}
        self._entries: list[tuple] = []
        self._cache: dict[int, dict] = {}
        self._kept: dict[int, dict[str, torch.Tensor]] = {}  # materialised Conv2d weight gradients, norms -> sums
        self._scale = 1.0
        self._active = False
        self._anchors: dict[torch.device, torch.Tensor] = {}
        self._hooks = [layer.register_forward_hook(self._make_hook(i)) for i, (_, layer, _) in enumerate(self._layers)]

    def _walk(self, module: nn.Module, name: str, seen: set[int]) -> None:
        """Layers with their own trainable parameters, as Opacus's ``iterate_submodules``: a layer without a
        rule (neither bk's nor an Opacus grad sampler) is taken whole, its children included. A module that
        appears twice in the tree is one layer (its calls are summed)."""
        if id(module) in seen:
            return
        seen.add(id(module))
        kind = supported_kind(module)
        if _has_trainable(module):
            self._layers.append((name, module, kind))
            if kind is not None or type(module) not in GradSampleModule.GRAD_SAMPLERS:
                return
        for child_name, child in module.named_children():
            self._walk(child, f"{name}.{child_name}" if name else child_name, seen)

    # ------------------------------------------------------------------------------------------ forward

    def _make_hook(self, index: int):
        def hook(layer: nn.Module, args: tuple, output):
            if not self._active:
                return None
            if not isinstance(output, torch.Tensor):
                raise ConfigError(f"grad_sample_mode bk: layer '{self._layers[index][0]}' returns "
                                  f"{type(output).__name__}, not one tensor; use privacy.grad_sample_mode: hooks")
            slot = [[a.detach() for a in args if isinstance(a, torch.Tensor)], None]
            self._calls.setdefault(index, []).append(slot)
            anchor = self._anchors.get(output.device)
            if anchor is None:
                anchor = self._anchors[output.device] = torch.zeros((), device=output.device, requires_grad=True)
            return _Tap.apply(output, anchor, slot)
        return hook

    def forward(self, x: torch.Tensor, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return self._module(x, *args, **kwargs)
        self._calls = {}
        self._scale = float(x.shape[0] // self.copies)  # the chunk's mean loss over n examples: n undoes the 1/n
        detached = {n: p.detach() for n, p in self._trainable.items()}
        self._active = True
        try:
            return torch.func.functional_call(self._module, detached, (x, *args), kwargs)
        finally:
            self._active = False

    # ----------------------------------------------------------------------------------- after backward

    def _book(self) -> list[tuple]:
        """(index, layer, kind, inputs per call, output gradients per call) of every layer the last backward
        pass reached; the calls are dropped once read. The gradients are those of the chunk's *mean* loss:
        per-example norms are scaled by n², sums by n (``self._scale``) at the end, not tensor by tensor."""
        for index, calls in self._calls.items():
            done = [(acts, g) for acts, g in calls if g is not None]
            if self.copies > 1:  # K copies of an example are consecutive rows: K calls of one row per example
                done = [([_copy(a, k, self.copies) for a in acts], _copy(g, k, self.copies))
                        for acts, g in done for k in range(self.copies)]
            if done:
                _, layer, kind = self._layers[index]
                self._entries.append((index, layer, kind, [a for a, _ in done], [g for _, g in done]))
        self._calls = {}
        return self._entries

    def _materialised(self, index: int, layer: nn.Module, kind: str | None, acts: list, grads: list
                      ) -> dict[nn.Parameter, torch.Tensor]:
        """Per-example gradients (n, *shape) of a norm layer or a fallback layer, summed over its calls."""
        cache = self._cache.get(index)
        if cache is not None:
            return cache
        if kind == "norm":
            out = {getattr(layer, k): v for k, v in L.norm_layer_grads(layer, [a[0] for a in acts], grads).items()}
        else:
            fn = GradSampleModule.GRAD_SAMPLERS.get(type(layer), ft_compute_per_sample_gradient)
            out: dict[nn.Parameter, torch.Tensor] = {}
            for a, g in zip(acts, grads):
                for p, gs in fn(layer, a, g).items():
                    if p.requires_grad:
                        out[p] = gs.float() if p not in out else out[p] + gs.float()
        self._cache[index] = out
        return out

    def sq_norms(self, params: list[nn.Parameter]) -> torch.Tensor:
        """(n, len(params)) per-example squared gradient norms of ``params`` for the last backward pass."""
        self._entries, self._cache, self._kept = [], {}, {}
        columns = {id(p): j for j, p in enumerate(params)}
        cols: list[torch.Tensor | None] = [None] * len(params)
        n, device = 0, params[0].device
        for index, layer, kind, acts, grads in self._book():
            n, device = grads[0].shape[0], grads[0].device
            if kind == "conv2d":  # a materialised per-example weight gradient is kept for clipped_sums
                got = L.conv2d_norms(layer, [a[0] for a in acts], grads, keep=self._kept.setdefault(index, {}))
                found = {getattr(layer, k): v for k, v in got.items()}
            elif kind in ("linear", "embedding"):
                fn = {"linear": L.linear_norms, "embedding": L.embedding_norms}[kind]
                found = {getattr(layer, k): v for k, v in fn(layer, [a[0] for a in acts], grads).items()}
            else:
                found = {p: gs.reshape(n, -1).pow(2).sum(1)
                         for p, gs in self._materialised(index, layer, kind, acts, grads).items()}
            for p, v in found.items():
                if id(p) in columns:
                    cols[columns[id(p)]] = v
        zero = torch.zeros(n, device=device)
        return torch.stack([zero if c is None else c.to(device) for c in cols], dim=1) * self._scale ** 2

    def clipped_sums(self, params: list[nn.Parameter], factors: torch.Tensor) -> list[torch.Tensor]:
        """Σ_i factors[i, j] · (example i's gradient of ``params[j]``) for the last backward pass."""
        columns = {id(p): j for j, p in enumerate(params)}
        sums: list[torch.Tensor | None] = [None] * len(params)
        factors = factors * self._scale
        for index, layer, kind, acts, grads in self._entries:
            if kind in ("linear", "conv2d", "embedding"):
                mine = {k: columns[id(p)] for k, p in layer.named_parameters(recurse=False) if id(p) in columns}
                fn = {"linear": L.linear_sums, "conv2d": L.conv2d_sums, "embedding": L.embedding_sums}[kind]
                extra = {"kept": self._kept.get(index)} if kind == "conv2d" else {}
                got = fn(layer, [a[0] for a in acts], grads, {k: factors[:, j] for k, j in mine.items()}, **extra)
                for k, v in got.items():
                    sums[mine[k]] = v
            else:
                for p, gs in self._materialised(index, layer, kind, acts, grads).items():
                    if id(p) in columns:
                        j = columns[id(p)]
                        sums[j] = torch.einsum("i,i...->...", factors[:, j].to(gs.dtype), gs)
        self._entries, self._cache, self._kept = [], {}, {}
        return [torch.zeros_like(p) if s is None else s.to(p.dtype).view_as(p) for p, s in zip(params, sums)]

    def _close(self) -> None:
        """Remove the hooks and the functorch helpers (the model is left as it was)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for _, layer, _ in self._layers:
            if hasattr(layer, "ft_compute_sample_grad"):
                del layer.ft_compute_sample_grad
        self._calls = {}


class BKDPOptimizer(_StepperHooks, DPOptimizer):
    """Opacus ``DPOptimizer`` whose clipped sum comes from a :class:`BKModule` (flat, per-layer, automatic).

    The factors are the project's clipping styles (:func:`~training.dp.clipping.flat_clip_factors`,
    :func:`~training.dp.clipping.automatic_clip_factors`, per-layer thresholds C/√L), the statistics and the
    noise/canary/scaling path are those of :class:`~training.dp.clipping.FlatDPOptimizer`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, bk: BKModule, clipping: str, gamma: float,
                 **kwargs) -> None:
        if clipping not in ("flat", "per_layer", "automatic"):
            raise ValueError(f"clipping must be flat, per_layer or automatic, got {clipping!r}")
        if not gamma > 0:
            raise ValueError(f"automatic clipping gamma must be > 0, got {gamma!r}")
        super().__init__(optimizer, **kwargs)
        self.bk, self.clipping, self.gamma = bk, clipping, float(gamma)

    def clip_and_accumulate(self) -> None:
        """Per-sample norms from the book, the style's factors, then the clipped sums into ``p.summed_grad``."""
        sq = self.bk.sq_norms(self.params)
        n = sq.shape[0]
        if n == 0:
            return
        norms = sq.sum(1).sqrt()
        C = self.max_grad_norm
        if self.clipping == "per_layer":
            thresholds = torch.tensor(per_layer_norms(C, len(self.params)), device=sq.device)
            per = sq.sqrt()
            factors = flat_clip_factors(per, max_grad_norm=thresholds)
            clipped = (per > thresholds).any(dim=1)
        else:
            f = (flat_clip_factors(norms, max_grad_norm=C) if self.clipping == "flat"
                 else automatic_clip_factors(norms, max_grad_norm=C, gamma=self.gamma))
            factors, clipped = f[:, None].expand(n, len(self.params)), norms > C
        self._record(norms, clipped)
        for p, s in zip(self.params, self.bk.clipped_sums(self.params, factors)):
            p.summed_grad = s if p.summed_grad is None else p.summed_grad + s
