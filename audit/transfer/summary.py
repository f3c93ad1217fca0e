"""One line per dataset of a ``transfer.json``, as display strings (for the CLI table and reports).

>>> from audit.transfer.transfer_file import TransferRow
>>> row = TransferRow(dataset="svhn", name="svhn", root=None, status="missing", reason="missing: no data at /d")
>>> summary_rows([row])[0]["status"]
'missing: no data at /d'
"""

from __future__ import annotations

from collections.abc import Sequence

from audit.transfer.transfer_file import Accuracy, FinetuneEntry, ProtocolError, TransferRow

__all__ = ["SUMMARY_COLUMNS", "format_accuracy", "summary_rows"]

SUMMARY_COLUMNS = ("dataset", "status", "train / test", "linear probe", "k-NN", "fine-tune", "rho (R^2)")


def format_accuracy(entry: Accuracy | ProtocolError | None) -> str:
    """``"87.5% [85.1, 89.6]"`` from an accuracy estimate; ``"error"`` for a failed protocol, ``"-"`` if absent."""
    if entry is None:
        return "-"
    if isinstance(entry, ProtocolError):
        return "error"
    return f"{100 * entry.accuracy:.1f}% [{100 * entry.ci_low:.1f}, {100 * entry.ci_high:.1f}]"


def summary_rows(rows: Sequence[TransferRow]) -> list[dict[str, str]]:
    """Display rows (keys :data:`SUMMARY_COLUMNS`) of a transfer result's ``datasets``."""
    out = []
    for row in rows:
        line = dict.fromkeys(SUMMARY_COLUMNS, "-")
        line["dataset"] = row.dataset
        line["status"] = row.status if row.status == "ok" else f"{row.reason or row.status}"
        if row.status == "ok":
            acc = row.accuracies()
            if row.train is not None and row.test is not None:
                line["train / test"] = f"{row.train.n} / {row.test.n}"
            line["linear probe"] = format_accuracy(acc.get("linear_probe"))
            line["k-NN"] = format_accuracy(acc.get("knn"))
            ft = row.finetune
            line["fine-tune"] = format_accuracy(ft if isinstance(ft, ProtocolError) else acc.get("finetune"))
            if isinstance(ft, FinetuneEntry) and ft.dp and ft.epsilon is not None:
                line["fine-tune"] += f" (eps={ft.epsilon:.2g})"
            decay = row.diagnostics.decay if row.diagnostics is not None else None
            if decay is not None:
                line["rho (R^2)"] = f"{decay.rho:.3f} ({decay.r_squared:.2f})"
        out.append(line)
    return out
