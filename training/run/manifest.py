"""The manifest: what a checkpoint claims.

``manifest.json`` beside every checkpoint is the contract between training and auditing (see DESIGN.md).
Every writer (the trainer, the batched reference-model trainer, ``audit import``) builds it with
:func:`build_manifest`; auditors read it through :func:`training.run.open_run`, which checks sha256s and
fingerprints before trusting anything. A hand-written manifest of the same schema is accepted too.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from training.config import DataConfig, ModelConfig
from foundation.errors import CheckpointError
from foundation.io import read_json, write_json
from foundation.files import CONFIG_FILE, MANIFEST_FILE, MEMBERSHIP_FILE, WEIGHTS_FILE

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
    "build_manifest",
    "model_config",
]


#: A file the manifest names inside its run directory: a plain name, never a path (``../x``, ``/etc/passwd``).
_FILE_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"


#: Bounds on what a received manifest may state, checked before anything is allocated from it: a model with more
#: classes, a larger input or more parameters than these is refused in one line (10^5 classes covers
#: ImageNet-21k; 4096 px and 64 channels any image model; 10^10 parameters is 40 GB of float32 weights).
MAX_CLASSES, MAX_CHANNELS, MAX_SIDE, MAX_PARAMETERS = 100_000, 64, 4096, 10**10
#: A DP phase's noise multiplier above this adds ~10^4 clipping norms of noise per step: not a training run.
MAX_PHASE_SIGMA = 1e4


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelInfo(_M):
    arch: str = Field(description="registry/timm name or 'package.module:factory'")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    num_classes: int = Field(ge=1, le=MAX_CLASSES)
    input_shape: tuple[int, int, int] = Field(description="(C, H, W) of the float input in [0, 1]")
    normalize_mean: tuple[float, float, float] | None = None
    normalize_std: tuple[float, float, float] | None = None
    cifar_stem: bool = True
    fix_batchnorm: bool = True
    param_count: int = Field(ge=0, le=MAX_PARAMETERS)
    trainable_param_count: int = Field(ge=0, le=MAX_PARAMETERS)
    weights_file: str = Field(WEIGHTS_FILE, pattern=_FILE_NAME, description="a file name in the run directory")
    weights_sha256: str
    frozen: list[str] = Field(default_factory=list, description="parameter names not trained")
    notes: list[str] = Field(default_factory=list, description="e.g. 'BatchNorm2d -> GroupNorm(...)'")

    @model_validator(mode="after")
    def _bounded_shape(self) -> "ModelInfo":
        c, h, w = self.input_shape
        if not (1 <= c <= MAX_CHANNELS and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE):
            raise ValueError(f"model.input_shape must be (C, H, W) with 1 <= C <= {MAX_CHANNELS} and 1 <= H, W <= "
                             f"{MAX_SIDE}, got {list(self.input_shape)}")
        return self


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
    pool_selection: Literal["random", "first"] | None = Field(None, description="how the pool subset was chosen "
                                                              "(absent: random, or an older manifest)")
    pool_fingerprint: str = Field(description="sha256 over the pool's x and y arrays (foundation.io.fingerprint_arrays)")
    split_size: int | None = Field(None, description="examples in data.split when the pool was drawn from it "
                                                     "(absent: imported runs and older manifests)")
    split_labels_sha256: str | None = Field(None, description="sha256 over data.split's size and labels "
                                                              "(training.data.SplitRows.labels_sha256)")
    membership_file: str = Field(MEMBERSHIP_FILE, pattern=_FILE_NAME, description="a file name in the run directory")
    membership_sha256: str
    membership: MembershipInfo
    nonmember_split: str | None = Field(None, description="external checkpoints: split whose examples are OUT")
    canaries: dict[str, Any] | None = None
    streamed: bool | None = Field(None, description="the pool was decoded from files on the fly "
                                  "(data.stream, training.data.stream) rather than held in memory; None: not recorded")


class PhaseInfo(_M):
    name: str
    dp: bool = Field(strict=True)
    dataset: str | None = None
    noise_multiplier: float | None = Field(None, ge=0.0, le=MAX_PHASE_SIGMA)
    sample_rate: float | None = Field(None, ge=0.0, le=1.0)
    steps: int = Field(ge=0, le=10**9)
    batch_size: int | None = Field(None, ge=0)
    sampling: Literal["poisson", "shuffle", "none"] = "poisson"
    max_grad_norm: float | None = None
    clipping: Literal["flat", "per_layer", "automatic"] | None = None
    grad_sample_mode: str | None = None
    optimizer: str | None = None
    lr: float | None = None
    frozen: list[str] = Field(default_factory=list)
    fallback_layers: list[str] | None = Field(None, description="grad_sample_mode bk: layers whose per-sample "
                                              "gradients came from the exact per-layer fallback")
    epsilon: float | None = Field(None, description="epsilon of this phase alone (DP phases)")


class PrivacyInfo(_M):
    dp: bool = Field(strict=True, description="true or false (a string such as 'yes' is refused)")
    unit: Literal["example"] = "example"
    neighbouring: Literal["add/remove", "replace-one"] = "add/remove"
    delta: float | None = None
    accountant: str | None = None
    epsilon: float | None = Field(None, description="claimed epsilon (all DP phases composed); None = no DP claim")
    epsilon_cross_check: dict[str, Any] | None = Field(None, description="{'accountant': 'pld', 'epsilon': ...}")
    phases: list[PhaseInfo] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_claim(self) -> "PrivacyInfo":
        if self.epsilon is not None and not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"privacy.epsilon must be a finite number >= 0 (or null: no claim), got {self.epsilon}")
        if self.delta is not None and not 0.0 < self.delta < 1.0:
            raise ValueError(f"privacy.delta must be in (0, 1) (or null), got {self.delta}")
        return self

    @property
    def claimed_epsilon(self) -> float:
        """The claimed epsilon; +inf when the checkpoint makes no DP claim."""
        return float(self.epsilon) if (self.dp and self.epsilon is not None) else float("inf")


class Provenance(_M):
    package_version: str
    git_commit: str | None = None
    git_dirty: bool | None = Field(None, description="tracked files differed from git_commit when the run was made "
                                   "(the code that ran is then not exactly that commit); None when unknown")
    python: str | None = None
    torch: str | None = None
    opacus: str | None = None
    timm: str | None = None
    seed: int | None = None
    config_file: str | None = Field(CONFIG_FILE, pattern=_FILE_NAME, description="a file name in the run directory")
    config_sha256: str | None = None
    created: str
    command: str | None = None
    device: str | None = None
    device_name: str | None = Field(None, description="the accelerator's model as the driver names it, e.g. "
                                    "'NVIDIA H200'; None on the CPU")
    threads: dict[str, Any] | None = Field(None, description="torch threads the training used and why "
                                           "(training.threads.ThreadPlan.record); None: not recorded")


class Manifest(_M):
    format: Literal["dp-audit-manifest/1"] = MANIFEST_FORMAT
    run_name: str
    model: ModelInfo
    data: DataInfo
    privacy: PrivacyInfo
    training: dict[str, Any] = Field(default_factory=dict, description="recipe, optimizer, steps, metrics")
    provenance: Provenance


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``<run_dir>/manifest.json`` atomically (write it last: its presence marks the run complete)."""
    return write_json(Path(run_dir) / MANIFEST_FILE, manifest.model_dump(mode="json"))


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    """Read and validate ``<run_dir>/manifest.json``. Auditors go through :func:`training.run.open_run`.

    Raises:
        CheckpointError: the manifest is missing, not JSON, or not of this schema (names the first bad key).
    """
    path = Path(run_dir) / MANIFEST_FILE
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


def model_config(manifest: Manifest) -> ModelConfig:
    """The :class:`~training.config.ModelConfig` that rebuilds the manifest's architecture (no weights)."""
    m = manifest.model
    return ModelConfig(arch=m.arch, kwargs=dict(m.kwargs), cifar_stem=m.cifar_stem, fix_batchnorm=m.fix_batchnorm,
                       normalize_mean=m.normalize_mean, normalize_std=m.normalize_std)


def _versions() -> dict[str, str | None]:
    def ver(mod: str) -> str | None:
        try:
            return __import__(mod).__version__
        except Exception:  # noqa: BLE001 - an optional package that fails to import has no version
            return None

    return {"python": platform.python_version(), "torch": ver("torch"), "opacus": ver("opacus"), "timm": ver("timm")}


def _git_state(cwd: Path | None = None) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether tracked files differ from it) of the checkout this package runs from; (None, None)
    outside a git checkout or without git. A copy of a working tree with an older ``.git`` (as a remote machine may
    get) records that commit *and* ``dirty``, so the manifest never passes the edited code off as the commit."""
    import subprocess

    here = cwd or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=here)
        commit = out.stdout.strip() or None if out.returncode == 0 else None
        if commit is None:
            return None, None
        st = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                            timeout=10, cwd=here)
        return commit, (bool(st.stdout.strip()) if st.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        return None, None


def _device_name(device: str | None) -> str | None:
    """The accelerator's model (:func:`training.device.device_name`) for a GPU device string, else None."""
    import torch

    from training.device import device_name, is_cuda

    try:
        return device_name(torch.device(device)) if device and is_cuda(device) else None
    except (RuntimeError, AssertionError, ValueError):  # no driver here, or a string torch cannot parse
        return None


def build_manifest(*, run_name: str, model: ModelConfig, num_classes: int, input_shape: Sequence[int],
                   param_count: int, trainable_param_count: int, weights_sha256: str,
                   data: DataConfig | Mapping[str, Any], pool_fingerprint: str, membership: MembershipInfo,
                   membership_sha256: str, privacy: PrivacyInfo, training: Mapping[str, Any],
                   frozen: Sequence[str] = (), notes: Sequence[str] = (), canaries: Mapping[str, Any] | None = None,
                   nonmember_split: str | None = None, seed: int | None = None, config_sha256: str | None = None,
                   command: str | None = None, device: str | None = None, streamed: bool | None = None,
                   split: tuple[int, str] | None = None, threads: Mapping[str, Any] | None = None) -> Manifest:
    """The manifest of a run directory whose weights and membership file are already written.

    The one builder behind ``audit train``, the batched reference-model trainer and ``audit import``: it fills
    the pool size from ``membership``, the package, git and library versions and the creation time.

    Args:
        run_name: the run's name.
        model: the architecture as built (its ``pretrained``/``freeze`` fields are not recorded).
        num_classes, input_shape: logits and (C, H, W) of the float input.
        param_count, trainable_param_count: from :func:`training.models.count_parameters`.
        weights_sha256, membership_sha256: sha256 of the written ``model.safetensors`` and ``membership.npy``.
        data: the data config (trained runs) or an import source ``{"dataset", "split", "root"?, "image_size"?}``.
        pool_fingerprint: :meth:`training.data.ImageSet.fingerprint` of the pool the membership indexes.
        membership: how members were drawn (its ``n_pool`` is the pool size).
        privacy: the claim. training: recipe, optimizer, steps and metrics.
        frozen, notes: parameters not trained; notes on the model (e.g. BatchNorm replaced).
        canaries: the input canaries' description (:func:`training.pool.build_pool`).
        nonmember_split: imported checkpoints: the split whose examples are OUT.
        seed, config_sha256, command, device: provenance; ``config_sha256`` None means no ``config.yaml``.
        streamed: whether the pool streamed from disk (:mod:`training.data.stream`); None: not recorded.
        split: ``(size, labels sha256)`` of ``data.split`` the pool was drawn from (:class:`training.pool.Pool`),
            so an auditor can tell whether the split's images outside the pool are still the same rows.
        threads: the torch threads used and why (:meth:`training.threads.ThreadPlan.record`).

    >>> from training.config import DataConfig, ModelConfig
    >>> man = build_manifest(run_name="r", model=ModelConfig(arch="small_cnn"), num_classes=10,
    ...     input_shape=(3, 8, 8), param_count=5, trainable_param_count=5, weights_sha256="0" * 64,
    ...     data=DataConfig(dataset="digits"), pool_fingerprint="1" * 64, membership_sha256="2" * 64,
    ...     membership=MembershipInfo(scheme="all", n_members=4, n_pool=4), privacy=PrivacyInfo(dp=False),
    ...     training={"recipe": "standard"})
    >>> man.data.pool_size, man.provenance.config_file, man.privacy.claimed_epsilon
    (4, None, inf)
    """
    if isinstance(data, DataConfig):
        d = {"dataset": data.dataset, "root": data.root, "split": data.split, "test_split": data.test_split,
             "image_size": data.image_size, "pool_seed": data.pool_seed, "pool_subset": data.pool_size is not None,
             "pool_selection": data.pool_selection}
    else:
        d = {"dataset": data["dataset"], "root": data.get("root"), "split": data["split"],
             "image_size": data.get("image_size")}
    commit, dirty = _git_state()
    return Manifest(
        run_name=run_name,
        model=ModelInfo(arch=model.arch, kwargs=dict(model.kwargs), num_classes=int(num_classes),
                        input_shape=tuple(int(s) for s in input_shape), normalize_mean=model.normalize_mean,
                        normalize_std=model.normalize_std, cifar_stem=model.cifar_stem,
                        fix_batchnorm=model.fix_batchnorm, param_count=int(param_count),
                        trainable_param_count=int(trainable_param_count), weights_sha256=weights_sha256,
                        frozen=list(frozen), notes=list(notes)),
        data=DataInfo(**d, pool_size=membership.n_pool, pool_fingerprint=pool_fingerprint,
                      split_size=None if split is None else int(split[0]),
                      split_labels_sha256=None if split is None else split[1],
                      membership_sha256=membership_sha256, membership=membership, nonmember_split=nonmember_split,
                      canaries=None if canaries is None else dict(canaries), streamed=streamed),
        privacy=privacy,
        training=dict(training),
        provenance=Provenance(package_version=_package_version(), git_commit=commit, git_dirty=dirty, **_versions(),
                              seed=seed, config_file=CONFIG_FILE if config_sha256 is not None else None,
                              config_sha256=config_sha256,
                              created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              command=command, device=device, device_name=_device_name(device),
                              threads=None if threads is None else dict(threads)),
    )


def _package_version() -> str:
    from training import __version__

    return __version__
