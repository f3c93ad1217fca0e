"""Signals of the target and its reference models on the pool and on population samples, cached on disk.

``<run>/signals.npz`` holds (float32 scaled logits phi, see :mod:`attacks.signals`; model 0 is the target,
models 1..K the reference models in keep-mask order)::

    key               sha256 over the target's weights, the reference index, the augmentations, the pool
                      fingerprint and the population (its fingerprint and the chosen indices)
    pool              (1 + K, n, A)  phi on every pool example and augmented query
    population        (1 + K, m, A)  phi on the m population samples z (m may be 0)
    population_index  (m,)           positions of z in the population source (test split / import hold-out)
    keep              (K, n)         keep masks of the reference models
    augmentations     (A,)           query names, identity first

A cache whose key differs is recomputed and replaced.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from attacks.shadows import ShadowSet
from attacks.signals import AugmentationSpec, compute_signals
from attacks.target import TargetRun
from training.data import ImageSet
from training.io import sha256_bytes, write_npz

__all__ = ["SIGNALS_FILE", "Signals", "choose_population", "signals_key", "load_or_compute_signals"]

SIGNALS_FILE = "signals.npz"


@dataclasses.dataclass(frozen=True, eq=False)
class Signals:
    """Cached signals (see the module docstring for shapes)."""

    pool: np.ndarray
    population: np.ndarray
    population_index: np.ndarray
    keep: np.ndarray
    augmentations: tuple[str, ...]
    key: str


def choose_population(population: ImageSet | None, m: int, seed: int) -> np.ndarray:
    """Sorted positions of ``min(m, len(population))`` population samples, a seeded uniform subset.

    >>> choose_population(None, 10, 0).size
    0
    """
    if population is None or m <= 0:
        return np.zeros(0, dtype=np.int64)
    size = min(int(m), len(population))
    rng = np.random.default_rng([int(seed), 0x504F50])
    return np.sort(rng.choice(len(population), size=size, replace=False)).astype(np.int64)


def signals_key(*, target: TargetRun, shadows: ShadowSet | None, spec: AugmentationSpec,
                population_fingerprint: str | None, population_index: np.ndarray) -> str:
    """The cache key: changes whenever any input of the signals changes."""
    data = {"weights": target.weights_sha256, "pool": target.pool_fingerprint,
            "shadows": None if shadows is None else shadows.index_sha256, "augmentations": dataclasses.asdict(spec),
            "population": population_fingerprint, "population_index": population_index.tolist()}
    return sha256_bytes(json.dumps(data, sort_keys=True).encode("utf-8"))


def _read_cache(path: Path, key: str) -> Signals | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            return Signals(pool=z["pool"], population=z["population"], population_index=z["population_index"],
                           keep=z["keep"], augmentations=tuple(str(a) for a in z["augmentations"]), key=key)
    except (OSError, KeyError, ValueError):  # unreadable or foreign cache: recompute it
        return None


def load_or_compute_signals(*, target: TargetRun, shadows: ShadowSet | None, spec: AugmentationSpec,
                            n_population: int, seed: int, device: torch.device, batch_size: int = 512,
                            log: Callable[[str], None] | None = None) -> Signals:
    """Signals of the target (model 0) and the reference models on the pool and population, cached.

    Args:
        target: the verified target.
        shadows: its verified reference models, or None.
        spec: the augmented queries.
        n_population: how many population samples z to use (fewer when fewer exist; 0 for none).
        seed: seeds the population draw.
        device: where the models run.
        batch_size: examples per forward pass.
        log: optional progress callback.

    Returns:
        :class:`Signals`, read from ``<run>/signals.npz`` when its key matches, else computed and written.
    """
    from training.checkpoint import load_model_from_run

    say = log or (lambda _msg: None)
    pop_index = choose_population(target.population, n_population, seed)
    population = target.population.subset(pop_index) if pop_index.size else None
    key = signals_key(target=target, shadows=shadows, spec=spec,
                      population_fingerprint=None if population is None else population.fingerprint(),
                      population_index=pop_index)
    path = target.run_dir / SIGNALS_FILE
    cached = _read_cache(path, key)
    if cached is not None:
        say(f"signals re-used from {path}")
        return cached
    run_dirs = [target.run_dir] + ([] if shadows is None else list(shadows.run_dirs))
    n, m, a = len(target.pool), pop_index.size, spec.n_augmentations
    phi_pool = np.empty((len(run_dirs), n, a), dtype=np.float32)
    phi_pop = np.empty((len(run_dirs), m, a), dtype=np.float32)
    for i, run in enumerate(run_dirs):
        model, _ = load_model_from_run(run, device=device, trust_code=target.code.trust_code)
        phi_pool[i] = compute_signals(model, target.pool.x, target.pool.y, spec=spec, batch_size=batch_size,
                                      device=device)
        if m:
            phi_pop[i] = compute_signals(model, population.x, population.y, spec=spec, batch_size=batch_size,
                                         device=device)
        say(f"signals: model {i + 1}/{len(run_dirs)}")
    keep = np.zeros((0, n), dtype=bool) if shadows is None else shadows.keep
    write_npz(path, key=np.array(key), pool=phi_pool, population=phi_pop, population_index=pop_index, keep=keep,
              augmentations=np.array(spec.names))
    return Signals(pool=phi_pool, population=phi_pop, population_index=pop_index, keep=keep,
                   augmentations=spec.names, key=key)
