"""The ``attack.json`` schema (format ``dp-audit-attack/1``), written by :func:`attacks.runner.run_attack`.

One strict model per block; :func:`read_attack_file` is the only reader (the report, the gate and the tests use
it). Every score behind these numbers is "higher = member". ``tpr_at_fpr`` keys are FPR levels written as
strings (``"0.001"``); intervals are ``[low, high]`` and ``null`` when the attack ran without bootstrap.

>>> m = AttackMetrics.model_validate_json('{"auc": "nan", "auc_ci": null, "tpr_at_fpr": {"0.001": 0.01}, '
...     '"tpr_at_fpr_ci": {}, "balanced_accuracy": 0.5, "n_members": 3, "n_nonmembers": 4}')
>>> m.auc
nan
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from foundation.result_json import Real, ResultModel, RunResult, read_named, write_result
from foundation.files import ATTACK_FILE

__all__ = ["ATTACK_FORMAT", "ATTACK_FILE", "Interval", "AttackMetrics", "Roc", "ClassSlice", "LeaveOneOut",
           "AttackEntry", "AttackSetup", "PopulationRecord", "PopulationSource", "Utility", "AttackFile",
           "read_attack_file", "write_attack_file", "summary_rows"]

ATTACK_FORMAT = "dp-audit-attack/1"

Interval = tuple[Real, Real]


class AttackMetrics(ResultModel):
    """Summary metrics of one attack (:func:`attacks.results.evaluate_scores`)."""

    auc: Real
    auc_ci: Interval | None
    tpr_at_fpr: dict[str, Real]
    tpr_at_fpr_ci: dict[str, Interval | None]
    balanced_accuracy: Real
    n_members: int
    n_nonmembers: int


class Roc(ResultModel):
    """The ROC read at a grid of FPRs, with a pointwise bootstrap band on the TPR (equal to it without one)."""

    fpr: list[Real]
    tpr: list[Real]
    tpr_lo: list[Real]
    tpr_hi: list[Real]


class ClassSlice(ResultModel):
    auc: Real | None
    n: int


class LeaveOneOut(ResultModel):
    """Mean and std over leave-one-out rounds (:func:`attacks.results.loo_summary`)."""

    auc_mean: Real
    auc_std: Real
    n_runs: int
    tpr_at_fpr_mean: dict[str, Real]
    tpr_at_fpr_std: dict[str, Real]


class AttackEntry(ResultModel):
    """One attack: its parameters, metrics, ROC, per-class AUC, most exposed members (pool positions).

    ``info``: the attack's diagnostics on the reported target (RMIA: population size, tie groups before and after
    breaking, the offline ``a`` used and what it was chosen on; LiRA: fallback counts); absent in older files.
    """

    _omit_if_none = frozenset({"leave_one_out", "info"})

    params: dict[str, Any]
    info: dict[str, Any] | None = None
    metrics: AttackMetrics
    roc: Roc
    per_class: dict[str, ClassSlice]
    most_vulnerable: list[int]
    leave_one_out: LeaveOneOut | None = None  # written only when evaluation is leave_one_out or both


class PopulationSource(ResultModel):
    """One population source (:class:`training.run.population.Population`): images available, used, and dropped
    as exact copies of pool images."""

    source: str
    available: int
    used: int
    dropped_pool_duplicates: int


class PopulationRecord(ResultModel):
    """Where the population samples z came from (:func:`attacks.signal_cache.load_or_compute_signals`).

    ``requested``: ``attack.population``; ``capped``: True when ``memory_mb`` (``attack.population_memory_mb``)
    cut the request down to a seeded subset; ``fingerprint``: :meth:`training.data.ImageSet.fingerprint` of the
    images used (None when none).
    """

    requested: int | Literal["all"]
    available: int
    memory_mb: Real
    capped: bool
    sources: list[PopulationSource]
    fingerprint: str | None


class AttackSetup(ResultModel):
    _omit_if_none = frozenset({"population", "ray_address", "queries_from", "reference_training"})

    n_reference: int
    augmentations: list[str]
    queries_from: str | None = None  # where the augmentations came from (absent: older file)
    pool_size: int
    n_members: int
    n_population: int
    population_rule: str | None = None  # how n_population was chosen (absent: older file)
    population: PopulationRecord | None = None  # its sources, cap and fingerprint (absent: older file)
    evaluation: Literal["target", "leave_one_out", "both"]
    recipe_hash: str | None
    executor: str | None
    ray_address: str | None = None  # the Ray the reference models trained on: local (127.0.0.1), or a cluster's
    # address without credentials (absent: no Ray, or an older file)
    shadow_train_seconds: Real
    reference_training: str | None = None  # who trained the reference models when not the run's recipe: the
    # user's own training function (audit.attack(run, train_fn=...)); absent: the recipe in config.yaml


class Utility(ResultModel):
    """Test and train accuracy of the target, measured by ``audit attack`` on the auditor's copy of the data."""

    test_accuracy: Real | None
    train_accuracy: Real | None


class AttackFile(RunResult):
    """``attack.json``: what was attacked (``inputs``: the freshness record), how, and every attack's results."""

    format: Literal["dp-audit-attack/1"] = ATTACK_FORMAT
    setup: AttackSetup
    attacks: dict[str, AttackEntry]
    utility: Utility


def read_attack_file(path: str | os.PathLike[str], *, identity: Mapping[str, Any] | None = None) -> AttackFile:
    """``attack.json`` of a run directory (or the file itself), verified and validated by
    :func:`foundation.result_json.read_result` (whose one-line errors name ``audit attack RUN`` as the remedy)."""
    return read_named(path, ATTACK_FILE, AttackFile, fmt=ATTACK_FORMAT, command="audit attack", identity=identity)


def write_attack_file(run_dir: str | os.PathLike[str], data: AttackFile, *, identity: Mapping[str, Any]) -> Path:
    """Write ``<run_dir>/attack.json`` atomically, signed for ``identity``
    (:func:`training.run.evidence_identity`)."""
    return write_result(Path(run_dir) / ATTACK_FILE, data, identity=identity)


def summary_rows(data: AttackFile) -> list[dict[str, Any]]:
    """One row per attack: name, AUC, its interval, TPR at each FPR level and the leave-one-out mean AUC."""
    return [{"attack": name, "auc": e.metrics.auc, "auc_ci": e.metrics.auc_ci, "tpr_at_fpr": e.metrics.tpr_at_fpr,
             "loo_auc": e.leave_one_out.auc_mean if e.leave_one_out is not None else None}
            for name, e in data.attacks.items()]
