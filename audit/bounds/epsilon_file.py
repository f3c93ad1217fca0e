"""The ``epsilon.json`` schema (format ``dp-audit-epsilon/2``), written by :func:`audit.bounds.runner.run_epsilon`.

:func:`read_epsilon_file` is the only reader (the report, the gate, the pipeline and the tests use it). Its
``verdict`` block is the one :class:`~audit.bounds.verdict.Verdict`. Format ``dp-audit-epsilon/1`` (before the
verdict recorded its claim, the violating methods and findings) is read through :func:`migrate_v1`, which
recomputes those from the file's own numbers; any other format is refused with the command that re-makes it.

>>> e = EstimateEntry.model_validate_json('{"method": "one_run", "source": "pool", "epsilon_lb": 0.5, '
...     '"alpha": 0.05, "delta": 1e-5, "counts": {"r": 10}, "ceiling": "inf", "assumptions": "", '
...     '"extra": {"in_verdict": true}}')
>>> e.ceiling, e.in_verdict
(inf, True)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from audit.bounds.power_record import PowerEntry
from audit.bounds.verdict import Verdict
from foundation.result_json import Real, ResultModel, RunResult, read_named, write_result
from foundation.files import EPSILON_FILE

__all__ = ["EPSILON_FORMAT", "EPSILON_FILE", "EstimateEntry", "SkippedEntry", "EpsilonFile", "read_epsilon_file",
           "write_epsilon_file", "migrate_v1"]

EPSILON_FORMAT = "dp-audit-epsilon/2"


class EstimateEntry(ResultModel):
    """One ε lower bound with its raw counts, the evidence it came from, and whether it decides the verdict.

    ``extra`` holds the estimator's details plus ``in_verdict`` and ``evidence`` (provenance of the scores).
    """

    method: str
    source: str
    epsilon_lb: Real
    alpha: Real
    delta: Real
    counts: dict[str, int]
    ceiling: Real
    assumptions: str
    extra: dict[str, Any]

    @property
    def in_verdict(self) -> bool:
        """Whether this bound takes part in the verdict."""
        return bool(self.extra.get("in_verdict", False))


class SkippedEntry(ResultModel):
    """A source that does not apply to the run, and why."""

    source: str
    reason: str


class EpsilonFile(RunResult):
    """``epsilon.json``: what was audited (``inputs``: the freshness record), the bounds and the verdict."""

    format: Literal["dp-audit-epsilon/2"] = EPSILON_FORMAT
    claimed_epsilon: Real
    delta: Real
    alpha: Real
    estimates: tuple[EstimateEntry, ...]
    skipped: tuple[SkippedEntry, ...]
    power: tuple[PowerEntry, ...] = ()  # what each deciding one-run bound could detect (absent: older file)
    verdict: Verdict

    @property
    def confidence(self) -> float:
        """The confidence level ``1 - alpha`` the bounds share."""
        return 1.0 - self.alpha


def migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A ``dp-audit-epsilon/1`` file's data in the ``/2`` layout.

    ``/1`` verdicts lacked ``claimed_epsilon``, ``claimed_delta``, ``violating`` and ``findings``; they follow
    from the file: the top-level claim and δ (δ only for a finite claim, as the verdict is judged), the deciding
    estimates whose ``ε_lb`` exceeds a finite claim, and no findings (``/1`` had no such checks).
    """
    verdict = data.get("verdict")
    if not isinstance(verdict, dict):
        return {**data, "format": EPSILON_FORMAT}
    claim = data.get("claimed_epsilon")
    value = float(claim) if isinstance(claim, (int, float, str)) else math.nan
    finite = math.isfinite(value)
    violating = [e.get("method") for e in data.get("estimates") or [] if isinstance(e, dict)
                 and (e.get("extra") or {}).get("in_verdict") and finite
                 and float(e.get("epsilon_lb", 0.0)) > value]
    verdict = {**verdict, "claimed_epsilon": claim, "claimed_delta": data.get("delta") if finite else None,
               "violating": violating, "findings": []}
    return {**data, "format": EPSILON_FORMAT, "verdict": verdict}


def read_epsilon_file(path: str | os.PathLike[str], *, identity: Mapping[str, Any] | None = None) -> EpsilonFile:
    """``epsilon.json`` of a run directory (or the file itself), verified and validated by
    :func:`foundation.result_json.read_result` (its one-line errors name ``audit epsilon RUN``); ``/1`` files are
    migrated."""
    return read_named(path, EPSILON_FILE, EpsilonFile, fmt=EPSILON_FORMAT, command="audit epsilon", identity=identity,
                      migrations={"dp-audit-epsilon/1": migrate_v1})


def write_epsilon_file(run_dir: str | os.PathLike[str], data: EpsilonFile, *, identity: Mapping[str, Any]) -> Path:
    """Write ``<run_dir>/epsilon.json`` atomically, signed for ``identity``
    (:func:`training.run.evidence_identity`)."""
    return write_result(Path(run_dir) / EPSILON_FILE, data, identity=identity)
