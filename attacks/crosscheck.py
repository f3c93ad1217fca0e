"""Optional cross-check of our ROC metrics against ML Privacy Meter (``privacy-meter==1.0.1`` on PyPI).

Privacy Meter's 1.0.1 release imports TensorFlow and predates LiRA-online and RMIA, so it is never on the
default path: install the optional extra (``pip install 'dp-audit[privacy-meter]'``) to use this module.
Given the same per-example scores (higher = member) and membership labels, its ``MetricResult`` computes
the ROC and AUC with scikit-learn; we check that its AUC matches ours and that every point of its ROC lies
on ours (scikit-learn drops collinear intermediate points, so its curve is a subset of ours).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

from attacks.metrics import auc, roc_curve
from training.errors import UserError

__all__ = ["privacy_meter_available", "CrossCheck", "crosscheck_with_privacy_meter"]


def privacy_meter_available() -> bool:
    """True when ``privacy_meter.metric_result`` imports (it pulls in TensorFlow)."""
    try:
        importlib.import_module("privacy_meter.metric_result")
    except Exception:  # noqa: BLE001 - any import failure (missing package, broken TensorFlow) means "no"
        return False
    return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrossCheck:
    """Outcome of a cross-check: both AUCs, the largest ROC-point mismatch and whether they agree."""

    auc_ours: float
    auc_privacy_meter: float
    max_roc_gap: float
    agrees: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)


def crosscheck_with_privacy_meter(scores: Any, labels: Any, *, atol: float = 1e-9) -> CrossCheck:
    """Compare our AUC and ROC with Privacy Meter's ``MetricResult`` on the same scores.

    Args:
        scores: ``(n,)`` scores, higher = member.
        labels: ``(n,)`` true membership.
        atol: tolerance for AUC and ROC-point agreement.

    Returns:
        A :class:`CrossCheck`.

    Raises:
        UserError: if ``privacy_meter`` cannot be imported (the optional extra is not installed).
    """
    try:
        metric_result = importlib.import_module("privacy_meter.metric_result")
    except Exception as exc:  # noqa: BLE001
        raise UserError(f"privacy-meter is not importable ({type(exc).__name__}: {exc}); install the optional "
                        f"extra with: pip install 'dp-audit[privacy-meter]'") from None
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels).astype(bool)
    fpr, tpr, _ = roc_curve(s, y)
    ours = auc(s, y)
    threshold = float(np.median(s))
    result = metric_result.MetricResult(metric_id="dp_audit_crosscheck", predicted_labels=(s >= threshold),
                                        true_labels=y.astype(int), predictions_proba=s,
                                        signal_values=s, threshold=threshold)
    theirs = float(result.roc_auc)
    pm_fpr, pm_tpr = np.asarray(result.roc[0], dtype=np.float64), np.asarray(result.roc[1], dtype=np.float64)
    ours_pts = np.stack([fpr, tpr], axis=1)
    gaps = [float(np.min(np.max(np.abs(ours_pts - p), axis=1))) for p in np.stack([pm_fpr, pm_tpr], axis=1)]
    gap = max(gaps) if gaps else 0.0
    return CrossCheck(auc_ours=ours, auc_privacy_meter=theirs, max_roc_gap=gap,
                      agrees=bool(abs(ours - theirs) <= atol and gap <= atol))
