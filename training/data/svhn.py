"""SVHN cropped digits (Netzer et al. 2011) in torchvision's on-disk format, or an npz folder.

Layouts accepted under ``root`` (checked in this order):

1. npz folder: ``<root>/<split>.npz`` (+ ``classes.txt``), e.g. ``/work/shared/data/svhn``.
2. torchvision format: ``<root>/train_32x32.mat``, ``test_32x32.mat``, ``extra_32x32.mat`` (MATLAB v5, read
   with :func:`scipy.io.loadmat`): ``X`` uint8 (32, 32, 3, N) and ``y`` (N, 1) with digit 0 stored as 10.

Label 10 becomes 0, as in torchvision, so labels are the digits 0..9. ``download=True`` fetches the official
.mat file with torchvision's downloader (md5-checked).

>>> svhn_arrays(np.zeros((32, 32, 3, 2), np.uint8), np.array([[10], [3]]), source="demo")[1].tolist()
[0, 3]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data.arrays import find_split_file, npz_dir_catalog
from training.data.catalog import Catalog, array_catalog
from training.data.spec import DatasetSpec, MissingData
from foundation.errors import DataError

__all__ = ["SVHN", "svhn_arrays"]

_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat", "extra": "extra_32x32.mat"}
_CLASSES = tuple(str(i) for i in range(10))


def svhn_arrays(X: np.ndarray, y: np.ndarray, *, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Convert the .mat arrays (``X`` 32×32×3×N, ``y`` N×1 with 10 for zero) to (N, 32, 32, 3) and labels 0..9.

    Raises:
        DataError: if the shapes or values are not SVHN's.
    """
    X, y = np.asarray(X), np.asarray(y)
    if X.dtype != np.uint8 or X.ndim != 4 or X.shape[2] != 3:
        raise DataError(f"svhn: X in {source} must be uint8 (32, 32, 3, N), got {X.dtype} {X.shape}")
    labels = y.reshape(-1)
    if labels.shape != (X.shape[3],):
        raise DataError(f"svhn: y in {source} must hold {X.shape[3]} labels (shape (N, 1)), got shape {y.shape}")
    if len(labels) and not np.all(np.equal(np.mod(labels, 1), 0)):
        raise DataError(f"svhn: y in {source} must hold whole numbers 1..10, got non-integers")
    labels = labels.astype(np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() > 10):
        raise DataError(f"svhn: y in {source} must lie in 1..10 (10 = digit 0), got [{labels.min()}, {labels.max()}]")
    labels[labels == 10] = 0
    return np.ascontiguousarray(X.transpose(3, 0, 1, 2)), labels


def _open(root: Path | None, split: str, image_size: int | None) -> Catalog:
    if root is None or not root.exists():
        raise MissingData(root or "<root>")
    npz = find_split_file(root, [split])
    if npz is not None:
        return npz_dir_catalog(name="svhn", path=npz, split=split, image_size=image_size, default_classes=_CLASSES)
    if not root.is_dir():
        raise MissingData(root, "not a folder")
    path = root / _FILES[split]
    if not path.is_file():
        raise MissingData(path, "file missing")
    from scipy.io import loadmat

    try:
        mat = loadmat(path, variable_names=["X", "y"])
    except NotImplementedError:
        raise DataError(f"svhn: {path} is a MATLAB v7.3 file; re-save it as v5 or use the official "
                        "train_32x32.mat") from None
    except (ValueError, OSError, EOFError, TypeError) as exc:
        raise DataError(f"svhn: cannot read {path} ({exc}); it is truncated or not a MATLAB file") from None
    if "X" not in mat or "y" not in mat:
        raise DataError(f"svhn: {path} must hold variables X and y, found {', '.join(k for k in mat if k[0] != '_')}")
    x, y = svhn_arrays(mat["X"], mat["y"], source=str(path))
    return array_catalog(name="svhn", split=split, x=x, y=y, classes=_CLASSES, image_size=image_size,
                         source=str(path))


def _download(root: Path, split: str) -> None:
    from torchvision.datasets import SVHN as TorchvisionSVHN
    from torchvision.datasets.utils import download_url

    url, filename, md5 = TorchvisionSVHN.split_list[split]
    download_url(url, str(root), filename=filename, md5=md5)


SVHN = DatasetSpec(
    name="svhn", splits=("train", "test", "extra"),
    expected_layout="{root}/train_32x32.mat, test_32x32.mat or extra_32x32.mat (torchvision format) or "
                    "{root}/<split>.npz (+ classes.txt)",
    open=_open, download=_download,
    description="SVHN cropped digits: 73,257 train / 26,032 test / 531,131 extra 32x32 images, 10 classes",
)
