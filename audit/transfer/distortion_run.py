"""Feature distortion *during* DP fine-tuning: DP-FFT vs DP-LP-FFT trajectories.

Kumar et al., "Fine-Tuning can Distort Pretrained Features and Underperform Out-of-Distribution" (ICLR 2022)
show that full fine-tuning with a fresh head moves pretrained features more than linear probing first
(LP-FT); Ke et al., "On the Convergence of Differentially-Private Fine-tuning: To Linearly Probe or to Fully
Fine-tune?" (2024) compare DP-FFT with DP-LP-FFT under DP-SGD. This module fine-tunes a copy of a source checkpoint
with the project's one DP fine-tuning loop (:func:`training.recipes.finetune.finetune`, the loop of ``audit
train``'s ``finetune`` recipe) on a downstream training split and, every ``eval_every`` steps, records

* the k-NN test accuracy of the **backbone** features (``forward_features``; the downstream training
  features at that step are the k-NN bank, see :mod:`audit.transfer.knn`), and
* the relative feature change ``||F_t - F_0||_F / ||F_0||_F`` on the training and test examples
  (:func:`audit.transfer.distortion.relative_feature_change`; 0 = unchanged, higher = more distortion).

Strategies: ``"fft"`` trains head and backbone from step 0; ``"lp_fft"`` first trains only the head for
``lp_steps`` steps (backbone frozen: its features stay exactly the same), then everything for the remaining
``steps - lp_steps``, each phase with a fresh optimizer and its own batch sampler. The head is replaced by one
for the downstream classes (:func:`training.recipes.finetune.new_head`), zero-initialised (``head_init="zero"``)
or the model's own fresh classifier drawn from the seed (``"random"``, e.g. ``nn.Linear``'s default
``U(-1/sqrt(d), 1/sqrt(d))``: the misaligned head of Kumar et al.; with a zero head the first backbone gradients
vanish and only DP noise moves the backbone). Both phases use Poisson sampling at ``q = batch_size / n``,
per-example clipping at ``max_grad_norm`` and Gaussian noise ``noise_multiplier``; the epsilon reported in each
row is that of all DP steps taken so far (one downstream example is the privacy unit).
"""

from __future__ import annotations

import copy
import os
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from audit.transfer.distortion import feature_distortion
from audit.transfer.features import FINAL_LAYER, extract_features
from training.accounting import DPPhase, default_delta, epsilon_for
from training.config import OptimConfig, PrivacyConfig
from training.data import ImageSet
from foundation.errors import DataError
from training.recipes.budget import PhaseBudget
from training.recipes.finetune import finetune, finetune_phases, new_head

__all__ = ["TRAJECTORY_KEYS", "distortion_trajectory", "distortion_trajectory_model"]

Strategy = Literal["fft", "lp_fft"]

#: Keys of every row returned by :func:`distortion_trajectory`.
TRAJECTORY_KEYS = ("step", "phase", "strategy", "knn_accuracy", "knn_ci_low", "knn_ci_high",
                   "relative_change_train", "relative_change_test", "epsilon")


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _backbone_features(model: nn.Module, images: np.ndarray, device: torch.device) -> np.ndarray:
    with torch.no_grad():
        return extract_features(model, images, layers=[FINAL_LAYER], device=device)[FINAL_LAYER]


def distortion_trajectory_model(model: nn.Module, *, data: tuple[ImageSet, ImageSet], strategy: Strategy,
                                steps: int, lp_steps: int = 0, noise_multiplier: float, batch_size: int,
                                lr: float, eval_every: int, seed: int, max_grad_norm: float = 1.0,
                                momentum: float = 0.0, delta: float | None = None,
                                accountant: Literal["prv", "rdp"] = "rdp", k: int = 20, temperature: float = 0.07,
                                physical_batch_size: int = 256, head_init: Literal["zero", "random"] = "zero",
                                device: torch.device | str = "cpu") -> list[dict[str, Any]]:
    """Like :func:`distortion_trajectory` but starting from a module (left unchanged) instead of a run dir.

    Args:
        model: the source model (``forward_features``, ``reset_classifier``); a deep copy is fine-tuned.
        Other arguments: see :func:`distortion_trajectory`.

    Returns:
        See :func:`distortion_trajectory`.
    """
    if head_init not in ("zero", "random"):
        raise ValueError(f"head_init must be 'zero' or 'random', got {head_init!r}")
    if strategy not in ("fft", "lp_fft"):
        raise ValueError(f"strategy must be 'fft' or 'lp_fft', got {strategy!r}")
    steps = _check_int("steps", steps, 1)
    lp_steps = _check_int("lp_steps", lp_steps, 0)
    eval_every = _check_int("eval_every", eval_every, 1)
    batch_size = _check_int("batch_size", batch_size, 1)
    if strategy == "fft" and lp_steps != 0:
        raise ValueError(f"lp_steps must be 0 for strategy 'fft', got {lp_steps}")
    if strategy == "lp_fft" and not 0 < lp_steps < steps:
        raise ValueError(f"lp_steps must be in [1, steps - 1] = [1, {steps - 1}] for 'lp_fft', got {lp_steps}")
    if not (noise_multiplier >= 0 and np.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    train, test = data
    if len(train) < 2 or len(test) < 1 or np.unique(train.y).size < 2:
        raise DataError(f"distortion needs >= 2 classes in the training split and a non-empty test split, got "
                        f"{len(train)} train ({np.unique(train.y).size} classes) and {len(test)} test examples")
    device = torch.device(device)
    n = len(train)
    batch = min(batch_size, n)
    q = batch / n
    delta = float(delta) if delta is not None else float(default_delta(n))
    run_seed, _, head_seed = (int(v) for v in np.random.SeedSequence(int(seed)).generate_state(3))
    net = copy.deepcopy(model)
    head = new_head(net, len(train.classes), init=head_init, seed=head_seed)
    net = net.to(device).train()
    f0_tr = _backbone_features(net, train.x, device)
    f0_te = _backbone_features(net, test.x, device)
    rows: list[dict[str, Any]] = []

    def record(step: int, phase: str, net: nn.Module) -> None:
        f_tr = _backbone_features(net, train.x, device)
        f_te = _backbone_features(net, test.x, device)
        res = feature_distortion(train_features=[f0_tr, f_tr], train_labels=train.y, test_features=[f0_te, f_te],
                                 test_labels=test.y, k=k, temperature=temperature)
        acc = res.knn_accuracy[1]
        if step == 0:
            eps = 0.0
        elif noise_multiplier == 0:
            eps = float("inf")  # no noise: no finite guarantee
        else:
            eps = float(epsilon_for(phases=[DPPhase(float(noise_multiplier), q, step)], delta=delta,
                                    accountant=accountant))
        rows.append({"step": step, "phase": phase, "strategy": strategy, "knn_accuracy": acc.accuracy,
                     "knn_ci_low": acc.ci_low, "knn_ci_high": acc.ci_high,
                     "relative_change_train": res.relative_change_train[1],
                     "relative_change_test": res.relative_change_test[1], "epsilon": eps})

    record(0, "start", net)
    sigma = float(noise_multiplier)
    plan = ([PhaseBudget(name="lp", steps=lp_steps, noise_multiplier=sigma)] if strategy == "lp_fft" else []) + [
        PhaseBudget(name="fft", steps=steps - lp_steps, noise_multiplier=sigma)]
    privacy = PrivacyConfig(enabled=True, noise_multiplier=sigma, max_grad_norm=max_grad_norm, accountant=accountant)
    phases = finetune_phases(plan, head=head, backbone=[name for name, _ in net.named_parameters()], x=train.x,
                             y=train.y, dataset=train.name, batch_size=batch, privacy=privacy,
                             optim=OptimConfig(name="sgd", lr=lr, momentum=momentum), seed=run_seed)

    def on_step(done: int, phase: str, _stats: Any, trained: nn.Module) -> None:
        if done % eval_every == 0 or done == steps:
            record(done, phase, trained)

    finetune(net, phases, seed=run_seed, device=device, physical_batch_size=physical_batch_size, on_step=on_step)
    return rows


def distortion_trajectory(*, source_run_dir: str | os.PathLike[str], data: tuple[ImageSet, ImageSet],
                          strategy: Strategy, steps: int, lp_steps: int = 0, noise_multiplier: float,
                          batch_size: int, lr: float, eval_every: int, seed: int, max_grad_norm: float = 1.0,
                          momentum: float = 0.0, delta: float | None = None,
                          accountant: Literal["prv", "rdp"] = "rdp", k: int = 20, temperature: float = 0.07,
                          physical_batch_size: int = 256, head_init: Literal["zero", "random"] = "zero",
                          device: torch.device | str = "cpu", trust_code: bool = False) -> list[dict[str, Any]]:
    """DP-fine-tune a copy of a run's model and trace backbone k-NN accuracy and feature change over steps.

    Args:
        source_run_dir: run directory of the source checkpoint (weights sha256-checked on load).
        data: ``(train, test)`` downstream splits with the same classes; images at the model's input size.
        strategy: ``"fft"`` (all parameters from step 0) or ``"lp_fft"`` (head only for ``lp_steps``, then all).
        steps: total DP steps (both phases together), >= 1.
        lp_steps: steps of the linear-probing phase: 0 for ``"fft"``, in ``[1, steps - 1]`` for ``"lp_fft"``.
        noise_multiplier: sigma of DP-SGD (same for both phases), >= 0.
        batch_size: expected batch size; Poisson rate ``q = batch_size / len(train)``.
        lr: SGD learning rate (constant).
        eval_every: record a row every this many steps (and at the last step).
        seed: seed of the batch sampling and of the DP noise.
        max_grad_norm: per-example clipping norm C.
        momentum: SGD momentum.
        delta: DP delta (None: ``default_delta(len(train))``).
        accountant: accountant for the reported epsilon.
        k, temperature: k-NN parameters.
        physical_batch_size: largest chunk per forward/backward pass.
        head_init: ``"zero"`` or ``"random"`` (seeded) initialisation of the new head.
        device: where to train.
        trust_code: allow the run's manifest to name code to import (see
            :func:`training.run.open_run`).

    Returns:
        One dict per recorded step (step 0 first) with keys :data:`TRAJECTORY_KEYS`: ``step`` (DP steps
        taken), ``phase`` (``"start"``, ``"lp"`` or ``"fft"``), ``strategy``, ``knn_accuracy`` with its 95%
        Wilson interval ``knn_ci_low``/``knn_ci_high``, ``relative_change_train``/``relative_change_test``
        (``||F_t - F_0|| / ||F_0||``, higher = more distortion) and ``epsilon`` spent so far.

    Raises:
        CheckpointError: the run directory or its weights are missing or do not match.
        DataError: fewer than 2 classes in ``train`` or an empty ``test``.
        ValueError: out-of-range arguments (named).
        ConfigError: the DP engine rejects the model (e.g. trainable BatchNorm).
    """
    from training.run import open_run

    model = open_run(source_run_dir, trust_code=trust_code, verify=False).model(device=device)
    return distortion_trajectory_model(model, data=data, strategy=strategy, steps=steps, lp_steps=lp_steps,
                                       noise_multiplier=noise_multiplier, batch_size=batch_size, lr=lr,
                                       eval_every=eval_every, seed=seed, max_grad_norm=max_grad_norm,
                                       momentum=momentum, delta=delta, accountant=accountant, k=k,
                                       temperature=temperature, physical_batch_size=physical_batch_size,
                                       head_init=head_init, device=device)
