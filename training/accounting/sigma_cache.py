"""An opt-in on-disk cache of calibrated noise multipliers, shared by concurrent processes.

A sweep calibrates the same σ many times (every seed of an arm, every run of a config): with the PLD accountant
one calibration takes tens of seconds of CPU. Setting the environment variable ``DP_AUDIT_SIGMA_CACHE`` to a
directory makes :func:`training.accounting.noise_multiplier_for` keep each result there, one JSON file per exact
argument tuple (target ε, q, steps, δ, accountant, tolerance; floats by their exact ``repr``), keyed by the hash
of those arguments and of this cache's format version. Processes that ask for the same σ at once wait on a file
lock, so it is computed once. An entry is only ever a σ this function computed for exactly these arguments; a
file that does not parse, or whose stored arguments differ from the request, is ignored and recomputed.
Without the variable nothing is read or written.

>>> import tempfile
>>> calls = []
>>> with tempfile.TemporaryDirectory() as d:
...     a = cached_sigma(d, {"target_epsilon": 1.0}, lambda: calls.append(1) or 2.5)
...     b = cached_sigma(d, {"target_epsilon": 1.0}, lambda: calls.append(1) or 9.9)
>>> a, b, len(calls)
(2.5, 2.5, 1)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundation.io import waiting_lock

__all__ = ["SIGMA_CACHE_ENV", "cached_sigma", "cache_dir"]

SIGMA_CACHE_ENV = "DP_AUDIT_SIGMA_CACHE"
_FORMAT = 1


def cache_dir() -> str | None:
    """The cache directory named by ``DP_AUDIT_SIGMA_CACHE``, or None when unset or empty."""
    return os.environ.get(SIGMA_CACHE_ENV) or None


def cached_sigma(directory: str | os.PathLike, key: dict[str, Any], compute: Callable[[], float]) -> float:
    """σ for ``key`` from ``directory``, else ``compute()`` stored there (computed once across processes)."""
    ident = {"format": _FORMAT, **{k: repr(v) for k, v in sorted(key.items())}}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"sigma-{digest}.json"
    with waiting_lock(root / f"sigma-{digest}.lock"):
        got = _read(path, ident)
        if got is not None:
            return got
        sigma = float(compute())
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": ident, "sigma": sigma}, sort_keys=True))
        os.replace(tmp, path)
        return sigma


def _read(path: Path, ident: dict[str, Any]) -> float | None:
    try:
        entry = json.loads(path.read_text())
        if entry.get("key") == ident and isinstance(entry.get("sigma"), (int, float)) and entry["sigma"] > 0:
            return float(entry["sigma"])
    except (OSError, ValueError, AttributeError):
        pass
    return None
