"""The in-memory image set every loader returns, and the pixel operations on it.

An :class:`ImageSet` holds ``x`` uint8 RGB images in HWC layout, shape (N, H, W, 3), and ``y`` int64 labels,
shape (N,), with the class names and where the images came from. It is immutable (its arrays are read-only
views), so a fingerprint taken once stays valid.

Resizing (:func:`fit_image`, :meth:`ImageSet.resized`) uses PIL's bicubic filter: the shorter side is scaled to
``size`` and the centre ``size`` x ``size`` square is kept (for square images that is a plain resize). This is
how the ``/work/shared/data`` Food-101 arrays were made.

>>> import numpy as np
>>> s = ImageSet(x=np.zeros((4, 8, 8, 3), np.uint8), y=np.array([0, 1, 0, 1]), classes=("a", "b"),
...              name="demo", split="train")
>>> len(s), s.subset([3, 1]).y.tolist(), s.resized(16).x.shape
(4, [1, 1], (4, 16, 16, 3))
>>> to_float_tensor(s.x).shape
torch.Size([4, 3, 8, 8])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from foundation.io import fingerprint_arrays

__all__ = ["ImageSet", "LabelledImages", "check_image_arrays", "to_float_tensor", "fit_image", "resize_images", "concat_sets"]

RESAMPLE = Image.Resampling.BICUBIC


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.setflags(write=False)
    return view


def check_image_arrays(x: np.ndarray, y: np.ndarray) -> None:
    """Check that ``x`` is uint8 N×H×W×3 (RGB, channels last) and ``y`` holds N integer labels.

    Raises:
        TypeError: a wrong dtype.
        ValueError: a wrong shape.
    """
    if x.dtype != np.uint8:
        raise TypeError(f"x must be uint8 (0..255), got {x.dtype}; convert with x.astype(np.uint8) after scaling")
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"x must have shape (N, H, W, 3) (RGB, channels last), got {x.shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise ValueError(f"y must have shape ({len(x)},) to match x, got {y.shape}")
    if len(y) and not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"y must hold integer labels, got {y.dtype}")


class LabelledImages:
    """What an in-memory :class:`ImageSet` and a file-backed :class:`~training.data.stream.StreamSet` share:
    rows ``x`` of shape (N, H, W, 3), int64 labels ``y`` (read-only) in ``[0, len(classes))``, the class names
    ``classes``, and the dataset's ``name`` and ``split``. Subclasses are frozen dataclasses (``repr=False``)."""

    __slots__ = ()

    def _set_labels(self, y: np.ndarray) -> None:
        """Keep ``y`` as read-only int64 labels and ``classes`` as a tuple of names, once every label names a class.

        Raises:
            ValueError: a label outside ``[0, len(classes))``.
        """
        y = np.asarray(y).astype(np.int64, copy=False)
        classes = tuple(str(c) for c in self.classes)  # type: ignore[attr-defined]
        if len(y) and (y.min() < 0 or y.max() >= len(classes)):
            raise ValueError(f"{type(self).__name__}.y must lie in [0, {len(classes)}), got range "
                             f"[{y.min()}, {y.max()}]")
        object.__setattr__(self, "y", _readonly(y))
        object.__setattr__(self, "classes", classes)

    def __len__(self) -> int:
        return int(self.x.shape[0])  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        x = self.x  # type: ignore[attr-defined]
        return (f"{type(self).__name__}(name={self.name!r}, split={self.split!r}, n={len(self)}, "  # type: ignore
                f"image={x.shape[1]}x{x.shape[2]}, classes={len(self.classes)}{self._repr_more()})")  # type: ignore

    def _repr_more(self) -> str:
        return ""

    @property
    def num_classes(self) -> int:
        """Number of classes (``len(classes)``), which may exceed the labels present."""
        return len(self.classes)  # type: ignore[attr-defined]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one image as a model sees it: (3, H, W)."""
        return (3, int(self.x.shape[1]), int(self.x.shape[2]))  # type: ignore[attr-defined]


@dataclass(frozen=True, eq=False, repr=False)
class ImageSet(LabelledImages):
    """Images and labels of one split of one dataset.

    Attributes:
        x: uint8 array (N, H, W, 3), RGB, channels last.
        y: int64 array (N,), each label in ``[0, len(classes))``.
        classes: class names; ``classes[i]`` is the name of label ``i``.
        name: dataset registry name (e.g. ``"cifar10"``).
        split: split name (e.g. ``"train"``).

    Raises:
        TypeError: if ``x`` is not uint8.
        ValueError: if shapes disagree or a label is outside ``[0, len(classes))``.
    """

    x: np.ndarray
    y: np.ndarray
    classes: tuple[str, ...]
    name: str
    split: str

    def __post_init__(self) -> None:
        x = np.asarray(self.x)
        y = np.asarray(self.y)
        check_image_arrays(x, y)
        self._set_labels(y)
        object.__setattr__(self, "x", _readonly(x))

    def subset(self, indices: Sequence[int] | np.ndarray) -> ImageSet:
        """The examples at ``indices`` (integer positions, in the given order, or a boolean mask of length N).

        Raises:
            ValueError: if a mask has the wrong length or an index is out of range.
        """
        idx = np.asarray(indices)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise ValueError(f"subset mask must have shape ({len(self)},), got {idx.shape}")
            idx = np.flatnonzero(idx)
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"subset indices must be a 1-D integer array or boolean mask, got {idx.dtype}{idx.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise ValueError(f"subset indices must lie in [0, {len(self)}), got [{idx.min()}, {idx.max()}]")
        return ImageSet(x=self.x[idx], y=self.y[idx], classes=self.classes, name=self.name, split=self.split)

    def fingerprint(self) -> str:
        """sha256 over ``x`` then ``y`` (dtype, shape and bytes): identifies the data exactly."""
        return fingerprint_arrays(self.x, self.y)

    def resized(self, size: int) -> ImageSet:
        """Images resized to ``size`` x ``size`` with :func:`fit_image` (PIL bicubic); ``self`` if already that size."""
        if self.x.shape[1] == size and self.x.shape[2] == size:
            return self
        return ImageSet(x=resize_images(self.x, size), y=self.y, classes=self.classes, name=self.name,
                        split=self.split)


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"image size must be a positive integer, got {size!r}")
    return int(size)


def fit_image(img: Image.Image, size: int) -> np.ndarray:
    """Scale the shorter side of ``img`` to ``size`` (PIL bicubic) and centre-crop to ``size`` x ``size``.

    Args:
        img: any PIL image; it is converted to RGB first.
        size: output side length in pixels.

    Returns:
        uint8 array (size, size, 3).

    >>> fit_image(Image.new("RGB", (40, 20), (10, 20, 30)), 8).shape
    (8, 8, 3)
    """
    size = _check_size(size)
    img = img.convert("RGB")
    w, h = img.size
    if (w, h) != (size, size):
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        if (nw, nh) != (w, h):
            img = img.resize((nw, nh), RESAMPLE)
        left, top = (nw - size) // 2, (nh - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8)


def resize_images(x: np.ndarray, size: int) -> np.ndarray:
    """Apply :func:`fit_image` to every image of a uint8 (N, H, W, 3) array; returns (N, size, size, 3)."""
    size = _check_size(size)
    out = np.empty((len(x), size, size, 3), dtype=np.uint8)
    for i, img in enumerate(x):
        out[i] = fit_image(Image.fromarray(np.ascontiguousarray(img), mode="RGB"), size)
    return out


def to_float_tensor(x, device=None):
    """uint8 (N, H, W, 3) images to a float32 torch tensor (N, 3, H, W) scaled to [0, 1].

    ``x`` is a NumPy array or a uint8 torch tensor (a streamed batch, :mod:`training.data.stream`); a tensor is
    moved to ``device`` as uint8 first and converted there. Both give the same values bit for bit (uint8 to
    float32 is exact, the division by 255 correctly rounded).

    Raises:
        TypeError: if ``x`` is not uint8.
        ValueError: if ``x`` is not (N, H, W, 3).
    """
    import torch

    if isinstance(x, torch.Tensor):
        if x.dtype != torch.uint8:
            raise TypeError(f"to_float_tensor expects uint8 images, got {x.dtype}")
        if x.ndim != 4 or x.shape[-1] != 3:
            raise ValueError(f"to_float_tensor expects shape (N, H, W, 3), got {tuple(x.shape)}")
        t = x.to(device, non_blocking=x.is_pinned()) if device is not None else x
        return t.to(torch.float32).permute(0, 3, 1, 2).contiguous().div_(255.0)
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise TypeError(f"to_float_tensor expects uint8 images, got {x.dtype}")
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"to_float_tensor expects shape (N, H, W, 3), got {x.shape}")
    t = torch.from_numpy(x.astype(np.float32)).permute(0, 3, 1, 2).contiguous().div_(255.0)
    return t if device is None else t.to(device)


def concat_sets(sets: Sequence[ImageSet], *, split: str | None = None) -> ImageSet:
    """Concatenate image sets of one dataset (same classes and image size), in order.

    Args:
        sets: the sets; at least one.
        split: split name of the result (default: the parts' names joined with ``+``).

    Raises:
        ValueError: if ``sets`` is empty or the parts differ in classes or image size.
    """
    if not sets:
        raise ValueError("concat_sets needs at least one ImageSet")
    first = sets[0]
    for s in sets[1:]:
        if s.classes != first.classes:
            raise ValueError(f"cannot concatenate {s.name}/{s.split} and {first.name}/{first.split}: classes differ")
        if s.x.shape[1:] != first.x.shape[1:]:
            raise ValueError(f"cannot concatenate images of shape {s.x.shape[1:]} and {first.x.shape[1:]}")
    return ImageSet(x=np.concatenate([s.x for s in sets]), y=np.concatenate([s.y for s in sets]),
                    classes=first.classes, name=first.name,
                    split=split if split is not None else "+".join(s.split for s in sets))
