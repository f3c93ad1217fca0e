"""The auditor's canary package: the canaries a vendor must train on, in a safe file format.

An auditor who does not trust a vendor's privacy claim chooses the canaries itself (``audit canaries make``,
:mod:`audit.canaries`): it draws m canaries, includes each with probability 1/2, and hands the vendor a
package holding **only the included canaries**, shuffled, without inclusion bits or seed. The vendor trains
on its data plus the package (``training.canaries.from_file``); the pool builder appends the package's images
after the real pool, every one of them a member, and the manifest records the package's sha256 and the
auditor's commitment. The package is the one file of the protocol that training reads, so its format lives here
(``training`` never imports ``audit``).

The file is an ``.npz`` without pickles (read with ``allow_pickle=False``):

* ``x`` uint8 (n, H, W, 3) images, ``y`` int64 (n,) labels;
* ``meta``: a 0-d unicode array holding JSON: ``format`` (:data:`PACKAGE_FORMAT`), ``count`` (n), ``kind``,
  ``image_shape``, ``num_classes`` and ``commitment`` (the auditor's published commitment, 64 hex digits).

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "pkg.npz"
>>> _ = write_package(p, x=np.zeros((2, 4, 4, 3), np.uint8), y=np.array([1, 0]), kind="ood", num_classes=3,
...                   commitment="ab" * 32)
>>> pkg = read_package(p)
>>> pkg.count, pkg.kind, pkg.y.tolist(), len(pkg.sha256)
(2, 'ood', [1, 0], 64)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from foundation.errors import DataError
from foundation.io import atomic_path, sha256_file

__all__ = ["PACKAGE_FORMAT", "CanaryPackage", "read_package", "write_package", "HEX64"]

PACKAGE_FORMAT = "dp-audit-canary-package/1"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
_KEYS = {"x", "y", "meta"}


@dataclasses.dataclass(frozen=True, eq=False)
class CanaryPackage:
    """A verified canary package.

    Attributes:
        path: where it was read from.
        sha256: sha256 of the file's bytes (what the manifest records).
        x: uint8 (n, H, W, 3) canary images; y: int64 (n,) labels.
        kind: how the auditor designed them (e.g. ``ood``).
        num_classes: classes the labels index.
        commitment: the auditor's commitment (64 hex digits), published before training.
    """

    path: Path
    sha256: str
    x: np.ndarray
    y: np.ndarray
    kind: str
    num_classes: int
    commitment: str

    @property
    def count(self) -> int:
        return int(self.y.shape[0])

    def describe(self) -> dict[str, Any]:
        """What the manifest records about the package (``data.canaries``, with ``first_index`` added)."""
        return {"kind": "auditor", "design": self.kind, "count": self.count, "package_sha256": self.sha256,
                "commitment": self.commitment, "source": "the auditor's canary package (training.canaries.from_file)",
                "inclusion": "all package canaries are members; the auditor kept the excluded ones and the "
                             "inclusion bits secret (independent Bernoulli(1/2), committed before training)"}


def _meta_text(meta: dict[str, Any]) -> np.ndarray:
    return np.array(json.dumps(meta, sort_keys=True))


def write_package(path: str | os.PathLike[str], *, x: np.ndarray, y: np.ndarray, kind: str, num_classes: int,
                  commitment: str) -> Path:
    """Write a canary package atomically (the auditor's side; see :mod:`audit.canaries`).

    Raises:
        ValueError: malformed arrays or commitment.
    """
    x = np.asarray(x)
    y = np.asarray(y, dtype=np.int64)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3 or y.shape != (x.shape[0],):
        raise ValueError(f"x must be uint8 (n, H, W, 3) and y int64 (n,), got {x.dtype} {x.shape} and {y.shape}")
    if not HEX64.match(str(commitment)):
        raise ValueError(f"commitment must be 64 lower-case hex digits, got {commitment!r}")
    meta = {"format": PACKAGE_FORMAT, "count": int(y.shape[0]), "kind": str(kind),
            "image_shape": list(x.shape[1:]), "num_classes": int(num_classes), "commitment": str(commitment)}
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, x=x, y=y, meta=_meta_text(meta))
    return path


def read_package(path: str | os.PathLike[str], *, num_classes: int | None = None,
                 image_shape: tuple[int, int] | None = None) -> CanaryPackage:
    """Read and check a canary package (no pickles are ever loaded).

    Args:
        path: the ``.npz`` file.
        num_classes: the training data's class count; labels must lie below it (None: the package's own).
        image_shape: the training data's (H, W); the canaries must have it (None: not checked).

    Raises:
        DataError: a missing or unreadable file, another format, or arrays that do not fit (one line).
    """
    path = Path(path)
    where = f"canary package {path}"
    if not path.is_file():
        raise DataError(f"{where} not found (training.canaries.from_file): point it at the file 'audit canaries "
                        "make' wrote for the vendor")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if set(npz.files) != _KEYS:
                raise DataError(f"{where} must hold exactly the arrays x, y, meta; it holds {sorted(npz.files)}")
            x, y, meta_arr = npz["x"], npz["y"], npz["meta"]
    except DataError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise DataError(f"{where} is not a readable .npz without pickles ({type(exc).__name__}: {exc})") from None
    try:
        meta = json.loads(str(meta_arr[()])) if meta_arr.ndim == 0 and meta_arr.dtype.kind == "U" else None
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != PACKAGE_FORMAT:
        raise DataError(f"{where} is not a {PACKAGE_FORMAT} file (its 'meta' is missing or of another format)")
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3 or x.shape[0] < 1:
        raise DataError(f"{where}: x must be uint8 (n >= 1, H, W, 3), got {x.dtype} {x.shape}")
    if y.dtype != np.int64 or y.shape != (x.shape[0],):
        raise DataError(f"{where}: y must be int64 of shape ({x.shape[0]},), got {y.dtype} {y.shape}")
    classes = int(meta.get("num_classes", -1)) if isinstance(meta.get("num_classes"), int) else -1
    limit = classes if num_classes is None else int(num_classes)
    if limit < 1 or int(y.min()) < 0 or int(y.max()) >= limit or (num_classes is not None and classes != limit):
        raise DataError(f"{where}: labels must lie in [0, {limit}) and the package must be made for {limit} "
                        f"classes (it says {classes}, labels span {int(y.min())}..{int(y.max())})")
    if image_shape is not None and tuple(x.shape[1:3]) != tuple(image_shape):
        raise DataError(f"{where}: canaries are {x.shape[1]}x{x.shape[2]} but the training images are "
                        f"{image_shape[0]}x{image_shape[1]}; make the package for this data (audit canaries make "
                        f"--image-size)")
    commitment = str(meta.get("commitment", ""))
    if not HEX64.match(commitment) or meta.get("count") != x.shape[0]:
        raise DataError(f"{where}: its meta must record the count ({x.shape[0]}) and a 64-hex-digit commitment")
    x.setflags(write=False)
    y.setflags(write=False)
    return CanaryPackage(path=path, sha256=sha256_file(path), x=x, y=y, kind=str(meta.get("kind", "unknown")),
                         num_classes=classes, commitment=commitment)
