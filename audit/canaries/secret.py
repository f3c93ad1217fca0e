"""Auditor-chosen canaries: the secret set, the vendor's package, and the commitment that binds them.

The protocol (``audit canaries make`` → the vendor trains → ``audit epsilon RUN --canaries SECRET``):

1. The auditor draws m canaries designed to be memorised (``ood``: uniform-noise colour images with uniformly
   random labels, far from any natural image, so a model that fits them must memorise each one) and includes
   each independently with probability 1/2. Everything follows from a secret seed (by default 63 bits from the
   OS CSPRNG), kept by the auditor.
2. It writes three files: the **vendor package** (:mod:`training.canary_package`: only the included canaries,
   shuffled, no inclusion bits, no seed), the **secret file** (every canary, the inclusion bits, the package order,
   the seed and a random 256-bit salt; an ``.npz`` without pickles) and the **commitment**
   ``sha256("dp-audit canary commitment/1" ‖ salt ‖ digest)``, where ``digest`` is the sha256 over the secret's
   canonical content (:func:`content_digest`). The commitment is published before training and is written into
   the package, so the run's manifest records it.
3. After training, the auditor reveals the secret; anyone can recompute the commitment from it
   (:func:`verify_secret`) and check that the package the run trained on is the secret's included canaries in
   package order.

The salt keeps the commitment from revealing anything about the bits (it is hiding); sha256 makes it binding: the
auditor cannot choose the bits after seeing the model (which would let it manufacture a violation), and the vendor
cannot swap the package for one it prefers.

>>> s = make_canaries(count=6, num_classes=3, image_size=(4, 4), seed=1)
>>> s.count, s.x.shape, int(s.included.sum()) == len(s.package_order), verify_secret(s) == s.commitment
(6, (6, 4, 4, 3), True, True)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from training.canary_package import HEX64, write_package
from training.input_canaries import noise_images
from foundation.errors import CheckpointError, UserError
from foundation.files import CANARY_PACKAGE_FILE, CANARY_SECRET_FILE, COMMITMENT_FILE
from foundation.io import all_or_nothing, atomic_path, fingerprint_arrays, sha256_file, write_text

__all__ = ["SECRET_FORMAT", "KINDS", "CanarySecret", "make_canaries", "content_digest", "commitment_of",
           "verify_secret", "write_canaries", "read_secret"]

SECRET_FORMAT = "dp-audit-canary-secret/1"
KINDS = ("ood",)
_TAG = b"dp-audit canary commitment/1"
_DESIGN, _INCLUDE, _ORDER = 0x43445347, 0x43494E43, 0x434F5244  # "CDSG", "CINC", "CORD": separate streams
_ARRAYS = {"x", "y", "included", "package_order", "meta"}


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class CanarySecret:
    """The auditor's canaries and everything needed to check a run against them.

    Attributes:
        x: uint8 (m, H, W, 3) every canary; y: int64 (m,) their labels.
        included: bool (m,) inclusion bits (independent Bernoulli(1/2)).
        package_order: int64 (n_in,) the canary index at each package position (``x[package_order]`` is the
            package).
        kind: the design (:data:`KINDS`); num_classes: classes the labels index.
        seed: the secret seed the canaries, bits and order follow from.
        salt: 32 random bytes (hex) mixed into the commitment.
        commitment: the published commitment (64 hex digits).
        package_sha256: sha256 of the package file written for the vendor (None until written).
    """

    x: np.ndarray
    y: np.ndarray
    included: np.ndarray
    package_order: np.ndarray
    kind: str
    num_classes: int
    seed: int
    salt: str
    commitment: str
    package_sha256: str | None = None

    @property
    def count(self) -> int:
        return int(self.y.shape[0])

    @property
    def package_x(self) -> np.ndarray:
        return self.x[self.package_order]

    @property
    def package_y(self) -> np.ndarray:
        return self.y[self.package_order]

    def meta(self) -> dict[str, Any]:
        """The JSON fields of the secret file (what :func:`content_digest` covers, plus salt and results)."""
        return {"format": SECRET_FORMAT, "kind": self.kind, "count": self.count, "num_classes": self.num_classes,
                "image_shape": list(self.x.shape[1:]), "seed": str(self.seed), "salt": self.salt,
                "commitment": self.commitment, "package_sha256": self.package_sha256}


def content_digest(*, x: np.ndarray, y: np.ndarray, included: np.ndarray, package_order: np.ndarray, kind: str,
                   num_classes: int, seed: int) -> str:
    """sha256 over the secret's canonical content: the arrays (dtype, shape, bytes) and the design fields.

    It does not depend on how the ``.npz`` was zipped, so a re-saved secret keeps its commitment.
    """
    arrays = fingerprint_arrays(np.ascontiguousarray(x), np.ascontiguousarray(y), np.ascontiguousarray(included),
                                np.ascontiguousarray(package_order))
    fields = json.dumps({"format": SECRET_FORMAT, "kind": kind, "num_classes": int(num_classes),
                         "seed": str(int(seed))}, sort_keys=True)
    return hashlib.sha256(f"{arrays}\n{fields}".encode("utf-8")).hexdigest()


def commitment_of(digest: str, salt: str) -> str:
    """``sha256(tag ‖ salt ‖ digest)`` (salt and digest as bytes from hex)."""
    return hashlib.sha256(_TAG + bytes.fromhex(salt) + bytes.fromhex(digest)).hexdigest()


def _design(kind: str, *, count: int, num_classes: int, image_size: tuple[int, int],
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if kind == "ood":
        return noise_images(rng, count=count, image_size=image_size, num_classes=num_classes)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def make_canaries(*, count: int, num_classes: int, image_size: tuple[int, int], kind: str = "ood",
                  seed: int | None = None, salt: str | None = None, design_seed: int | None = None) -> CanarySecret:
    """Draw m canaries and their inclusion bits, and commit to them.

    Args:
        count: m, the number of canaries (>= 2; 1,000-5,000 give a useful ceiling).
        num_classes: classes of the vendor's task (labels are drawn in ``[0, num_classes)``).
        image_size: (H, W) of the vendor's training images.
        kind: the design (:data:`KINDS`).
        seed: the secret seed; None draws 63 bits from the OS CSPRNG. A guessable seed lets the vendor rebuild
            the excluded canaries and the bits from the package: pass one only for reproducible experiments.
        salt: 64 hex digits; None draws 32 bytes from the OS CSPRNG (tests pass one to be deterministic).
        design_seed: draw the canary images and labels from this seed instead of ``seed`` (experiments that give
            several secrets the same canaries, so they can share reference models; the bits still follow ``seed``).

    Raises:
        ValueError: an argument out of range (the message names it).
    """
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 2:
        raise ValueError(f"count must be an integer >= 2, got {count!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if len(image_size) != 2 or any(int(s) < 1 or int(s) > 1024 for s in image_size):
        raise ValueError(f"image_size must be (H, W) with sides in [1, 1024], got {image_size!r}")
    seed = secrets.randbits(63) if seed is None else int(seed)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    salt = secrets.token_hex(32) if salt is None else str(salt)
    if not HEX64.match(salt):
        raise ValueError("salt must be 64 lower-case hex digits")
    x, y = _design(kind, count=int(count), num_classes=int(num_classes),
                   image_size=(int(image_size[0]), int(image_size[1])),
                   rng=np.random.default_rng([seed if design_seed is None else int(design_seed), _DESIGN]))
    included = np.random.default_rng([seed, _INCLUDE]).random(int(count)) < 0.5
    if not included.any() or included.all():  # a one-sided draw has no audit value (chance 2^(1-m))
        included[0] = not included[0]
    order = np.random.default_rng([seed, _ORDER]).permutation(np.flatnonzero(included)).astype(np.int64)
    y = y.astype(np.int64)
    digest = content_digest(x=x, y=y, included=included, package_order=order, kind=kind, num_classes=num_classes,
                            seed=seed)
    return CanarySecret(x=x, y=y, included=included, package_order=order, kind=kind, num_classes=int(num_classes),
                        seed=seed, salt=salt, commitment=commitment_of(digest, salt))


def verify_secret(secret: CanarySecret) -> str:
    """Recompute the commitment from the secret's content and salt; return it if it equals the recorded one.

    Raises:
        CheckpointError: the content does not produce the recorded commitment (the secret was altered).
    """
    digest = content_digest(x=secret.x, y=secret.y, included=secret.included, package_order=secret.package_order,
                            kind=secret.kind, num_classes=secret.num_classes, seed=secret.seed)
    got = commitment_of(digest, secret.salt)
    if got != secret.commitment:
        raise CheckpointError(f"the canary secret does not match its own commitment (recomputed {got[:16]}..., "
                              f"recorded {secret.commitment[:16]}...): it was altered after it was made")
    return got


def write_canaries(out_dir: str | os.PathLike[str], secret: CanarySecret, *,
                   overwrite: bool = False) -> dict[str, Path]:
    """Write the vendor package, the secret file and ``commitment.txt`` into ``out_dir`` (each atomically).

    Returns:
        ``{"package": ..., "secret": ..., "commitment": ...}`` paths.

    Raises:
        UserError: ``out_dir`` already holds one of the files and ``overwrite`` is False.
    """
    out = Path(out_dir)
    paths = {"package": out / CANARY_PACKAGE_FILE, "secret": out / CANARY_SECRET_FILE,
             "commitment": out / COMMITMENT_FILE}
    if not overwrite and any(p.exists() for p in paths.values()):
        raise UserError(f"{out} already holds canary files; choose another --out (a new secret needs a new "
                        "commitment) or pass --overwrite")
    with all_or_nothing(out, files=tuple(paths.values())):  # a kit is whole or absent: a package without its secret
        write_package(paths["package"], x=secret.package_x, y=secret.package_y, kind=secret.kind,
                      num_classes=secret.num_classes, commitment=secret.commitment)
        secret = dataclasses.replace(secret, package_sha256=sha256_file(paths["package"]))
        meta = {**secret.meta(), "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with atomic_path(paths["secret"], mode=0o600) as tmp:  # the bits and seed: owner only
            with open(tmp, "wb") as fh:
                np.savez(fh, x=secret.x, y=secret.y, included=secret.included, package_order=secret.package_order,
                         meta=np.array(json.dumps(meta, sort_keys=True)))
        write_text(paths["commitment"], secret.commitment + "\n")
    return paths


def read_secret(path: str | os.PathLike[str]) -> CanarySecret:
    """Read a secret file (no pickles) and verify it against its own commitment.

    Raises:
        CheckpointError: missing, unreadable, malformed, or altered (one line).
    """
    path = Path(path)
    where = f"canary secret {path}"
    if not path.is_file():
        raise CheckpointError(f"{where} not found: pass the {CANARY_SECRET_FILE} that 'audit canaries make' wrote")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if set(npz.files) != _ARRAYS:
                raise CheckpointError(f"{where} must hold the arrays {sorted(_ARRAYS)}; it holds {sorted(npz.files)}")
            arr = {k: npz[k] for k in npz.files}
        meta = json.loads(str(arr["meta"][()])) if arr["meta"].ndim == 0 and arr["meta"].dtype.kind == "U" else None
    except CheckpointError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointError(f"{where} is not a readable .npz without pickles ({type(exc).__name__})") from None
    if not isinstance(meta, dict) or meta.get("format") != SECRET_FORMAT:
        raise CheckpointError(f"{where} is not a {SECRET_FORMAT} file")
    x, y, inc, order = arr["x"], arr["y"], arr["included"], arr["package_order"]
    m = y.shape[0] if y.ndim == 1 else -1
    ok = (x.dtype == np.uint8 and x.ndim == 4 and x.shape[0] == m and x.shape[-1] == 3 and y.dtype == np.int64
          and inc.dtype == np.bool_ and inc.shape == (m,) and order.dtype == np.int64 and order.ndim == 1
          and order.size == int(inc.sum()) and np.array_equal(np.sort(order), np.flatnonzero(inc)))
    if not ok:
        raise CheckpointError(f"{where}: arrays are malformed (x uint8 (m,H,W,3), y int64, included bool, "
                              "package_order a permutation of the included indices)")
    try:
        secret = CanarySecret(x=x, y=y, included=inc, package_order=order, kind=str(meta["kind"]),
                              num_classes=int(meta["num_classes"]), seed=int(meta["seed"]), salt=str(meta["salt"]),
                              commitment=str(meta["commitment"]), package_sha256=meta.get("package_sha256"))
        if not HEX64.match(secret.salt) or not HEX64.match(secret.commitment):
            raise ValueError("salt and commitment must be 64 hex digits")
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: its meta is malformed ({exc})") from None
    verify_secret(secret)
    return secret
