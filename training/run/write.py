"""Writing the weights and the membership mask of a run directory, returning the sha256 the manifest records.

The sha256 is computed from the bytes written, so a writer never reads its own files back to hash them.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from foundation.io import atomic_path, sha256_bytes
from foundation.files import MEMBERSHIP_FILE, WEIGHTS_FILE

__all__ = ["write_weights", "write_membership"]


def _write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_weights(run_dir: str | os.PathLike[str], tensors: Mapping[str, Any]) -> str:
    """Save a name -> tensor map as ``<run_dir>/model.safetensors`` (atomically); return its sha256."""
    from safetensors.torch import save

    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    _write_bytes(Path(run_dir) / WEIGHTS_FILE, data)
    return sha256_bytes(data)


def write_membership(run_dir: str | os.PathLike[str], mask: np.ndarray) -> str:
    """Save the bool membership mask as ``<run_dir>/membership.npy`` (no pickle, atomically); return its sha256.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     from foundation.io import sha256_file
    ...     sha = write_membership(d, np.array([True, False]))
    ...     sha == sha256_file(Path(d) / MEMBERSHIP_FILE)
    True
    """
    buf = io.BytesIO()
    np.save(buf, np.asarray(mask, dtype=bool), allow_pickle=False)
    data = buf.getvalue()
    _write_bytes(Path(run_dir) / MEMBERSHIP_FILE, data)
    return sha256_bytes(data)
