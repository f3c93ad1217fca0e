"""The ``transfer.json`` schema (format ``dp-audit-transfer/1``), written by
:func:`audit.transfer.runner.evaluate_transfer`.

``datasets`` is a list of rows, one per dataset of the suite in suite order. A row is ``ok`` (data loaded and
evaluated; each enabled protocol has its block), ``missing`` (data absent: ``reason`` says where it was looked
for) or ``error`` (loaded but not evaluable). :func:`read_transfer_file` is the only reader; a file whose
``datasets`` is a mapping (a layout no release of ``audit transfer`` wrote) is refused with the command that
re-makes it.

>>> row = TransferRow.model_validate_json('{"dataset": "svhn", "name": "svhn", "root": null, '
...     '"status": "missing", "reason": "missing: no data at /d"}')
>>> row.status, row.accuracies()
('missing', {})
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from foundation.result_json import CodeRecord, Real, ResultModel, read_named, write_result
from foundation.files import TRANSFER_FILE

__all__ = ["TRANSFER_FORMAT", "TRANSFER_FILE", "Accuracy", "LinearProbeEntry", "KnnEntry", "FinetuneEntry",
           "ProtocolError", "LayerEntry", "DecayEntry", "Diagnostics", "SplitInfo", "TransferRow", "TransferFile",
           "read_transfer_file", "write_transfer_file"]

TRANSFER_FORMAT = "dp-audit-transfer/1"
PROTOCOLS = ("linear_probe", "knn", "finetune")


class Accuracy(ResultModel):
    """:class:`audit.transfer.metrics.AccuracyEstimate`: test accuracy with its confidence interval."""

    correct: int
    total: int
    accuracy: Real
    ci_low: Real
    ci_high: Real
    confidence: Real
    method: str


class LinearProbeEntry(ResultModel):
    accuracy: Accuracy
    C: Real
    val_accuracy: dict[str, Real]
    n_train: int
    n_val: int
    n_test: int
    converged: bool


class KnnEntry(ResultModel):
    accuracy: Accuracy
    k: int
    temperature: Real
    n_train: int
    n_test: int


class FinetuneEntry(ResultModel):
    """:class:`audit.transfer.finetune.FinetuneResult`: accuracy and the privacy parameters actually used."""

    accuracy: Accuracy
    dp: bool
    steps: int
    batch_size: int
    sample_rate: Real
    train_backbone: bool
    trainable_params: int
    noise_multiplier: Real | None
    epsilon: Real | None
    delta: Real | None
    accountant: str | None
    final_loss: Real | None
    notes: list[str]


class ProtocolError(ResultModel):
    """A protocol that could not run on this dataset (the row's other protocols are kept)."""

    status: Literal["error"]
    reason: str


class LayerEntry(ResultModel):
    """:class:`audit.transfer.separability.LayerSeparation` of one feature block."""

    layer: str
    dim: int
    fuzziness: Real
    fisher: Real
    residual: Real


class DecayEntry(ResultModel):
    rho: Real
    intercept: Real
    r_squared: Real
    n_layers: int


class Diagnostics(ResultModel):
    _omit_if_none = frozenset({"measure"})

    n_examples: int
    measure: str | None = None  # absent when the subset had fewer than two classes
    layers: list[LayerEntry]
    decay: DecayEntry | None
    note: str | None


class SplitInfo(ResultModel):
    split: str
    n: int
    fingerprint: str
    classes_present: int


class TransferRow(ResultModel):
    """One dataset of the suite. Blocks of protocols that did not run are absent from the file."""

    _omit_if_none = frozenset({"reason", "num_classes", "image_size", "train", "test", "feature_dim",
                               "features_cached", "linear_probe", "knn", "diagnostics", "finetune"})

    dataset: str
    name: str
    root: str | None
    status: Literal["ok", "missing", "error"]
    reason: str | None = None
    num_classes: int | None = None
    image_size: int | None = None
    train: SplitInfo | None = None
    test: SplitInfo | None = None
    feature_dim: int | None = None
    features_cached: bool | None = None
    linear_probe: LinearProbeEntry | None = None
    knn: KnnEntry | None = None
    diagnostics: Diagnostics | None = None
    finetune: FinetuneEntry | ProtocolError | None = None

    def accuracies(self) -> dict[str, Accuracy]:
        """Test accuracy of each protocol that ran successfully, in :data:`PROTOCOLS` order."""
        out = {}
        for name in PROTOCOLS:
            block = getattr(self, name)
            if block is not None and not isinstance(block, ProtocolError):
                out[name] = block.accuracy
        return out


class TransferFile(ResultModel):
    """``transfer.json``: the checkpoint evaluated, the suite, and one row per dataset."""

    _omit_if_none = frozenset({"code"})

    format: Literal["dp-audit-transfer/1"] = TRANSFER_FORMAT
    run: dict[str, str]
    model: dict[str, Any]
    privacy: dict[str, Any]
    image_size: int
    device: str
    suite: dict[str, Any]
    created: str
    datasets: list[TransferRow]
    code: CodeRecord | None = None  # which code the run named and whether it was trusted (absent: older file)

    def row(self, dataset: str) -> TransferRow:
        """The row of one dataset (by its suite label).

        Raises:
            KeyError: if the suite had no such dataset.
        """
        for r in self.datasets:
            if r.dataset == dataset:
                return r
        raise KeyError(f"no dataset {dataset!r} in this result; have {[r.dataset for r in self.datasets]}")


def read_transfer_file(path: str | os.PathLike[str], *, identity: Mapping[str, Any] | None = None) -> TransferFile:
    """``transfer.json`` of a run directory (or the file itself), verified and validated by
    :func:`foundation.result_json.read_result` (whose one-line errors name ``audit transfer RUN`` as the remedy)."""
    return read_named(path, TRANSFER_FILE, TransferFile, fmt=TRANSFER_FORMAT, command="audit transfer",
                      identity=identity)


def write_transfer_file(path: str | os.PathLike[str], data: TransferFile, *, identity: Mapping[str, Any]) -> Path:
    """Write ``data`` to ``path`` (normally ``<run_dir>/transfer.json``) atomically, signed for ``identity``
    (:func:`training.run.evidence_identity`)."""
    return write_result(path, data, identity=identity)
