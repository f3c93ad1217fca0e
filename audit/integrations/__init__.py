"""Auditing training code we did not write: :class:`OpacusAuditor` (white-box gradient canaries in any Opacus
script) and :class:`CanaryDataset` (input canaries added to the user's dataset)."""

from audit.integrations.canary_dataset import CanaryDataset
from audit.integrations.opacus import AuditedRun, OpacusAuditor

__all__ = ["OpacusAuditor", "CanaryDataset", "AuditedRun"]
