"""Book-keeping per-layer math: per-sample gradient norms and clipped sums from a layer's inputs and output grads.

Book-keeping clipping (Bu, Wang, Zha, Karypis, "Differentially Private Optimization on Large Model at Small
Cost", ICML 2023) keeps, during one ordinary backward pass, each layer's input activations ``a`` and output
gradients ``g``. For a layer whose weight gradient is a sum of outer products over T positions (Linear over a
sequence, Conv2d over the im2col patches), example i's gradient is ``G_i = g_iᵀ a_i`` (p × d) and

* its squared norm is either the *ghost norm* ``⟨a_i a_iᵀ, g_i g_iᵀ⟩`` (two T × T Gram matrices) or the
  norm of the materialised ``G_i``; the paper's hybrid rule takes the ghost norm when ``2T² < p·d``;
* the clipped sum is ``Σ_i c_i G_i = (c ⊙ g)ᵀ a``: one ordinary weight-gradient product with the output
  gradients rescaled per example, no per-sample gradient kept; except that a Conv2d whose ``G_i`` were
  materialised for the norm (by the convolution's own weight-gradient kernel, one group per example: far
  cheaper on a CPU than im2col products) sums those instead.

LayerNorm and GroupNorm have per-sample gradients of the size of their (small) parameters, which are
materialised. Embedding's ghost norm counts the pairs of positions that look up the same row.

Every function here is pure: ``a`` and ``g`` are lists with one entry per call of the layer in the forward pass
(a layer used twice shares its weights, so its per-sample gradient is the sum over calls: the calls are
concatenated along the position axis), ``g`` already holds per-example loss gradients (the caller undoes the
mean's 1/n). Results are float32.

>>> import torch
>>> a, g = torch.randn(3, 5, 4), torch.randn(3, 5, 2)   # 3 examples, 5 positions, Linear(4 -> 2)
>>> per_sample = torch.einsum("ntp,ntd->npd", g, a)
>>> ghost = matmul_sq_norms(a[:, None], g[:, None], ghost=True)
>>> torch.allclose(ghost, per_sample.pow(2).sum((1, 2)), rtol=1e-4)
True
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["use_ghost", "matmul_sq_norms", "linear_norms", "linear_sums", "conv2d_grad_samples", "conv2d_norms",
           "conv2d_sums", "norm_layer_grads", "embedding_norms", "embedding_sums"]


def use_ghost(*, T: int, p: int, d: int) -> bool:
    """The paper's hybrid rule: the ghost norm costs ~2T² per example and group, the materialised gradient p·d."""
    return 2 * T * T < p * d


def matmul_sq_norms(a: torch.Tensor, g: torch.Tensor, *, ghost: bool) -> torch.Tensor:
    """Squared Frobenius norms of ``Σ_groups ‖g_iᵀ a_i‖²`` per example.

    Args:
        a: (n, G, T, d) inputs, G groups.
        g: (n, G, T, p) output gradients.
        ghost: Gram matrices (n, G, T, T) or materialised gradients (n, G, p, d).

    Returns:
        (n,) float32, clamped at 0 (the ghost form can round slightly below).
    """
    if ghost:
        return ((a @ a.transpose(-1, -2)) * (g @ g.transpose(-1, -2))).sum((1, 2, 3)).clamp_min(0)
    return (g.transpose(-1, -2) @ a).pow(2).sum((1, 2, 3))


def _bias_sq(g: torch.Tensor) -> torch.Tensor:
    """(n, G, T, p) -> squared norms of the per-example bias gradient Σ_t g."""
    return g.sum(2).pow(2).sum((1, 2))


# ------------------------------------------------------------------------------------------------- Linear


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """Concatenate the calls of a layer (no copy for the usual single call)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _linear_3d(layer: nn.Linear, acts: list[torch.Tensor], grads: list[torch.Tensor]):
    n = grads[0].shape[0]
    a = _cat([x.float().reshape(n, -1, layer.in_features) for x in acts], 1)
    g = _cat([y.float().reshape(n, -1, layer.out_features) for y in grads], 1)
    return a, g


def linear_norms(layer: nn.Linear, acts: list[torch.Tensor], grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-example squared gradient norms of ``weight`` (and ``bias``) of a Linear layer."""
    a, g = _linear_3d(layer, acts, grads)
    out = {}
    if layer.weight.requires_grad:
        ghost = use_ghost(T=a.shape[1], p=layer.out_features, d=layer.in_features)
        out["weight"] = matmul_sq_norms(a[:, None], g[:, None], ghost=ghost)
    if layer.bias is not None and layer.bias.requires_grad:
        out["bias"] = _bias_sq(g[:, None])
    return out


def linear_sums(layer: nn.Linear, acts: list[torch.Tensor], grads: list[torch.Tensor],
                factors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Σ_i c_i G_i for ``weight`` and ``bias``: one product with the rescaled output gradients."""
    a, g = _linear_3d(layer, acts, grads)
    out = {}
    if "bias" in factors:
        out["bias"] = factors["bias"] @ g.sum(1)
    if "weight" in factors:
        c = factors["weight"][:, None, None]
        if a.shape[-1] < g.shape[-1]:  # rescale the smaller of the two
            a = a * c
        else:
            g = g * c
        out["weight"] = g.reshape(-1, g.shape[-1]).T @ a.reshape(-1, a.shape[-1])
    return out


# ------------------------------------------------------------------------------------------------- Conv2d


def _padded(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The input as the convolution sees it after padding (any padding mode, 'same'/'valid' included)."""
    mode = "constant" if layer.padding_mode == "zeros" else layer.padding_mode
    return F.pad(x.float(), layer._reversed_padding_repeated_twice, mode=mode)


def _kernel_input(layer: nn.Conv2d, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The input and the padding to hand ``torch.nn.grad.conv2d_weight``: zero padding given as numbers is left to
    the kernel; any other mode, or 'same'/'valid', is applied here and the kernel pads nothing."""
    if layer.padding_mode == "zeros" and not isinstance(layer.padding, str):
        return x.float(), layer.padding
    return _padded(layer, x), 0


def _im2col(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """(n, C·kh·kw, L) patches, as ``F.unfold`` lays them out (which is far slower on CPU), from strided views."""
    (kh, kw), (dh, dw), (sh, sw) = layer.kernel_size, layer.dilation, layer.stride
    x = _padded(layer, x)
    patches = x.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)[..., ::dh, ::dw]
    n, C, Ho, Wo = patches.shape[:4]
    return patches.permute(0, 1, 4, 5, 2, 3).reshape(n, C * kh * kw, Ho * Wo)


def _conv2d_weight_grad(layer: nn.Conv2d, x: torch.Tensor, y: torch.Tensor, *, per_example: bool) -> torch.Tensor:
    """The convolution's weight gradient for input ``x`` and output gradient ``y`` from its own weight-gradient
    kernel: summed over the batch, or per example (n, out_channels, in_channels/groups·kh·kw) with the batch folded
    into the channels, one group per (example, group) (``groups = n·G``)."""
    x, padding = _kernel_input(layer, x)
    y = y.float()
    if not per_example:
        return torch.nn.grad.conv2d_weight(x, layer.weight.shape, y, stride=layer.stride, padding=padding,
                                           dilation=layer.dilation, groups=layer.groups)
    (n, C, H, W), G = x.shape, layer.groups
    return torch.nn.grad.conv2d_weight(x.reshape(1, n * C, H, W), (n * layer.out_channels, C // G, *layer.kernel_size),
                                       y.reshape(1, n * layer.out_channels, *y.shape[2:]), stride=layer.stride,
                                       padding=padding, dilation=layer.dilation,
                                       groups=n * G).reshape(n, layer.out_channels, -1)


def conv2d_grad_samples(layer: nn.Conv2d, acts: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    """Example i's weight gradient ``G_i`` (n, out_channels, in_channels/groups·kh·kw), summed over the calls.

    The convolution's own weight-gradient kernel computes it for all examples at once (:func:`_conv2d_weight_grad`).
    On a CPU this is several times faster than the im2col copy and batched products of the same arithmetic
    (ResNet-20's 32×32 layers: ~7x).
    """
    return sum(_conv2d_weight_grad(layer, x, y, per_example=True) for x, y in zip(acts, grads))


def conv2d_norms(layer: nn.Conv2d, acts: list[torch.Tensor], grads: list[torch.Tensor],
                 keep: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Per-example squared gradient norms of a Conv2d layer's ``weight`` (positions = output pixels): the ghost
    norm over im2col patches when the hybrid rule takes it, else the materialised :func:`conv2d_grad_samples`,
    which are left in ``keep["weight"]`` (when given) for :func:`conv2d_sums` to reuse."""
    n, G = grads[0].shape[0], layer.groups
    p = layer.out_channels // G
    d = layer.in_channels // G * layer.kernel_size[0] * layer.kernel_size[1]
    g = _cat([y.float().reshape(n, G, p, -1) for y in grads], 3).transpose(2, 3)  # (n, G, T, p)
    out = {}
    if layer.weight.requires_grad:
        if use_ghost(T=g.shape[2], p=p, d=d):
            cols = [_im2col(layer, x) for x in acts]
            a = _cat([c.reshape(n, G, d, -1) for c in cols], 3).transpose(2, 3)  # (n, G, T, d)
            out["weight"] = matmul_sq_norms(a, g, ghost=True)
        else:
            samples = conv2d_grad_samples(layer, acts, grads)
            out["weight"] = samples.pow(2).sum((1, 2))
            if keep is not None:
                keep["weight"] = samples
    if layer.bias is not None and layer.bias.requires_grad:
        out["bias"] = _bias_sq(g)
    return out


def conv2d_sums(layer: nn.Conv2d, acts: list[torch.Tensor], grads: list[torch.Tensor],
                factors: dict[str, torch.Tensor], kept: dict[str, torch.Tensor] | None = None
                ) -> dict[str, torch.Tensor]:
    """Σ_i c_i G_i: from the per-example gradients :func:`conv2d_norms` ``kept`` (one weighted sum), else the
    convolution's ordinary weight gradient with each example's output gradient scaled."""
    out = {}
    if "weight" in factors and kept and "weight" in kept:
        out["weight"] = torch.einsum("i,ioj->oj", factors["weight"].to(kept["weight"].dtype),
                                     kept["weight"]).reshape(layer.weight.shape)
    elif "weight" in factors:
        c = factors["weight"][:, None, None, None]
        out["weight"] = sum(_conv2d_weight_grad(layer, x, y.float() * c, per_example=False)
                            for x, y in zip(acts, grads))
    if "bias" in factors:
        out["bias"] = sum(factors["bias"] @ y.float().sum((2, 3)) for y in grads)
    return out


# ------------------------------------------------------------------------------------- LayerNorm, GroupNorm


def norm_layer_grads(layer: nn.Module, acts: list[torch.Tensor], grads: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Materialised per-example gradients of a LayerNorm's or GroupNorm's affine ``weight`` and ``bias``.

    LayerNorm: Σ over the leading positions of x̂ ⊙ g (shape of ``normalized_shape``); GroupNorm: Σ over the
    spatial positions per channel (shape (C,)). x̂ is the input normalised without the affine part.
    """
    n = grads[0].shape[0]
    wg, bg = 0.0, 0.0
    for x, y in zip(acts, grads):
        x, y = x.float(), y.float()
        if isinstance(layer, nn.LayerNorm):
            xhat = F.layer_norm(x, layer.normalized_shape, eps=layer.eps)
            shape = (n, -1, *layer.normalized_shape)
        else:
            xhat = F.group_norm(x, layer.num_groups, eps=layer.eps)
            shape = (n, layer.num_channels, -1)
        dim = 1 if isinstance(layer, nn.LayerNorm) else 2
        wg = wg + (xhat * y).reshape(shape).sum(dim)
        bg = bg + y.reshape(shape).sum(dim)
    out = {}
    if layer.weight is not None and layer.weight.requires_grad:
        out["weight"] = wg
    if layer.bias is not None and layer.bias.requires_grad:
        out["bias"] = bg
    return out


# ---------------------------------------------------------------------------------------------- Embedding


def _embedding_flat(layer: nn.Embedding, acts: list[torch.Tensor], grads: list[torch.Tensor]):
    n = grads[0].shape[0]
    idx = _cat([x.reshape(n, -1) for x in acts], 1)
    g = _cat([y.float().reshape(n, -1, layer.embedding_dim) for y in grads], 1)
    if layer.padding_idx is not None:  # the padding row receives no gradient
        g = g * (idx != layer.padding_idx).unsqueeze(-1)
    return idx, g


def embedding_norms(layer: nn.Embedding, acts: list[torch.Tensor], grads: list[torch.Tensor]
                    ) -> dict[str, torch.Tensor]:
    """Per-example squared norm of the embedding gradient: Σ_{t,s} [idx_t = idx_s] ⟨g_t, g_s⟩."""
    idx, g = _embedding_flat(layer, acts, grads)
    same = (idx[:, :, None] == idx[:, None, :]).float()
    return {"weight": ((g @ g.transpose(1, 2)) * same).sum((1, 2)).clamp_min(0)}


def embedding_sums(layer: nn.Embedding, acts: list[torch.Tensor], grads: list[torch.Tensor],
                   factors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Σ_i c_i G_i: the rescaled output gradients added into the rows that were looked up."""
    idx, g = _embedding_flat(layer, acts, grads)
    g = g * factors["weight"][:, None, None]
    out = torch.zeros(layer.num_embeddings, layer.embedding_dim, dtype=g.dtype, device=g.device)
    return {"weight": out.index_add_(0, idx.reshape(-1), g.reshape(-1, layer.embedding_dim))}
