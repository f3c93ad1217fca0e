"""A catalog is one split's labels plus a way to materialise any of its rows.

Loaders return catalogs instead of decoded arrays so that only the images actually used are decoded: a
``limit`` or a seeded pool subset of Places365 (1.8 M files) touches only the chosen files. Array formats
(npz, CIFAR pickles, SVHN .mat) hold everything in memory anyway and materialise by slicing.

The ``limit`` rule (:func:`limit_indices`) is class-balanced and deterministic: classes take turns, each
contributing its next example in listing order, until ``limit`` examples are chosen; they are returned in
listing order. So ``limit=20`` on a class-sorted list of 10 classes gives the first 2 of each class.

>>> limit_indices(np.array([0, 0, 0, 1, 1, 2]), 4).tolist()
[0, 1, 3, 5]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from training.data.imageset import ImageSet, fit_image, resize_images
from foundation.errors import DataError

__all__ = ["Catalog", "FileFetch", "array_catalog", "file_catalog", "limit_indices", "check_labels", "DEFAULT_DECODE_SIZE"]

#: Side length of images decoded from files when no ``image_size`` is given.
DEFAULT_DECODE_SIZE = 32


@dataclass(frozen=True, eq=False)
class Catalog:
    """The labels of one split and a function that materialises rows of it.

    Attributes:
        name: dataset registry name.
        split: canonical split name.
        y: int64 labels (N,).
        classes: class names, ``classes[i]`` names label ``i``.
        fetch: maps sorted int64 row indices to uint8 images (k, H, W, 3) at the final size.
        source: where the data was read from (for messages).
    """

    name: str
    split: str
    y: np.ndarray
    classes: tuple[str, ...]
    fetch: Callable[[np.ndarray], np.ndarray]
    source: str

    def __len__(self) -> int:
        return len(self.y)

    @property
    def file_backed(self) -> bool:
        """Whether rows are decoded from image files (a streamable catalog) rather than sliced from arrays."""
        return isinstance(self.fetch, FileFetch)

    def take(self, indices: np.ndarray | Sequence[int] | None = None) -> ImageSet:
        """Materialise the rows at ``indices`` (all rows when None) as an :class:`ImageSet`."""
        idx = np.arange(len(self), dtype=np.int64) if indices is None else np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(self))):
            raise ValueError(f"catalog indices must be 1-D within [0, {len(self)}), got shape {idx.shape}")
        return ImageSet(x=self.fetch(idx), y=self.y[idx], classes=self.classes, name=self.name, split=self.split)


def limit_indices(y: np.ndarray, limit: int | None) -> np.ndarray:
    """Row indices kept by ``limit``: class-balanced round robin over classes, returned in listing order.

    Args:
        y: labels in listing order.
        limit: how many rows to keep; None or a value >= len(y) keeps all.

    Returns:
        sorted int64 indices.

    Raises:
        ValueError: if ``limit`` is not a positive integer.
    """
    n = len(y)
    if limit is None or limit >= n:
        return np.arange(n, dtype=np.int64)
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit <= 0:
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    y = np.asarray(y)
    order = np.argsort(y, kind="stable")
    labels_sorted = y[order]
    starts = np.searchsorted(labels_sorted, labels_sorted, side="left")
    rank = np.arange(n) - starts  # position of each row within its class, in listing order
    rank_of_row = np.empty(n, dtype=np.int64)
    rank_of_row[order] = rank
    # Round k visits classes in label order; stable sort by (rank, label) gives the round-robin sequence.
    turn = np.lexsort((y, rank_of_row))
    return np.sort(turn[:limit]).astype(np.int64)


def check_labels(name: str, source: str, y: np.ndarray, num_classes: int) -> np.ndarray:
    """Validate user-supplied labels: integer, 1-D, within ``[0, num_classes)``; returns them as int64.

    Raises:
        DataError: naming the dataset, the file and the offending values.
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise DataError(f"{name}: labels in {source} must be 1-D, got shape {y.shape}")
    if len(y) and not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{name}: labels in {source} must be integers, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{name}: labels in {source} must lie in [0, {num_classes}) for {num_classes} classes, "
                        f"got range [{y.min()}, {y.max()}]")
    return y


def array_catalog(*, name: str, split: str, x: np.ndarray, y: np.ndarray, classes: Sequence[str],
                  image_size: int | None, source: str) -> Catalog:
    """A catalog over in-memory uint8 (N, H, W, 3) images; rows are resized only when fetched."""
    if len(x) != len(y):
        raise DataError(f"{name}: {source} holds {len(x)} images but {len(y)} labels")
    y = check_labels(name, source, y, len(classes))

    def fetch(idx: np.ndarray) -> np.ndarray:
        rows = x[idx]
        if image_size is not None and rows.shape[1:3] != (image_size, image_size):
            rows = resize_images(rows, image_size)
        return np.ascontiguousarray(rows)

    return Catalog(name=name, split=split, y=y, classes=tuple(classes), fetch=fetch, source=source)


def decode_image(path: Path, size: int, *, name: str) -> np.ndarray:
    """Decode one image file with PIL and :func:`fit_image` it to ``size``; unreadable files are DataErrors."""
    try:
        with Image.open(path) as img:
            return fit_image(img, size)
    except FileNotFoundError:
        raise DataError(f"{name}: image file listed in the metadata is missing: {path}") from None
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise DataError(f"{name}: cannot decode image {path} ({exc}); the file is corrupt or not an image") from None


def file_catalog(*, name: str, split: str, paths: Sequence[Path], y: np.ndarray, classes: Sequence[str],
                 image_size: int | None, source: str) -> Catalog:
    """A catalog over image files; each fetched file is decoded with PIL and fit to ``image_size`` (default 32)."""
    if len(paths) != len(y):
        raise DataError(f"{name}: {source} lists {len(paths)} files but {len(y)} labels")
    y = check_labels(name, source, y, len(classes))
    size = DEFAULT_DECODE_SIZE if image_size is None else image_size
    fetch = FileFetch(name=name, files=tuple(paths), size=size)
    return Catalog(name=name, split=split, y=y, classes=tuple(classes), fetch=fetch, source=source)


@dataclass(frozen=True, eq=False)
class FileFetch:
    """The ``fetch`` of a file-backed catalog: decodes the listed files on demand (picklable, so a
    ``torch.utils.data`` worker process can run it; :mod:`training.data.stream`).

    Attributes:
        name: dataset name (for messages).
        files: one path per catalog row.
        size: side length every image is fit to.
    """

    name: str
    files: tuple[Path, ...]
    size: int

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        out = np.empty((len(idx), self.size, self.size, 3), dtype=np.uint8)
        for j, i in enumerate(idx):
            out[j] = decode_image(self.files[int(i)], self.size, name=self.name)
        return out
