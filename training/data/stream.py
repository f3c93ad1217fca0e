"""Data that streams: file-backed image sets decoded on the fly through a ``torch.utils.data`` pipeline.

A pool of Places365 (1.8 M files) or iNaturalist 2021 (2.7 M) does not fit in memory as one uint8 array. When a
run streams (``data.stream``, decided by :func:`decide_stream`), the pool and test set are :class:`StreamSet`
objects instead of :class:`~training.data.ImageSet`: labels stay in memory, images stay on disk. Their ``x`` is a
:class:`RowArray`, a read-only, array-like view of the rows (``x[idx]``, ``x.shape``, ``len(x)``) that decodes
only the rows asked for, so code written for in-memory arrays keeps working row by row; the bulk consumers
(the training loop, :mod:`training.evaluate`, :mod:`attacks.signals`, the fingerprint) iterate
:meth:`RowArray.loader` instead: a ``DataLoader`` over the rows with ``workers`` decoding processes and pinned
memory when the batches go to CUDA.

What stays the same as the in-memory path:

* the rows and their order (the same catalog indices: pool subset, canaries appended at the end);
* every batch: the loader takes its batches from the caller (the training loop passes its sampler's
  ``indices(step)``; nothing here samples), so DP sampling and accounting are untouched and a resumed run's
  step t sees the uninterrupted run's batch; worker processes return batches in order;
* the pixels (the same :func:`~training.data.catalog.decode_image`) and so the fingerprint, computed in chunks by
  :class:`foundation.io.ArrayFingerprint`, byte-for-byte the in-memory ``fingerprint_arrays(x, y)``.

An unreadable file stops the stream with a one-line :class:`~foundation.errors.DataError` naming it.

>>> decide_stream("auto", file_backed=True, nbytes=MEMORY_BUDGET_BYTES + 1), decide_stream(True, file_backed=False,
...     nbytes=1)
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from training.data.imageset import ImageSet, LabelledImages
from training.device import is_cuda
from foundation.errors import DataError
from foundation.io import ArrayFingerprint

__all__ = ["RowArray", "StreamSet", "decide_stream", "is_streamed", "MEMORY_BUDGET_BYTES", "CHUNK_ROWS"]

#: ``data.stream: auto`` streams a file-backed pool whose decoded pixels (pool + test, uint8) exceed this.
MEMORY_BUDGET_BYTES = 4 * 2**30
#: rows per batch when a stream is read in order (fingerprint, evaluation default).
CHUNK_ROWS = 256


def decide_stream(mode: bool | str, *, file_backed: bool, nbytes: int, budget: int | None = None) -> bool:
    """Whether a split streams: never for array-backed data (npz, CIFAR, SVHN: already in memory, the fast path);
    for file-backed data when ``mode`` is True, or ``"auto"`` and its decoded pixels exceed ``budget`` bytes
    (default :data:`MEMORY_BUDGET_BYTES`).

    Raises:
        ValueError: ``mode`` is not True, False or ``"auto"``.
    """
    if mode not in (True, False, "auto"):
        raise ValueError(f"data.stream must be true, false or auto, got {mode!r}")
    if not file_backed or mode is False:
        return False
    return mode is True or nbytes > (MEMORY_BUDGET_BYTES if budget is None else budget)


def is_streamed(images: Any) -> bool:
    """Whether ``images`` (an ImageSet, a StreamSet or None) streams from disk."""
    return isinstance(images, StreamSet)


@dataclass(frozen=True)
class _Failure:
    """A decoding error carried out of a worker process as a value, so it surfaces as one line."""

    message: str


class _Rows(Dataset):
    """The map-style dataset behind :meth:`RowArray.loader`: a batch of positions -> (uint8 images, positions)."""

    def __init__(self, rows: RowArray) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.rows.gather(np.array([i], dtype=np.int64))[0]

    def __getitems__(self, positions: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | _Failure:
        pos = np.asarray(positions, dtype=np.int64)
        try:
            return self.rows.gather(pos), pos
        except DataError as exc:
            return _Failure(str(exc))


def _collate(batch: tuple[np.ndarray, np.ndarray] | _Failure) -> tuple[torch.Tensor, np.ndarray] | _Failure:
    if isinstance(batch, _Failure):
        return batch
    x, pos = batch
    return torch.from_numpy(x), pos


class RowArray:
    """A lazy, read-only uint8 (N, H, W, 3) array whose rows are decoded when indexed.

    Row ``i`` is catalog row ``src[i]`` when ``src[i] >= 0`` (decoded by ``fetch``), else row ``-src[i] - 1`` of
    the in-memory ``extra`` images (input canaries appended to a streamed pool).

    Args:
        fetch: the catalog's ``fetch`` (sorted or unsorted int64 catalog rows -> uint8 images); picklable for
            worker processes (:class:`training.data.catalog.FileFetch`).
        src: int64 source of each row, as above.
        image_shape: (H, W) of every row.
        extra: uint8 (M, H, W, 3) in-memory rows, or None.
        workers: decoding processes of :meth:`loader` (0: decode in this process).
    """

    dtype = np.dtype(np.uint8)
    ndim = 4

    def __init__(self, *, fetch: Callable[[np.ndarray], np.ndarray], src: np.ndarray, image_shape: tuple[int, int],
                 extra: np.ndarray | None = None, workers: int = 0) -> None:
        self.fetch = fetch
        self.src = np.asarray(src, dtype=np.int64)
        self.image_shape = (int(image_shape[0]), int(image_shape[1]))
        self.extra = np.zeros((0, *self.image_shape, 3), np.uint8) if extra is None else np.asarray(extra, np.uint8)
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0:
            raise ValueError(f"workers must be an integer >= 0, got {workers!r}")
        self.workers = int(workers)
        if self.src.ndim != 1 or (len(self.src) and self.src.min() < -len(self.extra)):
            raise ValueError("src must be 1-D and refer only to existing extra rows")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.src), *self.image_shape, 3)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.src)

    def __repr__(self) -> str:
        return f"RowArray(shape={self.shape}, extra={len(self.extra)}, workers={self.workers})"

    def _positions(self, key: Any) -> np.ndarray:
        n = len(self)
        if isinstance(key, slice):
            return np.arange(n, dtype=np.int64)[key]
        idx = np.asarray(key)
        if idx.dtype == bool:
            if idx.shape != (n,):
                raise IndexError(f"boolean index of shape {idx.shape} for {n} rows")
            return np.flatnonzero(idx)
        if idx.size == 0:
            return idx.astype(np.int64)
        if not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"rows must be indexed by integers, slices or a boolean mask, got {idx.dtype}")
        idx = idx.astype(np.int64)
        if idx.min() < -n or idx.max() >= n:
            raise IndexError(f"row index out of range for {n} rows")
        return np.where(idx < 0, idx + n, idx)

    def gather(self, positions: np.ndarray) -> np.ndarray:
        """Decode the rows at 1-D int64 ``positions``, in that order: uint8 (k, H, W, 3).

        Raises:
            DataError: a file cannot be read or decoded (the message names it).
        """
        src = self.src[positions]
        out = np.empty((len(src), *self.image_shape, 3), dtype=np.uint8)
        from_file = src >= 0
        if from_file.any():
            out[from_file] = self.fetch(src[from_file])
        if not from_file.all():
            out[~from_file] = self.extra[-src[~from_file] - 1]
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        """Rows as NumPy indexing gives them: an int -> (H, W, 3); a slice, mask or integer array of any shape
        -> that shape + (H, W, 3). Only the first axis can be indexed."""
        if isinstance(key, tuple):
            raise IndexError("a RowArray is indexed along its rows only")
        if isinstance(key, (int, np.integer)):
            return self.gather(self._positions(np.array([key])))[0]
        pos = self._positions(key)
        return self.gather(pos.reshape(-1)).reshape(*pos.shape, *self.image_shape, 3)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Every row decoded (what ``np.asarray`` gives): the whole set in memory."""
        out = self.gather(np.arange(len(self), dtype=np.int64))
        return out if dtype is None else out.astype(dtype)

    def subset(self, positions: Any) -> RowArray:
        """The rows at ``positions`` (integers in the given order, a slice or a boolean mask), still lazy."""
        return RowArray(fetch=self.fetch, src=self.src[self._positions(positions)], image_shape=self.image_shape,
                        extra=self.extra, workers=self.workers)

    def appended(self, x: np.ndarray) -> RowArray:
        """These rows followed by the in-memory uint8 images ``x`` (M, H, W, 3)."""
        x = np.asarray(x, dtype=np.uint8)
        if x.shape[1:] != (*self.image_shape, 3):
            raise ValueError(f"appended images must be {(*self.image_shape, 3)}, got {x.shape[1:]}")
        new = -(len(self.extra) + 1 + np.arange(len(x), dtype=np.int64))
        return RowArray(fetch=self.fetch, src=np.concatenate([self.src, new]), image_shape=self.image_shape,
                        extra=np.concatenate([self.extra, x]), workers=self.workers)

    def loader(self, batches: Iterable[np.ndarray], *, device: torch.device | str | None = None,
               count: int | None = None) -> Iterator[tuple[torch.Tensor, np.ndarray]]:
        """Decode each batch of row positions in ``batches``, in order, through a ``DataLoader``.

        The batches are the caller's (the training loop passes its sampler's, so nothing is re-sampled here);
        ``workers`` processes decode ahead of use (two batches each); the images come back pinned when
        ``device`` is CUDA. An empty batch gives an empty (0, H, W, 3) tensor. ``count``, when known, is the
        number of batches: no more workers than batches are started, none for a single batch.

        Yields:
            ``(uint8 tensor (k, H, W, 3) on the CPU, int64 positions (k,))`` per batch.

        Raises:
            DataError: a file cannot be read or decoded: one line naming it.
        """
        pin = is_cuda(device) if device is not None else False
        workers = self.workers if count is None else min(self.workers, count if count > 1 else 0)
        loader = DataLoader(_Rows(self), batch_sampler=_Batches(batches), num_workers=workers,
                            collate_fn=_collate, pin_memory=pin, generator=torch.Generator())
        it = iter(loader)
        try:
            for item in it:
                if isinstance(item, _Failure):
                    raise DataError(item.message)
                yield item
        finally:
            del it  # shuts the worker processes down, also when the consumer stops early

    def chunks(self, batch_size: int | None = None, *, device: torch.device | str | None = None
               ) -> Iterator[tuple[int, torch.Tensor]]:
        """``(first row, uint8 tensor)`` for consecutive rows, ``batch_size`` (default :data:`CHUNK_ROWS`) at a
        time, in order."""
        batch_size = CHUNK_ROWS if batch_size is None else batch_size
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        starts = range(0, len(self), int(batch_size))
        spans = (np.arange(s, min(s + batch_size, len(self)), dtype=np.int64) for s in starts)
        for x, pos in self.loader(spans, device=device, count=len(starts)):
            yield int(pos[0]) if len(pos) else 0, x


class _Batches:
    """An iterable of position batches as a ``DataLoader`` batch sampler (iterated once, in order)."""

    def __init__(self, batches: Iterable[np.ndarray]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[np.ndarray]:
        for b in self.batches:
            yield np.asarray(b, dtype=np.int64)


@dataclass(frozen=True, eq=False, repr=False)
class StreamSet(LabelledImages):
    """An :class:`~training.data.ImageSet` whose images stay on disk: labels in memory, ``x`` a :class:`RowArray`.

    It offers what the pool and test set are used for (``len``, ``x``, ``y``, ``classes``, ``subset``,
    ``fingerprint``, ``input_shape``), with the same values an ImageSet of the same rows would give.
    """

    x: RowArray
    y: np.ndarray
    classes: tuple[str, ...]
    name: str
    split: str
    _memo: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        y = np.asarray(self.y)
        if y.shape != (len(self.x),):
            raise ValueError(f"y must have shape ({len(self.x)},) to match x, got {y.shape}")
        self._set_labels(y)

    @classmethod
    def from_catalog(cls, catalog: Any, indices: np.ndarray, *, workers: int) -> StreamSet:
        """The rows ``indices`` of a file-backed :class:`~training.data.Catalog`, not decoded."""
        idx = np.asarray(indices, dtype=np.int64)
        size = catalog.fetch.size
        rows = RowArray(fetch=catalog.fetch, src=idx, image_shape=(size, size), workers=workers)
        return cls(x=rows, y=catalog.y[idx], classes=catalog.classes, name=catalog.name, split=catalog.split)

    def _repr_more(self) -> str:
        return f", workers={self.x.workers}"

    def subset(self, indices: Sequence[int] | np.ndarray) -> StreamSet:
        """The examples at ``indices`` (positions in order, or a boolean mask of length N), still on disk."""
        idx = np.asarray(indices)
        if idx.dtype == bool and idx.shape != (len(self),):
            raise ValueError(f"subset mask must have shape ({len(self)},), got {idx.shape}")
        if idx.dtype != bool and idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"subset indices must be integers or a boolean mask, got {idx.dtype}")
        pos = self.x._positions(idx if idx.size or idx.dtype == bool else idx.astype(np.int64))
        return StreamSet(x=self.x.subset(pos), y=self.y[pos], classes=self.classes, name=self.name, split=self.split)

    def appended(self, x: np.ndarray, y: np.ndarray) -> StreamSet:
        """These examples followed by in-memory images ``x`` with labels ``y`` (input canaries)."""
        return StreamSet(x=self.x.appended(x), y=np.concatenate([self.y, np.asarray(y, np.int64)]),
                         classes=self.classes, name=self.name, split=self.split)

    def fingerprint(self) -> str:
        """:meth:`ImageSet.fingerprint` of the same rows, computed chunk by chunk while streaming (kept once
        computed)."""
        if "fp" not in self._memo:
            fp = ArrayFingerprint()
            fp.begin(np.uint8, self.x.shape)
            for _, chunk in self.x.chunks():
                fp.update(chunk.numpy())
            fp.begin(self.y.dtype, self.y.shape)
            fp.update(self.y)
            self._memo["fp"] = fp.hexdigest()
        return self._memo["fp"]

    def materialize(self) -> ImageSet:
        """Every row decoded into an in-memory :class:`ImageSet` (for small sets only)."""
        return ImageSet(x=np.asarray(self.x), y=self.y, classes=self.classes, name=self.name, split=self.split)
