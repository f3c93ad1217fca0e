"""Auditing training code we did not write: :class:`OpacusAuditor` (white-box gradient canaries in any Opacus
script), :class:`CanaryDataset` (input canaries added to the user's dataset) and :class:`AuditPool` (the members the
auditor draws, so that ``audit.attack(run, train_fn=...)`` can run LiRA and RMIA on the run)."""

from audit.integrations.audit_pool import AuditPool
from audit.integrations.canary_dataset import CanaryDataset
from audit.integrations.opacus import AuditedRun, OpacusAuditor

__all__ = ["OpacusAuditor", "CanaryDataset", "AuditPool", "AuditedRun"]
