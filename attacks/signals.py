"""Membership signals: the scaled logit of the true label, over augmented queries.

The signal every attack in :mod:`attacks` consumes is the *scaled logit* of Carlini et al., "Membership
Inference Attacks From First Principles" (IEEE S&P 2022), Sec. IV-B::

    phi(x, y) = log p_y(x) - log sum_{y' != y} p_y'(x)

It is the logit of the true-label probability, so ``p_y = sigmoid(phi)`` and the cross-entropy loss is
``softplus(-phi)``; its distribution over reference models is close to Gaussian, which is what LiRA
assumes. We compute it from ``log_softmax`` and a ``logsumexp`` over the other classes, never through
``1 - p``, so it stays finite for logits of any size.

Queries are augmented (LiRA queries the model on flipped and shifted copies of each image, Sec. VI-A);
:class:`AugmentationSpec` lists them in a stable order whose first entry is always the identity.
Higher phi means the model is more confident in the true label (and, for attacks, more "member-like").
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from training.data import RowArray, to_float_tensor

__all__ = [
    "AugmentationSpec",
    "augment_batch",
    "iter_augmentations",
    "compute_signals",
    "scaled_logit",
    "loss_from_phi",
    "prob_from_phi",
    "log_prob_from_phi",
]

Padding = Literal["reflect", "zeros"]
_PADDINGS = ("reflect", "zeros")


def scaled_logit(logits: Tensor, labels: Tensor) -> Tensor:
    """Scaled logit ``phi = log p_y - log sum_{y' != y} p_y'`` of the true label, computed stably.

    Args:
        logits: ``(N, C)`` model outputs, ``C >= 2``. Half-precision inputs are computed in float32.
        labels: ``(N,)`` integer class indices in ``[0, C)``.

    Returns:
        ``(N,)`` tensor of scaled logits (float32 or the logits' wider float dtype). Finite for any finite
        logits; higher means more confident in the true label.

    Raises:
        ValueError: if the shapes do not match, ``C < 2`` or a label is out of range.

    >>> logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1000.0, -1000.0]])
    >>> phi = scaled_logit(logits, torch.tensor([0, 0]))
    >>> round(float(phi[0]), 4)   # log(e^2) - log(1 + 1)
    1.3069
    >>> float(phi[1])
    -1000.0
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must have shape (N, C); got shape {tuple(logits.shape)}")
    n, c = logits.shape
    if c < 2:
        raise ValueError(f"logits must have at least 2 classes; got C={c}")
    labels = torch.as_tensor(labels, device=logits.device)
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},); got {tuple(labels.shape)}")
    labels = labels.long()
    if n and (int(labels.min()) < 0 or int(labels.max()) >= c):
        raise ValueError(f"labels must lie in [0, {c}); got range [{int(labels.min())}, {int(labels.max())}]")
    if not torch.is_floating_point(logits) or logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    log_p = torch.log_softmax(logits, dim=1)
    log_p_true = log_p.gather(1, labels[:, None]).squeeze(1)
    others = log_p.scatter(1, labels[:, None], float("-inf"))
    return log_p_true - torch.logsumexp(others, dim=1)


def loss_from_phi(phi: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """Cross-entropy loss ``-log p_y = softplus(-phi)`` from scaled logits (torch or numpy, stable).

    >>> float(loss_from_phi(np.array(0.0)))  # p_y = 1/2
    0.6931471805599453
    """
    if isinstance(phi, Tensor):
        return torch.nn.functional.softplus(-phi)
    return np.logaddexp(0.0, -np.asarray(phi, dtype=np.float64))


def log_prob_from_phi(phi: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """``log p_y = -softplus(-phi)`` (log-sigmoid), stable for any phi (torch or numpy)."""
    if isinstance(phi, Tensor):
        return torch.nn.functional.logsigmoid(phi)
    return -np.logaddexp(0.0, -np.asarray(phi, dtype=np.float64))


def prob_from_phi(phi: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """True-label probability ``p_y = sigmoid(phi)`` from scaled logits (torch or numpy).

    >>> float(prob_from_phi(np.array(0.0)))
    0.5
    """
    if isinstance(phi, Tensor):
        return torch.sigmoid(phi)
    phi = np.asarray(phi, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -phi))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AugmentationSpec:
    """Which augmented copies of each image the model is queried on.

    The queries are every combination of (no flip, horizontal flip if ``flip``) with every translation
    ``(dy, dx)`` in ``{-shifts, -shifts + stride, ..., shifts}^2``. A translation by ``(dy, dx)`` moves the
    image content ``dy`` pixels down and ``dx`` pixels right: ``out[i, j] = padded[i - dy, j - dx]``, where the
    border is filled by ``padding``: ``"reflect"`` mirrors the image without repeating the edge pixel (as
    ``numpy.pad(mode="reflect")``; LiRA's choice), ``"zeros"`` fills with 0 (black for inputs in [0, 1]).

    Order (stable, part of the signal file format): for each flip in ``(False, True)``, the identity
    translation ``(0, 0)`` first, then the others in row-major order of ``(dy, dx)``. Index 0 is therefore
    always the un-augmented query. ``AugmentationSpec(flip=True, shifts=1)`` gives LiRA's 18 queries.

    Attributes:
        flip: also query the horizontally flipped image.
        shifts: largest translation in pixels (``>= 0``); 0 means no translations.
        stride: step between translations in pixels (``>= 1``); e.g. ``shifts=4, stride=4`` gives -4, 0, 4.
        padding: how borders are filled: ``"reflect"`` or ``"zeros"``.

    >>> AugmentationSpec(flip=True, shifts=0).names
    ('identity', 'hflip')
    >>> AugmentationSpec(flip=True, shifts=1).n_augmentations
    18
    """

    flip: bool = False
    shifts: int = 0
    stride: int = 1
    padding: Padding = "reflect"

    def __post_init__(self) -> None:
        if not isinstance(self.flip, bool):
            raise TypeError(f"flip must be a bool; got {self.flip!r}")
        for name, low in (("shifts", 0), ("stride", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")
        if self.padding not in _PADDINGS:
            raise ValueError(f"padding must be one of {_PADDINGS}; got {self.padding!r}")

    @property
    def offsets(self) -> tuple[tuple[int, int], ...]:
        """Translations ``(dy, dx)``, identity first, then row-major."""
        steps = range(-self.shifts, self.shifts + 1, self.stride) if self.shifts else range(0, 1)
        grid = [(dy, dx) for dy, dx in itertools.product(steps, steps) if (dy, dx) != (0, 0)]
        return ((0, 0), *grid)

    @property
    def augmentations(self) -> tuple[tuple[bool, int, int], ...]:
        """``(flip, dy, dx)`` for every query, in the stable order described above."""
        flips = (False, True) if self.flip else (False,)
        return tuple((f, dy, dx) for f in flips for dy, dx in self.offsets)

    @property
    def names(self) -> tuple[str, ...]:
        """Stable names: ``identity``, ``hflip``, ``shift_-1_+0``, ``hflip_shift_-1_+0``, ..."""
        out = []
        for f, dy, dx in self.augmentations:
            parts = (["hflip"] if f else []) + ([f"shift_{dy:+d}_{dx:+d}"] if (dy, dx) != (0, 0) else [])
            out.append("_".join(parts) or "identity")
        return tuple(out)

    @property
    def n_augmentations(self) -> int:
        """Number of queries per example, ``A``."""
        return len(self.augmentations)


def _reflect_index(size: int, pad: int, device: torch.device) -> Tensor:
    idx = torch.arange(-pad, size + pad, device=device)
    idx = torch.where(idx < 0, -idx, idx)
    return torch.where(idx >= size, 2 * (size - 1) - idx, idx)


def _pad(x: Tensor, pad: int, padding: str) -> Tensor:
    if pad == 0:
        return x
    h, w = x.shape[-2:]
    if padding == "zeros":
        return torch.nn.functional.pad(x, (pad, pad, pad, pad), mode="constant", value=0)
    if pad >= min(h, w):
        raise ValueError(f"reflect padding needs shifts < image size; got shifts={pad} for {h}x{w} images")
    rows, cols = _reflect_index(h, pad, x.device), _reflect_index(w, pad, x.device)
    return x.index_select(-2, rows).index_select(-1, cols)


def iter_augmentations(x: Tensor, spec: AugmentationSpec) -> Iterator[Tensor]:
    """Yield each augmented copy of ``x`` (``(N, C, H, W)``, any dtype) in ``spec`` order.

    One copy at a time, so a caller can run the model per augmentation without holding all of them.

    Raises:
        ValueError: if ``x`` is not 4-D, or reflect padding is wider than the image.
    """
    if x.ndim != 4:
        raise ValueError(f"x must have shape (N, C, H, W); got shape {tuple(x.shape)}")
    h, w = x.shape[-2:]
    pad = spec.shifts
    padded = _pad(x, pad, spec.padding)
    flipped = None
    for f, dy, dx in spec.augmentations:
        if f and flipped is None:
            flipped = torch.flip(padded, dims=(-1,))
        src = flipped if f else padded
        top, left = pad - dy, pad - dx
        yield src[..., top: top + h, left: left + w]


def augment_batch(x: Tensor, spec: AugmentationSpec) -> Tensor:
    """All augmented copies of a batch, stacked: ``(N, C, H, W) -> (A, N, C, H, W)``.

    A flipped query is the flipped image translated by ``(dy, dx)`` (flip first, then shift).

    >>> x = torch.arange(4.0).reshape(1, 1, 2, 2)
    >>> augment_batch(x, AugmentationSpec(flip=True)).shape
    torch.Size([2, 1, 1, 2, 2])
    >>> augment_batch(x, AugmentationSpec(flip=True))[1, 0, 0].tolist()
    [[1.0, 0.0], [3.0, 2.0]]
    """
    return torch.stack(list(iter_augmentations(x, spec)), dim=0)


def _as_float_nchw(x: np.ndarray | Tensor) -> Tensor:
    """uint8 ``(N, H, W, C)`` (the dataset layout) -> float ``(N, C, H, W)`` in [0, 1]; float stays as is."""
    if isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim == 4 and x.shape[-1] == 3:
        return to_float_tensor(x)  # the dataset's own conversion (its arrays are read-only: no torch warning)
    t = torch.as_tensor(x)
    if t.ndim != 4:
        raise ValueError(f"x must be 4-D (uint8 N,H,W,C or float N,C,H,W); got shape {tuple(t.shape)}")
    if t.dtype == torch.uint8:
        return t.permute(0, 3, 1, 2).float().div_(255.0)
    if not torch.is_floating_point(t):
        raise TypeError(f"x must be uint8 (N,H,W,C) or float (N,C,H,W); got dtype {t.dtype}")
    return t


@torch.no_grad()
def compute_signals(
    model: nn.Module,
    x: np.ndarray | Tensor | RowArray,
    y: np.ndarray | Tensor,
    *,
    spec: AugmentationSpec = AugmentationSpec(),
    batch_size: int = 256,
    device: str | torch.device | None = None,
) -> np.ndarray:
    """Scaled logits of ``model`` on every augmented query of every example.

    The model is run in eval mode under ``torch.no_grad``; its previous train/eval mode is restored.

    Args:
        model: takes float ``(N, 3, H, W)`` in [0, 1] (normalisation is inside the model), returns logits.
        x: uint8 images in the dataset layout ``(N, H, W, C)`` (scaled by 1/255), or float ``(N, C, H, W)``
            already in [0, 1], or a streamed set's :class:`~training.data.RowArray` (read through its
            DataLoader, chunk by chunk; the same signals as its rows in memory).
        y: ``(N,)`` integer labels.
        spec: the augmentations to query.
        batch_size: examples per forward pass (each augmentation is a separate pass).
        device: where to run; default: the device of the model's first parameter (CPU if it has none).
            The model is not moved: it must already live there.

    Returns:
        ``(N, A)`` float32 array of scaled logits, columns in ``spec.names`` order.

    Raises:
        ValueError: on bad shapes or ``batch_size < 1``.
        TypeError: on an unsupported image dtype.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1; got {batch_size!r}")
    first = next(iter(model.parameters()), None)
    dev = torch.device(device) if device is not None else (first.device if first is not None else
                                                            torch.device("cpu"))
    dtype = first.dtype if first is not None and torch.is_floating_point(first) else torch.float32
    y_t = torch.as_tensor(np.array(y, dtype=np.int64, copy=True)) if isinstance(y, np.ndarray) else torch.as_tensor(y).long()
    n = len(x)
    if y_t.shape != (n,):
        raise ValueError(f"y must have shape ({n},) to match x; got {tuple(y_t.shape)}")
    out = np.empty((n, spec.n_augmentations), dtype=np.float32)
    was_training = model.training
    model.eval()
    try:
        if isinstance(x, RowArray):  # a streamed pool or population: decoded by its DataLoader, in order
            chunks = ((start, to_float_tensor(xb)) for start, xb in x.chunks(batch_size, device=dev))
        else:
            chunks = ((start, _as_float_nchw(x[start: start + batch_size])) for start in range(0, n, batch_size))
        for start, xf in chunks:
            xb = xf.to(dev, dtype)
            yb = y_t[start: start + batch_size].to(dev)
            for a, xa in enumerate(iter_augmentations(xb, spec)):
                phi = scaled_logit(model(xa.contiguous()), yb)
                out[start: start + len(yb), a] = phi.float().cpu().numpy()
    finally:
        model.train(was_training)
    return out
