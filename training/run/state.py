"""Resumable training state of a run directory.

While training runs, ``state/checkpoint.pt`` holds everything needed to resume
(weights, optimizer and scheduler state, step, RNG state, partial metrics); it is written by us and read back
with ``torch.load(weights_only=True)``, so resuming never executes code from a file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from foundation.errors import CheckpointError
from foundation.io import atomic_path
from foundation.files import STATE_FILE

__all__ = [
    "STATE_FILE",
    "save_state",
    "load_state",
    "clear_state",
    "has_state",
]


def save_state(run_dir: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Atomically write resumable state (tensors, numbers, strings, lists and dicts only)."""
    path = Path(run_dir) / STATE_FILE
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return path


def load_state(run_dir: str | os.PathLike[str], *, config_sha256: str) -> dict[str, Any] | None:
    """Read resumable state, or None when there is none; refuse state from another config."""
    path = Path(run_dir) / STATE_FILE
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt or truncated file, or one holding objects we never write
        raise CheckpointError(
            f"resume state {path} is corrupt or not written by dp-audit ({type(exc).__name__}); "
            f"delete {path.parent} to start over") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"resume state {path} is incomplete; delete {path.parent} to start over")
    if state.get("config_sha256") != config_sha256:
        raise CheckpointError(
            f"resume state in {Path(run_dir)} was written with a different config; resume with the same config "
            f"and overrides, or choose another run name")
    return state


def has_state(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` holds the saved state of an interrupted run."""
    return (Path(run_dir) / STATE_FILE.parent).exists()


def clear_state(run_dir: str | os.PathLike[str]) -> None:
    """Delete the resumable state (the run is complete)."""
    shutil.rmtree(Path(run_dir) / STATE_FILE.parent, ignore_errors=True)
