"""The names of the files in a run directory: the one place they are spelt.

A finished run directory holds::

    manifest.json        what the checkpoint claims (training.run.manifest); written last
    model.safetensors    the weights (sha256 in the manifest)
    membership.npy       one bool per pool index, True = trained on (sha256 in the manifest)
    config.yaml          the resolved training config (runs written by ``audit train``; sha256 in the manifest)
    import.json          the data sources of an imported checkpoint (``audit import``)
    metrics.json         accuracies, steps, loss history
    canary_package.npz   the auditor's canary package the run trained on (training.canaries.from_file; its
                         sha256 in the manifest's data.canaries)
    state/checkpoint.pt  resumable training state (removed when the run completes)
    tb/                  TensorBoard curves
    .lock                held while a command writes the run (foundation.lock)

>>> has_recipe("/nonexistent")
False
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CANARY_PACKAGE_FILE", "MANIFEST_FILE", "WEIGHTS_FILE", "MEMBERSHIP_FILE", "CONFIG_FILE", "IMPORT_FILE", "METRICS_FILE",
           "STATE_DIR", "STATE_FILE", "TB_DIR", "has_recipe", "is_complete"]

MANIFEST_FILE = "manifest.json"
WEIGHTS_FILE = "model.safetensors"
MEMBERSHIP_FILE = "membership.npy"
CONFIG_FILE = "config.yaml"
IMPORT_FILE = "import.json"
METRICS_FILE = "metrics.json"
CANARY_PACKAGE_FILE = "canary_package.npz"
STATE_DIR = "state"
STATE_FILE = Path(STATE_DIR) / "checkpoint.pt"
TB_DIR = "tb"


def has_recipe(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` holds a ``config.yaml`` (a training recipe that reference models can follow)."""
    return (Path(run_dir) / CONFIG_FILE).is_file()


def is_complete(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` holds a manifest (written last, so its presence marks a finished run)."""
    return (Path(run_dir) / MANIFEST_FILE).is_file()
