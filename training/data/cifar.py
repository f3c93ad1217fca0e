"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) in torchvision's on-disk format, read without ``pickle.load``.

Layouts accepted under ``root`` (checked in this order):

1. npz folder: ``<root>/<split>.npz`` (+ ``classes.txt``), e.g. ``/work/shared/data/cifar10_exact``.
2. torchvision format, ``root`` being the folder that holds the extracted archive or the archive's folder:
   CIFAR-10 ``cifar-10-batches-py/data_batch_1..5``, ``test_batch``, ``batches.meta``;
   CIFAR-100 ``cifar-100-python/train``, ``test``, ``meta`` (fine labels, 100 classes).

Each batch is a pickled dict with ``data`` uint8 (N, 3072): per row the 1024 red, then 1024 green, then 1024
blue values of a 32×32 image in row-major order; and ``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100).
The pickles are read with :mod:`training.data.safe_pickle`, which builds numpy arrays and nothing else.
``download=True`` fetches and extracts the official archive with torchvision's downloader (md5-checked).

>>> cifar_rows_to_images(np.arange(3072, dtype=np.int64).reshape(1, 3072).astype(np.uint8)).shape
(1, 32, 32, 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data.arrays import find_split_file, npz_dir_catalog
from training.data.catalog import Catalog, array_catalog
from training.data.safe_pickle import load_restricted
from training.data.spec import DatasetSpec, MissingData
from foundation.errors import DataError

__all__ = ["CIFAR10", "CIFAR100", "cifar_rows_to_images", "read_cifar_batch"]


@dataclass(frozen=True)
class _CifarFormat:
    name: str
    folder: str
    files: dict[str, tuple[str, ...]]
    meta_file: str
    names_key: str
    labels_key: str
    num_classes: int
    torchvision_class: str


_C10 = _CifarFormat(name="cifar10", folder="cifar-10-batches-py",
                    files={"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
                    meta_file="batches.meta", names_key="label_names", labels_key="labels", num_classes=10,
                    torchvision_class="CIFAR10")
_C100 = _CifarFormat(name="cifar100", folder="cifar-100-python", files={"train": ("train",), "test": ("test",)},
                     meta_file="meta", names_key="fine_label_names", labels_key="fine_labels", num_classes=100,
                     torchvision_class="CIFAR100")


def cifar_rows_to_images(data: np.ndarray) -> np.ndarray:
    """CIFAR rows (N, 3072) of R, G, B planes to images (N, 32, 32, 3)."""
    return np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def read_cifar_batch(path: Path, *, name: str, labels_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR batch pickle safely; returns images (N, 32, 32, 3) uint8 and labels (N,) int64.

    Raises:
        DataError: if the pickle is unsafe, truncated, or not shaped like a CIFAR batch.
    """
    with open(path, "rb") as fh:
        batch = load_restricted(fh, source=str(path))
    if not isinstance(batch, dict) or "data" not in batch or labels_key not in batch:
        keys = ", ".join(sorted(map(str, batch))) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(f"{name}: {path} is not a CIFAR batch: expected a dict with 'data' and '{labels_key}', "
                        f"found {keys}")
    data, labels = batch["data"], np.asarray(batch[labels_key])
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{name}: 'data' in {path} must be uint8 (N, 3072), got {desc}")
    if labels.shape != (len(data),) or (len(labels) and not np.issubdtype(labels.dtype, np.integer)):
        raise DataError(f"{name}: '{labels_key}' in {path} must be {len(data)} integers, got "
                        f"{labels.dtype} {labels.shape}")
    return cifar_rows_to_images(data), labels.astype(np.int64)


def _read_names(path: Path, fmt: _CifarFormat) -> tuple[str, ...]:
    with open(path, "rb") as fh:
        meta = load_restricted(fh, source=str(path))
    names = meta.get(fmt.names_key) if isinstance(meta, dict) else None
    if not isinstance(names, list) or len(names) != fmt.num_classes:
        raise DataError(f"{fmt.name}: {path} must hold '{fmt.names_key}', a list of {fmt.num_classes} class names")
    return tuple(n.decode("latin1") if isinstance(n, bytes) else str(n) for n in names)


def _torchvision_dir(root: Path, fmt: _CifarFormat) -> Path | None:
    if (root / fmt.folder).is_dir():
        return root / fmt.folder
    if (root / fmt.meta_file).is_file():
        return root
    return None


def _open(fmt: _CifarFormat, root: Path | None, split: str, image_size: int | None) -> Catalog:
    if root is None or not root.exists():
        raise MissingData(root or "<root>")
    npz = find_split_file(root, [split])
    if npz is not None:
        return npz_dir_catalog(name=fmt.name, path=npz, split=split, image_size=image_size,
                               default_classes=[str(i) for i in range(fmt.num_classes)])
    base = _torchvision_dir(root, fmt)
    if base is None:
        raise MissingData(root)
    for f in (*fmt.files[split], fmt.meta_file):
        if not (base / f).is_file():
            raise MissingData(base / f, "file missing")
    classes = _read_names(base / fmt.meta_file, fmt)
    parts = [read_cifar_batch(base / f, name=fmt.name, labels_key=fmt.labels_key) for f in fmt.files[split]]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return array_catalog(name=fmt.name, split=split, x=x, y=y, classes=classes, image_size=image_size,
                         source=str(base))


def _download(fmt: _CifarFormat, root: Path, split: str) -> None:
    import torchvision.datasets as tvd
    from torchvision.datasets.utils import download_and_extract_archive

    cls = getattr(tvd, fmt.torchvision_class)
    download_and_extract_archive(cls.url, str(root), filename=cls.filename, md5=cls.tgz_md5)


def _layout(fmt: _CifarFormat) -> str:
    listed = "data_batch_1..5, test_batch and batches.meta" if fmt is _C10 else "train, test and meta"
    return (f"{{root}}/{fmt.folder}/{listed} (torchvision format) or {{root}}/train.npz and {{root}}/test.npz "
            f"(+ classes.txt)")


CIFAR10 = DatasetSpec(
    name="cifar10", splits=("train", "test"), expected_layout=_layout(_C10),
    open=lambda root, split, size: _open(_C10, root, split, size),
    download=lambda root, split: _download(_C10, root, split),
    description="CIFAR-10: 50,000 train / 10,000 test 32x32 images, 10 classes",
)
CIFAR100 = DatasetSpec(
    name="cifar100", splits=("train", "test"), expected_layout=_layout(_C100),
    open=lambda root, split, size: _open(_C100, root, split, size),
    download=lambda root, split: _download(_C100, root, split),
    description="CIFAR-100 (fine labels): 50,000 train / 10,000 test 32x32 images, 100 classes",
)
