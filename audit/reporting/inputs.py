"""Every file of a run directory that the report and the gate read, parsed once.

A run directory holds ``manifest.json`` (always) and, once the matching command has run, ``metrics.json``
(``audit train``), ``attack.json`` (``audit attack``), ``epsilon.json`` (``audit epsilon``) and
``transfer.json`` (``audit transfer``). The result files are read through their writers' readers
(:func:`attacks.attack_file.read_attack_file`, :func:`audit.bounds.epsilon_file.read_epsilon_file`,
:func:`audit.transfer.transfer_file.read_transfer_file`): one schema per file, so a malformed or outdated file
is refused with one line that names the file, the key and the command that re-makes it. Each must be signed by
this auditor's evidence key for the run as it is now (:mod:`foundation.evidence`: the weights and membership files
hashed against the manifest, the pool, the manifest's claim): an edited file, one received with the run, or one
written before the claim was edited is refused. So is an ``attack.json``
or ``epsilon.json`` whose ``inputs`` name other weights, membership or pool than the manifest (stale after a
retrain, or copied from another run): its figures are not this model's.

>>> Metrics.model_validate({"test_accuracy": 0.9}).steps is None
True
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from attacks.attack_file import AttackFile, read_attack_file
from audit.bounds.epsilon_file import EpsilonFile, read_epsilon_file
from audit.mechanism.result import MechanismResult, read_mechanism
from audit.transfer.transfer_file import TransferFile, read_transfer_file
from foundation.errors import CheckpointError
from foundation.files import ATTACK_FILE, EPSILON_FILE, METRICS_FILE, TRANSFER_FILE
from foundation.io import read_json
from training.run import VerifiedRun, as_run, evidence_identity
from training.run.freshness import foreign_keys, manifest_identity
from training.run.manifest import Manifest

__all__ = [
    "Metrics",
    "RunFiles",
    "load_run",
    "level_key",
    "FILE_COMMANDS",
]

#: The command that writes each optional file of a run directory (``{run}`` is the run directory).
FILE_COMMANDS = {
    METRICS_FILE: "audit train {config}",
    ATTACK_FILE: "audit attack {run}",
    EPSILON_FILE: "audit epsilon {run}",
    TRANSFER_FILE: "audit transfer {run}",
}


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Metrics(_In):
    """``metrics.json`` written by training."""

    test_accuracy: float | None = None
    train_accuracy: float | None = None
    steps: int | None = None
    epsilon_spent: float | None = None
    final_loss: float | None = None


def _read_metrics(run_dir: Path) -> Metrics | None:
    path = run_dir / METRICS_FILE
    if not path.exists():
        return None
    data = read_json(path, what=METRICS_FILE)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}; re-create it")
    try:
        return Metrics.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise CheckpointError(f"{path} is invalid at '{key}': {first['msg']}; re-create it with "
                              f"'{FILE_COMMANDS[METRICS_FILE].split(' {')[0]}'") from None


def _read_optional(run_dir: Path, name: str, reader: Callable[[Path], Any]) -> Any:
    path = run_dir / name
    return reader(path) if path.exists() else None


@dataclass(frozen=True, kw_only=True)
class RunFiles:
    """Everything a run directory holds that the report and the gate read.

    Attributes:
        run_dir: the run directory.
        manifest: the validated manifest (always present).
        metrics, attack, epsilon, transfer: the parsed optional files, ``None`` when absent.
        mechanism: ``mechanism.json`` (``audit mechanism``), ``None`` when absent.
        config: the resolved training config (``config.yaml``) as a mapping, ``None`` when absent.
        run: the opened run (:func:`training.run.open_run`); its weights, membership and pool are verified
            on first use (the report's thumbnails use its pool).
    """

    run_dir: Path
    manifest: Manifest
    metrics: Metrics | None
    attack: AttackFile | None
    epsilon: EpsilonFile | None
    transfer: TransferFile | None
    config: dict[str, Any] | None
    run: VerifiedRun | None = None
    mechanism: MechanismResult | None = None

    @property
    def measured_test_accuracy(self) -> float | None:
        """Test accuracy as ``audit attack`` measured it on the auditor's data (the signed ``attack.json``): what
        the gate decides on. ``metrics.json`` is the vendor's record and never decides."""
        return self.attack.utility.test_accuracy if self.attack is not None else None

    @property
    def test_accuracy(self) -> float | None:
        """Test accuracy from ``metrics.json``, else from ``attack.json``'s utility block."""
        if self.metrics is not None and self.metrics.test_accuracy is not None:
            return self.metrics.test_accuracy
        if self.attack is not None:
            return self.attack.utility.test_accuracy
        return None


def load_run(run_dir: str | os.PathLike[str] | VerifiedRun) -> RunFiles:
    """Read and validate every file of a run directory.

    Args:
        run_dir: a directory written by ``audit train`` or ``audit import``, or the run already opened.

    Returns:
        The parsed files; optional files that are absent are ``None``.

    Raises:
        CheckpointError: the directory or its manifest is missing, or a present file is malformed.
    """
    run = as_run(run_dir, verify=False, scan_code=False)  # the report and the gate never build a model
    path = run.run_dir
    ident = evidence_identity(run)  # hashes the weights and membership files against the manifest
    attack = _read_optional(path, ATTACK_FILE, lambda p: read_attack_file(
        p, identity={k: v for k, v in ident.items() if k != "claim_sha256"}))  # the attack does not use the claim
    epsilon = _read_optional(path, EPSILON_FILE, lambda p: read_epsilon_file(p, identity=ident))
    for name, result in ((ATTACK_FILE, attack), (EPSILON_FILE, epsilon)):
        if result is not None:
            _check_made_for(run, name, result.inputs)
    return RunFiles(
        run_dir=path,
        manifest=run.manifest,
        run=run,
        metrics=_read_metrics(path),
        attack=attack,
        epsilon=epsilon,
        transfer=_read_optional(path, TRANSFER_FILE, lambda p: read_transfer_file(p, identity=ident)),
        config=run.config_data,
        mechanism=read_mechanism(path),
    )


def _check_made_for(run: VerifiedRun, name: str, inputs: dict[str, Any]) -> None:
    """Refuse a result file made for other weights, membership or pool than the manifest's (stale after a
    retrain, or copied from another run): its figures would be reported as this model's."""
    bad = foreign_keys(inputs, run.manifest)
    if bad:
        have = manifest_identity(run.manifest)
        what = ", ".join(f"{k} {str(inputs.get(k))[:12]} is not the manifest's {have[k][:12]}" for k in bad)
        command = FILE_COMMANDS[name].format(run=run.run_dir)
        raise CheckpointError(f"{run.run_dir / name} was not made for this run ({what}): a stale or foreign result; "
                              f"re-make it with '{command}'")


def level_key(levels: dict[str, Any], fpr: float) -> str | None:
    """The key of ``levels`` whose numeric value equals ``fpr`` (keys are strings such as ``"0.001"``).

    >>> level_key({"0.01": 0.2, "1e-3": 0.1}, 0.001)
    '1e-3'
    >>> level_key({"0.01": 0.2}, 0.5) is None
    True
    """
    for key in levels:
        try:
            value = float(key)
        except ValueError:
            continue
        if math.isclose(value, fpr, rel_tol=1e-9, abs_tol=0.0):
            return key
    return None
