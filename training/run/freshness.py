"""Whether an output is still current: one rule for every step that reads a run directory.

An output (``attack.json``, ``epsilon.json``, the signal cache, the pipeline's ledger entries for transfer and the
report) records the inputs it was made from: the run's identity (the weights and membership sha256s, both checked
against their files by :class:`~training.run.VerifiedRun`, and the pool fingerprint the manifest binds them to)
plus step-specific keys (a settings hash, the sha256 of another file, ...). It is current exactly when that record equals the one the same step would write now.
Nothing here hashes a file: the identity comes from the :class:`~training.run.VerifiedRun`, verified once.

>>> rec = {"weights_sha256": "a", "membership_sha256": "b", "pool_fingerprint": "c", "config_sha256": "d"}
>>> digest(rec) == digest(dict(reversed(list(rec.items()))))
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from foundation.io import sha256_bytes
from training.run.manifest import Manifest
from training.run.verified import VerifiedRun

__all__ = ["IDENTITY_KEYS", "identity", "inputs_record", "digest", "inputs_digest", "is_current", "manifest_identity",
           "foreign_keys", "evidence_identity"]

IDENTITY_KEYS = ("weights_sha256", "membership_sha256", "pool_fingerprint")


def identity(run: VerifiedRun) -> dict[str, str]:
    """The run's identity: verified weights and membership sha256s, and the manifest's pool fingerprint."""
    return {"weights_sha256": run.weights_sha256, "membership_sha256": run.membership_sha256,
            "pool_fingerprint": run.pool_fingerprint}


def inputs_record(run: VerifiedRun, **step: Any) -> dict[str, Any]:
    """What an output records about its inputs: :func:`identity` plus the step's own keys (JSON values)."""
    clash = sorted(set(step) & set(IDENTITY_KEYS))
    if clash:
        raise ValueError(f"step keys {clash} would overwrite the run's identity")
    return {**identity(run), **step}


def digest(record: Mapping[str, Any]) -> str:
    """sha256 of the record's canonical JSON (keys sorted)."""
    return sha256_bytes(json.dumps(record, sort_keys=True, default=str).encode("utf-8"))


def inputs_digest(run: VerifiedRun, **step: Any) -> str:
    """:func:`digest` of :func:`inputs_record`: one string for a cache key or a ledger entry."""
    return digest(inputs_record(run, **step))


def is_current(recorded: Any, run: VerifiedRun, **step: Any) -> bool:
    """Whether ``recorded`` (an output's inputs record, or its digest string) matches what the step would record
    now. An output written before this rule (other keys) is simply not current, and is remade."""
    expected = inputs_record(run, **step)
    if isinstance(recorded, str):
        return recorded == digest(expected)
    return isinstance(recorded, Mapping) and dict(recorded) == expected


def manifest_identity(manifest: Manifest) -> dict[str, str]:
    """The run's identity as its manifest records it (:func:`identity` without checking the files)."""
    return {"weights_sha256": manifest.model.weights_sha256, "membership_sha256": manifest.data.membership_sha256,
            "pool_fingerprint": manifest.data.pool_fingerprint}


def evidence_identity(run: VerifiedRun | Manifest, *, claim: bool = True) -> dict[str, str]:
    """What a signed derived file is bound to (:mod:`foundation.evidence`): the run's identity as its manifest
    records it (weights and membership sha256s, checked against their files when given a :class:`VerifiedRun`;
    the pool fingerprint) and, with ``claim``, ``claim_sha256``: the sha256 of the manifest's whole privacy block
    (ε, δ, σ, phases), so a claim edited after the file was written makes it stale. Files whose content does
    not depend on the claim (``signals.npz``, ``scores.npz``, ``attack.json``) are bound without it: a claim
    edit then re-makes ``epsilon.json``, not the attack."""
    manifest = run.manifest if isinstance(run, VerifiedRun) else run
    ident = identity(run) if isinstance(run, VerifiedRun) else manifest_identity(manifest)  # a run: files checked
    return {**ident, "claim_sha256": digest(manifest.privacy.model_dump(mode="json"))} if claim else dict(ident)


def foreign_keys(recorded: Any, manifest: Manifest) -> list[str]:
    """The :data:`IDENTITY_KEYS` on which an output's inputs record differs from the run as its manifest records
    it (missing counts as different): empty when the output was made for this run's weights, membership and pool.
    Hashes nothing (the files themselves are checked against the manifest by :class:`VerifiedRun`); for readers
    that do not know the step's own keys (the report, the gate): the step itself uses :func:`is_current`.

    >>> from types import SimpleNamespace as NS
    >>> m = NS(model=NS(weights_sha256="w"), data=NS(membership_sha256="m", pool_fingerprint="p"))
    >>> foreign_keys({"weights_sha256": "w", "membership_sha256": "m", "pool_fingerprint": "p", "x": 1}, m)
    []
    >>> foreign_keys({"weights_sha256": "old", "membership_sha256": "m"}, m)
    ['weights_sha256', 'pool_fingerprint']
    """
    have = manifest_identity(manifest)
    got = recorded if isinstance(recorded, Mapping) else {}
    return [k for k in IDENTITY_KEYS if got.get(k) != have[k]]
