"""Training-time augmentation on tensor batches: per-example random translation (random crop) and horizontal flip.

The transforms are those LiRA's queries use (:mod:`attacks.signals`, Carlini et al. 2022, Sec. VI-A), so a target
trained with them is queried in distribution: copy k of example i is the image flipped with probability 1/2, then
translated by (dy, dx), each uniform in [-p, p] — the random crop of the image padded by p pixels — with the
border filled by the mirror image (``reflect``, no edge pixel repeated, as ``torch.nn.functional.pad``'s
``reflect``) or by zeros. Pixel (r, c) of the result is ``x[r - dy, c - dx]`` of the (flipped) image, exactly
what the signal query ``(flip, dy, dx)`` computes.

Randomness: :func:`draw` takes a ``torch.Generator`` (CPU; the loop seeds it per step with
:func:`training.dp.rng.augment_generator`) and draws every example's offsets and flips in a fixed order, so the
Opacus engine and the batched engine, given the same seed and batch, transform the same examples the same way.
:func:`apply` does the work on the batch's device by index arithmetic (no Python loop over examples).

>>> import torch
>>> x = torch.arange(16.0).reshape(1, 1, 4, 4)
>>> out = apply(x, Draw(dy=torch.tensor([[1]]), dx=torch.tensor([[0]]), flip=torch.tensor([[False]])), pad_mode="zeros")
>>> out[0, 0, :2].tolist()  # shifted down by one row, the top row filled with zeros
[[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from training.config import AugmentConfig

__all__ = ["Draw", "draw", "apply", "augment", "reflect_index"]


@dataclass(frozen=True)
class Draw:
    """One step's random choices for n examples × K copies: ``dy``, ``dx`` (int64, (n, K)), ``flip`` (bool, (n, K))."""

    dy: Tensor
    dx: Tensor
    flip: Tensor


def draw(spec: AugmentConfig, n: int, *, generator: torch.Generator) -> Draw:
    """The offsets and flips of ``n`` examples × ``spec.multiplicity`` copies, from ``generator`` (CPU).

    Order of the draws: dy, then dx (each ``randint(-p, p + 1, (n, K))``, skipped when p = 0), then the flips
    (``randint(0, 2, (n, K))``, skipped without ``flip``). Everything is drawn on the CPU, so the choices do not
    depend on where the batch lives.

    Raises:
        ValueError: ``n`` negative.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    k, p = spec.multiplicity, spec.crop_padding
    zeros = torch.zeros((n, k), dtype=torch.int64)
    dy = torch.randint(-p, p + 1, (n, k), generator=generator) if p else zeros
    dx = torch.randint(-p, p + 1, (n, k), generator=generator) if p else zeros
    flip = (torch.randint(0, 2, (n, k), generator=generator).bool() if spec.flip
            else torch.zeros((n, k), dtype=torch.bool))
    return Draw(dy=dy, dx=dx, flip=flip)


def reflect_index(idx: Tensor, size: int) -> Tensor:
    """Mirror indices in [-(size - 1), 2 size - 2] into [0, size) without repeating the edge (``reflect`` padding)."""
    idx = torch.where(idx < 0, -idx, idx)
    return torch.where(idx >= size, 2 * (size - 1) - idx, idx)


def apply(x: Tensor, choice: Draw, *, pad_mode: str) -> Tensor:
    """Transform ``x`` (n, C, H, W) by ``choice``: (n·K, C, H, W), copy k of example i at row i·K + k.

    Raises:
        ValueError: shapes that do not match, or reflect padding as wide as the image.
    """
    if x.ndim != 4:
        raise ValueError(f"x must be (n, C, H, W), got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    if tuple(choice.dy.shape[:1]) != (n,):
        raise ValueError(f"the draw is for {choice.dy.shape[0]} examples, the batch has {n}")
    k = choice.dy.shape[1]
    dev = x.device
    dy, dx = choice.dy.to(dev).reshape(-1), choice.dx.to(dev).reshape(-1)
    flip = choice.flip.to(dev).reshape(-1)
    if pad_mode == "reflect" and n and max(int(dy.abs().max()), int(dx.abs().max())) >= min(h, w):
        raise ValueError(f"reflect padding needs shifts smaller than the image ({h}x{w})")
    rows = torch.arange(h, device=dev)[None, :] - dy[:, None]  # (nK, H): source row of each output row
    cols = torch.arange(w, device=dev)[None, :] - dx[:, None]  # (nK, W): source column in the flipped image
    inside = None
    if pad_mode == "zeros":
        inside = ((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :]
        rows, cols = rows.clamp(0, h - 1), cols.clamp(0, w - 1)
    elif pad_mode == "reflect":
        rows, cols = reflect_index(rows, h), reflect_index(cols, w)
    else:
        raise ValueError(f"pad_mode must be 'reflect' or 'zeros', got {pad_mode!r}")
    cols = torch.where(flip[:, None], w - 1 - cols, cols)  # flip first: column c of the flip is w - 1 - c
    src = torch.arange(n, device=dev).repeat_interleave(k)
    out = x[src[:, None, None, None], torch.arange(c, device=dev)[None, :, None, None], rows[:, None, :, None],
            cols[:, None, None, :]]
    if inside is not None:
        out = out * inside[:, None].to(out.dtype)
    return out.contiguous(memory_format=torch.channels_last) if x.is_contiguous(
        memory_format=torch.channels_last) and not x.is_contiguous() else out


def augment(x: Tensor, spec: AugmentConfig, *, generator: torch.Generator | None) -> Tensor:
    """``x`` transformed as ``spec`` says with choices from ``generator``: (n·K, C, H, W).

    Without active transforms and with K = 1 the batch is returned unchanged (nothing is drawn); with K > 1 and no
    transform the copies are identical.

    Raises:
        ValueError: an active spec without a generator.
    """
    if not spec.active and spec.multiplicity == 1:
        return x
    if generator is None:
        raise ValueError("augmentation needs a torch.Generator (training.dp.rng.augment_generator)")
    return apply(x, draw(spec, len(x), generator=generator), pad_mode=spec.padding_mode)
