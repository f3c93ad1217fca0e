"""Evaluating a classifier on uint8 images: the one batched loop behind predictions, accuracy and mean loss.

Every caller that scores a model on an :class:`~training.data.ImageSet` (the trainer's train/test accuracy and its
``test/accuracy`` curve, continual pre-training's public validation loss, reference-model metrics, imported
checkpoints, the transfer fine-tuning protocol) goes through :func:`predict` / :func:`accuracy` /
:func:`mean_loss`. The model runs in eval mode under ``torch.no_grad()`` in chunks of ``batch_size`` images, and
its train/eval mode is restored afterwards (also when the forward pass raises). A streamed set
(:class:`~training.data.StreamSet`) is read through its DataLoader (:mod:`training.data.stream`), chunk by chunk.

>>> import numpy as np, torch
>>> from training.data import ImageSet
>>> class Brightest(torch.nn.Module):  # class 1 when the mean intensity is above one half
...     def forward(self, x):
...         m = x.mean(dim=(1, 2, 3))
...         return torch.stack([0.5 - m, m - 0.5], dim=1)
>>> x = np.stack([np.full((2, 2, 3), v, np.uint8) for v in (0, 255, 10, 240)])
>>> images = ImageSet(x=x, y=np.array([0, 1, 1, 1]), classes=("dark", "bright"), name="toy", split="test")
>>> predict(Brightest(), images.x, device="cpu", batch_size=3).tolist()
[0, 1, 0, 1]
>>> accuracy(Brightest(), images, device="cpu"), accuracy(Brightest(), None, device="cpu")
(0.75, None)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from training.data import ImageSet, RowArray, StreamSet, to_float_tensor

__all__ = ["predict", "accuracy", "mean_loss"]


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _logits(model: nn.Module, x_u8: np.ndarray | RowArray, *, device: torch.device | str,
            batch_size: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(start row, logits) per chunk of ``batch_size`` images; call inside :func:`_eval_mode`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if isinstance(x_u8, RowArray):  # a streamed set: its DataLoader decodes the chunks ahead of use
        for start, xb in x_u8.chunks(int(batch_size), device=device):
            yield start, model(to_float_tensor(xb, device))
        return
    for start in range(0, len(x_u8), int(batch_size)):
        yield start, model(to_float_tensor(np.asarray(x_u8[start:start + batch_size])).to(device))


def predict(model: nn.Module, x_u8: np.ndarray | RowArray, *, device: torch.device | str, batch_size: int = 512) -> np.ndarray:
    """Arg-max class (int64, shape (N,)) of ``model`` for uint8 (N, H, W, 3) images.

    Raises:
        ValueError: ``batch_size`` below 1; TypeError/ValueError from :func:`training.data.to_float_tensor` for
            images that are not uint8 NHWC.
    """
    with _eval_mode(model):
        out = [logits.argmax(dim=1).cpu().numpy() for _, logits in _logits(model, x_u8, device=device,
                                                                             batch_size=batch_size)]
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


def accuracy(model: nn.Module, images: ImageSet | StreamSet | None, *, device: torch.device | str,
             batch_size: int = 512) -> float | None:
    """Top-1 accuracy of ``model`` on ``images``: the share of :func:`predict` equal to ``images.y``.

    Returns:
        The accuracy in [0, 1], or None when there are no images (``None`` or an empty set).
    """
    if images is None or len(images) == 0:
        return None
    correct = int(np.sum(predict(model, images.x, device=device, batch_size=batch_size) == images.y))
    return correct / len(images)


def mean_loss(model: nn.Module, images: ImageSet | StreamSet, *, device: torch.device | str, batch_size: int = 512) -> float:
    """Mean cross-entropy of ``model`` on ``images`` (NaN for an empty set)."""
    if len(images) == 0:
        return float("nan")
    total = 0.0
    with _eval_mode(model):
        for start, logits in _logits(model, images.x, device=device, batch_size=batch_size):
            y = torch.from_numpy(np.array(images.y[start:start + len(logits)], dtype=np.int64)).to(logits.device)
            total += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
    return total / len(images)
