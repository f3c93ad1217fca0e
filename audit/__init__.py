"""dp-audit: attacks, empirical epsilon, transfer evaluation, reports and gates for DP vision models.

The public Python API: the CLI's commands as functions with the same names and arguments
(:func:`train`, :func:`attack`, :func:`epsilon`, :func:`report`, :func:`gate`; see :mod:`audit.api`), the tight
mechanism audits :func:`audit_mechanism` / :func:`audit_opacus_mechanism` / :func:`audit_config_mechanism` (a
training config's DP-SGD before training: ``audit mechanism CONFIG``; :mod:`audit.mechanism`), and
:class:`OpacusAuditor` / :class:`CanaryDataset` / :class:`AuditPool` to audit a training script built on Opacus
(:mod:`audit.integrations`). Names are imported on first use, so ``import audit`` stays light.

>>> import audit
>>> sorted(n for n in audit.__all__ if n[0].islower())
['attack', 'audit_config_mechanism', 'audit_mechanism', 'audit_opacus_mechanism', 'epsilon', 'gate', 'report', 'train']
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "train": "audit.api", "attack": "audit.api", "epsilon": "audit.api", "report": "audit.api", "gate": "audit.api",
    "audit_mechanism": "audit.mechanism.api", "audit_opacus_mechanism": "audit.mechanism.api",
    "audit_config_mechanism": "audit.mechanism.config_target",
    "OpacusAuditor": "audit.integrations", "CanaryDataset": "audit.integrations", "AuditedRun": "audit.integrations",
    "AuditPool": "audit.integrations",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'audit' has no attribute {name!r}")
    value = importlib.import_module(module)
    if module != f"audit.{name}":
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])
