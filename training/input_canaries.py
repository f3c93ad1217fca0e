"""Input canaries, drawn in one place: examples that are easy to memorise (Jagielski et al. 2020; Steinke, Nasr,
Jagielski, NeurIPS 2023), whose inclusion a one-run audit tests.

Two designs:

* ``mislabel``: held-out items (the test split, or a ``source`` dataset) relabelled to a class drawn uniformly
  among the wrong ones: :func:`pick_sources` then :func:`wrong_labels`;
* ``ood``: uniform noise with uniform labels: :func:`noise_images` (uint8 images, as datasets hold them) or
  :func:`noise_tensors` (the float tensors a model receives, for a dataset we did not write).

Every user draws from these functions: ``audit train``'s pool (:func:`training.pool.make_canaries`, generator
:func:`canary_rng`), :class:`audit.CanaryDataset` (the same generator, so the same seed picks the same sources
and labels) and the auditor's secret canaries (:func:`audit.canaries.secret.make_canaries`, its own streams).
Each function takes the generator and draws in a fixed order, so a seed gives the same canaries everywhere.

>>> x, y = noise_images(canary_rng(0), count=3, image_size=(2, 2), num_classes=10)
>>> x.dtype, x.shape, y.tolist()
(dtype('uint8'), (3, 2, 2, 3), [4, 2, 1])
>>> rng = canary_rng(0)
>>> src = pick_sources(rng, n_source=10, count=3)
>>> src.tolist(), bool((wrong_labels(rng, np.zeros(3, dtype=np.int64), num_classes=4) != 0).all())
([5, 8, 9], True)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["CANARY_STREAM", "canary_rng", "pick_sources", "wrong_labels", "noise_images", "noise_tensors"]

CANARY_STREAM = 0x43414E41  # "CANA": the stream of audit train's and CanaryDataset's canaries


def canary_rng(seed: int) -> np.random.Generator:
    """The generator of the input canaries drawn with ``seed`` (``training.canaries.seed``, ``CanaryDataset``'s
    ``seed``); separate from every other stream of the run."""
    return np.random.default_rng([int(seed), CANARY_STREAM])


def pick_sources(rng: np.random.Generator, *, n_source: int, count: int) -> np.ndarray:
    """``count`` distinct held-out items out of ``n_source``, sorted (the ``mislabel`` design's sources)."""
    return np.sort(rng.choice(int(n_source), size=int(count), replace=False))


def wrong_labels(rng: np.random.Generator, true: np.ndarray, *, num_classes: int) -> np.ndarray:
    """A label drawn uniformly among the ``num_classes - 1`` wrong ones for each true label."""
    true = np.asarray(true)
    return (true + rng.integers(1, int(num_classes), size=len(true))) % int(num_classes)


def noise_images(rng: np.random.Generator, *, count: int, image_size: Sequence[int],
                 num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``ood`` canaries as images: uint8 uniform noise ``(count, H, W, 3)`` and uniform labels (int64)."""
    h, w = (int(s) for s in image_size)
    x = rng.integers(0, 256, size=(int(count), h, w, 3), dtype=np.uint8)
    return x, rng.integers(0, int(num_classes), size=int(count))


def noise_tensors(rng: np.random.Generator, *, count: int, shape: Sequence[int],
                  num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``ood`` canaries as model inputs: float32 uniform noise in [0, 1) of ``(count, *shape)``, uniform labels."""
    x = rng.random((int(count), *(int(s) for s in shape)), dtype=np.float32)
    return x, rng.integers(0, int(num_classes), size=int(count))
