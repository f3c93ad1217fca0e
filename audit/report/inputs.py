"""Typed, validated readers for the files in a run directory.

A run directory holds ``manifest.json`` (always) and, once the matching command has run, ``metrics.json``
(``audit train``), ``attack.json`` (``audit attack``), ``epsilon.json`` (``audit epsilon``) and
``transfer.json`` (``audit transfer``). The report and the gate read them through this module only, so a
malformed file is refused once, with one line that names the file and the key.

Non-finite floats are stored as the strings ``"inf"``, ``"-inf"`` and ``"nan"`` (see
:func:`training.io.write_json`); the models below parse them back into floats. Unknown extra keys are ignored,
so a newer writer does not break an older reader; missing required keys are errors.

Every attack score follows the convention "higher score = member"; the metrics stored here (AUC, TPR at a
fixed FPR) are computed from such scores by ``audit attack``.

>>> AttackMetrics.model_validate({"auc": "nan", "tpr_at_fpr": {"0.001": 0.01}}).auc
nan
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from training.errors import CheckpointError
from training.io import read_json
from training.manifest import Manifest, read_manifest

__all__ = [
    "Metrics",
    "AttackMetrics",
    "Roc",
    "ClassSlice",
    "AttackEntry",
    "AttackSetup",
    "CodeRecord",
    "AttackFile",
    "Estimate",
    "Verdict",
    "EpsilonFile",
    "TransferProtocol",
    "TransferLayer",
    "TransferDataset",
    "TransferFile",
    "RunFiles",
    "load_run",
    "level_key",
    "FILE_COMMANDS",
]

#: The command that writes each optional file of a run directory (``{run}`` is the run directory).
FILE_COMMANDS = {
    "metrics.json": "audit train {config}",
    "attack.json": "audit attack {run}",
    "epsilon.json": "audit epsilon {run}",
    "transfer.json": "audit transfer {run}",
}


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


Interval = tuple[float, float]


class Metrics(_In):
    """``metrics.json`` written by training."""

    test_accuracy: float | None = None
    train_accuracy: float | None = None
    steps: int | None = None
    epsilon_spent: float | None = None
    final_loss: float | None = None


class AttackMetrics(_In):
    """Summary metrics of one attack. ``tpr_at_fpr`` keys are FPR levels written as strings ("0.001")."""

    auc: float
    auc_ci: Interval | None = None
    tpr_at_fpr: dict[str, float]
    tpr_at_fpr_ci: dict[str, Interval | None] = {}
    balanced_accuracy: float | None = None
    n_members: int | None = None
    n_nonmembers: int | None = None

    @field_validator("tpr_at_fpr_ci", mode="before")
    @classmethod
    def _no_intervals(cls, value: Any) -> Any:
        return {} if value is None else value  # written as null when the attack ran without bootstrap


class Roc(_In):
    """ROC curve points with an optional pointwise confidence band on the TPR."""

    fpr: list[float]
    tpr: list[float]
    tpr_lo: list[float] | None = None
    tpr_hi: list[float] | None = None


class ClassSlice(_In):
    auc: float | None = None
    n: int


class AttackEntry(_In):
    params: dict[str, Any] = {}
    metrics: AttackMetrics
    roc: Roc | None = None
    per_class: dict[str, ClassSlice] = {}
    most_vulnerable: list[int] = []


class AttackSetup(_In):
    n_reference: int | None = None
    augmentations: list[str] = []
    pool_size: int | None = None
    n_members: int | None = None
    n_population: int | None = None
    evaluation: str | None = None
    recipe_hash: str | None = None


class CodeRecord(_In):
    """``code`` in attack/epsilon/transfer results: whether ``--trust-code`` was given and what code the run named."""

    trust_code: bool = False
    names_code: list[str] = []


class AttackFile(_In):
    """``attack.json`` (format ``dp-audit-attack/1``)."""

    format: str = "dp-audit-attack/1"
    run: str | None = None
    setup: AttackSetup = AttackSetup()
    attacks: dict[str, AttackEntry]
    utility: dict[str, float | None] = {}
    code: CodeRecord | None = None


class Estimate(_In):
    """One empirical epsilon lower bound with the raw counts it came from."""

    method: str
    source: str | None = None
    epsilon_lb: float
    alpha: float | None = None
    delta: float | None = None
    counts: dict[str, Any] = {}
    ceiling: float | None = None
    assumptions: str | None = None
    extra: dict[str, Any] = {}


class Verdict(_In):
    status: Literal["VIOLATION", "CONSISTENT", "NO_CLAIM"]
    claimed_epsilon: float | None = None
    confidence: float | None = None
    best_epsilon_lb: float | None = None
    best_method: str | None = None
    tightness: float | None = None
    inconclusive_above: float | None = None
    notes: list[str] = []


class EpsilonFile(_In):
    """``epsilon.json`` (format ``dp-audit-epsilon/1``)."""

    format: str = "dp-audit-epsilon/1"
    claimed_epsilon: float | None = None
    delta: float | None = None
    alpha: float | None = None
    estimates: list[Estimate] = []
    verdict: Verdict
    code: CodeRecord | None = None

    def claim(self, default: float) -> float:
        """The claimed epsilon the verdict used (top level, else the verdict's, else ``default``)."""
        for value in (self.claimed_epsilon, self.verdict.claimed_epsilon):
            if value is not None:
                return value
        return default

    def confidence(self) -> float | None:
        """The confidence level 1 - alpha of the bounds (top-level alpha, else the verdict's or estimates')."""
        if self.alpha is not None:
            return 1.0 - self.alpha
        if self.verdict.confidence is not None:
            return self.verdict.confidence
        alphas = {e.alpha for e in self.estimates if e.alpha is not None}
        return 1.0 - alphas.pop() if len(alphas) == 1 else None


class TransferProtocol(_In):
    accuracy: float | None = None
    ci: Interval | None = None


class TransferLayer(_In):
    """Representation diagnostics of one feature block (index or name)."""

    block: int | str
    separability: float | None = None
    fuzziness: float | None = None
    fisher: float | None = None
    residual: float | None = None


class TransferDataset(_In):
    status: str = Field(description="'ok', 'missing' (data not found) or 'error'")
    reason: str | None = None
    protocols: dict[str, TransferProtocol] = {}
    layers: list[TransferLayer] = []
    rho: float | None = None


_PROTOCOLS = ("linear_probe", "knn", "finetune")


def _accuracy_of(block: Any) -> dict[str, Any]:
    """``{"accuracy": x, "ci": [lo, hi]}`` from a protocol result (a number or an AccuracyEstimate dict)."""
    acc = block.get("accuracy") if isinstance(block, dict) else block
    if isinstance(acc, dict):
        lo, hi = acc.get("ci_low"), acc.get("ci_high")
        return {"accuracy": acc.get("accuracy"), "ci": [lo, hi] if lo is not None and hi is not None else None}
    return {"accuracy": acc, "ci": block.get("ci") if isinstance(block, dict) else None}


def _row_to_dataset(row: dict[str, Any]) -> dict[str, Any]:
    """One row of ``audit transfer``'s list layout into the keyed layout of :class:`TransferDataset`."""
    protocols = {}
    for name in _PROTOCOLS:
        block = row.get(name)
        if isinstance(block, dict) and block.get("status", "ok") == "ok":
            protocols[name] = _accuracy_of(block)
    diag = row.get("diagnostics") if isinstance(row.get("diagnostics"), dict) else {}
    layers = [{"block": layer.get("layer", i), **{k: layer.get(k) for k in ("fuzziness", "fisher", "residual")}}
              for i, layer in enumerate(diag.get("layers") or [])]
    decay = diag.get("decay") if isinstance(diag.get("decay"), dict) else {}
    return {"status": row.get("status", "ok"), "reason": row.get("reason"), "protocols": protocols,
            "layers": layers, "rho": decay.get("rho")}


class TransferFile(_In):
    """``transfer.json`` (format ``dp-audit-transfer/1``).

    Two layouts are accepted: ``datasets`` as a mapping name -> :class:`TransferDataset`, or as the list of
    rows that ``audit transfer`` writes (``{"dataset": name, "status": ..., "linear_probe": {"accuracy":
    {"accuracy", "ci_low", "ci_high", ...}}, "knn": ..., "diagnostics": {"layers": [...], "decay": {"rho"}}}``).
    """

    format: str = "dp-audit-transfer/1"
    datasets: dict[str, TransferDataset] = {}
    code: CodeRecord | None = None

    @model_validator(mode="before")
    @classmethod
    def _rows_to_mapping(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("datasets"), list):
            rows = data["datasets"]
            keyed = {str(r.get("dataset", r.get("name", i))): _row_to_dataset(r)
                     for i, r in enumerate(rows) if isinstance(r, dict)}
            data = {**data, "datasets": keyed}
        return data


_FORMATS = {
    "attack.json": (AttackFile, "dp-audit-attack/"),
    "epsilon.json": (EpsilonFile, "dp-audit-epsilon/"),
    "transfer.json": (TransferFile, "dp-audit-transfer/"),
    "metrics.json": (Metrics, None),
}


def _read_optional(run_dir: Path, name: str) -> Any:
    path = run_dir / name
    if not path.exists():
        return None
    model, prefix = _FORMATS[name]
    data = read_json(path, what=name)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}; re-create it")
    fmt = data.get("format")
    if prefix is not None and fmt is not None and not str(fmt).startswith(prefix):
        raise CheckpointError(f"{path} has format {fmt!r}, expected '{prefix}1': it is not a {name} file")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise CheckpointError(f"{path} is invalid at '{key}': {first['msg']}; re-create it with "
                              f"'{FILE_COMMANDS[name].split(' {')[0]}'") from None


@dataclass(frozen=True, kw_only=True)
class RunFiles:
    """Everything a run directory holds that the report and the gate read.

    Attributes:
        run_dir: the run directory.
        manifest: the validated manifest (always present).
        metrics, attack, epsilon, transfer: the parsed optional files, ``None`` when absent.
        config: the resolved training config (``config.yaml``) as a mapping, ``None`` when absent.
    """

    run_dir: Path
    manifest: Manifest
    metrics: Metrics | None
    attack: AttackFile | None
    epsilon: EpsilonFile | None
    transfer: TransferFile | None
    config: dict[str, Any] | None

    @property
    def test_accuracy(self) -> float | None:
        """Test accuracy from ``metrics.json``, else from ``attack.json``'s utility block."""
        if self.metrics is not None and self.metrics.test_accuracy is not None:
            return self.metrics.test_accuracy
        if self.attack is not None:
            return self.attack.utility.get("test_accuracy")
        return None


def _read_config(run_dir: Path, manifest: Manifest) -> dict[str, Any] | None:
    import yaml

    name = manifest.provenance.config_file or "config.yaml"
    path = run_dir / name
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise CheckpointError(f"{path} is not valid YAML ({exc}); re-create the run") from None
    return data if isinstance(data, dict) else None


def load_run(run_dir: str | os.PathLike[str]) -> RunFiles:
    """Read and validate every file of a run directory.

    Args:
        run_dir: a directory written by ``audit train`` or ``audit import``.

    Returns:
        The parsed files; optional files that are absent are ``None``.

    Raises:
        CheckpointError: the directory or its manifest is missing, or a present file is malformed.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise CheckpointError(f"run directory not found: {path} (pass a directory written by 'audit train')")
    manifest = read_manifest(path)
    return RunFiles(
        run_dir=path,
        manifest=manifest,
        metrics=_read_optional(path, "metrics.json"),
        attack=_read_optional(path, "attack.json"),
        epsilon=_read_optional(path, "epsilon.json"),
        transfer=_read_optional(path, "transfer.json"),
        config=_read_config(path, manifest),
    )


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
