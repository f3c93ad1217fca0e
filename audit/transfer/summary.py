"""One line per dataset of a ``transfer.json``, as display strings (for the CLI table and reports).

>>> row = {"dataset": "svhn", "status": "missing", "reason": "missing: no data at /d"}
>>> summary_rows({"datasets": [row]})[0]["status"]
'missing: no data at /d'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SUMMARY_COLUMNS", "format_accuracy", "summary_rows"]

SUMMARY_COLUMNS = ("dataset", "status", "train / test", "linear probe", "k-NN", "fine-tune", "rho (R^2)")


def format_accuracy(entry: Mapping[str, Any] | None) -> str:
    """``"87.5% [85.1, 89.6]"`` from a protocol entry holding an ``accuracy`` estimate; ``"-"`` if absent."""
    if not entry:
        return "-"
    if entry.get("status") == "error":
        return "error"
    acc = entry.get("accuracy") or {}
    if not isinstance(acc.get("accuracy"), (int, float)):
        return "-"
    return f"{100 * acc['accuracy']:.1f}% [{100 * acc['ci_low']:.1f}, {100 * acc['ci_high']:.1f}]"


def summary_rows(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """Display rows (keys :data:`SUMMARY_COLUMNS`) of a transfer result's ``datasets`` list."""
    out = []
    for row in data.get("datasets", []):
        status = row.get("status", "?")
        line = dict.fromkeys(SUMMARY_COLUMNS, "-")
        line["dataset"] = str(row.get("dataset", "?"))
        line["status"] = status if status == "ok" else f"{row.get('reason', status)}"
        if status == "ok":
            line["train / test"] = f"{row['train']['n']} / {row['test']['n']}"
            line["linear probe"] = format_accuracy(row.get("linear_probe"))
            line["k-NN"] = format_accuracy(row.get("knn"))
            ft = row.get("finetune")
            line["fine-tune"] = format_accuracy(ft)
            if ft and ft.get("dp") and isinstance(ft.get("epsilon"), (int, float)):
                line["fine-tune"] += f" (eps={ft['epsilon']:.2g})"
            decay = (row.get("diagnostics") or {}).get("decay")
            if decay:
                line["rho (R^2)"] = f"{decay['rho']:.3f} ({decay['r_squared']:.2f})"
        out.append(line)
    return out
