"""The names of the files dp-audit writes: the one place they are spelt (modules import them from here).

A finished run directory holds::

    manifest.json            what the checkpoint claims (training.run.manifest); written last
    model.safetensors        the weights (sha256 in the manifest)
    membership.npy           one bool per pool index, True = trained on (sha256 in the manifest)
    config.yaml              the resolved training config (runs written by ``audit train``; sha256 in the manifest)
    import.json              the data sources of an imported checkpoint (``audit import``)
    metrics.json             accuracies, steps, loss history
    canary_package.npz       the auditor's canary package the run trained on (training.canaries.from_file; its
                             sha256 in the manifest's data.canaries)
    model_init.safetensors   θ_0, the weights before the first step (runs with gradient canaries)
    gradient_canaries.npy    which gradient canaries were included (sha256 in the manifest)
    input_canaries.npz       OpacusAuditor's input canaries and their final scores
    pool.npz                 OpacusAuditor's pool (audit.AuditPool): every item's input tensor and label
    state/checkpoint.pt      resumable training state (removed when the run completes)
    tb/                      TensorBoard curves
    .lock                    held while a command writes the run (foundation.lock)

and, once audited::

    shadows/                 reference models: <k>/ run directories, index.json, keep.npy (.staging/ while Ray
                             tasks write)
    signals.npz              every model's scaled logits (attacks.signal_cache)
    attack.json, scores.npz  ``audit attack``'s results and per-example scores
    epsilon.json             ``audit epsilon``; transfer.json: ``audit transfer``; pipeline.json: ``audit run``
    mechanism.json           ``audit mechanism``: the tight audit of the run's DP-SGD mechanism (audit.mechanism)
    report.html/.md/.json    ``audit report`` (report.pdf with --pdf)
    canary_references/       reference models of an auditor's canaries: index.json, <k>/keep.npy, phi.npy,
                             weights.safetensors

The auditor's canary secret (``audit canaries``) is canary_secret.npz beside canary_package.npz and
commitment.txt; ``audit gate`` writes gate.json.

>>> has_recipe("/nonexistent")
False
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CANARY_PACKAGE_FILE", "MANIFEST_FILE", "WEIGHTS_FILE", "MEMBERSHIP_FILE", "CONFIG_FILE", "IMPORT_FILE",
           "METRICS_FILE", "INIT_WEIGHTS_FILE", "GRADIENT_CANARY_FILE", "INPUT_CANARY_FILE", "POOL_FILE", "STATE_DIR", "STATE_FILE",
           "TB_DIR", "LOCK_FILE", "SHADOW_DIR", "INDEX_FILE", "KEEP_FILE", "STAGING_DIR", "SIGNALS_FILE",
           "ATTACK_FILE", "SCORES_FILE", "EPSILON_FILE", "TRANSFER_FILE", "PIPELINE_FILE", "REPORT_HTML_FILE",
           "REPORT_MD_FILE", "REPORT_JSON_FILE", "REPORT_PDF_FILE", "CANARY_REFERENCE_DIR", "PHI_FILE",
           "REFERENCE_WEIGHTS_FILE", "CANARY_SECRET_FILE", "COMMITMENT_FILE", "GATE_FILE", "MECHANISM_FILE", "RUN_DIR_MARKERS",
           "has_recipe", "has_recorded_pool", "is_complete"]

# ------------------------------------------------------------------------------------- written by training
MANIFEST_FILE = "manifest.json"
WEIGHTS_FILE = "model.safetensors"
MEMBERSHIP_FILE = "membership.npy"
CONFIG_FILE = "config.yaml"
IMPORT_FILE = "import.json"
METRICS_FILE = "metrics.json"
CANARY_PACKAGE_FILE = "canary_package.npz"
MECHANISM_FILE = "mechanism.json"
INIT_WEIGHTS_FILE = "model_init.safetensors"
GRADIENT_CANARY_FILE = "gradient_canaries.npy"
INPUT_CANARY_FILE = "input_canaries.npz"
POOL_FILE = "pool.npz"
STATE_DIR = "state"
STATE_FILE = Path(STATE_DIR) / "checkpoint.pt"
TB_DIR = "tb"
LOCK_FILE = ".lock"

#: What marks a directory as a run directory (``foundation.io`` refuses to delete a directory without one).
RUN_DIR_MARKERS = (MANIFEST_FILE, CONFIG_FILE, STATE_DIR, IMPORT_FILE)

# ------------------------------------------------------------------------------------- written by auditing
SHADOW_DIR = "shadows"
INDEX_FILE = "index.json"  # shadows/ and canary_references/
KEEP_FILE = "keep.npy"  # shadows/ and each canary reference
STAGING_DIR = ".staging"  # shadows/.staging: Ray tasks' outputs before they are adopted
SIGNALS_FILE = "signals.npz"
ATTACK_FILE = "attack.json"
SCORES_FILE = "scores.npz"
EPSILON_FILE = "epsilon.json"
TRANSFER_FILE = "transfer.json"
PIPELINE_FILE = "pipeline.json"
REPORT_HTML_FILE = "report.html"
REPORT_MD_FILE = "report.md"
REPORT_JSON_FILE = "report.json"
REPORT_PDF_FILE = "report.pdf"
CANARY_REFERENCE_DIR = "canary_references"
PHI_FILE = "phi.npy"
REFERENCE_WEIGHTS_FILE = "weights.safetensors"

# ------------------------------------------------------------------------------------- the auditor's own files
CANARY_SECRET_FILE = "canary_secret.npz"
COMMITMENT_FILE = "commitment.txt"
GATE_FILE = "gate.json"


def has_recorded_pool(manifest: object) -> bool:
    """Whether a run's manifest records an ``audit.AuditPool`` (``training.audit_pool``: ``pool.npz``, its sha256
    and the membership draw), which ``audit.attack(run, train_fn=...)`` needs.

    >>> from types import SimpleNamespace as NS
    >>> has_recorded_pool(NS(training={"audit_pool": {"file": POOL_FILE}})), has_recorded_pool(NS(training={}))
    (True, False)
    """
    return isinstance((getattr(manifest, "training", None) or {}).get("audit_pool"), dict)


def has_recipe(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` holds a ``config.yaml`` (a training recipe that reference models can follow)."""
    return (Path(run_dir) / CONFIG_FILE).is_file()


def is_complete(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` holds a manifest (written last, so its presence marks a finished run)."""
    return (Path(run_dir) / MANIFEST_FILE).is_file()
