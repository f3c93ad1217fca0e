"""Datasets: one registry, one contract, uint8 NHWC images in memory.

>>> from training.data import load_dataset, to_float_tensor
>>> s = load_dataset("digits", limit=20)
>>> len(s), sorted(set(s.y.tolist())) == list(range(10)), tuple(to_float_tensor(s.x).shape)
(20, True, (20, 3, 8, 8))

See :mod:`training.data.registry` for the names, :mod:`training.data.spec` for the contract,
:mod:`training.data.pool` for the pool and test set a config describes and :mod:`training.data.stream` for
file-backed sets that stream from disk instead of being held in memory.
"""

from training.data.catalog import Catalog, limit_indices
from training.data.imageset import ImageSet, concat_sets, fit_image, resize_images, to_float_tensor
from training.data.pool import SplitRows, load_pool, load_test, pool_indices, split_rows
from training.data.registry import DATASETS, load_dataset
from training.data.safe_pickle import RestrictedUnpickler, load_restricted
from training.data.spec import DatasetSpec, MissingData, Registry
from training.data.stream import RowArray, StreamSet, is_streamed

__all__ = [
    "ImageSet",
    "StreamSet",
    "RowArray",
    "is_streamed",
    "Catalog",
    "DatasetSpec",
    "Registry",
    "MissingData",
    "DATASETS",
    "load_dataset",
    "load_pool",
    "load_test",
    "pool_indices",
    "split_rows",
    "SplitRows",
    "limit_indices",
    "to_float_tensor",
    "fit_image",
    "resize_images",
    "concat_sets",
    "RestrictedUnpickler",
    "load_restricted",
]
