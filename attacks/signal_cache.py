"""Signals of the target and its reference models on the pool and on population samples, cached on disk.

``<run>/signals.npz`` holds (float32 scaled logits phi, see :mod:`attacks.signals`; model 0 is the target,
models 1..K the reference models in keep-mask order)::

    key               :func:`training.run.inputs_digest` of the target (verified weights, membership, pool)
                      with the reference index, the augmentations and the population (its fingerprint and
                      the chosen indices)
    pool              (1 + K, n, A)  phi on every pool example and augmented query
    population        (1 + K, m, A)  phi on the m population samples z (m may be 0)
    population_index  (m,)           positions of z in the run's population (:func:`training.run.run_population`:
                                     test split, then the training split outside the pool; or an import's
                                     hold-out)
    keep              (K, n)         keep masks of the reference models
    augmentations     (A,)           query names, identity first

    content_sha256    sha256 over every array above (name, dtype, shape, bytes)

A cached file is re-used only when it is signed by this auditor's evidence key for this run
(:mod:`foundation.evidence`: a ``signals.npz`` received with a run directory is never reused), its key matches,
its arrays hash to ``content_sha256`` and the target's own signals (model 0, recomputed each time: one forward
pass) equal the cached ones; anything else (an edited, truncated or foreign file) is recomputed and replaced,
with a message saying why. Reference-model rows are trusted as far as the reference models themselves are
(trained by this auditor: ``shadows/index.json`` is signed too).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sized
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.stage_log import stage_ticker
from attacks.shadows import ShadowSet
from attacks.signals import AugmentationSpec, compute_signals
from foundation.errors import CheckpointError
from foundation.evidence import read_signed_npz, write_signed_npz
from foundation.files import SIGNALS_FILE
from training.run import VerifiedRun, evidence_identity, inputs_digest, run_population
from training.threads import ThreadBudget, model_work, using_threads

__all__ = ["SIGNALS_FILE", "Signals", "choose_population", "population_size", "signals_key", "content_sha256",
           "structure_problem", "load_or_compute_signals"]



@dataclasses.dataclass(frozen=True, eq=False)
class Signals:
    """Cached signals (see the module docstring for shapes)."""

    pool: np.ndarray
    population: np.ndarray
    population_index: np.ndarray
    keep: np.ndarray
    augmentations: tuple[str, ...]
    key: str
    population_rule: str = ""
    population_record: dict[str, Any] | None = None


def choose_population(population: Sized | None, m: int, seed: int) -> np.ndarray:
    """Sorted positions of ``min(m, len(population))`` population samples, a seeded uniform subset.

    >>> choose_population(None, 10, 0).size
    0
    """
    if population is None or m <= 0:
        return np.zeros(0, dtype=np.int64)
    size = min(int(m), len(population))
    rng = np.random.default_rng([int(seed), 0x504F50])
    return np.sort(rng.choice(len(population), size=size, replace=False)).astype(np.int64)


def population_size(requested: int | str, available: int, *, n_models: int, n_augmentations: int,
                    image_bytes: int, memory_mb: float) -> tuple[int, str]:
    """How many population samples to use, and the rule that chose it (for ``attack.json``).

    ``requested`` is ``"all"`` or a number; either is capped by what exists and by ``memory_mb``, the budget
    of the population's signals (``n_models x n_augmentations`` float32 per sample) and image copy.

    >>> population_size("all", 10_000, n_models=17, n_augmentations=2, image_bytes=3072, memory_mb=1024)
    (10000, 'all 10,000 available')
    >>> population_size("all", 10_000, n_models=17, n_augmentations=2, image_bytes=3072, memory_mb=1)[0]
    326
    """
    per_sample = n_models * n_augmentations * 4 + int(image_bytes)
    cap = int(memory_mb * 2**20 // max(1, per_sample))
    want = available if requested == "all" else min(int(requested), available)
    what = f"all {available:,} available" if requested == "all" else f"{want:,} of {available:,} available"
    if want > cap:
        return cap, f"{what}, capped at {cap:,} by population_memory_mb={memory_mb:g}"
    return want, what


def signals_key(*, target: VerifiedRun, shadows: ShadowSet | None, spec: AugmentationSpec,
                population_fingerprint: str | None, population_index: np.ndarray) -> str:
    """The cache key: changes whenever any input of the signals changes."""
    return inputs_digest(target, shadows=None if shadows is None else shadows.index_sha256,
                         augmentations=dataclasses.asdict(spec), population=population_fingerprint,
                         population_index=population_index.tolist())


_FIELDS = ("key", "pool", "population", "population_index", "keep", "augmentations")


def content_sha256(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over the named arrays (sorted by name; dtype, shape and bytes of each).

    >>> a = {"x": np.arange(3)}
    >>> content_sha256(a) == content_sha256({"x": np.arange(3)}) != content_sha256({"x": np.arange(4)})
    True
    """
    h = hashlib.sha256()
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode("utf-8"))
        h.update(arr.tobytes())
    return h.hexdigest()


def structure_problem(arrays: dict[str, np.ndarray]) -> str | None:
    """What is structurally wrong with cached signal arrays (shapes that disagree, non-finite signals, repeated
    population indices, keep masks that are not bool), or None.

    >>> ok = {"pool": np.zeros((2, 3, 1), np.float32), "population": np.zeros((2, 0, 1), np.float32),
    ...       "population_index": np.zeros(0, np.int64), "keep": np.zeros((1, 3), bool)}
    >>> structure_problem(ok) is None, structure_problem({**ok, "keep": np.zeros((2, 3), bool)})
    (True, 'keep has 2 reference models, pool 1')
    """
    pool, pop, index, keep = (arrays[k] for k in ("pool", "population", "population_index", "keep"))
    if pool.ndim != 3 or pop.ndim != 3 or keep.ndim != 2 or index.ndim != 1:
        return "arrays of the wrong rank"
    if keep.shape[0] != pool.shape[0] - 1:
        return f"keep has {keep.shape[0]} reference models, pool {pool.shape[0] - 1}"
    if keep.dtype != np.bool_ or keep.shape[1] != pool.shape[1]:
        return "keep masks are not bool over the pool"
    if pop.shape[0] != pool.shape[0] or pop.shape[2] != pool.shape[2] or pop.shape[1] != index.size:
        return "population signals do not match the pool's or the population index"
    if index.dtype.kind not in "iu" or np.unique(index).size != index.size:
        return "population indices are not unique integers"
    if not (np.isfinite(pool).all() and np.isfinite(pop).all()):
        return "non-finite signals"
    return None


def _read_cache(path: Path, key: str, say: Callable[[str], None], identity: dict[str, str]) -> Signals | None:
    """The cached signals when the file is readable, signed by this auditor for this run (:mod:`foundation.evidence`:
    a file received with the run, or edited, is never reused), its key matches and its content hash holds; else
    None."""
    if not path.is_file() and not path.is_symlink():
        return None
    if path.is_symlink():
        say(f"{path} is a symbolic link (not made by this auditor): recomputing")
        return None
    try:
        z = read_signed_npz(path, remake="audit attack", identity=identity)
    except CheckpointError as exc:
        say(f"{exc}: recomputing")
        return None
    try:
        if "key" not in z or str(z["key"]) != key:
            say(f"{path} was made from other inputs: recomputing")
            return None
        arrays = {f: z[f] for f in _FIELDS}
        recorded = str(z["content_sha256"]) if "content_sha256" in z else None
    except (KeyError, ValueError) as exc:
        say(f"{path} is unreadable ({type(exc).__name__}): recomputing")
        return None
    if recorded != content_sha256(arrays):
        say(f"{path} does not match its content hash (edited, or written by an older version): recomputing")
        return None
    problem = structure_problem(arrays)
    if problem is not None:
        say(f"{path}: {problem}: recomputing")
        return None
    return Signals(pool=arrays["pool"], population=arrays["population"],
                   population_index=arrays["population_index"], keep=arrays["keep"],
                   augmentations=tuple(str(a) for a in arrays["augmentations"]), key=key)


#: Tolerance between cached and recomputed target signals (different devices differ in the last digits).
_RECHECK_TOL = 1e-3


def load_or_compute_signals(*, target: VerifiedRun, shadows: ShadowSet | None, spec: AugmentationSpec,
                            n_population: int | str, seed: int, device: torch.device, batch_size: int = 512,
                            population_memory_mb: float = 1024.0,
                            log: Callable[[str], None] | None = None) -> Signals:
    """Signals of the target (model 0) and the reference models on the pool and population, cached.

    Args:
        target: the verified target.
        shadows: its verified reference models, or None.
        spec: the augmented queries.
        n_population: how many population samples z to use, or ``"all"`` (fewer when fewer exist or
            ``population_memory_mb`` caps them, :func:`population_size`; 0 for none).
        seed: seeds the population draw.
        device: where the models run.
        batch_size: examples per forward pass.
        population_memory_mb: the population's memory budget (MiB).
        log: optional progress callback.

    Returns:
        :class:`Signals`, read from ``<run>/signals.npz`` when its key matches, else computed and written.
    """
    say = log or (lambda _msg: None)
    source = None if n_population == 0 else run_population(target)
    available = 0 if source is None else len(source)
    m_pop, rule = population_size(n_population, available, n_models=1 + (0 if shadows is None else shadows.n_models),
                                  n_augmentations=spec.n_augmentations, memory_mb=population_memory_mb,
                                  image_bytes=0 if source is None else source.image_bytes)
    pop_index = choose_population(source, m_pop, seed)
    population, pop_index, taken = (source.take(pop_index) if pop_index.size
                                     else (None, pop_index, {"sources": [], "fingerprint": None}))
    want = available if n_population == "all" else min(int(n_population), available)
    record = {"requested": n_population, "available": available, "memory_mb": float(population_memory_mb),
              "capped": m_pop < want, **taken}
    dropped = sum(s["dropped_pool_duplicates"] for s in taken["sources"])
    rule = (f"{rule} ({source.source})" if source is not None else rule) + (
        f"; {dropped} exact copies of pool images dropped" if dropped else "")
    key = signals_key(target=target, shadows=shadows, spec=spec, population_fingerprint=taken["fingerprint"],
                      population_index=pop_index)
    path = target.run_dir / SIGNALS_FILE
    runs = [target] + ([] if shadows is None else list(shadows.runs))
    n, m, a = len(target.pool), pop_index.size, spec.n_augmentations

    arch = target.manifest.model
    threads = ThreadBudget().plan(work=model_work(params=arch.param_count, input_shape=arch.input_shape))

    def signals_of(run: VerifiedRun, *, keep_weights: bool) -> tuple[np.ndarray, np.ndarray]:
        model = run.model(device=device, keep_weights=keep_weights)
        with using_threads(threads):  # the thread policy, sized for one forward pass of this architecture
            on_pool = compute_signals(model, target.pool.x, target.pool.y, spec=spec, batch_size=batch_size,
                                      device=device)
            on_pop = compute_signals(model, population.x, population.y, spec=spec, batch_size=batch_size,
                                     device=device) if m else np.empty((0, a), dtype=np.float32)
        return on_pool, on_pop

    cached = _read_cache(path, key, say, evidence_identity(target, claim=False))
    target_phi = None
    say(f"population: {rule}" if available else "population: none available")
    if cached is not None:
        target_phi = signals_of(target, keep_weights=True)
        same = all(c.shape == t.shape and np.allclose(c, t, rtol=_RECHECK_TOL, atol=_RECHECK_TOL)
                   for c, t in zip((cached.pool[0], cached.population[0]), target_phi))
        if same:
            say(f"signals re-used from {path} (content hash and the target's own signals verified)")
            return dataclasses.replace(cached, population_rule=rule, population_record=record)
        say(f"{path} holds target signals that differ from the target's weights: recomputing")
    phi_pool = np.empty((len(runs), n, a), dtype=np.float32)
    phi_pop = np.empty((len(runs), m, a), dtype=np.float32)
    tick = stage_ticker(say, "signals (target + references)", len(runs))
    for i, run in enumerate(runs):
        phi_pool[i], phi_pop[i] = (target_phi if (i == 0 and target_phi is not None)
                                   else signals_of(run, keep_weights=i == 0))
        tick(i + 1)
    keep = np.zeros((0, n), dtype=bool) if shadows is None else shadows.keep
    arrays = {"key": np.array(key), "pool": phi_pool, "population": phi_pop, "population_index": pop_index,
              "keep": keep, "augmentations": np.array(spec.names)}
    if path.is_symlink():  # never write through a link the auditor did not make
        path.unlink()
    write_signed_npz(path, identity=evidence_identity(target, claim=False),
                     arrays={**arrays, "content_sha256": np.array(content_sha256(arrays))})
    return Signals(pool=phi_pool, population=phi_pop, population_index=pop_index, keep=keep,
                   augmentations=spec.names, key=key, population_rule=rule, population_record=record)
