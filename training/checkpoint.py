"""Run directories: resumable training state, final checkpoints, and loading a model back from a run.

A finished run directory holds ``model.safetensors`` + ``manifest.json`` (+ ``membership.npy``, ``metrics.json``,
``config.yaml``, ``tb/``). While training runs, ``state/checkpoint.pt`` holds everything needed to resume
(weights, optimizer and scheduler state, step, RNG state, partial metrics); it is written by us and read back
with ``torch.load(weights_only=True)``, so resuming never executes code from a file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from training.config import ModelConfig
from training.errors import CheckpointError
from training.io import atomic_path, load_safetensors, read_json, sha256_file
from training.manifest import Manifest, read_manifest, verify_weights
from training.models import build_model

__all__ = [
    "STATE_FILE",
    "save_state",
    "load_state",
    "clear_state",
    "load_model_from_run",
    "model_config_from_manifest",
]

STATE_FILE = Path("state") / "checkpoint.pt"


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


def clear_state(run_dir: str | os.PathLike[str]) -> None:
    shutil.rmtree(Path(run_dir) / STATE_FILE.parent, ignore_errors=True)


def model_config_from_manifest(manifest: Manifest) -> ModelConfig:
    m = manifest.model
    return ModelConfig(arch=m.arch, kwargs=dict(m.kwargs), cifar_stem=m.cifar_stem, fix_batchnorm=m.fix_batchnorm,
                       normalize_mean=m.normalize_mean, normalize_std=m.normalize_std)


def check_finite_weights(state: dict[str, torch.Tensor] | str | os.PathLike[str], path: Any = None) -> None:
    """Refuse weights that hold NaN or inf (a diverged model: every attack on it would be meaningless).

    Args:
        state: a state dict, or the path of a safetensors file.
        path: the file named in the message (default: ``state`` when it is a path).

    Raises:
        CheckpointError: some floating-point tensor is not finite.
    """
    if not isinstance(state, dict):
        path, state = state, load_safetensors(state)
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(f"weights in {path} are not finite ({len(bad)} tensor(s) hold NaN or inf, first "
                              f"'{bad[0]}'): the model diverged in training; retrain it with a lower learning rate")


def load_model_from_run(run_dir: str | os.PathLike[str], *, device: str | torch.device = "cpu",
                        trust_code: bool = False) -> tuple[torch.nn.Module, Manifest]:
    """Rebuild the architecture named in the manifest and load its verified weights (eval mode).

    Args:
        run_dir: the run directory.
        device: where the model goes.
        trust_code: allow a manifest ``model.arch`` that is an import path (it is imported and called); only
            when the user trusts who made the run directory (``--trust-code``).

    Raises:
        UntrustedCodeError: the manifest names code to import and ``trust_code`` is False (nothing imported).
        CheckpointError: missing/corrupt manifest or weights, sha256 mismatch, or weights that do not fit.
    """
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    weights = verify_weights(run_dir, manifest)
    built = build_model(model_config_from_manifest(manifest), num_classes=manifest.model.num_classes,
                        input_shape=tuple(manifest.model.input_shape), trust_code=trust_code)
    module = built.module
    state = load_safetensors(weights)
    check_finite_weights(state, weights)
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise CheckpointError(f"weights in {weights} do not fit architecture {manifest.model.arch}: {first}") from None
    return module.to(device).eval(), manifest


def read_metrics(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    return read_json(Path(run_dir) / "metrics.json", what="metrics")


def file_sha(path: str | os.PathLike[str]) -> str:
    return sha256_file(path)
