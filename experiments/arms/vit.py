"""The representation law under DP fine-tuning: a 12-block ViT at ε ∈ {1, 3, 8, ∞}, tuned vs untuned, with the
per-block separation fuzziness and prediction residual and their geometric fits.

He & Su (PNAS 2023) find that in a well-trained network the separation fuzziness D of the features falls
geometrically across layers, ``D_l ≈ ρ^l D_0``; the seed study asks whether DP fine-tuning of a Vision
Transformer keeps that law, and how ε and hyper-parameter tuning move it. Per seed (``scale.seeds``):

1. a ``scale.vit_arch`` ViT (timm, ``scale.vit_kwargs``; patch 4 on 32×32 images through the project's model
   builder, Opacus-ready) is pre-trained non-DP for ``source_steps`` on the *pre-training part* of the public
   images (no hub weights can be fetched; the public images are a disjoint split of the same training file), with
   random crops and flips (:data:`~experiments.arms.common.CROP_FLIP`) when ``scale.vit_pretrain_augment`` and the
   learning rate over ``scale.vit_pretrain_schedule``; with ``scale.vit_shared_pretrain`` once (seed 0) for every
   seed, as a study of one public checkpoint has it, and the seeds vary what follows;
2. for every ε of ``vit_epsilons`` it is fine-tuned on the private images for ``steps`` steps, DP with σ by
   ``sigma_for`` (the scale's accountant; ``inf``: non-DP, σ none), once *untuned* (the default learning rate)
   and once *tuned*: a seeded random search (:func:`lr_search`) of ``vit_trials`` learning rates, log-uniform in
   ``lr × vit_lr_range``, each trial fine-tuning the pre-trained model for ``vit_trial_steps`` steps at the same
   σ and batch size on the public *tuning-train* part and scored (accuracy, then loss) on the public
   *tuning-validation* part. Both parts are the ``vit_tune_fraction`` of the public images held out of
   pre-training, so the search never sees a private image and costs no privacy; the best rate then fine-tunes
   on the private images. The candidate rates depend on the seed only (the same for every ε);
3. every final model: test accuracy, and the class token after each block (``net.blocks.i``: timm ViTs pool with
   the class token, ``global_pool="token"``) of ``vit_probe_images`` fixed test images, from which
   :mod:`audit.transfer.separability` gives per block D (:func:`separation_fuzziness`) and the normalised
   least-squares residual of one-hot labels on the features (:func:`least_squares_residual`), and
   :func:`fit_geometric_decay` fits ``log v_l = a + l·log ρ`` over the blocks for both (the residual with the same
   geometric form: it lies in (0, 1] and He & Su's law is stated for it as well; a zero residual, labels exactly
   affine in the features, cannot be fitted and gives ρ = R² = NaN). The fits have ``blocks − 2`` degrees of
   freedom (10 for 12 blocks).

Keys per seed (``eps1``, ``eps3``, ``eps8``, ``epsinf``; :func:`eps_tag`) × (``tuned``, ``untuned``):
``{key}_acc``, ``_D``, ``_residual`` (one value per block), ``_rho_D``, ``_r2_D``, ``_rho_res``, ``_r2_res``,
``_lr``, ``_sigma`` (None for ε = ∞), ``_seconds``; ``{eps}_tuned_trials`` (every trial's rate and scores);
``pretrain_acc``, ``pretrain_D``, ``pretrain_residual``.

When the arm runs as separate (seed, ε) jobs (:mod:`experiments.gpu.queue`), ``pretrained_cache`` names a folder
where the first job of a seed keeps its pre-trained weights (safetensors, keyed by everything that determines
them) and the seed's other jobs load them instead of pre-training again: one pre-training per seed, as in the
whole run, and every ε of a seed starts from the same weights even where GPU kernels are not bit-reproducible.

>>> [eps_tag(e) for e in (1.0, 3.0, 0.5, float("inf"))]
['eps1', 'eps3', 'eps0p5', 'epsinf']
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.arms.common import (CROP_FLIP, ArmData, ArmScale, build, load_arm_data, per_seed, phase, sigma_for,
                                    test_acc, train)
from experiments.arms.model_cache import cached_fit, cached_origin, fit_key
from training.data import ImageSet

__all__ = ["eps_tag", "PublicParts", "public_parts", "probe_set", "block_features", "block_profile", "lr_search",
           "vit_data", "vit_lr", "pretrained_vit", "pretrain_key", "vit_arm", "TUNING_PRIVACY_COST", "POOLING"]

TUNING_PRIVACY_COST = ("none: the search trains and scores on public images only (the public tuning-train and "
                       "tuning-validation parts, disjoint from the private images)")
#: :func:`pretrained_vit`'s file prefix in a cache folder
PRETRAIN_PREFIX = "vit-pretrained"
POOLING = "class token (token 0) of each block's output"
_SPLIT_KEY = 0x56495450   # "VITP": the public split's fixed permutation
_PROBE_KEY = 0x50524F42   # "PROB": the probe images' fixed draw
_SEARCH_KEY = 0x4C525345  # "LRSE": the candidate learning rates


def eps_tag(eps: float) -> str:
    """A JSON-key-safe name of ε: ``eps8``, ``eps0p5``, ``epsinf``."""
    if math.isinf(eps):
        return "epsinf"
    text = f"{eps:g}".replace(".", "p").replace("-", "m")
    return f"eps{text}"


@dataclass(frozen=True)
class PublicParts:
    """The public images split three ways: pre-training, and the search's tuning-train / tuning-validation."""

    pretrain: ImageSet
    tune_train: ImageSet
    tune_val: ImageSet


def public_parts(public: ImageSet, fraction: float) -> PublicParts:
    """Split ``public`` by a fixed permutation: ``fraction`` of it held out of pre-training, halved into
    tuning-train and tuning-validation.

    Raises:
        ValueError: ``fraction`` not in (0, 1) or a part would have fewer than 2 images.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"vit_tune_fraction must lie in (0, 1), got {fraction}")
    n = len(public)
    held = int(round(fraction * n))
    n_val = held // 2
    if min(n - held, held - n_val, n_val) < 2:
        raise ValueError(f"{n} public images cannot be split into pre-training / tuning-train / tuning-validation "
                         f"parts of at least 2 images each at vit_tune_fraction={fraction}")
    order = np.random.default_rng([0, _SPLIT_KEY]).permutation(n)
    return PublicParts(pretrain=public.subset(order[:n - held]), tune_train=public.subset(order[n - held:n - n_val]),
                       tune_val=public.subset(order[n - n_val:]))


def probe_set(test: ImageSet, size: int) -> ImageSet:
    """The fixed draw of ``size`` test images (all of them if fewer) whose features every model is measured on."""
    k = min(int(size), len(test))
    idx = np.sort(np.random.default_rng([0, _PROBE_KEY]).choice(len(test), size=k, replace=False))
    return test.subset(idx)


def block_features(model: torch.nn.Module, images: ImageSet, *, device="cpu") -> list[np.ndarray]:
    """The class token after each transformer block (``net.blocks.i``, in order), one (N, D) array per block,
    read by forward hooks (:func:`audit.transfer.features.extract_features`).

    Raises:
        ValueError: the model has no ``blocks.i`` feature blocks (not a ViT).
    """
    from audit.transfer.features import block_names, extract_features, token_pooling

    names = [n for n in block_names(model) if n.rpartition(".")[0].endswith("blocks")]
    if not names:
        raise ValueError(f"{type(model).__name__} has no ViT blocks to measure; got {block_names(model)}")
    cls, _ = token_pooling(model)
    if not cls:
        raise ValueError("the ViT does not pool with its class token (timm global_pool != 'token')")
    feats = extract_features(model, images.x, layers=names, device=device)
    return [feats[n] for n in names]


def _fit(values: list[float]) -> tuple[float, float]:
    from audit.transfer.separability import fit_geometric_decay

    try:
        fit = fit_geometric_decay(values)
    except ValueError:  # a zero or infinite value: no geometric fit
        return math.nan, math.nan
    return fit.rho, fit.r_squared


def block_profile(model: torch.nn.Module, probe: ImageSet, *, device="cpu") -> dict[str, Any]:
    """Per-block D and least-squares residual of ``model`` on ``probe`` and their geometric fits."""
    from audit.transfer.separability import separation_profile

    feats = block_features(model, probe, device=device)
    rows, _, _ = separation_profile({f"block{i + 1}": f for i, f in enumerate(feats)}, probe.y)
    d = [float(r.fuzziness) for r in rows]
    res = [float(r.residual) for r in rows]
    rho_d, r2_d = _fit(d)
    rho_r, r2_r = _fit(res)
    return {"D": d, "residual": res, "rho_D": rho_d, "r2_D": r2_d, "rho_res": rho_r, "r2_res": r2_r}


def vit_lr(scale: ArmScale) -> float:
    """The ViT's default learning rate: ``vit_lr``, else ``lr``."""
    return float(scale.vit_lr or scale.lr)


def lr_search(pretrained: torch.nn.Module, data: ArmData, *, scale: ArmScale, sigma: float | None, seed: int,
              device="cpu") -> dict[str, Any]:
    """The tuned arm's learning rate: ``vit_trials`` log-uniform rates in ``lr × vit_lr_range`` (numpy rng of
    ``seed``), each fine-tuning a copy of ``pretrained`` for ``vit_trial_steps`` steps at noise multiplier
    ``sigma`` (None: non-DP) on the public tuning-train part, scored by accuracy (ties: lower loss) on the public
    tuning-validation part. Reads ``data.public`` only.

    Returns:
        ``{"lr": best rate, "trials": [{"lr", "val_acc", "val_loss"}, ...]}``.
    """
    from training.evaluate import mean_loss

    parts = public_parts(data.public, scale.vit_tune_fraction)
    lo, hi = (vit_lr(scale) * float(f) for f in scale.vit_lr_range)
    if not 0 < lo <= hi:
        raise ValueError(f"vit_lr_range must give 0 < low <= high learning rates, got {lo}, {hi}")
    rng = np.random.default_rng([int(seed), _SEARCH_KEY])
    lrs = np.exp(rng.uniform(math.log(lo), math.log(hi), size=int(scale.vit_trials)))
    trials = []
    for k, lr in enumerate(lrs):
        model = copy.deepcopy(pretrained)
        run_seed = int(seed) * 1000 + 100 + k
        model = train(model, [phase("tune", parts.tune_train, scale=scale, steps=scale.vit_trial_steps, sigma=sigma,
                                    seed=run_seed, index=0, lr=float(lr))], seed=run_seed, device=device)
        trials.append({"lr": float(lr), "val_acc": test_acc(model, parts.tune_val, device),
                       "val_loss": float(mean_loss(model, parts.tune_val, device=device))})
    if not trials:
        return {"lr": vit_lr(scale), "trials": []}

    def rank(t: dict[str, float]) -> tuple[float, float]:
        loss = t["val_loss"] if math.isfinite(t["val_loss"]) else math.inf
        return (t["val_acc"], -loss)

    return {"lr": max(trials, key=rank)["lr"], "trials": trials}


def vit_data(scale: ArmScale, *, device="cpu") -> ArmData:
    """The arm's images: :func:`~experiments.arms.common.load_arm_data` with ``vit_public`` public images (when
    set) for the pre-training and the search."""
    return load_arm_data(scale.with_(public=scale.vit_public) if scale.vit_public else scale, device=device)


def pretrained_vit(scale: ArmScale, data: ArmData, *, seed: int, device="cpu", cache: str | Path | None = None
                   ) -> torch.nn.Module:
    """The arm's public pre-training of ``seed`` (with ``vit_shared_pretrain`` the arm asks for seed 0 only):
    ``source_steps`` non-DP steps on the public pre-training part, kept in and loaded from ``cache``
    (:func:`experiments.arms.model_cache.cached_fit`)."""
    base = vit_lr(scale)
    pretrain = public_parts(data.public, scale.vit_tune_fraction).pretrain
    pre = phase("public", pretrain, scale=scale, steps=scale.source_steps, sigma=None, seed=seed, index=0, lr=base,
                augment=CROP_FLIP if scale.vit_pretrain_augment else None, schedule=scale.vit_pretrain_schedule,
                warmup_steps=scale.vit_pretrain_warmup)
    return cached_fit(cache, pretrain_key(scale, data, seed=seed, device=device),
                      lambda: build(scale, data, seed=seed, device=device, arch=scale.vit_arch,
                                    kwargs=scale.vit_kwargs),
                      lambda model: train(model, [pre], seed=seed, device=device), device=device,
                      prefix=PRETRAIN_PREFIX)


def pretrain_key(scale: ArmScale, data: ArmData, *, seed: int, device="cpu") -> dict[str, Any]:
    """The cache key of :func:`pretrained_vit`'s model (:func:`~experiments.arms.model_cache.fit_key`): what
    ``python -m experiments arms adopt`` files a pre-training from a GPU lease under."""
    pretrain = public_parts(data.public, scale.vit_tune_fraction).pretrain
    return fit_key(scale, pretrain, seed=seed, lr=vit_lr(scale), device=device)


def vit_arm(scale: ArmScale, *, device="cpu", log: Callable[[str], None] | None = None,
            data: ArmData | None = None, pretrained_cache: str | Path | None = None) -> dict[str, Any]:
    """Per seed: pre-train, then every (ε, tuned/untuned) private fine-tuning with its accuracy and per-block
    profile (see the module docstring). ``data`` replaces the scale's data (tests); ``pretrained_cache``: a folder
    that shares each seed's pre-trained weights between the jobs of one run
    (:func:`experiments.arms.model_cache.cached_fit`)."""
    if data is None:
        data = vit_data(scale, device=device)
    parts = public_parts(data.public, scale.vit_tune_fraction)
    probe = probe_set(data.test, scale.vit_probe_images)
    n, t = len(data.private), scale.steps
    epsilons = [float(e) for e in scale.vit_epsilons]
    if any(not e > 0 for e in epsilons):
        raise ValueError(f"vit_epsilons must be > 0 (inf: non-DP), got {epsilons}")
    sigmas = {e: None if math.isinf(e) else sigma_for(scale, n=n, steps=t, epsilon=e) for e in epsilons}
    base = vit_lr(scale)
    blocks: list[int] = []

    def fine_tune(pretrained: torch.nn.Module, sigma: float | None, lr: float, seed: int, key: str,
                  out: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        model = train(copy.deepcopy(pretrained), [phase("private", data.private, scale=scale, steps=t, sigma=sigma,
                                                        seed=seed, index=1, lr=lr)], seed=seed, device=device)
        out[f"{key}_seconds"] = time.perf_counter() - t0
        out[f"{key}_acc"] = test_acc(model, data.test, device)
        out.update({f"{key}_{k}": v for k, v in block_profile(model, probe, device=device).items()})
        out.update({f"{key}_lr": float(lr), f"{key}_sigma": sigma})

    shared: dict[int, torch.nn.Module] = {}  # a shared pre-training, trained once in this process
    origins: dict[str, Any] = {}  # where each pre-training ran (a cached one may come from another machine)

    def load_pretrained(seed: int) -> torch.nn.Module:
        model = pretrained_vit(scale, data, seed=seed, device=device, cache=pretrained_cache)
        origins[str(seed)] = cached_origin(pretrained_cache, pretrain_key(scale, data, seed=seed, device=device),
                                           prefix=PRETRAIN_PREFIX) or {"device": torch.device(device).type,
                                                                       "torch": torch.__version__, "adopted": False}
        return model

    def pretrain_for(seed: int) -> torch.nn.Module:
        if not scale.vit_shared_pretrain:
            return load_pretrained(seed)
        if 0 not in shared:
            shared[0] = load_pretrained(0)
        return shared[0]

    def one(seed: int) -> dict[str, Any]:
        pretrained = pretrain_for(seed)
        prof = block_profile(pretrained, probe, device=device)
        blocks[:] = [len(prof["D"])]
        out: dict[str, Any] = {"pretrain_acc": test_acc(pretrained, data.test, device), "pretrain_D": prof["D"],
                               "pretrain_residual": prof["residual"]}
        for e in epsilons:
            tag = eps_tag(e)
            fine_tune(pretrained, sigmas[e], base, seed, f"{tag}_untuned", out)
            search = lr_search(pretrained, data, scale=scale, sigma=sigmas[e], seed=seed, device=device)
            out[f"{tag}_tuned_trials"] = search["trials"]
            fine_tune(pretrained, sigmas[e], search["lr"], seed, f"{tag}_tuned", out)
        return out

    per = per_seed(scale, one, log)
    return {"arm": "vit", "scale": scale.name, "seeds": list(scale.seeds), "arch": scale.vit_arch,
            "vit_kwargs": dict(scale.vit_kwargs), "blocks": blocks[0] if blocks else None,
            "fit_dof": blocks[0] - 2 if blocks else None, "pooling": POOLING, "probe_images": len(probe),
            "epsilons": [eps_tag(e) for e in epsilons], "sigmas": {eps_tag(e): s for e, s in sigmas.items()},
            "accountant": scale.accountant, "delta": scale.delta, "steps": t, "source_steps": scale.source_steps,
            "shared_pretrain": bool(scale.vit_shared_pretrain),
            "pretrain_schedule": {"schedule": scale.vit_pretrain_schedule, "warmup_steps": scale.vit_pretrain_warmup},
            "default_lr": base,
            "pretrain_augment": CROP_FLIP.model_dump() if scale.vit_pretrain_augment or scale.augment else None,
            "tuning_privacy_cost": TUNING_PRIVACY_COST,
            "tuning": {"trials": scale.vit_trials, "trial_steps": scale.vit_trial_steps,
                       "lr_range": [base * float(f) for f in scale.vit_lr_range], "score": "public tuning-validation "
                       "accuracy, ties by lower loss", "pretrain_images": len(parts.pretrain),
                       "tune_train_images": len(parts.tune_train), "tune_val_images": len(parts.tune_val)},
            "private_images": n, "pretrained_on": origins, "per_seed": per}
