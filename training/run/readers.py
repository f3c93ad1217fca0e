"""Read one file of a run directory and check it against the manifest (the pieces :func:`~training.run.open_run`
assembles into a :class:`~training.run.VerifiedRun`): weights, membership, config.yaml.

Each reader raises a :class:`~foundation.errors.CheckpointError` (or :class:`~foundation.errors.ConfigError`) with one
line that names the file and how to fix it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.config import TrainConfig
from foundation.errors import CheckpointError, ConfigError
from foundation.io import sha256_bytes
from foundation.files import CONFIG_FILE
from training.run.manifest import Manifest

__all__ = ["read_weights", "decode_weights", "check_finite_weights", "read_membership", "read_config",
           "without_downloads", "parse_yaml"]


def read_weights(run_dir: Path, manifest: Manifest) -> bytes:
    """The bytes of the weights file after checking their sha256 against the manifest (the file is read once).

    Raises:
        CheckpointError: missing file or sha256 mismatch.
    """
    path = run_dir / manifest.model.weights_file
    if not path.is_file():
        raise CheckpointError(f"weights file {path} named in the manifest is missing")
    data = path.read_bytes()
    digest = sha256_bytes(data)
    if digest != manifest.model.weights_sha256:
        raise CheckpointError(
            f"weights file {path} does not match the manifest (sha256 {digest[:12]}... != "
            f"{manifest.model.weights_sha256[:12]}...): the checkpoint was modified or belongs to another run")
    return data


def decode_weights(data: bytes, *, source: Path) -> dict[str, torch.Tensor]:
    """CPU tensors from the bytes of a safetensors file (no pickle).

    Raises:
        CheckpointError: the bytes are not a safetensors file.
    """
    from safetensors.torch import load

    try:
        return load(data)
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"weights file {source} is corrupt or not safetensors ({exc})") from None


def check_finite_weights(state: dict[str, torch.Tensor], path: Any) -> None:
    """Refuse weights that hold NaN or inf (a diverged model: every attack on it would be meaningless).

    Raises:
        CheckpointError: some floating-point tensor is not finite.
    """
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(f"weights in {path} are not finite ({len(bad)} tensor(s) hold NaN or inf, first "
                              f"'{bad[0]}'): the model diverged in training; retrain it with a lower learning rate")


def read_membership(run_dir: Path, manifest: Manifest) -> np.ndarray:
    """The membership mask (bool, one per pool index) after checking its sha256 and length.

    Raises:
        CheckpointError: missing file, sha256 mismatch, or not a bool vector of the pool's length.
    """
    import io

    path = run_dir / manifest.data.membership_file
    if not path.is_file():
        raise CheckpointError(f"membership file {path} named in the manifest is missing")
    data = path.read_bytes()
    if sha256_bytes(data) != manifest.data.membership_sha256:
        raise CheckpointError(f"membership file {path} does not match the manifest's sha256: refusing to audit")
    try:
        mask = np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:  # object arrays (pickles), truncated or foreign files
        raise CheckpointError(f"membership file {path} is not a plain .npy bool array ({exc})") from None
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.ndim != 1 or mask.shape[0] != manifest.data.pool_size:
        raise CheckpointError(
            f"membership file {path} must be a bool vector of length {manifest.data.pool_size}, "
            f"got {mask.dtype} {mask.shape}")
    _check_redraw(mask, manifest, path)
    return mask


def _check_redraw(mask: np.ndarray, manifest: Manifest, path: Path) -> None:
    """A membership the manifest says was drawn Bernoulli(p) from a recorded seed (``audit train``) is drawn
    again and compared: a mask permuted or re-drawn after training (its sha256 re-recorded) would make every
    membership-inference figure meaningless, so it is refused.

    Raises:
        CheckpointError: the mask is not the draw of the recorded seed.
    """
    from training.pool import draw_membership

    info = manifest.data.membership
    if info.scheme != "bernoulli" or info.seed is None or info.p is None or not 0.0 < info.p < 1.0:
        return
    expected = draw_membership(mask.size, p=float(info.p), seed=int(info.seed))
    canaries = manifest.data.canaries or {}
    if canaries.get("kind") == "auditor" and int(canaries.get("count", 0)) > 0:  # the auditor's package: all IN
        first = int(canaries.get("first_index", 0))
        expected[first:first + int(canaries["count"])] = True
    differ = int((expected != mask).sum())
    if differ:
        raise CheckpointError(f"membership file {path} is not the Bernoulli(p={info.p:g}) draw of the recorded seed "
                              f"{info.seed} ({differ} of {mask.size} entries differ: permuted or re-drawn after "
                              f"training): refusing to audit")


def read_config(run_dir: Path, manifest: Manifest, text: bytes, parse: Callable[[], Any]) -> TrainConfig:
    """Validate ``config.yaml`` (its bytes ``text``; ``parse()`` gives them parsed) into a :class:`TrainConfig`
    after checking the bytes' sha256 against the manifest.

    Raises:
        CheckpointError: the file differs from the one the manifest records, or is not a valid training config.
    """
    from training.config import validate_config

    path = run_dir / CONFIG_FILE
    want = manifest.provenance.config_sha256
    if want is not None and sha256_bytes(text) != want:
        raise CheckpointError(f"{path} does not match the manifest's config sha256: the recipe was edited after "
                              f"training; restore it (or retrain) before auditing")
    data = parse()
    try:
        config = validate_config(data if isinstance(data, dict) else {}, TrainConfig, source=f"config error in {path}")
    except ConfigError as exc:
        raise CheckpointError(f"{path} is not a valid training config ({exc})") from None
    return without_downloads(config)


def without_downloads(config: TrainConfig) -> TrainConfig:
    """``config`` with every dataset download flag off (``data.download``, ``training.continual.public.download``).

    A received run's recipe is the vendor's: rebuilding its pool (for attacks, ε, reference models, the report)
    must read the data already on the auditor's disk, never fetch what the vendor's flag asks for (a download
    writes wherever ``data.root`` points). Missing data is then the usual one-line error naming the layout.

    >>> cfg = TrainConfig.model_validate({"data": {"download": True}})
    >>> without_downloads(cfg).data.download, without_downloads(cfg).training.continual.public.download
    (False, False)
    """
    continual = config.training.continual
    public = continual.public.model_copy(update={"download": False})
    training = config.training.model_copy(update={"continual": continual.model_copy(update={"public": public})})
    return config.model_copy(update={"data": config.data.model_copy(update={"download": False}), "training": training})


def parse_yaml(path: Path, text: bytes) -> Any:
    import yaml

    from training.config import safe_load_yaml

    try:
        return safe_load_yaml(text)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid YAML ({exc}); re-create the run") from None
