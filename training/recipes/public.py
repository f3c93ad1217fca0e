"""The public data of DP continual pre-training: loaded, and made disjoint from the private pool.

The public phase trains *without* noise, so an image that is also in the private pool would be trained on
non-privately: the DP claim would not cover it, and an auditor's non-members would not be non-members. Every
public training image whose pixels equal a private pool image (member or not) is therefore dropped, and the
number dropped is recorded. This makes "10 % of the pool" style public sets safe: draw the public set from the
same split with another seed and the overlap is removed.

>>> import numpy as np
>>> a = np.zeros((3, 2, 2, 3), np.uint8); a[1] += 1; a[2] += 2
>>> b = np.zeros((2, 2, 2, 3), np.uint8); b[1] += 2
>>> overlap_mask(a, b).tolist()
[True, False, True]
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from training.config import DataConfig
from training.data import ImageSet, RowArray, load_pool, load_test
from foundation.errors import DataError

__all__ = ["PublicData", "overlap_mask", "load_public"]


def _row_digests(x: np.ndarray | RowArray) -> list[bytes]:
    if isinstance(x, RowArray):  # a streamed set: digested chunk by chunk, never held whole
        return [d for _, chunk in x.chunks() for d in _row_digests(chunk.numpy())]
    flat = np.ascontiguousarray(x).reshape(len(x), -1)
    return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in flat]


def overlap_mask(x: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Bool mask over ``x``: True where the image's pixels equal some image in ``other`` (same shape per image).

    Images of different sizes never match.
    """
    if len(x) == 0 or len(other) == 0 or x.shape[1:] != other.shape[1:]:
        return np.zeros(len(x), dtype=bool)
    seen = set(_row_digests(other))
    return np.fromiter((d in seen for d in _row_digests(x)), dtype=bool, count=len(x))


@dataclass(frozen=True)
class PublicData:
    """Public training images (disjoint from the private pool) and the public validation set.

    Attributes:
        train: public training images.
        val: public validation images (the public config's ``test_split``), or None.
        dropped: number of public images removed because they are in the private pool.
        dataset: the public dataset's registry name.
    """

    train: ImageSet
    val: ImageSet | None
    dropped: int
    dataset: str


def load_public(cfg: DataConfig, *, private: ImageSet) -> PublicData:
    """Load the public set that ``cfg`` describes and drop images that are in the private pool.

    Args:
        cfg: ``training.continual.public``.
        private: the private training pool (members and non-members).

    Returns:
        :class:`PublicData`.

    Raises:
        DataError: if the public images do not have the private pool's size and channels (set
            ``public.image_size``), or nothing is left after removing the overlap.
    """
    train = load_pool(cfg)
    if train.x.shape[1:] != private.x.shape[1:]:
        raise DataError(f"public images are {train.x.shape[1:3]}, private images {private.x.shape[1:3]}; set "
                        f"training.continual.public.image_size: {private.x.shape[1]}")
    overlap = overlap_mask(train.x, private.x)
    keep = np.flatnonzero(~overlap)
    if len(keep) == 0:
        raise DataError("every public image is also in the private pool; choose a disjoint public split or dataset")
    train = train.subset(keep) if len(keep) < len(train) else train
    val = load_test(cfg) if cfg.test_split else None
    return PublicData(train=train, val=val, dropped=int(overlap.sum()), dataset=cfg.dataset)
