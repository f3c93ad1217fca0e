"""`audit import`: turn a checkpoint trained elsewhere into a run directory that `audit attack` can audit.

The weights are read without unpickling (:func:`training.models.load_weights_file`: safetensors, or torch
files with ``weights_only=True``), loaded strictly into the named architecture and saved as
``model.safetensors``. The pool is the member source followed by the non-member source (minus the
non-members held out as population samples z); ``membership.npy`` marks the members. The run directory gets:

- ``model.safetensors``, ``membership.npy``;
- ``import.json`` (format ``dp-audit-import/1``): the member and non-member sources (dataset, root, split,
  image size, limit, size, fingerprint), the held-out population indices and the source weights' sha256;
- ``metrics.json``: accuracy on members (``train_accuracy``) and non-members (``test_accuracy``);
- ``manifest.json`` (written last): membership scheme ``explicit``, no training phase, and privacy
  ``dp: false`` (epsilon = inf) unless a claimed epsilon and delta are given.

There is no ``config.yaml``: without a training recipe only attacks that need no reference models (LOSS,
Attack-P) can run.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.device import resolve_device
from training.config import ModelConfig
from training.data import concat_sets
from foundation.errors import CheckpointError, ConfigError, DataError
from training.evaluate import accuracy
from foundation.io import all_or_nothing, check_output_dir, remove_run_dir, sha256_file, write_json
from training.models import build_model, load_weights_file
from training.run import IMPORT_FILE, is_complete
from training.run.imported import IMPORT_FORMAT, combine_import_sets, load_source
from training.run.manifest import Manifest, PrivacyInfo
from training.run.writer import privacy_record, write_run
from training.models.cifar_resnet import depth_mismatch
from training.models.registry import canonical_arch
from training.models.weights import load_state_strict, strip_prefix

__all__ = ["parse_source", "ImportResult", "import_checkpoint"]


def parse_source(text: str, *, root: str | None = None, image_size: int | None = None,
                 limit: int | None = None) -> dict[str, Any]:
    """``"DATASET:SPLIT"`` -> an import-record source.

    >>> parse_source("cifar10:test", root="/data")
    {'dataset': 'cifar10', 'split': 'test', 'root': '/data', 'image_size': None, 'limit': None}

    Raises:
        ConfigError: the text is not ``DATASET:SPLIT``.
    """
    dataset, sep, split = str(text).partition(":")
    if not sep or not dataset or not split:
        raise ConfigError(f"expected DATASET:SPLIT (e.g. cifar10:train), got {text!r}")
    return {"dataset": dataset, "split": split, "root": None if root is None else str(root),
            "image_size": image_size, "limit": limit}


@dataclasses.dataclass(frozen=True)
class ImportResult:
    """The written run directory, its manifest and the measured accuracies."""

    run_dir: Path
    manifest: Manifest
    metrics: dict[str, Any]
    n_population: int


def _claim(claimed_epsilon: float | None, delta: float | None, accountant: str | None) -> PrivacyInfo:
    if claimed_epsilon is None and delta is None:
        return privacy_record(notes=["external checkpoint imported without a DP claim: epsilon = inf"])
    if claimed_epsilon is None or delta is None:
        raise ConfigError("give --claimed-epsilon and --delta together (or neither for a non-DP checkpoint)")
    if not (claimed_epsilon > 0 and math.isfinite(claimed_epsilon)):
        raise ConfigError(f"--claimed-epsilon must be a finite number > 0, got {claimed_epsilon}")
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"--delta must be in (0, 1), got {delta}")
    return privacy_record(epsilon=float(claimed_epsilon), delta=float(delta), accountant=accountant or "claimed",
                          notes=["epsilon as claimed by the checkpoint's provider; dp-audit cannot recompute it "
                                 "(no training recipe)"])


def _load_model(weights: Path, cfg: ModelConfig, *, num_classes: int, input_shape: tuple[int, int, int]
                ) -> tuple[torch.nn.Module, list[str]]:
    built = build_model(cfg, num_classes=num_classes, input_shape=input_shape, trust_code=True)  # the caller's arch
    state = strip_prefix(load_weights_file(weights), "net.")
    wrong_depth = depth_mismatch(built.module.net, state, arch=cfg.arch)
    if wrong_depth:
        raise CheckpointError(f"{weights}: {wrong_depth}")
    hint = (f"; check --arch {cfg.arch}, --num-classes {num_classes}, --fix-batchnorm/--no-fix-batchnorm "
            f"and --cifar-stem/--no-cifar-stem")
    notes = load_state_strict(built.module.net, state, source=str(weights), head_prefix=None, hint=hint)
    return built.module.eval(), list(built.notes) + notes


def import_checkpoint(*, weights: str | os.PathLike[str], arch: str, members: dict[str, Any],
                      nonmembers: dict[str, Any], out: str | os.PathLike[str], kwargs: dict[str, Any] | None = None,
                      num_classes: int | None = None, normalize_mean: Sequence[float] | None = None,
                      normalize_std: Sequence[float] | None = None, cifar_stem: bool = True,
                      fix_batchnorm: bool = False, population: int = 0, seed: int = 0,
                      claimed_epsilon: float | None = None, delta: float | None = None, accountant: str | None = None,
                      overwrite: bool = False, device: str = "auto", command: str | None = None) -> ImportResult:
    """Write ``out`` as an auditable run directory for the external checkpoint ``weights``.

    Args:
        weights: ``.safetensors`` or ``.pt``/``.pth``/``.th``/``.bin`` state dict (never unpickled).
        arch: architecture registry/timm name (``resnet20_cifar`` ... ``resnet110_cifar``, ``resnet_cifar`` with
            ``depth``, ``small_cnn``, ...); a CIFAR ResNet is recorded under the name of its real depth.
        members, nonmembers: sources from :func:`parse_source` (members trained on, non-members not).
        out: the run directory to create.
        kwargs: extra architecture keyword arguments.
        num_classes: number of logits (default: the member source's classes).
        normalize_mean, normalize_std: per-channel input normalisation the checkpoint expects (inside the model).
        cifar_stem: small-image stem (ResNet 3x3 stem, ViT patch 4) as in :class:`~training.config.ModelConfig`.
        fix_batchnorm: replace BatchNorm with GroupNorm (False: keep the checkpoint's BatchNorm).
        population: non-members to hold out of the pool as population samples z (Attack-P, RMIA).
        seed: seeds the hold-out draw.
        claimed_epsilon, delta, accountant: the provider's DP claim (epsilon and delta together, or neither).
        overwrite: replace an existing run directory.
        device: where to evaluate accuracy (``auto``, ``cpu``, ``cuda``).
        command: the command line, for the provenance.

    Returns:
        :class:`ImportResult`.

    Raises:
        CheckpointError: unreadable weights, weights that do not fit ``arch``, or an existing ``out``.
        ConfigError: inconsistent options. DataError: sources that cannot be loaded or combined.
    """
    out = Path(out)
    weights = Path(weights)
    check_output_dir(out, what="run directory")
    if overwrite and out.is_symlink():
        remove_run_dir(out)  # refuses, before any work
    if is_complete(out) and not overwrite:
        raise CheckpointError(f"{out} already holds a run; choose another --out or pass --overwrite")
    privacy = _claim(claimed_epsilon, delta, accountant)
    member_set = load_source(members, what="members")
    nonmember_set = load_source(nonmembers, what="nonmembers")
    if isinstance(population, bool) or not isinstance(population, int) or not 0 <= population < len(nonmember_set):
        raise ConfigError(f"--population must be an integer in [0, {len(nonmember_set) - 1}] (non-members held "
                          f"out of the pool; at least one must stay), got {population!r}")
    held = (np.sort(np.random.default_rng([int(seed), 0x494D50]).choice(len(nonmember_set), population,
                                                                        replace=False))
            if population else np.zeros(0, dtype=np.int64))
    pool, pop_set = combine_import_sets(member_set, nonmember_set, held)
    membership = np.zeros(len(pool), dtype=bool)
    membership[:len(member_set)] = True
    n_classes = int(num_classes) if num_classes is not None else len(pool.classes)
    if int(pool.y.max()) >= n_classes:
        raise DataError(f"the data has labels up to {int(pool.y.max())} but the model has {n_classes} classes")
    arch, kwargs = canonical_arch(arch, dict(kwargs or {}))  # the manifest names the network really built
    mcfg = ModelConfig(arch=arch, kwargs=kwargs, cifar_stem=cifar_stem, fix_batchnorm=fix_batchnorm,
                       normalize_mean=None if normalize_mean is None else tuple(normalize_mean),
                       normalize_std=None if normalize_std is None else tuple(normalize_std))
    module, notes = _load_model(weights, mcfg, num_classes=n_classes, input_shape=pool.input_shape)
    dev = resolve_device(device, field="--device")
    module.to(dev)
    outside = pool.subset(~membership)
    non_eval = outside if pop_set is None else concat_sets([outside, pop_set])
    metrics = {"train_accuracy": accuracy(module, pool.subset(membership), device=dev),
               "test_accuracy": accuracy(module, non_eval, device=dev),
               "note": "train = accuracy on the members, test = accuracy on every non-member (pool and population)"}
    if (out.exists() or out.is_symlink()) and overwrite:
        remove_run_dir(out)
    with all_or_nothing(out):  # a failed write (a full disk) leaves no run directory without its manifest
        out.mkdir(parents=True, exist_ok=True)
        same_dataset = members["dataset"] == nonmembers["dataset"] and members.get("root") == nonmembers.get("root")
        record = {"format": IMPORT_FORMAT,
                  "members": {**members, "n": len(member_set), "fingerprint": member_set.fingerprint()},
                  "nonmembers": {**nonmembers, "n": len(nonmember_set), "fingerprint": nonmember_set.fingerprint()},
                  "population": {"n": int(held.size), "seed": int(seed), "indices": held.tolist()},
                  "weights": {"source": str(weights), "sha256": sha256_file(weights)}}
        write_json(out / IMPORT_FILE, record)
        manifest = write_run(
            out, run_name=out.name, model=mcfg, module=module.to("cpu"), num_classes=n_classes,
            input_shape=pool.input_shape,
            notes=notes + [f"imported from {weights} (sha256 {record['weights']['sha256'][:12]}...)"],
            data=members, pool_fingerprint=pool.fingerprint(), membership=membership, membership_scheme="explicit",
            nonmember_split=nonmembers["split"] if same_dataset else f"{nonmembers['dataset']}:{nonmembers['split']}",
            privacy=privacy, metrics=metrics, training={"recipe": "external", "test_accuracy": metrics["test_accuracy"],
                                                        "train_accuracy": metrics["train_accuracy"]},
            command=command, device=str(dev))
        return ImportResult(run_dir=out, manifest=manifest, metrics=metrics, n_population=int(held.size))
