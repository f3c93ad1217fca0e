"""The dataset registry and :func:`load_dataset`, the one entry point for loading any split.

Registered names, in order: ``digits`` (embedded default), ``synthetic``, ``npz``, ``cifar10``, ``cifar100``,
``svhn``, ``food101``, ``places365``, ``inat2021``. Every entry is a :class:`~training.data.spec.DatasetSpec`
with the same contract (``splits``, ``expected_layout``, ``load(root, split, image_size, download, limit)``).
Nothing is ever downloaded unless ``download=True``.

>>> s = load_dataset("digits", split="test")
>>> s.x.shape, s.x.dtype.name, s.y.dtype.name, len(s.classes)
((450, 8, 8, 3), 'uint8', 'int64', 10)
>>> load_dataset("cifar11")
Traceback (most recent call last):
...
foundation.errors.DataError: unknown dataset 'cifar11'; valid names: digits, synthetic, npz, cifar10, cifar100, svhn, food101, places365, inat2021 (did you mean 'cifar10'?)
"""

from __future__ import annotations

import os

from training.data.arrays import NPZ
from training.data.builtin import DIGITS, SYNTHETIC
from training.data.cifar import CIFAR10, CIFAR100
from training.data.folders import FOOD101, INAT2021, PLACES365
from training.data.imageset import ImageSet
from training.data.spec import Registry
from training.data.svhn import SVHN

__all__ = ["DATASETS", "load_dataset"]

DATASETS = Registry([DIGITS, SYNTHETIC, NPZ, CIFAR10, CIFAR100, SVHN, FOOD101, PLACES365, INAT2021])


def load_dataset(name: str, *, root: str | os.PathLike[str] | None = None, split: str = "train",
                 image_size: int | None = None, download: bool = False, limit: int | None = None) -> ImageSet:
    """Load one split of a registered dataset.

    Args:
        name: registry name (see :data:`DATASETS`).
        root: data folder (or .npz file for ``npz``); not needed for ``digits`` and ``synthetic``.
        split: split name; each dataset lists its own (aliases such as ``test`` -> ``val`` are accepted).
        image_size: resize images to this square size (bicubic, centre crop); None keeps the native size
            (32 for datasets decoded from image files).
        download: let torchvision fetch the files into ``root`` (needs internet); never done otherwise.
        limit: keep at most this many examples, class-balanced in listing order (decodes only those).

    Returns:
        the split as an :class:`ImageSet` with ``x`` uint8 (N, H, W, 3) and ``y`` int64 (N,).

    Raises:
        DataError: unknown name or split (listing the valid ones), missing root or files (naming the path
            and the expected layout), or malformed data.
    """
    return DATASETS[name].load(root, split, image_size, download, limit)
