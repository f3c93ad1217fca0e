"""The shared root of real data and weights that tests and benchmarks read: ``$DP_AUDIT_SHARED``.

Default: ``shared/`` beside the repository (``../shared`` from its root), holding ``data/`` (CIFAR-10/100, SVHN,
Food101 arrays), ``weights/`` and ``third_party/``. A clone elsewhere sets ``DP_AUDIT_SHARED=/path/to/shared``;
tests that need it are skipped with a reason naming the variable. The product never reads it: users point
``data.root`` at their own data.

>>> import os
>>> os.environ[SHARED_ENV] = "/srv/shared"; str(shared_root())
'/srv/shared'
>>> del os.environ[SHARED_ENV]; shared_root().name
'shared'
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SHARED_ENV", "shared_root", "missing_reason"]

#: The environment variable naming the shared root.
SHARED_ENV = "DP_AUDIT_SHARED"


def shared_root() -> Path:
    """``$DP_AUDIT_SHARED`` when set (``~`` expanded), else ``shared/`` beside the repository."""
    value = os.environ.get(SHARED_ENV, "").strip()
    if value:
        return Path(value).expanduser()
    return Path(__file__).resolve().parents[1].parent / "shared"


def missing_reason(what: str) -> str:
    """A skip reason that names the variable: ``"<what> not found under <root> (set DP_AUDIT_SHARED=...)"``."""
    return f"{what} not found under {shared_root()} (set {SHARED_ENV} to the shared data root)"
