"""The run directory: its file names, the manifest, resumable state, imported checkpoints, verified opening and
whether outputs are current. Every reader and writer of a run directory goes through this package.

* :mod:`foundation.files`: the file names (``manifest.json``, ``model.safetensors``, ``config.yaml``, ...).
* :mod:`training.run.manifest`: the manifest schema, :func:`build_manifest`, :func:`write_manifest`.
* :mod:`training.run.writer`: :func:`write_run`, the one writer of a run directory (weights, membership, metrics,
  config, hashes, privacy block, manifest last) behind ``audit train``, reference models, ``audit import`` and
  :class:`audit.OpacusAuditor`.
* :mod:`training.run.state`: resumable training state (``state/checkpoint.pt``).
* :mod:`training.run.imported`: ``import.json`` and the pool of an imported checkpoint.
* :mod:`training.run.readers`: one file of a run read and checked against the manifest.
* :mod:`training.run.verified`: :func:`open_run` -> :class:`VerifiedRun` (manifest, weights, membership, config,
  pool: each read and verified once).
* :mod:`training.run.population`: the attacks' population samples (test split + the training split outside the
  pool, or an import's hold-out), checked against the manifest.
* :mod:`training.run.freshness`: one rule for "is this output still current".
* :mod:`foundation.lock`: one writer per run directory at a time (``.lock``).
"""

from foundation.files import (CONFIG_FILE, IMPORT_FILE, MANIFEST_FILE, MEMBERSHIP_FILE, METRICS_FILE, STATE_FILE,
                                TB_DIR, WEIGHTS_FILE, has_recipe, is_complete)
from training.run.freshness import evidence_identity, identity, inputs_digest, inputs_record, is_current
from training.run.imported import IMPORT_FORMAT
from training.run.manifest import (MANIFEST_FORMAT, DataInfo, Manifest, MembershipInfo, ModelInfo, PhaseInfo,
                                   PrivacyInfo, Provenance, build_manifest, write_manifest)
from training.run.verified import VerifiedRun, as_run, open_run
from training.run.population import Population, run_population
from training.run.writer import privacy_record, write_membership, write_run, write_weights

__all__ = [
    "CONFIG_FILE", "IMPORT_FILE", "MANIFEST_FILE", "MEMBERSHIP_FILE", "METRICS_FILE", "STATE_FILE", "TB_DIR",
    "WEIGHTS_FILE", "has_recipe", "is_complete", "evidence_identity", "identity", "inputs_digest", "inputs_record",
    "is_current",
    "IMPORT_FORMAT", "MANIFEST_FORMAT", "DataInfo", "Manifest", "MembershipInfo", "ModelInfo", "PhaseInfo",
    "PrivacyInfo", "Provenance", "build_manifest", "write_manifest", "VerifiedRun", "as_run", "open_run",
    "write_run", "privacy_record", "write_membership", "write_weights", "Population", "run_population",
]
