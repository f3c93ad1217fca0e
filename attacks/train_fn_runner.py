"""``audit.attack(run, train_fn=...)``: LiRA, RMIA and the rest on a run whose model is the user's own class.

A run written by :class:`audit.OpacusAuditor` over an ``audit.AuditPool`` records its pool (``pool.npz``: every
item's input tensor and label, sha256 and fingerprint in the manifest's ``training.audit_pool``) and which items
the target trained on (``membership.npy``, Bernoulli(1/2) from the recorded seed). :func:`attack_with_train_fn`:

1. opens the run (weights and membership verified against the manifest) and reads the recorded pool, refusing
   it unless its sha256 and fingerprint hold and the membership is the recorded draw (:func:`read_recorded_pool`);
2. draws the K balanced keep masks and K seeds exactly as for a run with a recipe
   (:func:`attacks.shadows.balanced_keep_masks`, :func:`attacks.shadows.shadow_seeds`, same streams) and has the
   user's ``train_fn`` train each reference model (:mod:`attacks.train_fn`: sequential, or Ray tasks), scoring it
   and the target on the pool where it was trained;
3. writes the auditor's evidence as for any run: ``shadows/keep.npy``, ``shadows/<k>/model.safetensors`` and a
   signed ``shadows/index.json`` (the function's name, the seeds, each model's sha256, the executor), the signed
   ``signals.npz`` (:mod:`attacks.signal_cache` layout, no population: RMIA and Attack-P compare with the pool),
   then ``attack.json`` and ``scores.npz`` (:func:`attacks.runner.score_attacks`), so ``audit epsilon``,
   ``audit report`` and ``audit gate`` read it like any other run.

A second call with the same settings, function name, pool and target re-uses the signed signals without calling
``train_fn``; a call that was interrupted or failed at a model resumes with the models it had not finished (each
finished model is saved as it comes back: its weights and its signed ``shadows/<k>/reference.npz``);
``retrain_shadows=True`` trains them all again. The function is known by its qualified name: after changing what
it does, pass ``retrain_shadows=True``. Utility (``attack.json``'s ``utility``) is measured by the
auditor on the pool: test accuracy on its non-members, train accuracy on its members.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.attack_file import ATTACK_FORMAT, AttackFile
from attacks.config import AttackConfig
from attacks.shadows import balanced_keep_masks, shadow_seeds
from attacks.signal_cache import Signals, _read_cache, content_sha256
from attacks.stage_log import StageLog, stage_ticker
from attacks.train_fn import EXECUTORS, Shared, Trained, train_reference_models
from foundation.errors import CheckpointError, UserError
from foundation.evidence import read_signed_npz, sign_json, verify_json, write_signed_npz
from foundation.files import INDEX_FILE, KEEP_FILE, POOL_FILE, SHADOW_DIR, SIGNALS_FILE, WEIGHTS_FILE
from foundation.io import fingerprint_arrays, read_json, save_safetensors, sha256_file, write_json, write_npy
from foundation.lock import run_lock
from training.models.build import USER_MODEL_PREFIX
from training.pool import draw_membership
from training.run import VerifiedRun, evidence_identity, inputs_digest, inputs_record, open_run

__all__ = ["TRAIN_FN_INDEX_FORMAT", "attack_with_train_fn", "read_recorded_pool"]

TRAIN_FN_INDEX_FORMAT = "dp-audit-train-fn-shadows/1"


def read_recorded_pool(run: VerifiedRun) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """``(x, y, membership, record)`` of the pool an ``audit.AuditPool`` recorded in ``run``, each checked.

    Raises:
        UserError: the run records no pool (its training set was not an ``audit.AuditPool``).
        CheckpointError: ``pool.npz`` missing, edited or malformed, or a membership that is not the recorded draw.
    """
    rec = (run.manifest.training or {}).get("audit_pool")
    if not isinstance(rec, dict):
        raise UserError(f"{run.run_dir} records no pool: its training set was not an audit.AuditPool, so no example "
                        f"is known to be a non-member and no attack can be scored; wrap the training set with "
                        f"audit.AuditPool(dataset, seed=...) before the DataLoader, train again, and attack that run")
    path = run.run_dir / POOL_FILE
    if path.is_symlink() or not path.is_file() or sha256_file(path) != rec.get("sha256"):
        raise CheckpointError(f"{path} is missing or does not match the sha256 in the manifest (training.audit_pool): "
                              f"the run does not carry the pool it was trained on")
    try:
        with np.load(path, allow_pickle=False) as npz:
            x, y = npz["x"], npz["y"]
    except (KeyError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a pool file ({exc})") from None
    size, seed = rec.get("size"), rec.get("seed")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (size, seed)):
        raise CheckpointError(f"{run.run_dir}: the manifest's training.audit_pool must record the pool's size and "
                              f"seed as integers >= 0: the run directory was edited")
    if x.dtype != np.float32 or y.ndim != 1 or y.dtype.kind not in "iu" or len(x) != len(y) or len(y) != size:
        raise CheckpointError(f"{path} must hold float32 x and integer y of {size} items")
    if fingerprint_arrays(x, y) != rec.get("fingerprint"):
        raise CheckpointError(f"{path} does not match the pool fingerprint in the manifest")
    classes = int(run.manifest.model.num_classes)
    if y.size and (int(y.min()) < 0 or int(y.max()) >= classes):
        raise CheckpointError(f"{path}: labels outside [0, {classes})")
    membership = run.membership
    mask = membership[:size]
    if mask.size != size or not np.array_equal(mask, draw_membership(size, p=0.5, seed=seed)):
        raise CheckpointError(f"{run.run_dir}: membership.npy is not the Bernoulli(1/2) draw of the recorded pool "
                              f"seed: the run directory was edited")
    return x, y.astype(np.int64), mask.copy(), rec


def _fn_name(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}.{name}" if module else name


def attack_with_train_fn(*, run_dir: str | Path, config: AttackConfig, train_fn: Callable[[np.ndarray, int], Any],
                         retrain_shadows: bool = False, progress: bool = False) -> Any:
    """Attack an ``OpacusAuditor`` run with reference models trained by ``train_fn(member_indices, seed)``.

    Args:
        run_dir: the run directory (``OpacusAuditor.finish`` over an ``audit.AuditPool``).
        config: the attack settings (``n_reference`` K >= 2; ``executor`` ``auto``/``sequential`` or ``ray``;
            ``flip``/``shifts`` default to the identity query: the auditor does not know your augmentation).
        train_fn: the user's training function (:mod:`attacks.train_fn` says what it receives and returns).
        retrain_shadows: train the reference models again even when their signed signals match.
        progress: print progress lines on stderr.

    Returns:
        The :class:`~attacks.runner.AttackResult`.

    Raises:
        UserError: a run that is not the user's own model class or records no pool, settings a train_fn cannot
            use, or a function that returns the wrong thing. CheckpointError: run files that do not verify.
    """
    if not callable(train_fn):
        raise UserError(f"train_fn must be a function train_fn(member_indices, seed) -> torch.nn.Module, got "
                        f"{type(train_fn).__name__}")
    if not isinstance(config, AttackConfig):
        raise TypeError(f"config must be an attacks.config.AttackConfig, got {type(config).__name__}")
    path = Path(run_dir)
    if not path.is_dir():
        raise CheckpointError(f"run directory not found: {path}")
    with run_lock(path):
        return _attack(path, config, train_fn, retrain=retrain_shadows, say=StageLog(show=progress))


def _settings_for(run: VerifiedRun, config: AttackConfig, x: np.ndarray) -> AttackConfig:
    arch = str(run.manifest.model.arch)
    if not arch.startswith(USER_MODEL_PREFIX):
        raise UserError(f"train_fn is for runs of your own model class (audit.OpacusAuditor); {run.run_dir} has "
                        f"model.arch {arch!r}, whose recorded recipe trains the reference models: call "
                        f"audit.attack(run) without train_fn")
    settings = config.for_target(None)  # the auditor does not know the user's augmentation: identity unless set
    if settings.augmentations.n_augmentations > 1 and x.ndim != 4:
        raise UserError(f"attack.flip/shifts query images (N, C, H, W); this pool's inputs have shape "
                        f"{tuple(x.shape[1:])}: leave them at their default")
    if settings.executor not in ("auto", *EXECUTORS):
        raise UserError(f"attack.executor {settings.executor!r} cannot run a train_fn: 'batched' and 'processes' "
                        f"train dp-audit's own recipes; your train_fn trains one model per call, so use "
                        f"'sequential' (default) or 'ray'")
    if settings.n_reference < 2:
        raise UserError("audit.attack(run, train_fn=...) trains reference models: attack.n_reference must be an "
                        "even number >= 2")
    return settings


def _attack(path: Path, config: AttackConfig, train_fn: Callable[..., Any], *, retrain: bool,
            say: Callable[[str], None]) -> Any:
    from attacks.runner import AttackResult, score_attacks, write_attack_results

    run = open_run(path, verify=False)
    x, y, mask, rec = read_recorded_pool(run)
    settings = _settings_for(run, config, x)
    n, k = len(y), settings.n_reference
    n_in = int(mask.sum())
    if settings.evaluation != "leave_one_out" and n_in in (0, n):
        raise UserError(f"the pool has {n_in} members of {n}: the attack needs members and non-members")
    keep = balanced_keep_masks(k, n, rng=[int(settings.seed), 0x4B454550])  # the streams of attacks.shadows
    seeds = shadow_seeds(k, settings.seed)
    spec = settings.augmentations
    identity = evidence_identity(run, claim=False)
    expected = {"pool_fingerprint": rec["fingerprint"], "target_weights_sha256": run.weights_sha256,
                "n_reference": k, "seed": int(settings.seed), "train_fn": _fn_name(train_fn),
                "augmentations": list(spec.names)}
    root = path / SHADOW_DIR
    phi, index = (None, None) if retrain else _reuse(run, root, expected, keep, say)
    if phi is None:
        phi, index = _train(run, root, expected, settings, train_fn, x=x, y=y, keep=keep, seeds=seeds, mask=mask,
                            retrain=retrain, say=say)
    truth = mask if settings.evaluation != "leave_one_out" else phi.keep[0]
    entries, scores = score_attacks(settings, phi, labels=y, truth=truth, n_reference=k, say=say)
    report = AttackFile.from_data({
        "format": ATTACK_FORMAT, "run": run.manifest.run_name,
        "inputs": inputs_record(run, config_sha256=settings.sha256()),
        "setup": {"n_reference": k, "augmentations": list(spec.names),
                  "queries_from": settings.queries_from(False).replace("no recipe recorded", "train_fn"),
                  "pool_size": n, "n_members": n_in, "n_population": 0,
                  "population_rule": "none (RMIA and Attack-P compare with the pool itself)", "evaluation":
                  settings.evaluation, "recipe_hash": None, "executor": index["executor"],
                  "ray_address": index.get("ray_address"), "shadow_train_seconds": float(index["train_seconds"]),
                  "reference_training": f"train_fn {index['train_fn']}"},
        "attacks": entries, "utility": index["utility"], "code": run.code.to_dict()})
    write_attack_results(run, report, scores=scores, truth=truth, labels=y)
    return AttackResult(run_dir=path, report=report, scores=scores, membership=truth,
                        shadows_trained=int(index.get("trained_now", 0)))


def _signals_key(run: VerifiedRun, index_sha: str, spec_names: list[str]) -> str:
    return inputs_digest(run, shadows=index_sha, augmentations=spec_names, population=None, population_index=[])


def _reuse(run: VerifiedRun, root: Path, expected: dict[str, Any], keep: np.ndarray,
           say: Callable[[str], None]) -> tuple[Signals | None, dict[str, Any] | None]:
    """The signed signals of an earlier call with the same expected record, or ``(None, None)``."""
    index_path = root / INDEX_FILE
    if root.is_symlink() or not index_path.is_file():
        return None, None
    try:
        index = verify_json(read_json(index_path, what="reference index"), path=index_path, remake="",
                            identity={"pool_fingerprint": expected["pool_fingerprint"]})
    except CheckpointError:
        say(f"{index_path} is not this auditor's signed index: training the reference models again")
        return None, None
    if index.get("format") != TRAIN_FN_INDEX_FORMAT or not index.get("complete") or \
            any(index.get(key) != value for key, value in expected.items()):
        say(f"reference models in {root} were made with other settings, another train_fn or target: training again")
        return None, None
    key = _signals_key(run, sha256_file(index_path), expected["augmentations"])
    cached = _read_cache(run.run_dir / SIGNALS_FILE, key, say, evidence_identity(run, claim=False))
    if cached is None or not np.array_equal(cached.keep, keep):
        return None, None
    say(f"reference models re-used from {root} (signed signals of {expected['train_fn']}; retrain_shadows=True "
        f"trains them again)")
    return cached, {**index, "trained_now": 0}


#: Per reference model, beside its weights: its signals (and, for the model that scored it, the target's), signed.
REFERENCE_FILE = "reference.npz"


def _model_identity(expected: dict[str, Any], k: int, seed: int) -> dict[str, Any]:
    keys = ("pool_fingerprint", "target_weights_sha256", "train_fn", "augmentations")
    return {**{key: expected[key] for key in keys}, "model": int(k), "seed": int(seed)}


def _save_model(root: Path, t: Trained, identity: dict[str, Any]) -> None:
    """Model ``t.k``'s weights, then its signed signals (the mark that it is finished)."""
    weights = save_safetensors(root / str(t.k) / WEIGHTS_FILE, {n: torch.from_numpy(a) for n, a in t.state.items()})
    arrays = {"phi": t.phi, "seconds": np.array(t.seconds), "weights_sha256": np.array(sha256_file(weights))}
    if t.target_phi is not None:
        arrays.update(target_phi=t.target_phi, target_pred=t.target_pred)
    write_signed_npz(root / str(t.k) / REFERENCE_FILE, identity=identity, arrays=arrays)


def _load_model(root: Path, k: int, identity: dict[str, Any]) -> Trained | None:
    """Model k as an earlier, interrupted call finished it (signed for this identity, its weights intact), or None."""
    path, weights = root / str(k) / REFERENCE_FILE, root / str(k) / WEIGHTS_FILE
    if not path.is_file() or not weights.is_file():
        return None
    try:
        z = read_signed_npz(path, remake="", identity=identity)
    except CheckpointError:
        return None
    if "phi" not in z or sha256_file(weights) != str(z.get("weights_sha256")):
        return None
    return Trained(k=k, phi=z["phi"], state={}, seconds=float(z["seconds"]), target_phi=z.get("target_phi"),
                   target_pred=z.get("target_pred"))


def _resume(root: Path, expected: dict[str, Any], keep: np.ndarray, seeds: list[int], sign: dict[str, Any],
            say: Callable[[str], None]) -> tuple[dict[str, Any] | None, dict[int, Trained]]:
    """The signed index of an earlier call with the same expected record and keep masks, and the models it
    finished (an interrupted or failed call resumes with the missing ones); ``(None, {})`` otherwise."""
    index_path = root / INDEX_FILE
    if root.is_symlink() or not index_path.is_file() or not (root / KEEP_FILE).is_file():
        return None, {}
    try:
        index = verify_json(read_json(index_path, what="reference index"), path=index_path, remake="", identity=sign)
    except CheckpointError:
        return None, {}
    if index.get("format") != TRAIN_FN_INDEX_FORMAT or any(index.get(k) != v for k, v in expected.items()) or \
            index.get("keep_sha256") != sha256_file(root / KEEP_FILE) or index.get("seeds") != list(seeds) or \
            not np.array_equal(np.load(root / KEEP_FILE, allow_pickle=False), keep):
        return None, {}
    done = {k: t for k in range(len(keep))
            if (t := _load_model(root, k, _model_identity(expected, k, seeds[k]))) is not None}
    if done:
        say(f"resuming: {len(done)} of {len(keep)} reference models in {root} were finished by an earlier call")
    return index, done


def _train(run: VerifiedRun, root: Path, expected: dict[str, Any], settings: AttackConfig,
           train_fn: Callable[..., Any], *, x: np.ndarray, y: np.ndarray, keep: np.ndarray, seeds: list[int],
           mask: np.ndarray, retrain: bool, say: Callable[[str], None]) -> tuple[Signals, dict[str, Any]]:
    """Train the K reference models with ``train_fn`` (resuming an interrupted call's finished ones unless
    ``retrain``), write their evidence and the signals; return both."""
    k = len(keep)
    sign = {"pool_fingerprint": expected["pool_fingerprint"]}
    index, done = (None, {}) if retrain else _resume(root, expected, keep, seeds, sign, say)
    if index is None:
        if root.is_symlink():
            root.unlink()
        elif root.exists():
            shutil.rmtree(root)
        keep_path = write_npy(root / KEEP_FILE, keep)
        index = {"format": TRAIN_FN_INDEX_FORMAT, **expected, "seeds": list(seeds),
                 "keep_sha256": sha256_file(keep_path), "target_run": run.manifest.run_name,
                 "executor": None, "train_seconds": 0.0, "complete": False,
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_json(root / INDEX_FILE, sign_json(index, identity=sign))
    todo = [j for j in range(k) if j not in done]
    scored = next((t for t in done.values() if t.target_phi is not None), None)
    executor = "sequential" if settings.executor == "auto" else settings.executor
    shared = Shared(train_fn=train_fn, x=x, y=y, spec=settings.augmentations,
                    target_state={n: t.numpy() for n, t in run.state_dict.items()},
                    num_classes=int(run.manifest.model.num_classes), batch_size=settings.signal_batch_size)
    say(f"training {len(todo)} of {k} reference models with {expected['train_fn']} ({executor})")
    tick = stage_ticker(say, "reference models trained (train_fn)", len(todo))

    def finished(t: Trained) -> None:  # saved as soon as it is back: an interrupted call loses no finished model
        _save_model(root, t, _model_identity(expected, t.k, seeds[t.k]))
        done[t.k] = t

    t0 = time.perf_counter()
    where = None
    if todo and executor == "ray":
        from attacks.ray_farm import ray_session

        with ray_session(settings.ray_options()) as session:
            where = session.where
            train_reference_models(shared=shared, keep=keep, seeds=seeds, executor="ray", ray=session, todo=todo,
                                   score_target=scored is None, on_done=tick, on_model=finished)
    elif todo:
        train_reference_models(shared=shared, keep=keep, seeds=seeds, executor=executor, todo=todo,
                               score_target=scored is None, on_done=tick, on_model=finished)
    seconds = time.perf_counter() - t0
    scored = next(t for t in done.values() if t.target_phi is not None)
    models = [{"dir": str(j), "weights_sha256": sha256_file(root / str(j) / WEIGHTS_FILE),
               "seconds": round(done[j].seconds, 3)} for j in range(k)]
    pred = scored.target_pred
    utility = {"test_accuracy": float((pred[~mask] == y[~mask]).mean()) if (~mask).any() else None,
               "train_accuracy": float((pred[mask] == y[mask]).mean()) if mask.any() else None}
    used = executor if index.get("executor") in (None, executor) else f"{index['executor']}+{executor}"
    index = {**index, "models": models, "executor": used, "utility": utility,
             "train_seconds": float(index.get("train_seconds", 0.0)) + seconds,
             "utility_measured_on": "the pool: test = its non-members, train = its members", "complete": True}
    if where is not None:
        index["ray_address"] = where
    write_json(root / INDEX_FILE, sign_json(index, identity=sign))
    a = settings.augmentations.n_augmentations
    pool_phi = np.stack([scored.target_phi] + [done[j].phi for j in range(k)]).astype(np.float32)
    arrays = {"key": np.array(_signals_key(run, sha256_file(root / INDEX_FILE), expected["augmentations"])),
              "pool": pool_phi, "population": np.empty((k + 1, 0, a), dtype=np.float32),
              "population_index": np.zeros(0, dtype=np.int64), "keep": keep,
              "augmentations": np.array(settings.augmentations.names)}
    path = run.run_dir / SIGNALS_FILE
    if path.is_symlink():
        path.unlink()
    write_signed_npz(path, identity=evidence_identity(run, claim=False),
                     arrays={**arrays, "content_sha256": np.array(content_sha256(arrays))})
    return (Signals(pool=pool_phi, population=arrays["population"], population_index=arrays["population_index"],
                    keep=keep, augmentations=settings.augmentations.names, key=str(arrays["key"])),
            {**index, "trained_now": len(todo)})
