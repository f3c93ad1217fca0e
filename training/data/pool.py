"""The training pool and test set that a :class:`~training.config.DataConfig` describes.

The pool is ``data.split`` of ``data.dataset``; with ``data.pool_size`` set it is a seeded random subset of
that size: ``np.random.default_rng(pool_seed).choice(N, pool_size, replace=False)``, sorted. The test set is
``data.test_split``, capped at ``data.test_size`` by a seeded subset drawn the same way from
``np.random.default_rng([pool_seed, 1])``. Only the chosen rows are decoded, so a small pool from a huge
image-folder dataset is cheap. Both are resized to ``data.image_size`` when it is set. A file-backed pool too
large for memory is not decoded at all but streamed (``data.stream``, :mod:`training.data.stream`).

:func:`split_rows` is the one pool draw: :func:`load_pool` materialises its pool rows, and its
:attr:`SplitRows.complement` (the rows of ``data.split`` outside the pool, images no model trained on) serves as
population samples for the attacks (:mod:`training.run.population`).

>>> from training.config import DataConfig
>>> pool = load_pool(DataConfig(dataset="digits", pool_size=100, pool_seed=3))
>>> len(pool), pool.fingerprint() == load_pool(DataConfig(dataset="digits", pool_size=100, pool_seed=3)).fingerprint()
(100, True)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from training.config import DataConfig
from training.data.catalog import Catalog
from training.data.imageset import ImageSet
from training.data.stream import StreamSet, decide_stream
from training.data.registry import DATASETS
from foundation.errors import DataError

__all__ = ["SplitRows", "load_pool", "load_test", "pool_indices", "split_rows"]


def pool_indices(n: int, size: int | None, rng: np.random.Generator | int | None, *,
                 selection: str = "random") -> np.ndarray:
    """Sorted indices of a subset of ``size`` out of ``n`` (all of them when ``size`` is None): uniformly random
    (``selection="random"``, drawn from ``rng``) or the first ``size`` rows (``"first"``).

    >>> pool_indices(10, 3, None, selection="first").tolist()
    [0, 1, 2]

    Raises:
        ValueError: if ``size`` is not in ``[1, n]`` or ``selection`` is unknown.
    """
    if size is None:
        return np.arange(n, dtype=np.int64)
    if not 0 < size <= n:
        raise ValueError(f"subset size must be in [1, {n}], got {size}")
    if selection == "first":
        return np.arange(size, dtype=np.int64)
    if selection != "random":
        raise ValueError(f"selection must be 'random' or 'first', got {selection!r}")
    return np.sort(np.random.default_rng(rng).choice(n, size=size, replace=False)).astype(np.int64)


def _take(cat: Catalog, idx: np.ndarray, mode: bool | str, *, workers: int) -> ImageSet | StreamSet:
    """The rows ``idx`` of ``cat``: a :class:`StreamSet` when :func:`decide_stream` says so, else decoded."""
    nbytes = len(idx) * 3 * cat.fetch.size ** 2 if cat.file_backed else 0
    if decide_stream(mode, file_backed=cat.file_backed, nbytes=nbytes):
        return StreamSet.from_catalog(cat, idx, workers=workers)
    return cat.take(idx)


@dataclass(frozen=True, eq=False)
class SplitRows:
    """``data.split`` as a catalog and the sorted rows of it that form the pool.

    Attributes:
        catalog: the whole training split (labels in memory; images decoded on :meth:`Catalog.take`).
        pool: sorted row indices of the pool.
    """

    catalog: Catalog
    pool: np.ndarray

    @property
    def complement(self) -> np.ndarray:
        """Sorted row indices of the split outside the pool (empty when the pool is the whole split)."""
        outside = np.ones(len(self.catalog), dtype=bool)
        outside[self.pool] = False
        return np.flatnonzero(outside).astype(np.int64)

    def labels_sha256(self) -> str:
        """sha256 over the split's size and labels: what the manifest records of the split (cheap: no image is
        decoded)."""
        y = np.ascontiguousarray(self.catalog.y, dtype=np.int64)
        return hashlib.sha256(f"{len(y)}|".encode() + y.tobytes()).hexdigest()


def split_rows(cfg: DataConfig) -> SplitRows:
    """The training split and the pool's rows in it: ``cfg.pool_size`` rows seeded by ``cfg.pool_seed`` (all rows
    when ``pool_size`` is None).

    Raises:
        DataError: as :func:`~training.data.load_dataset`, or if ``pool_size`` exceeds the split's size.
    """
    spec = DATASETS[cfg.dataset]
    cat = spec.catalog(cfg.root, cfg.split, cfg.image_size, cfg.download)
    if cfg.pool_size is not None and cfg.pool_size > len(cat):
        raise DataError(f"data.pool_size={cfg.pool_size} but {cfg.dataset} split {cfg.split!r} has only {len(cat)} "
                        f"examples; lower data.pool_size or leave it unset to use them all")
    return SplitRows(catalog=cat, pool=pool_indices(len(cat), cfg.pool_size, cfg.pool_seed,
                                                            selection=cfg.pool_selection))


def load_pool(cfg: DataConfig, rows: SplitRows | None = None) -> ImageSet | StreamSet:
    """The training pool: ``cfg.split``, optionally a ``cfg.pool_size`` subset seeded by ``cfg.pool_seed``.

    A :class:`~training.data.stream.StreamSet` (the same rows, decoded on demand) when ``cfg.stream`` says the
    pool streams (:func:`~training.data.stream.decide_stream`; the budget counts the pool alone here).

    Args:
        cfg: the data config.
        rows: :func:`split_rows` of ``cfg`` already drawn (None: drawn here).

    Raises:
        DataError: as :func:`~training.data.load_dataset`, or if ``pool_size`` exceeds the split's size.
    """
    rows = split_rows(cfg) if rows is None else rows
    return _take(rows.catalog, rows.pool, cfg.stream, workers=cfg.workers)


def load_test(cfg: DataConfig, *, stream: bool | None = None) -> ImageSet | StreamSet | None:
    """The test set: ``cfg.test_split`` capped at ``cfg.test_size`` examples; None when ``test_split`` is None.

    Args:
        cfg: the data config.
        stream: True: stream when file-backed (the pool streams); None: decide by ``cfg.stream`` alone.

    Raises:
        DataError: as :func:`~training.data.load_dataset`, or if the test split is the training split
            (test accuracy would then be measured on training examples).
    """
    if cfg.test_split is None:
        return None
    spec = DATASETS[cfg.dataset]
    if spec.resolve_split(cfg.test_split) == spec.resolve_split(cfg.split):
        raise DataError(f"data.test_split {cfg.test_split!r} is the training split {cfg.split!r} of {cfg.dataset}; "
                        "choose another split or set data.test_split: null")
    cat = spec.catalog(cfg.root, cfg.test_split, cfg.image_size, cfg.download)
    size = None if cfg.test_size is None or cfg.test_size >= len(cat) else cfg.test_size
    idx = pool_indices(len(cat), size, np.random.default_rng([cfg.pool_seed, 1]), selection=cfg.pool_selection)
    return _take(cat, idx, True if stream else cfg.stream, workers=cfg.workers)
