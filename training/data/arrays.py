"""Plain ``.npz`` arrays: the ``npz`` dataset and the npz folder layout every on-disk dataset also accepts.

An npz file holds ``x`` uint8 (N, H, W, 3) RGB images and ``y`` integer labels (N,); it is read with
``allow_pickle=False``. A folder layout holds one file per split, ``<root>/<split>.npz``, and optionally
``<root>/classes.txt`` (one class name per line; line i names label i). This is the layout of
``/work/shared/data/<name>/``.

>>> import tempfile, numpy as np
>>> d = Path(tempfile.mkdtemp())
>>> _ = np.savez(d / "train.npz", x=np.zeros((2, 4, 4, 3), np.uint8), y=np.array([0, 1]))
>>> cat = open_npz(d, "train", None)
>>> len(cat), cat.classes
(2, ('0', '1'))
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from training.data.catalog import Catalog, array_catalog
from training.data.imageset import check_image_arrays
from training.data.spec import DatasetSpec, MissingData
from foundation.errors import DataError

__all__ = ["MIN_CLASS_BOUND", "implied_classes", "read_npz", "read_classes", "find_split_file", "npz_dir_catalog", "open_npz", "NPZ"]


#: Without class names, labels may imply at most max(N, this) classes (N = number of labels).
MIN_CLASS_BOUND = 1000


def implied_classes(y: np.ndarray, *, name: str, source: str | Path) -> int:
    """K = max label + 1 for unnamed classes, bounded by the data: at most ``max(len(y), MIN_CLASS_BOUND)``.

    One stray label (say 10⁹) must not make K class names and a K-way classifier head.

    Raises:
        DataError: a negative label, or a label that implies more classes than the data can hold.

    >>> implied_classes(np.array([0, 3, 1]), name="npz", source="a.npz")
    4
    >>> implied_classes(np.array([0, 10**9]), name="npz", source="a.npz")
    Traceback (most recent call last):
    ...
    foundation.errors.DataError: npz: label 1000000000 in a.npz implies 1000000001 classes for 2 examples (at most 1000 without class names); labels must be 0..K-1: renumber them, or list the class names in classes.txt beside the file
    """
    if not len(y):
        return 0
    lo, hi = int(y.min()), int(y.max())
    if lo < 0:
        raise DataError(f"{name}: labels in {source} must be >= 0, got {lo}")
    bound = max(len(y), MIN_CLASS_BOUND)
    if hi + 1 > bound:
        raise DataError(f"{name}: label {hi} in {source} implies {hi + 1} classes for {len(y)} examples (at most "
                        f"{bound} without class names); labels must be 0..K-1: renumber them, or list the class "
                        "names in classes.txt beside the file")
    return hi + 1


def read_npz(path: Path, *, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate ``x`` (uint8 N×H×W×3) and ``y`` (integers, N) from an npz file.

    Raises:
        DataError: if the file is unreadable, holds pickled objects, lacks a key, or has a bad dtype or shape.
    """
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("x", "y") if k not in npz.files]
            if missing:
                raise DataError(f"{name}: {path} lacks array(s) {', '.join(missing)} (has: "
                                f"{', '.join(npz.files) or 'nothing'}); save it with np.savez(path, x=images, y=labels)")
            x, y = npz["x"], npz["y"]
    except DataError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DataError(f"{name}: cannot read {path} ({exc}); it must be an .npz written by np.savez") from None
    except ValueError as exc:
        raise DataError(f"{name}: cannot read {path} without unpickling ({exc}); store x and y as plain "
                        "numeric arrays, not object arrays") from None
    try:
        check_image_arrays(x, y)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name}: {path}: {exc}") from None
    return x, y.astype(np.int64)


def read_classes(path: Path, *, name: str) -> tuple[str, ...]:
    """Class names from a text file, one per line (blank lines ignored).

    Raises:
        DataError: if the file is unreadable or empty.
    """
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{name}: cannot read class names from {path} ({exc})") from None
    classes = tuple(ln for ln in lines if ln)
    if not classes:
        raise DataError(f"{name}: {path} lists no class names; write one name per line")
    return classes


def find_split_file(root: Path, names: Sequence[str]) -> Path | None:
    """The first ``<root>/<name>.npz`` that exists, or None (also None when ``root`` is not a folder)."""
    if not root.is_dir():
        return None
    for n in names:
        p = root / f"{n}.npz"
        if p.is_file():
            return p
    return None


def npz_dir_catalog(*, name: str, path: Path, split: str, image_size: int | None,
                    default_classes: Sequence[str] | None = None) -> Catalog:
    """Catalog of one npz file; class names from ``classes.txt`` beside it, else ``default_classes``, else
    ``"0".."K-1"`` with K = max label + 1.

    Raises:
        DataError: if the file or ``classes.txt`` is malformed or labels exceed the classes.
    """
    x, y = read_npz(path, name=name)
    classes_file = path.parent / "classes.txt"
    if classes_file.is_file():
        classes = read_classes(classes_file, name=name)
    elif default_classes is not None:
        classes = tuple(default_classes)
    else:
        classes = tuple(str(i) for i in range(implied_classes(y, name=name, source=path)))
    return array_catalog(name=name, split=split, x=x, y=y, classes=classes, image_size=image_size, source=str(path))


def open_npz(root: Path | None, split: str, image_size: int | None) -> Catalog:
    """Open the ``npz`` dataset: ``root`` is an .npz file (one split) or a folder of ``<split>.npz`` files.

    A single file serves the split ``train`` or the split named by its stem (``/d/test.npz`` serves ``test``);
    asking it for another split is an error, so a test set is never silently the training file.
    """
    if root is None:
        raise MissingData("<root>")
    if root.is_file():
        if split not in ("train", root.stem):
            raise DataError(f"npz: root {root} is a single file, which serves only split 'train'"
                            f"{'' if root.stem == 'train' else f' or {root.stem!r}'}; for split {split!r} point "
                            f"data.root at a folder holding {split}.npz, or set data.test_split: null")
        return npz_dir_catalog(name="npz", path=root, split=split, image_size=image_size)
    path = find_split_file(root, [split])
    if path is None:
        raise MissingData(root / f"{split}.npz" if root.is_dir() else root)
    return npz_dir_catalog(name="npz", path=path, split=split, image_size=image_size)


NPZ = DatasetSpec(
    name="npz",
    splits=("train", "test"),
    free_splits=True,
    expected_layout="an .npz file with x uint8 (N,H,W,3) and y int64 (N,), or a folder holding "
                    "{root}/<split>.npz (+ optional {root}/classes.txt, one class name per line)",
    open=open_npz,
    description="plain numpy arrays: an .npz file or a folder of <split>.npz",
)
