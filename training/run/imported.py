"""Imported checkpoints: the import record (``import.json``) and the pool rebuilt from its data sources.

A checkpoint brought in by ``audit import`` has no training recipe; ``import.json`` (format
``dp-audit-import/1``) names its member and non-member sources (dataset, root, split, image size, limit) and
the non-members held out as population samples z. The pool is the members followed by the non-members not
held out (:func:`combine_import_sets`, used by the importer too, so the fingerprints agree). A run with only a
hand-written manifest gets its pool from ``data.dataset``/``data.root``/``data.split`` (members) and
``data.nonmember_split`` (non-members of the same dataset) and no population (:func:`pool_from_manifest`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from training.data import ImageSet, concat_sets, load_dataset
from foundation.errors import CheckpointError, DataError
from foundation.io import read_json
from foundation.files import CONFIG_FILE, IMPORT_FILE
from training.run.manifest import Manifest

__all__ = ["IMPORT_FORMAT", "load_source", "combine_import_sets", "pool_from_import", "pool_from_manifest",
           "read_import_record"]

IMPORT_FORMAT = "dp-audit-import/1"


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


def pool_from_manifest(manifest: Manifest, run_dir: str | os.PathLike[str]) -> ImageSet:
    """The pool of a run with a hand-written manifest only: members ``data.split``, non-members
    ``data.nonmember_split`` of ``data.dataset``.

    Raises:
        CheckpointError: the manifest names no non-member split. DataError: the data cannot be loaded.
    """
    d = manifest.data
    if d.nonmember_split is None:
        raise CheckpointError(f"{run_dir} has neither {CONFIG_FILE} (a training recipe) nor {IMPORT_FILE}, and its "
                              f"manifest names no data.nonmember_split: the pool cannot be rebuilt; create the run "
                              f"with 'audit train' or 'audit import'")
    spec = {"dataset": d.dataset, "root": d.root, "image_size": d.image_size}
    record = {"format": IMPORT_FORMAT, "members": {**spec, "split": d.split},
              "nonmembers": {**spec, "split": d.nonmember_split}}
    return pool_from_import(record)[0]


def read_import_record(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The parsed ``import.json`` of ``run_dir``, or None when there is none.

    Raises:
        CheckpointError: the file is not valid JSON.
    """
    path = Path(run_dir) / IMPORT_FILE
    return read_json(path, what="import record") if path.is_file() else None
