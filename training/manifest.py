"""The manifest: what a checkpoint claims.

``manifest.json`` beside every checkpoint is the contract between training and auditing (see DESIGN.md).
Training writes it; auditors read it with :func:`read_manifest` and check sha256s and fingerprints before
trusting anything. External checkpoints get a hand-written manifest of the same schema (``audit import``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from training.errors import CheckpointError
from training.io import read_json, sha256_file, write_json

MANIFEST_FORMAT = "dp-audit-manifest/1"

__all__ = [
    "MANIFEST_FORMAT",
    "ModelInfo",
    "MembershipInfo",
    "DataInfo",
    "PhaseInfo",
    "PrivacyInfo",
    "Provenance",
    "Manifest",
    "read_manifest",
    "write_manifest",
    "verify_weights",
    "load_membership",
]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelInfo(_M):
    arch: str = Field(description="registry/timm name or 'package.module:factory'")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    num_classes: int
    input_shape: tuple[int, int, int] = Field(description="(C, H, W) of the float input in [0, 1]")
    normalize_mean: tuple[float, float, float] | None = None
    normalize_std: tuple[float, float, float] | None = None
    cifar_stem: bool = True
    fix_batchnorm: bool = True
    param_count: int
    trainable_param_count: int
    weights_file: str = "model.safetensors"
    weights_sha256: str
    frozen: list[str] = Field(default_factory=list, description="parameter names not trained")
    notes: list[str] = Field(default_factory=list, description="e.g. 'BatchNorm2d -> GroupNorm(...)'")


class MembershipInfo(_M):
    scheme: Literal["bernoulli", "all", "explicit"] = Field(
        description="bernoulli: each pool example IN independently with prob p (one-run audit needs this); "
        "all: the whole pool was trained on; explicit: a mask given by hand")
    p: float | None = None
    seed: int | None = None
    n_members: int
    n_pool: int


class DataInfo(_M):
    dataset: str
    root: str | None = None
    split: str
    test_split: str | None = None
    image_size: int | None = None
    pool_size: int
    pool_seed: int | None = None
    pool_subset: bool = False
    pool_fingerprint: str = Field(description="sha256 over the pool's x and y arrays (training.io.fingerprint_arrays)")
    membership_file: str = "membership.npy"
    membership_sha256: str
    membership: MembershipInfo
    nonmember_split: str | None = Field(None, description="external checkpoints: split whose examples are OUT")
    canaries: dict[str, Any] | None = None


class PhaseInfo(_M):
    name: str
    dp: bool
    dataset: str | None = None
    noise_multiplier: float | None = None
    sample_rate: float | None = None
    steps: int
    batch_size: int | None = None
    sampling: Literal["poisson", "shuffle", "none"] = "poisson"
    max_grad_norm: float | None = None
    clipping: Literal["flat", "per_layer", "automatic"] | None = None
    grad_sample_mode: str | None = None
    optimizer: str | None = None
    lr: float | None = None
    frozen: list[str] = Field(default_factory=list)
    epsilon: float | None = Field(None, description="epsilon of this phase alone (DP phases)")


class PrivacyInfo(_M):
    dp: bool
    unit: Literal["example"] = "example"
    neighbouring: Literal["add/remove", "replace-one"] = "add/remove"
    delta: float | None = None
    accountant: str | None = None
    epsilon: float | None = Field(None, description="claimed epsilon (all DP phases composed); None = no DP claim")
    epsilon_cross_check: dict[str, Any] | None = Field(None, description="{'accountant': 'pld', 'epsilon': ...}")
    phases: list[PhaseInfo] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @property
    def claimed_epsilon(self) -> float:
        """The claimed epsilon; +inf when the checkpoint makes no DP claim."""
        return float(self.epsilon) if (self.dp and self.epsilon is not None) else float("inf")


class Provenance(_M):
    package_version: str
    git_commit: str | None = None
    python: str | None = None
    torch: str | None = None
    opacus: str | None = None
    timm: str | None = None
    seed: int | None = None
    config_file: str | None = "config.yaml"
    config_sha256: str | None = None
    created: str
    command: str | None = None
    device: str | None = None


class Manifest(_M):
    format: Literal["dp-audit-manifest/1"] = MANIFEST_FORMAT
    run_name: str
    model: ModelInfo
    data: DataInfo
    privacy: PrivacyInfo
    training: dict[str, Any] = Field(default_factory=dict, description="recipe, optimizer, steps, metrics")
    provenance: Provenance


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    return write_json(Path(run_dir) / "manifest.json", manifest.model_dump(mode="json"))


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``<run_dir>/manifest.json`` (or a path to the manifest itself)."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / "manifest.json"
    if not path.exists():
        raise CheckpointError(
            f"no manifest at {path}: pass a run directory written by 'audit train' or 'audit import'")
    data = read_json(path, what="manifest")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise CheckpointError(f"manifest {path} is invalid at '{key}': {first['msg']}") from None


def verify_weights(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Path of the weights file after checking its sha256 against the manifest."""
    path = Path(run_dir) / manifest.model.weights_file
    if not path.is_file():
        raise CheckpointError(f"weights file {path} named in the manifest is missing")
    digest = sha256_file(path)
    if digest != manifest.model.weights_sha256:
        raise CheckpointError(
            f"weights file {path} does not match the manifest (sha256 {digest[:12]}... != "
            f"{manifest.model.weights_sha256[:12]}...): the checkpoint was modified or belongs to another run")
    return path


def load_membership(run_dir: str | os.PathLike[str], manifest: Manifest) -> np.ndarray:
    """The membership mask (bool, one per pool index) after checking its sha256 and length."""
    path = Path(run_dir) / manifest.data.membership_file
    if not path.is_file():
        raise CheckpointError(f"membership file {path} named in the manifest is missing")
    digest = sha256_file(path)
    if digest != manifest.data.membership_sha256:
        raise CheckpointError(f"membership file {path} does not match the manifest's sha256: refusing to audit")
    try:
        mask = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # object arrays (pickles), truncated or foreign files
        raise CheckpointError(f"membership file {path} is not a plain .npy bool array ({exc})") from None
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.ndim != 1 or mask.shape[0] != manifest.data.pool_size:
        raise CheckpointError(
            f"membership file {path} must be a bool vector of length {manifest.data.pool_size}, "
            f"got {mask.dtype} {mask.shape}")
    return mask
