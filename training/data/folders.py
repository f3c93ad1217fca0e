"""Image-folder datasets in torchvision's layouts: Food-101, Places365 and iNaturalist 2021.

Only the file list is read when a split is opened; images are decoded (PIL, RGB, shorter side scaled to
``image_size`` with bicubic filtering, centre crop; 32 when no size is given) only for the rows returned, so
``limit`` or a seeded pool subset of a huge set touches only those files. Every dataset also accepts the npz
folder layout ``<root>/<split>.npz`` (+ ``classes.txt``), checked first.

* ``food101`` (Bossard et al. 2014): ``<root>/food-101/`` (or ``<root>`` itself) with ``images/<class>/<id>.jpg``,
  ``meta/<split>.json`` (``{class: ["class/id", ...]}``, torchvision's source) or ``meta/<split>.txt``
  (``class/id`` per line), and ``meta/classes.txt``. Labels index ``classes.txt`` (else the sorted class names).
* ``places365`` (Zhou et al. 2017): ``categories_places365.txt`` (``/a/airfield 0``), file lists
  ``places365_train_standard.txt``, ``places365_train_challenge.txt``, ``places365_val.txt`` (``path label``),
  images under ``data_256_standard/`` or ``data_large_standard/`` (train; challenge alike) and ``val_256/`` or
  ``val_large/``. Class names drop the leading ``/a/``. The official test split has no public labels, so
  ``test`` is an alias of ``val`` and ``train`` of ``train-standard``.
* ``inat2021`` (Van Horn et al. 2021): ``<root>/2021_train/``, ``2021_train_mini/``, ``2021_valid/``, each holding
  category folders ``NNNNN_Kingdom_Phylum_Class_Order_Family_Genus_species`` of images. The label is the
  folder's number NNNNN (torchvision's ``target_type="full"``); class names are the rest of the folder name.
  Categories and files are listed in sorted order. ``test`` is an alias of ``valid``.

>>> places_class_name("/a/apartment_building/outdoor")
'apartment_building/outdoor'
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from training.data.arrays import find_split_file, npz_dir_catalog, read_classes
from training.data.catalog import Catalog, file_catalog
from training.data.spec import DatasetSpec, MissingData
from foundation.errors import DataError

__all__ = ["FOOD101", "PLACES365", "INAT2021", "places_class_name"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def _read_lines(path: Path, *, name: str) -> list[str]:
    try:
        return [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{name}: cannot read {path} ({exc})") from None


def _existing(root: Path | None) -> Path:
    if root is None or not root.exists():
        raise MissingData(root or "<root>")
    return root


def _npz_first(name: str, root: Path, names: Sequence[str], split: str, image_size: int | None) -> Catalog | None:
    npz = find_split_file(root, names)
    return None if npz is None else npz_dir_catalog(name=name, path=npz, split=split, image_size=image_size)


def _catalog(name: str, split: str, paths: list[Path], labels: list[int], classes: Sequence[str],
             image_size: int | None, source: Path) -> Catalog:
    if not paths:
        raise DataError(f"{name}: {source} lists no images for split {split!r}")
    return file_catalog(name=name, split=split, paths=paths, y=np.asarray(labels, dtype=np.int64), classes=classes,
                        image_size=image_size, source=str(source))


# ------------------------------------------------------------------------------------------------ Food-101


def _open_food101(root: Path | None, split: str, image_size: int | None) -> Catalog:
    root = _existing(root)
    found = _npz_first("food101", root, [split], split, image_size)
    if found is not None:
        return found
    if (root / "food-101").is_dir():
        base = root / "food-101"
    elif (root / "images").is_dir():
        base = root
    else:
        raise MissingData(root)
    meta, images = base / "meta", base / "images"
    if not images.is_dir():
        raise MissingData(images, "folder missing")
    json_file, txt_file = meta / f"{split}.json", meta / f"{split}.txt"
    if json_file.is_file():
        try:
            listing = json.loads(json_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"food101: {json_file} is not valid JSON ({exc})") from None
        if not isinstance(listing, dict) or not all(isinstance(v, list) for v in listing.values()):
            raise DataError(f"food101: {json_file} must map each class name to a list of 'class/id' entries")
        entries = [(cls, str(rel)) for cls, rels in listing.items() for rel in rels]
        source = json_file
    elif txt_file.is_file():
        entries = [(ln.split("/", 1)[0], ln) for ln in _read_lines(txt_file, name="food101")]
        source = txt_file
    else:
        raise MissingData(json_file, f"neither {split}.json nor {split}.txt in {meta}")
    classes_file = meta / "classes.txt"
    if classes_file.is_file():
        classes = read_classes(classes_file, name="food101")
    else:
        classes = tuple(sorted({cls for cls, _ in entries}))
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted({cls for cls, _ in entries if cls not in index})
    if unknown:
        raise DataError(f"food101: {source} uses classes not in {classes_file}: {', '.join(unknown[:5])}")
    paths = [images.joinpath(*(rel if rel.lower().endswith(IMAGE_SUFFIXES) else rel + ".jpg").split("/"))
             for _, rel in entries]
    return _catalog("food101", split, paths, [index[c] for c, _ in entries], classes, image_size, source)


def _download_food101(root: Path, split: str) -> None:
    from torchvision.datasets import Food101

    Food101(str(root), split=split, download=True)


FOOD101 = DatasetSpec(
    name="food101", splits=("train", "test"),
    expected_layout="{root}/food-101/images/<class>/<id>.jpg with {root}/food-101/meta/<split>.json (or "
                    "<split>.txt) and meta/classes.txt (torchvision format), or {root}/<split>.npz (+ classes.txt)",
    open=_open_food101, download=_download_food101,
    description="Food-101: 75,750 train / 25,250 test photos of 101 dishes (decoded and resized)",
)


# ----------------------------------------------------------------------------------------------- Places365

_PLACES_LISTS = {"train-standard": "places365_train_standard.txt",
                 "train-challenge": "places365_train_challenge.txt", "val": "places365_val.txt"}
_PLACES_DIRS = {"train-standard": ("data_256_standard", "data_large_standard", "data_256", "data_large"),
                "train-challenge": ("data_256_challenge", "data_large_challenge", "data_256", "data_large"),
                "val": ("val_256", "val_large")}
_PLACES_ALIASES = {"train": "train-standard", "test": "val"}


def places_class_name(category: str) -> str:
    """Readable Places365 class name: the category path without its leading ``/<letter>/``."""
    return re.sub(r"^/[a-z]/", "", category).lstrip("/")


def _open_places365(root: Path | None, split: str, image_size: int | None) -> Catalog:
    npz_names = [split] + [a for a, c in _PLACES_ALIASES.items() if c == split]
    root = _existing(root)
    found = _npz_first("places365", root, npz_names, split, image_size)
    if found is not None:
        return found
    cat_file, list_file = root / "categories_places365.txt", root / _PLACES_LISTS[split]
    for f in (cat_file, list_file):
        if not f.is_file():
            raise MissingData(f, "file missing")
    names: dict[int, str] = {}
    for ln in _read_lines(cat_file, name="places365"):
        parts = ln.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise DataError(f"places365: bad line {ln!r} in {cat_file}; expected '/a/airfield 0'")
        names[int(parts[1])] = places_class_name(parts[0])
    if sorted(names) != list(range(len(names))):
        raise DataError(f"places365: {cat_file} must number its categories 0..{len(names) - 1} without gaps")
    classes = tuple(names[i] for i in range(len(names)))
    images = next((root / d for d in _PLACES_DIRS[split] if (root / d).is_dir()), None)
    if images is None:
        raise MissingData(root / _PLACES_DIRS[split][0], f"no image folder ({' or '.join(_PLACES_DIRS[split])})")
    paths, labels = [], []
    for ln in _read_lines(list_file, name="places365"):
        parts = ln.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise DataError(f"places365: bad line {ln!r} in {list_file}; expected 'path label'")
        paths.append(images.joinpath(*parts[0].lstrip("/").split("/")))
        labels.append(int(parts[1]))
    return _catalog("places365", split, paths, labels, classes, image_size, list_file)


def _download_places365(root: Path, split: str) -> None:
    from torchvision.datasets import Places365

    Places365(str(root), split=split, small=True, download=True)


PLACES365 = DatasetSpec(
    name="places365", splits=("train-standard", "train-challenge", "val"), aliases=_PLACES_ALIASES,
    expected_layout="{root}/categories_places365.txt, the file list {root}/places365_train_standard.txt "
                    "(train-challenge: places365_train_challenge.txt; val: places365_val.txt) and images under "
                    "{root}/data_256_standard/ (or data_large_standard/; challenge: data_256_challenge/) or "
                    "{root}/val_256/ (or val_large/) (torchvision format), or {root}/<split>.npz (+ classes.txt)",
    open=_open_places365, download=_download_places365,
    description="Places365: 1.8 M train / 36,500 val scene photos, 365 classes (decoded and resized)",
)


# ------------------------------------------------------------------------------------------ iNaturalist 2021

_INAT_CATEGORY = re.compile(r"(\d{5})_(.+)")


def _open_inat2021(root: Path | None, split: str, image_size: int | None) -> Catalog:
    npz_names = [split] + (["test"] if split == "valid" else [])
    root = _existing(root)
    found = _npz_first("inat2021", root, npz_names, split, image_size)
    if found is not None:
        return found
    base = root / f"2021_{split}"
    if not base.is_dir():
        raise MissingData(base, "folder missing")
    categories = []
    for entry in sorted(os.scandir(base), key=lambda e: e.name):
        match = _INAT_CATEGORY.fullmatch(entry.name)
        if entry.is_dir() and match:
            categories.append((int(match.group(1)), match.group(2), Path(entry.path)))
    ids = [c[0] for c in categories]
    if not categories:
        raise DataError(f"inat2021: {base} has no category folders named like 00000_Animalia_..._species")
    if ids != list(range(len(ids))):
        first_bad = next(i for i, cid in enumerate(ids) if cid != i)
        raise DataError(f"inat2021: category folders in {base} must be numbered 00000..{len(ids) - 1:05d} without "
                        f"gaps; expected {first_bad:05d}, found {ids[first_bad]:05d}")
    classes = tuple(c[1] for c in categories)
    paths, labels = [], []
    for cid, _, folder in categories:
        files = sorted(e.name for e in os.scandir(folder) if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES))
        paths.extend(folder / f for f in files)
        labels.extend([cid] * len(files))
    return _catalog("inat2021", split, paths, labels, classes, image_size, base)


def _download_inat2021(root: Path, split: str) -> None:
    from torchvision.datasets import INaturalist

    INaturalist(str(root), version=f"2021_{split}", download=True)


INAT2021 = DatasetSpec(
    name="inat2021", splits=("train", "train_mini", "valid"), aliases={"test": "valid"},
    expected_layout="{root}/2021_train/, {root}/2021_train_mini/ or {root}/2021_valid/ holding category folders "
                    "00000_Animalia_..._species/*.jpg (torchvision format), or {root}/<split>.npz (+ classes.txt)",
    open=_open_inat2021, download=_download_inat2021,
    description="iNaturalist 2021: 2.7 M train / 500 k train_mini / 100 k valid photos, 10,000 species",
)
