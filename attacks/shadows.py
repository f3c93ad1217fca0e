"""Reference (shadow) models: balanced keep masks, a verified on-disk index, training or re-use.

LiRA's design (Carlini et al., "Membership Inference Attacks From First Principles", S&P 2022, Sec. VI-A):
for each pool example, choose a uniformly random half of the K reference models to train on it, so every
example is IN for exactly K/2 models (:func:`balanced_keep_masks`). Model k trains with the target's own
recipe (:mod:`attacks.recipe`, DP included) on ``keep[k]``.

On disk, under ``<run>/shadows/``::

    keep.npy        (K, n) bool keep masks
    index.json      format, recipe hash, pool fingerprint, K, seed, per-model seeds and weight sha256s,
                    executor (and ``ray_address``: the Ray it ran on, without secrets), training
                    seconds, complete flag
    <k>/            a normal run directory per model (model.safetensors, manifest.json, membership.npy, ...)

Reference models are re-used only when the recipe hash, pool fingerprint, K and seed all match and every
model verifies (weights sha256, membership equal to its keep mask, pool fingerprint). Anything else is
refused with a :class:`~foundation.errors.CheckpointError` naming the problem; ``retrain=True``
(``--retrain-shadows``) deletes the directory and trains afresh. An interrupted training (``complete`` false)
continues with the models still missing.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from attacks.stage_log import stage_ticker
from attacks.recipe import shadow_recipe
from attacks.shadow_train import resolve_executor, train_shadow_models
from training.data import is_streamed
from training.device import resolve_device
from foundation.errors import CheckpointError, ConfigError, UserError
from foundation.evidence import sign_json, verify_json
from foundation.io import read_json, sha256_file, write_json, write_npy
from training.run import VerifiedRun, is_complete, open_run
from training.run.verified import canary_package_of
from foundation.files import SHADOW_DIR, INDEX_FILE, KEEP_FILE

__all__ = ["SHADOW_DIR", "INDEX_FILE", "KEEP_FILE", "INDEX_FORMAT", "balanced_keep_masks", "shadow_seeds",
           "ShadowSet", "prepare_shadows"]

INDEX_FORMAT = "dp-audit-shadows/1"
_RETRAIN = "pass --retrain-shadows to delete them and train new ones"


def balanced_keep_masks(n_models: int, n: int, *, rng: np.random.Generator | int | list[int] | None) -> np.ndarray:
    """``(K, n)`` keep masks with every column holding exactly ``K/2`` True entries.

    Column j is a uniformly random ``K/2``-subset of the models (independently per example): the rank of
    each model in an independent uniform draw decides, as in LiRA's reference code.

    Args:
        n_models: K, even and ``>= 2``.
        n: number of pool examples.
        rng: generator or seed.

    Raises:
        ValueError: K odd or < 2, or n < 0.

    >>> keep = balanced_keep_masks(4, 6, rng=0)
    >>> keep.shape, keep.sum(axis=0).tolist()
    ((4, 6), [2, 2, 2, 2, 2, 2])
    """
    if isinstance(n_models, bool) or not isinstance(n_models, (int, np.integer)) or n_models < 2 or n_models % 2:
        raise ValueError(f"n_models must be an even integer >= 2; got {n_models!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be an integer >= 0; got {n!r}")
    ranks = np.random.default_rng(rng).random((n_models, n)).argsort(axis=0).argsort(axis=0)
    return ranks < n_models // 2


def shadow_seeds(n_models: int, seed: int) -> list[int]:
    """K distinct-stream non-negative seeds for the reference models, derived from ``seed``.

    >>> shadow_seeds(3, 0) == shadow_seeds(3, 0) != shadow_seeds(3, 1)
    True
    """
    state = np.random.SeedSequence([int(seed), 0x53484457]).generate_state(n_models, dtype=np.uint32)
    return [int(s) >> 1 for s in state]


@dataclasses.dataclass(frozen=True, eq=False)
class ShadowSet:
    """Verified reference models of one target.

    Attributes:
        root: ``<run>/shadows``.
        runs: one verified run per model (weights and membership checked), in keep-mask order.
        keep: ``(K, n)`` keep masks.
        index: the parsed ``index.json``.
        index_sha256: sha256 of ``index.json`` (part of the signal cache key).
        trained: models trained by this call (0 when all were re-used).
    """

    root: Path
    runs: list[VerifiedRun]
    keep: np.ndarray
    index: dict[str, Any]
    index_sha256: str
    trained: int

    @property
    def n_models(self) -> int:
        return len(self.runs)

    @property
    def executor(self) -> str:
        return str(self.index.get("executor"))

    @property
    def train_seconds(self) -> float:
        return float(self.index.get("train_seconds", 0.0))


def _refuse(root: Path, problem: str, alternative: str = "") -> CheckpointError:
    return CheckpointError(f"reference models in {root}: {problem}; {_RETRAIN}{alternative}")


def _read_index(root: Path, expected: dict[str, Any]) -> dict[str, Any]:
    try:
        index = read_json(root / INDEX_FILE, what="shadow index")
    except CheckpointError:
        raise _refuse(root, f"{INDEX_FILE} is corrupt (not valid JSON)") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise _refuse(root, f"{INDEX_FILE} is not a {INDEX_FORMAT} index")
    try:
        index = verify_json(index, path=root / INDEX_FILE, remake="",
                            identity={"pool_fingerprint": expected["pool_fingerprint"]})
    except CheckpointError:
        raise _refuse(root, f"{INDEX_FILE} is not signed by this auditor's evidence key (received with the run, "
                            f"edited, or made by another auditor), so they are not reused") from None
    missing = [k for k in (*expected, "seeds", "models", "complete", "keep_sha256") if k not in index]
    if missing:
        raise _refuse(root, f"{INDEX_FILE} lacks {', '.join(missing)}")
    if index["recipe_hash"] != expected["recipe_hash"]:
        raise _refuse(root, f"they were trained with another recipe (hash {str(index['recipe_hash'])[:12]}... != "
                            f"{expected['recipe_hash'][:12]}...: the target's config changed)")
    if index["pool_fingerprint"] != expected["pool_fingerprint"]:
        raise _refuse(root, "they were trained on another pool (fingerprint differs)")
    if index["n_reference"] != expected["n_reference"]:
        raise _refuse(root, f"there are {index['n_reference']} of them but attack.n_reference is "
                            f"{expected['n_reference']}", f" (or --set attack.n_reference={index['n_reference']} "
                                                          f"to re-use them)")
    if index["seed"] != expected["seed"]:
        raise _refuse(root, f"they were drawn with attack.seed={index['seed']}, not {expected['seed']}")
    k = expected["n_reference"]
    if not isinstance(index["models"], list) or len(index["models"]) != k or len(index["seeds"]) != k:
        raise _refuse(root, f"{INDEX_FILE} must list {k} models and seeds")
    return index


def _read_keep(root: Path, index: dict[str, Any], shape: tuple[int, int]) -> np.ndarray:
    path = root / KEEP_FILE
    if not path.is_file() or sha256_file(path) != index["keep_sha256"]:
        raise _refuse(root, f"{KEEP_FILE} is missing or does not match {INDEX_FILE}")
    keep = np.load(path, allow_pickle=False)
    if keep.dtype != np.bool_ or keep.shape != shape or not (keep.sum(axis=0) == shape[0] // 2).all():
        raise _refuse(root, f"{KEEP_FILE} must be balanced bool keep masks of shape {shape}")
    return keep


def _verify_model(root: Path, k: int, keep_k: np.ndarray, index: dict[str, Any], pool_fingerprint: str, *,
                  trust_code: bool) -> VerifiedRun:
    """Model k opened, its weights and membership verified (its pool is the target's, checked by fingerprint)."""
    try:
        run = open_run(root / str(k), trust_code=trust_code, verify=False)
        run.state_dict
        membership = run.membership
    except CheckpointError as exc:
        raise _refuse(root, f"model {k} is corrupt ({exc})") from None
    manifest = run.manifest
    recorded = index["models"][k].get("weights_sha256") if isinstance(index["models"][k], dict) else None
    if recorded is not None and recorded != manifest.model.weights_sha256:
        raise _refuse(root, f"model {k}'s weights sha256 differs from {INDEX_FILE}")
    if membership.shape != keep_k.shape or not (membership == keep_k).all():
        raise _refuse(root, f"model {k}'s membership differs from its keep mask")
    if manifest.data.pool_fingerprint != pool_fingerprint:
        raise _refuse(root, f"model {k} was trained on another pool")
    return run


def _new_index(expected: dict[str, Any], seeds: list[int], keep_sha: str, recipe: dict[str, Any],
               target_name: str) -> dict[str, Any]:
    return {"format": INDEX_FORMAT, **expected, "seeds": seeds, "keep_sha256": keep_sha, "target_run": target_name,
            "recipe": recipe, "models": [{"dir": str(k)} for k in range(len(seeds))], "executor": None,
            "train_seconds": 0.0, "complete": False,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def prepare_shadows(*, target: VerifiedRun, n_models: int, seed: int = 0, executor: str = "auto",
                    ray: Any = None, device: str = "auto", max_models_per_batch: int | None = None,
                    retrain: bool = False, log: Any = None, workers: int | None = None) -> ShadowSet:
    """Re-use or train the K reference models of ``target`` under ``<run>/shadows``.

    Args:
        target: the verified target (it must carry its recipe, ``config.yaml``).
        n_models: K, even and ``>= 2``.
        seed: draws the keep masks and each model's seed.
        executor: ``auto``, ``batched``, ``sequential`` or ``ray`` (see :mod:`attacks.shadow_train`).
        ray: :class:`attacks.ray_farm.RayOptions` for ``ray`` (None: a local Ray on all cores).
        device: ``auto``, ``cpu`` or ``cuda``.
        max_models_per_batch: most models per batched step (None: as many as fit in memory).
        retrain: delete any existing reference models first.
        log: optional ``callable(str)`` for progress messages.

    Returns:
        The verified :class:`ShadowSet`.

    Raises:
        UserError: the target has no recipe. ConfigError: an executor that cannot be used.
        ValueError: K odd or < 2 (:class:`~attacks.config.AttackConfig` checks K where the config is built).
        CheckpointError: existing reference models that do not match or are corrupt (unless ``retrain``).
    """
    if not target.has_recipe:
        raise UserError(f"{target.run_dir} has no config.yaml (an imported checkpoint): reference models need the "
                        f"target's training recipe; run only attacks without reference models "
                        f"(--set attack.attacks=[loss,attack_p])")
    root = target.run_dir / SHADOW_DIR
    # the executor is opened (a Ray cluster reached) before anything under shadows/ is deleted or written
    needed = retrain or not (root / INDEX_FILE).is_file() or not all(is_complete(root / str(k))
                                                                     for k in range(n_models))
    with _executor_open(executor, ray, needed=needed, log=log) as where:
        return _prepare(target=target, root=root, n_models=n_models, seed=seed, executor=executor, ray=ray,
                        where=where, device=device, max_models_per_batch=max_models_per_batch, retrain=retrain,
                        log=log, workers=workers)


@contextmanager
def _executor_open(executor: str, ray: Any, *, needed: bool, log: Any) -> Iterator[str | None]:
    """For ``executor="ray"`` with models to train (or delete): a Ray session for the whole preparation, its
    address as results record it; else nothing. A local Ray opened to the network says where nodes join it."""
    if executor != "ray" or not needed:
        yield None
        return
    from attacks.ray_farm import RayOptions, ray_session

    with ray_session(ray or RayOptions()) as session:
        joinable = session.joinable_at
        if joinable is not None:
            (log or (lambda msg: print(msg, file=sys.stderr)))(
                f"local Ray open to other nodes at {joinable}: on each, ray start --address {joinable} (with this "
                f"machine's ~/.ray/auth_token); the run directory must be on a file system they all mount")
        yield session.where


def _prepare(*, target: VerifiedRun, root: Path, n_models: int, seed: int, executor: str, ray: Any,
             where: str | None, device: str, max_models_per_batch: int | None, retrain: bool,
             log: Any, workers: int | None = None) -> ShadowSet:
    """:func:`prepare_shadows` once the executor is open."""
    say = log or (lambda _msg: None)
    recipe = shadow_recipe(config=target.config, manifest=target.manifest)
    n = len(target.pool)
    expected = {"recipe_hash": recipe.hash, "pool_fingerprint": target.pool_fingerprint, "n_reference": n_models,
                "seed": int(seed)}
    if root.is_symlink():  # shipped with the run: never followed, never written through
        if not retrain:
            raise _refuse(root, "it is a symbolic link (received with the run, not made by this auditor)")
        say(f"removing the link {root} (--retrain-shadows; its target is left alone)")
        root.unlink()
    if retrain and root.exists():
        say(f"deleting {root} (--retrain-shadows)")
        shutil.rmtree(root)
    if (root / INDEX_FILE).exists():
        index = _read_index(root, expected)
        keep = _read_keep(root, index, (n_models, n))
    elif root.exists() and any(root.iterdir()):
        raise _refuse(root, f"the directory exists but has no {INDEX_FILE}")
    else:
        keep = balanced_keep_masks(n_models, n, rng=[int(seed), 0x4B454550])
        keep_path = write_npy(root / KEEP_FILE, keep)
        index = _new_index(expected, shadow_seeds(n_models, seed), sha256_file(keep_path), recipe.to_dict(),
                           target.manifest.run_name)
        write_json(root / INDEX_FILE, sign_json(index, identity={"pool_fingerprint": target.pool_fingerprint}))
    todo = [k for k in range(n_models) if not is_complete(root / str(k))]
    runs = {k: _verify_model(root, k, keep[k], index, target.pool_fingerprint, trust_code=target.trust_code)
            for k in sorted(set(range(n_models)) - set(todo))}
    if todo and index["complete"]:
        raise _refuse(root, f"model {todo[0]} is missing")
    if todo:
        index = {**index, "models": [{"dir": str(k)} if k in todo else m for k, m in enumerate(index["models"])]}
        shape = tuple(target.pool.input_shape)
        chosen = resolve_executor(executor, recipe=recipe, num_classes=len(target.pool.classes), input_shape=shape,
                                  streamed=is_streamed(target.pool))
        say(f"training {len(todo)} of {n_models} reference models ({chosen}, {recipe.steps} steps each)")
        t0 = time.perf_counter()
        train_shadow_models(recipe=recipe, pool=target.pool, test=target.population, keep=keep,
                            seeds=index["seeds"], todo=todo, root=root, target_name=target.manifest.run_name,
                            executor=chosen, ray=ray, device=resolve_device(device),
                            max_models_per_batch=max_models_per_batch, trust_code=target.code.trust_code,
                            canary_package=canary_package_of(target),
                            on_done=stage_ticker(say, "reference models trained", len(todo)),
                            show_progress=log is not None, workers=workers)
        for k in todo:
            runs[k] = _verify_model(root, k, keep[k], index, target.pool_fingerprint, trust_code=target.trust_code)
        models = [{"dir": str(k), "weights_sha256": runs[k].manifest.model.weights_sha256} for k in range(n_models)]
        used = chosen if index.get("executor") in (None, chosen) else f"{index['executor']}+{chosen}"
        index = {**index, "models": models, "executor": used, "complete": True,
                 "train_seconds": float(index.get("train_seconds", 0.0)) + time.perf_counter() - t0}
        if chosen == "ray" and where is not None:
            index["ray_address"] = where  # the Ray it ran on: local (127.0.0.1), or the cluster without secrets
        write_json(root / INDEX_FILE, sign_json(index, identity={"pool_fingerprint": target.pool_fingerprint}))
    return ShadowSet(root=root, runs=[runs[k] for k in range(n_models)], keep=keep, index=index,
                     index_sha256=sha256_file(root / INDEX_FILE), trained=len(todo))
