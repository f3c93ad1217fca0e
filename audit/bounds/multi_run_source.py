"""Multi-run evidence for `audit epsilon`: 2n fresh models of the target's recipe, n of them with one canary.

Jagielski, Ullman, Oprea ("Auditing Differentially Private Machine Learning: How Private is Private SGD?",
NeurIPS 2020) and Nasr et al. ("Tight Auditing of Differentially Private Machine Learning", USENIX Security 2023)
audit a training algorithm by running it many times on two neighbouring datasets: D (the target's members) and
D ∪ {canary}. Each trained model is one independent trial, so the counts at a threshold on the canary's score
are binomial and the Clopper–Pearson and GDP bounds of :func:`audit.bounds.multi_run.epsilon_multi_run` apply.

Here every model follows the target's recipe (architecture, σ, C, sample rate, steps, optimizer, learning-rate
schedule; :func:`attacks.recipe.shadow_recipe`) on the target's own members, with a different seed per model,
and is trained by the batched DP-SGD trainer (:func:`training.dp.batched.train_many`). The canary is ONE example
appended to the members: a uniform-noise image with a fixed label (``ood``) or a test image with a wrong label
(``mislabel``). Its score in each model is the scaled logit φ = log p_y − log Σ_{y'≠y} p_y' of its label
(higher = member). The models are re-implementations of the recipe, not the target's own training code, so the
bounds audit the recipe and are reported for information: they never decide the verdict.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np

from audit.config import EpsilonConfig
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.multi_run import epsilon_multi_run
from audit.bounds.sources import Skipped, run_recipe
from audit.bounds.thresholds import HeldOut
from training.run import VerifiedRun

__all__ = ["SOURCE", "ASSUMPTIONS", "make_canary", "multi_run_evidence"]

SOURCE = "multi_run"
ASSUMPTIONS = ("models re-trained with the target's recipe by the batched DP-SGD trainer (training.dp.batched), "
               "not by the target's own training code: the bound audits the recipe, not the released model "
               "(not used for the verdict)")
_CANARY_STREAM = 0x4D52  # "MR": the canary's own random stream
_SEED_STREAM = 0x4D53


def make_canary(kind: str, *, image_shape: tuple[int, int, int], num_classes: int,
                test_x: np.ndarray | None = None, test_y: np.ndarray | None = None,
                rng: np.random.Generator | int | None = None) -> tuple[np.ndarray, int, dict[str, Any]]:
    """One canary example: ``ood`` uniform noise with a random fixed label, or a ``mislabel``-led test image.

    Args:
        kind: ``"ood"`` or ``"mislabel"``.
        image_shape: (H, W, C) of the pool's uint8 images.
        num_classes: number of labels (>= 2).
        test_x: uint8 (N, H, W, C) test images (``mislabel`` only).
        test_y: int (N,) test labels (``mislabel`` only).
        rng: randomness of the image, its label and the test image picked.

    Returns:
        ``(image uint8 (H, W, C), label, description)``.

    Raises:
        ValueError: an unknown kind, fewer than two classes, or ``mislabel`` without test images.

    >>> x, y, d = make_canary("ood", image_shape=(4, 4, 3), num_classes=10, rng=0)
    >>> x.shape, x.dtype, 0 <= y < 10, d["kind"]
    ((4, 4, 3), dtype('uint8'), True, 'ood')
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    gen = np.random.default_rng(rng)
    if kind == "ood":
        x = gen.integers(0, 256, size=tuple(image_shape), dtype=np.uint8)
        label = int(gen.integers(num_classes))
        return x, label, {"kind": "ood", "label": label}
    if kind == "mislabel":
        if test_x is None or test_y is None or len(test_x) == 0:
            raise ValueError("a mislabel canary needs a non-empty test set (test_x, test_y)")
        i = int(gen.integers(len(test_x)))
        true = int(test_y[i])
        label = int((true + 1 + gen.integers(num_classes - 1)) % num_classes)
        return np.array(test_x[i], dtype=np.uint8), label, {"kind": "mislabel", "label": label,
                                                             "true_label": true, "test_index": i}
    raise ValueError(f"kind must be 'ood' or 'mislabel', got {kind!r}")


def _canary_scores(states: list[dict], factory, x: np.ndarray, label: int) -> np.ndarray:
    """φ of the canary's label in each trained model (higher = member)."""
    from attacks.signals import compute_signals

    model = factory()
    out = np.empty(len(states), dtype=np.float64)
    for k, sd in enumerate(states):
        model.load_state_dict(sd)
        out[k] = float(compute_signals(model, x[None], np.array([label], dtype=np.int64))[0, 0])
    return out


def multi_run_evidence(*, run: VerifiedRun, config: EpsilonConfig, delta: float
                       ) -> tuple[EpsilonEstimate, ...] | Skipped:
    """Train ``config.multi_run_models`` models of the target's recipe, half with one canary, and bound ε.

    Args:
        run: The verified target: its ``config.yaml`` gives the recipe, its manifest σ, q, steps and C (last
            phase), its pool and membership the members every model trains on (plus the canary).
        config: ``multi_run_models`` (2n), ``multi_run_canary``, ``multi_run_seed``, ``holdout_fraction``,
            ``seed`` (the held-out split) and ``alpha``.
        delta: δ of the bounds (the manifest's δ).

    Returns:
        The Clopper–Pearson and (δ > 0) GDP estimates; ``extra`` records n, the canary, the seeds' origin, the
        scores' means and the training time. Or :class:`Skipped` when the recipe cannot be replayed by the
        batched trainer, the split leaves a side empty, or a mislabel canary has no test set.

    Raises:
        UserError: the run's ``config.yaml`` or rebuilt pool does not match its manifest.
    """
    import torch

    from attacks.recipe import batched_unsupported, model_factory, shadow_recipe
    from training.dp.batched import train_many
    from training.data import to_float_tensor
    from training.device import resolve_device

    n = config.multi_run_models // 2
    f = config.holdout_fraction
    if not 1 <= math.floor(f * n) <= n - 1:
        return Skipped(SOURCE, f"epsilon.multi_run_models = {config.multi_run_models} leaves too few models per "
                               f"side for a held-out threshold at holdout_fraction = {f}; use more models")
    cfg = run_recipe(run)
    recipe = shadow_recipe(config=cfg, manifest=run.manifest)
    pool = run.pool
    num_classes, image_shape = len(pool.classes), tuple(pool.x.shape[1:])
    input_shape = (int(image_shape[2]), int(image_shape[0]), int(image_shape[1]))
    why = batched_unsupported(recipe, num_classes=num_classes, input_shape=input_shape)
    if why is not None:
        return Skipped(SOURCE, f"the batched trainer cannot replay this recipe: {why}")
    members = np.flatnonzero(run.membership)
    if members.size == 0:
        return Skipped(SOURCE, "the run has no members to train on")
    test = run.population
    if config.multi_run_canary == "mislabel" and (test is None or len(test) == 0):
        return Skipped(SOURCE, "a mislabel canary needs the run's test set (data.test_size > 0); use "
                               "multi_run_canary = ood")
    cx, cy, canary = make_canary(config.multi_run_canary, image_shape=image_shape, num_classes=num_classes,
                                 test_x=None if test is None else test.x, test_y=None if test is None else test.y,
                                 rng=[config.multi_run_seed, _CANARY_STREAM])
    x = np.concatenate([pool.x[members], cx[None]], axis=0)
    y = np.concatenate([np.asarray(pool.y[members], dtype=np.int64), np.array([cy], dtype=np.int64)])
    masks = np.ones((2 * n, x.shape[0]), dtype=bool)
    masks[n:, -1] = False  # models [0, n) train with the canary, [n, 2n) without
    seeds = np.random.default_rng([config.multi_run_seed, _SEED_STREAM]).choice(2**31 - 1, size=2 * n,
                                                                              replace=False)
    batch_size = max(1, round(recipe.sample_rate * members.size))
    factory = model_factory(cfg.model, num_classes=num_classes, input_shape=input_shape)
    device = resolve_device("auto")
    t0 = time.perf_counter()
    states = train_many(
        model_factory=factory, x=to_float_tensor(x), y=torch.as_tensor(y), masks=masks,
        seeds=[int(s) for s in seeds], recipe=dataclasses.replace(recipe.train, batch_size=batch_size),
        device=device, executor="auto")
    seconds = time.perf_counter() - t0
    scores = _canary_scores(states, factory, cx, cy)
    if not np.all(np.isfinite(scores)):
        return Skipped(SOURCE, f"{int((~np.isfinite(scores)).sum())} model(s) gave a non-finite canary score "
                               "(diverged training); lower the learning rate")
    s_with, s_without = scores[:n], scores[n:]
    ests = epsilon_multi_run(scores_with=s_with, scores_without=s_without, delta=delta, alpha=config.alpha,
                             threshold_strategy=HeldOut(fraction=f, rng=config.seed))
    info = {"n_per_side": n, "canary": canary, "multi_run_seed": config.multi_run_seed,
            "training_seconds": round(seconds, 3), "device": str(device), "batch_size": batch_size,
            "steps": recipe.steps, "dp": recipe.dp, "noise_multiplier": recipe.noise_multiplier,
            "max_grad_norm": recipe.max_grad_norm, "sample_rate": recipe.sample_rate,
            "mean_score_with": float(s_with.mean()), "mean_score_without": float(s_without.mean()),
            "scores": "scaled logit of the canary's label in each model (higher = member)"}
    return tuple(dataclasses.replace(e, assumptions="; ".join(a for a in (e.assumptions, ASSUMPTIONS) if a),
                                     extra={**e.extra, "multi_run": info}) for e in ests)
