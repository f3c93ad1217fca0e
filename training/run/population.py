"""Population samples z for the attacks: images known to be OUT of the target and of every reference model.

A run's population is the concatenation, in this order, of

* ``test``: the run's test split (``data.test_split``, capped by ``data.test_size``, input-canary sources removed),
  the images test accuracy is measured on; no model trains on them;
* ``pool complement``: the rows of ``data.split`` that the seeded pool draw left out
  (:attr:`training.data.SplitRows.complement`, row order). The target trains on members of the pool and its
  reference models on subsets of the same pool (:mod:`attacks.shadows`), so none of them saw these images;
* ``import hold-out``: for an imported checkpoint, the non-members held out at import (no complement: the
  import's pool is the whole member / non-member sources).

Checks before any image is used: the pool is the one the manifest fingerprints (:attr:`VerifiedRun.pool`); the
split on disk has the size and labels the manifest recorded when the pool was drawn (``data.split_size``,
``data.split_labels_sha256``; runs written before these fields existed are checked through the pool fingerprint
alone), otherwise :func:`run_population` refuses; and any population image whose pixels equal those of a pool
image (an input canary included) is dropped, so an exact copy of a training image never serves as a non-member.
:meth:`Population.take` reports, per source, how many images were available, used and dropped, and the
fingerprint of the images taken.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from training.data import ImageSet, SplitRows, concat_sets
from training.data.stream import StreamSet, is_streamed
from foundation.errors import CheckpointError

if TYPE_CHECKING:
    from training.run.verified import VerifiedRun

__all__ = ["Population", "PopulationPart", "run_population", "check_split"]


def _digests(images: ImageSet | StreamSet) -> list[bytes]:
    """One digest per image (pixels only; labels are ignored, so a relabelled copy still matches); a streamed
    set is decoded chunk by chunk."""
    chunks = (c.numpy() for _, c in images.x.chunks()) if is_streamed(images) else (images.x,)
    return [hashlib.blake2b(np.ascontiguousarray(img).tobytes(), digest_size=16).digest()
            for chunk in chunks for img in chunk]


@dataclass(frozen=True, eq=False)
class PopulationPart:
    """One population source: its name for the record, its size, and how to materialise sorted positions."""

    source: str
    size: int
    take: Callable[[np.ndarray], ImageSet | StreamSet]


@dataclass(frozen=True, eq=False)
class Population:
    """The run's population sources, concatenated; images are decoded only for the positions taken.

    Attributes:
        parts: the sources in order (positions ``[0, parts[0].size)`` are the first, and so on).
        image_bytes: bytes of one image (what the attack's memory budget counts).
        pool_digests: pixel digests of every pool image (canaries included); matching images are dropped.
    """

    parts: tuple[PopulationPart, ...]
    image_bytes: int
    pool_digests: frozenset[bytes]

    def __len__(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def source(self) -> str:
        """The sources, for messages: ``"cifar10/test (test split) + cifar10/train outside the pool"``."""
        return " + ".join(p.source for p in self.parts) or "none"

    def take(self, positions: np.ndarray) -> tuple[ImageSet | None, np.ndarray, dict[str, Any]]:
        """The images at sorted ``positions``, minus exact copies of pool images.

        Returns:
            ``(images, kept_positions, record)``; ``images`` is None when nothing is left. ``record``:
            ``sources`` (per source: ``source``, ``available``, ``used``, ``dropped_pool_duplicates``) and
            ``fingerprint`` (:meth:`ImageSet.fingerprint` of the images, None when empty).
        """
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (np.any(np.diff(positions) <= 0) or positions[0] < 0 or positions[-1] >= len(self)):
            raise ValueError(f"positions must be sorted, unique and within [0, {len(self)})")
        sets, kept, sources, start = [], [], [], 0
        for part in self.parts:
            mine = positions[(positions >= start) & (positions < start + part.size)]
            used = dropped = 0
            if mine.size:
                images = part.take(mine - start)
                if is_streamed(images):  # what is taken fits the memory budget: decode it once
                    images = images.materialize()
                fresh = np.array([d not in self.pool_digests for d in _digests(images)], dtype=bool)
                dropped, used = int((~fresh).sum()), int(fresh.sum())
                if used:
                    sets.append(images.subset(np.flatnonzero(fresh)) if dropped else images)
                    kept.append(mine[fresh])
            sources.append({"source": part.source, "available": part.size, "used": used,
                            "dropped_pool_duplicates": dropped})
            start += part.size
        images = concat_sets(sets, split="population") if sets else None
        kept_positions = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
        return images, kept_positions, {"sources": sources,
                                        "fingerprint": None if images is None else images.fingerprint()}


def check_split(run: VerifiedRun, rows: SplitRows) -> None:
    """Refuse when ``data.split`` on disk is not the split the run's pool was drawn from (size or labels differ
    from the manifest's record); nothing to compare for runs whose manifest predates the record.

    Raises:
        CheckpointError: the split changed.
    """
    data = run.manifest.data
    if data.split_size is None:
        return
    size, labels = len(rows.catalog), rows.labels_sha256()
    if size != data.split_size or labels != data.split_labels_sha256:
        what = f"{size:,} examples (the manifest: {data.split_size:,})" if size != data.split_size else \
            "other labels than the manifest records (data.split_labels_sha256)"
        raise CheckpointError(
            f"{data.dataset} split {data.split!r} on disk has {what}: it is not the split {run.run_dir} drew its pool "
            f"from, so its images outside the pool are not known non-members; restore the original data, or set "
            f"attack.population: 0")


def run_population(run: VerifiedRun) -> Population | None:
    """The population of ``run`` (module docstring), or None when it has no source.

    Raises:
        CheckpointError: the pool or the training split on disk differs from what the manifest records.
        DataError: the data cannot be loaded.
    """
    pool = run.pool  # verified against the manifest's fingerprint first
    parts: list[PopulationPart] = []
    held_out = run.population
    if held_out is not None and len(held_out):
        parts.append(PopulationPart(source=run.population_source, size=len(held_out), take=held_out.subset))
    rows = run.split_rows
    if rows is not None:
        check_split(run, rows)
        outside = rows.complement
        if outside.size:
            data = run.manifest.data
            parts.append(PopulationPart(
                source=f"{data.dataset}/{data.split} outside the pool (pool complement)", size=int(outside.size),
                take=lambda pos, cat=rows.catalog, rows_=outside: cat.take(rows_[pos])))
    if not parts:
        return None
    return Population(parts=tuple(parts), image_bytes=int(np.prod(pool.x.shape[1:])),
                      pool_digests=frozenset(_digests(pool)))
