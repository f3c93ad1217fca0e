"""The audited run: its manifest, verified weights and membership, and the pool rebuilt from its sources.

Auditors never trust a run directory blindly (DESIGN.md). :func:`load_target` checks the weights and the
membership mask against the sha256s in ``manifest.json``, rebuilds the training pool and refuses the run when
the pool's fingerprint differs from the manifest's. The pool comes from one of three places, in this order:

1. ``config.yaml`` (a run written by ``audit train``): :func:`training.pool.build_pool` of the recipe, whose
   sha256 must equal ``provenance.config_sha256``; population samples ``z`` come from its test split.
2. ``import.json`` (a checkpoint brought in by ``audit import``): member and non-member sources
   (dataset, root, split, image size, limit) and the non-members held out as population samples.
3. A hand-written manifest only: ``data.dataset``/``data.root``/``data.split`` are the members and
   ``data.nonmember_split`` (same dataset) the non-members; no population samples.

Only case 1 carries a training recipe, so only it can train reference models.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from training.checkpoint import check_finite_weights
from training.config import TrainConfig, load_config
from training.data import ImageSet, concat_sets, load_dataset
from training.errors import CheckpointError, ConfigError, DataError
from training.io import read_json, sha256_file
from training.manifest import Manifest, load_membership, read_manifest, verify_weights
from training.pool import build_pool
from training.trust import CodeTrust, require_code_trust

__all__ = ["IMPORT_FILE", "IMPORT_FORMAT", "TargetRun", "load_target", "has_recipe", "pool_from_import",
           "combine_import_sets", "load_source"]

IMPORT_FILE = "import.json"
IMPORT_FORMAT = "dp-audit-import/1"
_SOURCE_KEYS = ("dataset", "root", "split", "image_size", "limit")


@dataclasses.dataclass(frozen=True, eq=False)
class TargetRun:
    """A verified run directory, ready to be attacked.

    Attributes:
        run_dir: the run directory.
        manifest: its validated manifest.
        config: the training recipe (``config.yaml``), or None for imported checkpoints.
        pool: the rebuilt training pool; its fingerprint equals the manifest's.
        membership: bool mask over the pool (True = trained on), sha256-verified.
        population: examples known to be OUT of the target (candidates for population samples z), or None.
        population_source: where ``population`` came from (for the record).
        code: the fields of the run that name code, and whether the user trusted them (``--trust-code``);
            every model built for this target passes ``code.trust_code`` on.
    """

    run_dir: Path
    manifest: Manifest
    config: TrainConfig | None
    pool: ImageSet
    membership: np.ndarray
    population: ImageSet | None
    population_source: str
    code: CodeTrust = CodeTrust(trust_code=False)

    @property
    def has_recipe(self) -> bool:
        """True when the run carries the recipe needed to train reference models."""
        return self.config is not None

    @property
    def weights_sha256(self) -> str:
        return self.manifest.model.weights_sha256

    @property
    def membership_sha256(self) -> str:
        return self.manifest.data.membership_sha256

    @property
    def pool_fingerprint(self) -> str:
        return self.manifest.data.pool_fingerprint


def has_recipe(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``run_dir`` holds a ``config.yaml`` (a training recipe)."""
    return (Path(run_dir) / "config.yaml").is_file()


def load_source(spec: Mapping[str, Any], *, what: str) -> ImageSet:
    """Load one data source ``{"dataset", "split", "root"?, "image_size"?, "limit"?}`` of an import record.

    Raises:
        CheckpointError: the record lacks ``dataset`` or ``split`` or has unknown keys.
        DataError: as :func:`training.data.load_dataset`.
    """
    if not isinstance(spec, Mapping) or not spec.get("dataset") or not spec.get("split"):
        raise CheckpointError(f"{IMPORT_FILE}: '{what}' must name at least a dataset and a split; re-run audit import")
    return load_dataset(str(spec["dataset"]), root=spec.get("root"), split=str(spec["split"]),
                        image_size=spec.get("image_size"), limit=spec.get("limit"))


def combine_import_sets(members: ImageSet, nonmembers: ImageSet, held_out: np.ndarray
                        ) -> tuple[ImageSet, ImageSet | None]:
    """Pool = members, then the non-members not in ``held_out``; population = the held-out non-members.

    Raises:
        CheckpointError: ``held_out`` is not a set of distinct positions in ``nonmembers``.
        DataError: members and non-members differ in classes or image size.
    """
    held = np.asarray(held_out, dtype=np.int64)
    if held.size and (held.min() < 0 or held.max() >= len(nonmembers) or np.unique(held).size != held.size):
        raise CheckpointError(f"{IMPORT_FILE}: population.indices must be distinct positions in the "
                              f"{len(nonmembers)} non-members; re-run audit import")
    rest = np.setdiff1d(np.arange(len(nonmembers)), held)
    try:
        pool = concat_sets([members, nonmembers.subset(rest)], split=f"{members.split}+{nonmembers.split}")
    except ValueError as exc:
        raise DataError(f"members and non-members cannot form one pool: {exc}") from None
    return pool, (nonmembers.subset(held) if held.size else None)


def pool_from_import(record: Mapping[str, Any]) -> tuple[ImageSet, ImageSet | None]:
    """The pool (members, then the non-members not held out) and the held-out population of an import record.

    The importer builds its pool with :func:`combine_import_sets` too, so the fingerprints agree.

    Args:
        record: the parsed ``import.json`` (``members``, ``nonmembers`` sources; optional
            ``population.indices``: positions in the non-member source held out as population samples).

    Returns:
        ``(pool, population)``; ``population`` is None when nothing is held out.

    Raises:
        CheckpointError: a malformed record. DataError: sources that cannot be loaded or combined.
    """
    if not isinstance(record, Mapping) or record.get("format") != IMPORT_FORMAT:
        raise CheckpointError(f"{IMPORT_FILE} is not a {IMPORT_FORMAT} record; re-run audit import")
    members = load_source(record.get("members"), what="members")
    nonmembers = load_source(record.get("nonmembers"), what="nonmembers")
    held = np.asarray((record.get("population") or {}).get("indices", []), dtype=np.int64)
    return combine_import_sets(members, nonmembers, held)


def _read_recipe(run_dir: Path, manifest: Manifest) -> TrainConfig:
    path = run_dir / "config.yaml"
    want = manifest.provenance.config_sha256
    if want is not None and sha256_file(path) != want:
        raise CheckpointError(f"{path} does not match the manifest's config sha256: the recipe was edited after "
                              f"training; restore it (or retrain) before attacking")
    try:
        return load_config(path)
    except ConfigError as exc:
        raise CheckpointError(f"{path} is not a valid training config ({exc})") from None


def _pool_from_manifest(manifest: Manifest, run_dir: Path) -> ImageSet:
    d = manifest.data
    if d.nonmember_split is None:
        raise CheckpointError(f"{run_dir} has neither config.yaml (a training recipe) nor {IMPORT_FILE}, and its "
                              f"manifest names no data.nonmember_split: the pool cannot be rebuilt; create the run "
                              f"with 'audit train' or 'audit import'")
    spec = {"dataset": d.dataset, "root": d.root, "image_size": d.image_size}
    record = {"format": IMPORT_FORMAT, "members": {**spec, "split": d.split},
              "nonmembers": {**spec, "split": d.nonmember_split}}
    return pool_from_import(record)[0]


def load_target(run_dir: str | os.PathLike[str], *, trust_code: bool = False) -> TargetRun:
    """Read and verify a run directory for auditing.

    Checks, in order: the run names no code to import unless ``trust_code`` (:func:`training.trust.require_code_trust`,
    before anything else is read); the manifest parses; the weights' sha256; the membership file's sha256 and shape;
    ``config.yaml`` against ``provenance.config_sha256`` (when present); the rebuilt pool's fingerprint
    against ``data.pool_fingerprint``.

    Raises:
        UntrustedCodeError: the run names code to import and ``trust_code`` is False.
        CheckpointError: any mismatch or missing file, with what was wrong and how to fix it.
        DataError: the pool's data cannot be loaded.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory not found: {run_dir}")
    code = require_code_trust(run_dir, trust_code=trust_code)
    manifest = read_manifest(run_dir)
    check_finite_weights(verify_weights(run_dir, manifest))
    membership = load_membership(run_dir, manifest)
    config, population, pop_source = None, None, "none"
    if has_recipe(run_dir):
        config = _read_recipe(run_dir, manifest)
        built = build_pool(config)
        pool, population = built.images, built.test
        pop_source = f"{config.data.dataset}/{config.data.test_split} (test split)" if population is not None \
            else "none"
    elif (run_dir / IMPORT_FILE).is_file():
        record = read_json(run_dir / IMPORT_FILE, what="import record")
        pool, population = pool_from_import(record)
        if population is not None:
            src = record["nonmembers"]
            pop_source = f"{src['dataset']}/{src['split']} (non-members held out at import)"
    else:
        pool = _pool_from_manifest(manifest, run_dir)
    fingerprint = pool.fingerprint()
    if fingerprint != manifest.data.pool_fingerprint or len(pool) != len(membership):
        raise CheckpointError(
            f"the pool rebuilt for {run_dir} ({len(pool)} examples, fingerprint {fingerprint[:12]}...) does not match "
            f"the manifest ({manifest.data.pool_size} examples, {manifest.data.pool_fingerprint[:12]}...): the data "
            f"on disk differs from the data the model was trained on; point data.root at the original data")
    return TargetRun(run_dir=run_dir, manifest=manifest, config=config, pool=pool, membership=membership,
                     population=population, population_source=pop_source, code=code)
