"""The training pool, its membership mask and input canaries: everything an auditor must be able to rebuild.

The pool is a deterministic function of the config (dataset, split, pool subset, image size, canaries), so a
reference model or an auditor on another machine can rebuild it from ``config.yaml`` and check it against the
manifest's fingerprint. Members are drawn by independent Bernoulli(p) trials with a recorded seed when
``data.audit_split`` is on (what LiRA-style attacks and the one-run audit need) or are the whole pool otherwise.

>>> mask = draw_membership(10, p=0.5, seed=3)
>>> bool((mask == draw_membership(10, p=0.5, seed=3)).all()), mask.dtype
(True, dtype('bool'))
"""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from training.canary_package import read_package
from training.config import CanaryConfig, TrainConfig
from training.data import ImageSet, SplitRows, load_pool, load_test, split_rows
from training.data.stream import StreamSet, is_streamed
from training.input_canaries import canary_rng, noise_images, pick_sources, wrong_labels
from foundation.errors import DataError

__all__ = ["Pool", "build_pool", "draw_membership", "make_canaries", "membership_mask"]


@dataclass(frozen=True)
class Pool:
    """The training pool (real examples followed by canaries) and the test set.

    Attributes:
        images: the pool; indices ``[n_real, n_real + n_canaries)`` are input canaries. A
            :class:`~training.data.stream.StreamSet` when the run streams (``data.stream``).
        test: the test set (canary sources removed), or None; streamed when the pool is.
        n_real: number of real pool examples.
        canaries: manifest description of the canaries, or None.
        package: the auditor's canary package file read (``training.canaries.from_file``), or None.
        split: ``data.split`` and the pool's rows in it (:func:`training.data.split_rows`); its complement is
            the population the attacks may use besides the test set.
    """

    images: ImageSet | StreamSet
    test: ImageSet | StreamSet | None
    n_real: int
    canaries: dict | None
    package: Path | None = None
    split: SplitRows | None = None

    @property
    def split_record(self) -> tuple[int, str] | None:
        """``(size, labels sha256)`` of ``data.split`` for the manifest; None when unknown."""
        return None if self.split is None else (len(self.split.catalog), self.split.labels_sha256())

    @property
    def streamed(self) -> bool:
        """Whether the pool streams from disk (:mod:`training.data.stream`) rather than sitting in memory."""
        return is_streamed(self.images)

    @property
    def n_canaries(self) -> int:
        return len(self.images) - self.n_real

    @property
    def auditor_canaries(self) -> bool:
        """Whether the canaries are an auditor's package (all members) rather than generated ones."""
        return bool(self.canaries) and self.canaries.get("kind") == "auditor"


def draw_membership(n: int, *, p: float, seed: int) -> np.ndarray:
    """Independent Bernoulli(p) membership for ``n`` pool examples, reproducible from ``seed``."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"membership probability p must be in (0, 1), got {p}")
    rng = np.random.default_rng([int(seed), 0x4D454D42])  # "MEMB": its own stream, apart from other seeds
    return rng.random(n) < p


def make_canaries(cfg: CanaryConfig, *, pool: ImageSet, test: ImageSet | None
                  ) -> tuple[np.ndarray, np.ndarray, ImageSet | None, dict]:
    """Input canaries (Jagielski et al. 2020; Steinke et al. 2023): examples that are easy to memorise, drawn by
    :mod:`training.input_canaries`.

    ``mislabel``: held-out test images with a label drawn uniformly among the wrong classes (the sources are
    removed from the test set). ``ood``: uniform-noise images with random labels.

    Returns:
        (x, y, test_without_sources, description)
    """
    rng = canary_rng(cfg.seed)
    m = cfg.count
    n_classes = len(pool.classes)
    if cfg.kind == "mislabel":
        if test is None or len(test) < m:
            raise DataError(
                f"training.canaries: 'mislabel' canaries need {m} held-out test images but the test split has "
                f"{0 if test is None else len(test)}; lower canaries.count or use kind: ood")
        src = pick_sources(rng, n_source=len(test), count=m)
        x = test.x[src]
        y = wrong_labels(rng, test.y[src], num_classes=n_classes)
        keep = np.setdiff1d(np.arange(len(test)), src)
        test = test.subset(keep)
        desc_src = {"source": f"{test.split} split (removed from test set)", "source_indices": src.tolist()}
    else:
        x, y = noise_images(rng, count=m, image_size=pool.x.shape[1:3], num_classes=n_classes)
        desc_src = {"source": "uniform noise images"}
    desc = {"kind": cfg.kind, "count": m, "seed": cfg.seed, **desc_src}
    return x.astype(np.uint8), y.astype(np.int64), test, desc


def _append(images: ImageSet | StreamSet, x: np.ndarray, y: np.ndarray) -> ImageSet | StreamSet:
    """``images`` followed by the canaries ``(x, y)``; a streamed pool keeps them in memory beside its files."""
    if is_streamed(images):
        return images.appended(x, y)
    return replace(images, x=np.concatenate([images.x, x]), y=np.concatenate([images.y, y]))


def build_pool(cfg: TrainConfig, *, canary_package: str | os.PathLike[str] | None = None) -> Pool:
    """Load the pool and test set described by ``cfg`` and append input canaries (if any).

    Args:
        cfg: the training config.
        canary_package: where to read the auditor's package named by ``training.canaries.from_file`` (a run
            directory's own copy, :data:`foundation.files.CANARY_PACKAGE_FILE`); None: the configured path.

    Raises:
        DataError: the data or the canary package cannot be loaded or does not fit the data.
    """
    rows = split_rows(cfg.data)
    images = load_pool(cfg.data, rows)
    test = load_test(cfg.data, stream=is_streamed(images) or None) if cfg.data.test_split else None
    n_real = len(images)
    canaries = package = None
    if cfg.training.canaries.from_file is not None:
        pkg = read_package(canary_package if canary_package is not None else cfg.training.canaries.from_file,
                           num_classes=len(images.classes), image_shape=tuple(images.x.shape[1:3]))
        images = _append(images, pkg.x, pkg.y)
        canaries, package = {**pkg.describe(), "first_index": n_real}, pkg.path
    elif cfg.training.canaries.count > 0:
        cx, cy, test, desc = make_canaries(cfg.training.canaries, pool=images, test=test)
        images = _append(images, cx, cy)
        canaries = {**desc, "first_index": n_real, "inclusion": "bernoulli(1/2) via the membership mask"}
    return Pool(images=images, test=test, n_real=n_real, canaries=canaries, package=package, split=rows)


def membership_mask(cfg: TrainConfig, pool: Pool) -> tuple[np.ndarray, dict[str, Any]]:
    """The membership mask ``cfg`` draws over ``pool`` (what training samples from) and how it was drawn
    (:func:`training.run.write_run`'s ``membership_*`` arguments)."""
    n = len(pool.images)
    if cfg.data.audit_split:
        mask = draw_membership(n, p=cfg.data.member_prob, seed=cfg.data.membership_seed)
        if pool.auditor_canaries:  # the auditor drew the canaries' inclusion: its whole package is trained on
            mask[pool.n_real:] = True
        info = {"membership_scheme": "bernoulli", "member_p": cfg.data.member_prob,
                "membership_seed": cfg.data.membership_seed}
    else:
        mask = np.ones(n, dtype=bool)
        if pool.n_canaries and not pool.auditor_canaries:  # generated canaries: IN with probability 1/2
            mask[pool.n_real:] = draw_membership(pool.n_canaries, p=0.5, seed=cfg.data.membership_seed)
        info = {"membership_scheme": "all", "membership_seed": cfg.data.membership_seed}
    return mask, info
