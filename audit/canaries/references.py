"""The auditor's reference models for its own canaries: trained on pool data plus random halves of all canaries.

LiRA (Carlini et al., S&P 2022) compares the target's scaled logit φ on each canary with reference models that
did (IN) and did not (OUT) train on it. Here the auditor trains them itself, with the batched DP-SGD engine
(:func:`training.dp.batched.train_many`) and the target's *claimed* recipe (:func:`attacks.recipe.shadow_recipe`:
σ, C, q, steps, optimizer, schedule), on the target's real pool (random halves when its members were drawn
Bernoulli, all of it otherwise) plus a random half of **every** canary (each canary IN for exactly K/2 models,
:func:`attacks.shadows.balanced_keep_masks`). Each model keeps the target's expected sample rate.

Two reference sets can be trained (Issue 11, "the auditor trusts nothing derived that it can recompute"):

* ``claimed`` — σ as the manifest claims;
* ``sigma0`` — the same recipe without noise (σ = 0, same clipping, steps and batch), for a claimed-DP run whose
  claim is in doubt: if the vendor did not add the noise it claims, these models resemble the target and LiRA's
  IN/OUT Gaussians separate; under the claim they would not.

Reference models depend only on the pool, the canary images and labels, and seeds; never on the inclusion bits
(so one set may serve several secrets that share the canary images). A set is stored under
``<root>/<name>-<key[:16]>/`` (``weights.safetensors`` with every model's tensors as ``<k>/<name>``, ``keep.npy``
(K, m) over the canaries, ``phi.npy`` (K, m, 1), ``index.json`` with the key's fields and the files' sha256s) and
re-used only when its key and sha256s match.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attacks.recipe import batched_unsupported, model_factory, shadow_recipe
from attacks.shadows import balanced_keep_masks, shadow_seeds
from attacks.signals import compute_signals
from audit.canaries.secret import CanarySecret
from training.data import to_float_tensor
from training.dp.batched import train_many
from training.dp.recipe import TrainRecipe
from foundation.errors import UserError
from foundation.evidence import sign_json, verify_json
from foundation.files import INDEX_FILE, KEEP_FILE, PHI_FILE, REFERENCE_WEIGHTS_FILE
from foundation.io import (fingerprint_arrays, read_json, save_safetensors, sha256_bytes, sha256_file, write_json,
                         write_npy)
from training.run import VerifiedRun

__all__ = ["ReferenceSet", "reference_recipes", "prepare_reference_set", "INDEX_FORMAT"]

INDEX_FORMAT = "dp-audit-canary-references/1"


@dataclasses.dataclass(frozen=True, eq=False)
class ReferenceSet:
    """One set of K reference models, seen through their signals on the canaries.

    Attributes:
        name: ``claimed`` or ``sigma0``.
        noise_multiplier: σ the models were trained with (0 without noise).
        keep: bool (K, m): canary i was in model k's training set.
        phi: float (K, m, 1): model k's scaled logit on canary i.
        root: the set's directory; key: sha256 of what identifies it; trained: models trained by this call.
    """

    name: str
    noise_multiplier: float
    keep: np.ndarray
    phi: np.ndarray
    root: Path
    key: str
    trained: int

    @property
    def n_models(self) -> int:
        return int(self.keep.shape[0])

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "noise_multiplier": self.noise_multiplier, "n_models": self.n_models,
                "dir": str(self.root), "key": self.key, "trained_now": self.trained}


def reference_recipes(run: VerifiedRun, *, sigma0: bool = True) -> tuple[list[tuple[str, TrainRecipe]], Any]:
    """``[(name, recipe), ...]`` for the run's claimed recipe and, for a claimed-DP run with σ > 0 (and
    ``sigma0``), the same recipe without noise; plus the :class:`~attacks.recipe.ShadowRecipe`.

    Raises:
        UserError: the run has no training recipe, or the batched engine cannot follow it (the message says why).
    """
    if run.config is None:
        raise UserError(f"{run.run_dir} has no config.yaml: the auditor's reference models need the run's "
                        "training recipe")
    recipe = shadow_recipe(config=run.config, manifest=run.manifest)
    why = batched_unsupported(recipe, num_classes=len(run.pool.classes), input_shape=tuple(run.pool.input_shape))
    if why is not None:
        raise UserError(f"the auditor's reference models are trained with the batched engine, which cannot follow "
                        f"this run's recipe: {why}")
    base = recipe.train
    out = [("claimed", base)]
    if sigma0 and base.dp and base.noise_multiplier > 0.0:
        out.append(("sigma0", dataclasses.replace(base, noise_multiplier=0.0)))
    return out, recipe


def _keep_masks(n_models: int, n_real: int, m: int, *, bernoulli: bool, seed: int) -> np.ndarray:
    keep = balanced_keep_masks(n_models, n_real + m, rng=[int(seed), 0x43524546])  # "CREF"
    if not bernoulli:
        keep[:, :n_real] = True  # the target trained on its whole real pool: so do the references
    return keep


def _key(fields: dict[str, Any]) -> str:
    return sha256_bytes(json.dumps(fields, sort_keys=True, default=str).encode("utf-8"))


def _load(root: Path, key: str, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray] | None:
    index_path = root / INDEX_FILE
    if not index_path.is_file():
        return None
    try:
        index = verify_json(read_json(index_path, what="reference index"), path=index_path, remake="",
                            identity={"key": key})
    except (UserError, AttributeError):  # unreadable, or not signed by this auditor (received with the run)
        return None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or index.get("key") != key:
        return None
    files = {"keep": root / KEEP_FILE, "phi": root / PHI_FILE, "weights": root / REFERENCE_WEIGHTS_FILE}
    if any(not p.is_file() or sha256_file(p) != index.get(f"{n}_sha256") for n, p in files.items()):
        return None
    keep = np.load(files["keep"], allow_pickle=False)
    phi = np.load(files["phi"], allow_pickle=False)
    if keep.dtype != np.bool_ or keep.shape != shape or phi.shape != (*shape, 1) or not np.isfinite(phi).all():
        return None
    return keep, phi.astype(np.float64)


def prepare_reference_set(*, run: VerifiedRun, secret: CanarySecret, name: str, recipe: TrainRecipe,
                          n_models: int, seed: int, root: str | Path, target_batch: int,
                          log: Callable[[str], None] | None = None) -> ReferenceSet:
    """Re-use or train one reference set (see the module docstring) and return its signals on the canaries.

    Args:
        run: the verified target (its pool's real part and its config are used).
        secret: the auditor's canaries (only their images and labels are used, never the bits).
        name: the set's name; recipe: how each model trains (its batch size is replaced, see below).
        n_models: K (even, >= 2); seed: keep masks and model seeds.
        root: directory holding the sets (one sub-directory per set).
        target_batch: the target's expected batch size B; each model's batch is B scaled by the ratio of its
            expected training-set size to the target's (equal when members were drawn with p = 1/2).
        log: progress messages.
    """
    say = log or (lambda _m: None)
    pool = run.pool
    n_real = len(pool) - int((run.manifest.data.canaries or {}).get("count", 0))
    x_real, y_real = np.asarray(pool.x[:n_real]), np.asarray(pool.y[:n_real])
    bernoulli = run.manifest.data.membership.scheme == "bernoulli"
    keep_all = _keep_masks(n_models, n_real, secret.count, bernoulli=bernoulli, seed=seed)
    # the target's expected training set: p of the real pool (or all of it) plus half of the m canaries; a
    # reference model's: half of the real pool (or all of it) plus half of the canaries. The batch keeps the
    # target's expected sample rate (B / E|members|) and does not depend on the realised member counts, so runs
    # of one recipe share their reference models.
    p = run.manifest.data.membership.p if bernoulli and run.manifest.data.membership.p else 1.0
    expected_target = p * n_real + secret.count / 2
    expected_ref = (n_real / 2 if bernoulli else n_real) + secret.count / 2
    batch = max(1, int(round(target_batch * expected_ref / expected_target)))
    recipe = dataclasses.replace(recipe, batch_size=batch, secure_mode=False)
    cfg = run.config
    fields = {"format": INDEX_FORMAT, "name": name, "real_pool": fingerprint_arrays(x_real, y_real),
              "canaries": fingerprint_arrays(np.ascontiguousarray(secret.x), np.ascontiguousarray(secret.y)),
              "recipe": {k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v)
                         for k, v in dataclasses.asdict(recipe).items() if k != "optim"},
              "optim": recipe.optim.model_dump(mode="json"), "model": cfg.model.model_dump(mode="json"),
              "n_models": int(n_models), "seed": int(seed), "bernoulli_real": bernoulli}
    key = _key(fields)
    where = Path(root) / f"{name}-{key[:16]}"
    shape = (int(n_models), secret.count)
    loaded = None if where.is_symlink() else _load(where, key, shape)
    if loaded is not None:
        say(f"re-using {n_models} '{name}' reference models in {where}")
        return ReferenceSet(name=name, noise_multiplier=float(recipe.noise_multiplier if recipe.dp else 0.0),
                            keep=loaded[0], phi=loaded[1], root=where, key=key, trained=0)
    factory = model_factory(cfg.model, num_classes=len(pool.classes), input_shape=tuple(pool.input_shape))
    x = np.concatenate([x_real, secret.x])
    y = np.concatenate([y_real, secret.y]).astype(np.int64)
    say(f"training {n_models} '{name}' reference models (σ = {recipe.noise_multiplier if recipe.dp else 0:g}, "
        f"{recipe.steps} steps, batch {batch}) on {n_real} pool examples + {secret.count} canaries")
    t0 = time.perf_counter()
    states = train_many(
        model_factory=factory, x=to_float_tensor(x), y=torch.as_tensor(y), masks=keep_all,
        seeds=shadow_seeds(n_models, seed), recipe=recipe, executor="auto")
    seconds = time.perf_counter() - t0
    phi = np.empty((*shape, 1), dtype=np.float64)
    tensors: dict[str, torch.Tensor] = {}
    for k, state in enumerate(states):
        model = factory()
        model.load_state_dict(state)
        phi[k] = compute_signals(model, secret.x, secret.y).astype(np.float64)
        tensors.update({f"{k}/{n}": t for n, t in state.items()})
    if not np.isfinite(phi).all():
        raise UserError(f"the '{name}' reference models produced non-finite outputs on the canaries (diverged "
                        "training); lower the learning rate of the recipe")
    keep = keep_all[:, n_real:]
    if where.is_symlink():  # never write through a link the auditor did not make
        where.unlink()
    paths = {"keep": write_npy(where / KEEP_FILE, keep), "phi": write_npy(where / PHI_FILE, phi),
             "weights": save_safetensors(where / REFERENCE_WEIGHTS_FILE, tensors)}
    write_json(where / INDEX_FILE, sign_json({**fields, "key": key, "train_seconds": seconds,
                                              **{f"{n}_sha256": sha256_file(p) for n, p in paths.items()}},
                                             identity={"key": key}))
    return ReferenceSet(name=name, noise_multiplier=float(recipe.noise_multiplier if recipe.dp else 0.0), keep=keep,
                        phi=phi, root=where, key=key, trained=int(n_models))
