"""Datasets that need nothing on disk: scikit-learn's bundled ``digits`` and seeded ``synthetic`` images.

``digits`` (the embedded default) is the UCI optical-digits set shipped inside scikit-learn: 1,797 grayscale
8×8 images with values 0..16, 10 classes. Pixels become ``round(v * 255 / 16)`` replicated to RGB. The split
is fixed and stratified: for each class c (in order) the class's indices are permuted with
``np.random.default_rng(0)`` (one generator, used class by class) and the first ``round(n_c / 4)`` go to
``test``; both splits keep the original order. That gives 1,347 train and 450 test images.

``synthetic`` draws class-conditional images: each class has a mean image (uniform in [48, 208] per pixel and
channel, drawn from ``seed``) and every example is its class mean plus Gaussian noise (std ``noise``), clipped
to 0..255. Labels are balanced (``i % classes``, shuffled). Options ride on the split name:
``train:n=200,classes=4,seed=1,noise=40,size=16``. Defaults: n=1000 for train and 500 for test, 10 classes,
seed 0, noise 48, size 8 (or ``image_size``). Train and test share the class means and differ in noise.

>>> s = load_synthetic_split("train:n=6,classes=3", image_size=None)
>>> s.x.shape, sorted(s.y.tolist())
((6, 8, 8, 3), [0, 0, 1, 1, 2, 2])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data.catalog import Catalog, array_catalog
from training.data.imageset import ImageSet
from training.data.spec import DatasetSpec
from foundation.errors import DataError

__all__ = ["DIGITS", "SYNTHETIC", "digits_split_indices", "load_synthetic_split"]

DIGITS_TEST_FRACTION = 0.25
DIGITS_SPLIT_SEED = 0


def digits_split_indices(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fixed stratified (train, test) indices of the digits split described in the module docstring."""
    rng = np.random.default_rng(DIGITS_SPLIT_SEED)
    test = []
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        k = int(round(len(members) * DIGITS_TEST_FRACTION))
        test.append(rng.permutation(members)[:k])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(y)), test_idx)
    return train_idx.astype(np.int64), test_idx.astype(np.int64)


def _open_digits(root: Path | None, split: str, image_size: int | None) -> Catalog:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float64)  # (1797, 8, 8), values 0..16
    y = np.asarray(bunch.target, dtype=np.int64)
    gray = np.rint(images * (255.0 / 16.0)).astype(np.uint8)
    x = np.repeat(gray[..., None], 3, axis=-1)
    train_idx, test_idx = digits_split_indices(y)
    idx = train_idx if split == "train" else test_idx
    return array_catalog(name="digits", split=split, x=x[idx], y=y[idx], classes=tuple(str(i) for i in range(10)),
                         image_size=image_size, source="sklearn.datasets.load_digits")


DIGITS = DatasetSpec(
    name="digits",
    splits=("train", "test"),
    expected_layout="nothing on disk (bundled with scikit-learn)",
    open=_open_digits,
    needs_root=False,
    description="scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes)",
)

_SYNTH_DEFAULTS = {"n": None, "classes": 10, "seed": 0, "noise": 48.0, "size": None}


def _parse_synthetic(split: str) -> tuple[str, dict[str, float | int | None]]:
    base, _, options = split.partition(":")
    params: dict[str, float | int | None] = dict(_SYNTH_DEFAULTS)
    for item in filter(None, (o.strip() for o in options.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in params:
            raise DataError(f"synthetic: bad split option {item!r} in {split!r}; use key=value with keys "
                            f"{', '.join(params)} (e.g. 'train:n=200,classes=4')")
        try:
            params[key] = float(value) if key == "noise" else int(value)
        except ValueError:
            raise DataError(f"synthetic: option {key} in {split!r} must be a number, got {value!r}") from None
    for key in ("n", "classes", "size"):
        if params[key] is not None and params[key] <= 0:  # type: ignore[operator]
            raise DataError(f"synthetic: option {key} must be positive, got {params[key]}")
    if params["noise"] < 0:  # type: ignore[operator]
        raise DataError(f"synthetic: option noise must be >= 0, got {params['noise']}")
    if params["n"] is None:
        params["n"] = 1000 if base == "train" else 500
    return base, params


def _synthetic_arrays(base: str, params: dict, image_size: int | None) -> tuple[np.ndarray, np.ndarray]:
    n, k, seed, noise = int(params["n"]), int(params["classes"]), int(params["seed"]), float(params["noise"])
    size = int(params["size"] or image_size or 8)
    means = np.random.default_rng([seed, k, size]).uniform(48.0, 208.0, size=(k, size, size, 3))
    rng = np.random.default_rng([seed, k, size, n, 1 if base == "train" else 2])
    y = rng.permutation(np.arange(n) % k).astype(np.int64)
    x = means[y] + rng.normal(0.0, noise, size=(n, size, size, 3))
    return np.clip(np.rint(x), 0, 255).astype(np.uint8), y


def _open_synthetic(root: Path | None, split: str, image_size: int | None) -> Catalog:
    base, params = _parse_synthetic(split)
    x, y = _synthetic_arrays(base, params, image_size)
    classes = tuple(f"class_{i}" for i in range(int(params["classes"])))
    return array_catalog(name="synthetic", split=split, x=x, y=y, classes=classes, image_size=image_size,
                         source=f"synthetic({split})")


def load_synthetic_split(split: str = "train", *, image_size: int | None = None) -> ImageSet:
    """All of one synthetic split (see the module docstring for the options)."""
    return SYNTHETIC.load(None, split, image_size)


SYNTHETIC = DatasetSpec(
    name="synthetic",
    splits=("train", "test"),
    expected_layout="nothing on disk (generated from a seed)",
    open=_open_synthetic,
    needs_root=False,
    split_options=True,
    description="seeded class-conditional Gaussian images (options in the split: 'train:n=200,classes=4')",
)
