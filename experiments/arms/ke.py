"""Ke et al. 2024's misalignment cause, at equal backbone steps (Ke, Hou, Fanti, Oh, "On the Convergence of
Differentially-Private Fine-tuning: To Linearly Probe or to Fully Fine-tune?", arXiv:2402.18905).

One source model (``ArmScale.ke_source``: ``scale.arch`` non-DP on the public pre-training images for
``source_steps``, or the ViT arm's public pre-trained ViT, :func:`experiments.arms.vit.pretrained_vit`); per seed, DP
fine-tuning on the downstream private images with the head initialised ``random`` (the model's own initialisation),
``zero``, or ``lp_aligned`` (a DP linear-probing phase first), every arm with the same ``steps`` of full fine-tuning
(the same number of backbone updates) at the same ε (LP-FFT's budget split by
:func:`training.recipes.budget.split_budget`, composed by PLD). The head's learning rate is ``head_lr_scale`` times
the backbone's, by parameter group (``optim.lr_scales``), in every phase, so no arm's head learns slower than
another's. kNN accuracy of the backbone features (:func:`audit.transfer.knn.knn_classify`, held-out ``val`` images
queried against a bank of private ones) is logged every ``knn_every`` steps: feature quality over time. The LP share
of ε is swept over ``lp_fractions`` and chosen per seed on the held-out ``val`` images, never on the test images.
DP-LP alone (the head only, as many DP steps as LP-FFT, the whole ε) is the other end Ke et al. compare LP-FFT with.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.arms.common import (ArmScale, build, chosen_parts, load_arm_data, per_seed, phase, sigma_for, test_acc,
                                    train)
from experiments.arms.model_cache import cached_fit, fit_key

__all__ = ["ke_arm", "ke_source", "knn_quality", "ke_parts", "select_split"]

HEAD_INITS = ("random", "zero")


def _split_key(f: float) -> str:
    return f"lpfft{int(round(100 * f))}"


def ke_parts(scale: ArmScale) -> list[str]:
    """The arm's independent runs of one seed (``ArmScale.ke_parts`` picks some; a GPU queue runs one each): the
    head inits (``random``, ``zero``), one LP-FFT run per budget split (``lpfft50`` is also the ``lp_aligned``
    arm) and ``lp``, DP linear probing alone for as many DP steps as LP-FFT takes, at the whole ε. Together: the
    whole arm."""
    return list(HEAD_INITS) + [_split_key(f) for f in sorted(set(scale.lp_fractions) | {0.5})] + ["lp"]


def select_split(values: dict[str, Any], lp_fractions) -> dict[str, Any]:
    """``selected_split`` (the LP-FFT split with the best held-out validation accuracy; never the test images) and
    its test accuracy ``selected_acc``, from one seed's ``lpfft<f>_val``/``_acc``; empty while a split is missing
    (the parts of a seed are joined first)."""
    keys = [_split_key(f) for f in lp_fractions]
    if any(f"{k}_val" not in values for k in keys):
        return {}
    chosen = max(keys, key=lambda k: values[f"{k}_val"])
    return {"selected_split": chosen, "selected_acc": values[f"{chosen}_acc"]}


def knn_quality(model: torch.nn.Module, bank, query, *, device="cpu") -> float:
    """kNN accuracy (k = 20, τ = 0.07) of ``model``'s backbone features: ``query`` images against ``bank``."""
    from audit.transfer.features import extract_features
    from audit.transfer.knn import knn_classify

    fb = extract_features(model, bank.x, layers=["features"], device=device)["features"]
    fq = extract_features(model, query.x, layers=["features"], device=device)["features"]
    return float(knn_classify(train_features=fb, train_labels=bank.y, test_features=fq, test_labels=query.y,
                              k=min(20, len(bank))).accuracy.accuracy)


def ke_source(scale: ArmScale, *, device="cpu", pretrained_cache: str | Path | None = None
              ) -> tuple[torch.nn.Module, float, float]:
    """(source model, its accuracy on the pre-training dataset's test images, the fine-tuning learning rate) of
    ``scale.ke_source``: ``arch``, ``scale.arch`` trained non-DP for ``source_steps`` on the public images (seed 0)
    and fine-tuned at ``lr``; ``vit``, the ViT arm's pre-trained model of seed 0 (the same cache key, so a run of
    the ViT arm at the same pre-training settings is reused) fine-tuned at ``vit_lr``."""
    if scale.ke_source == "vit":
        from experiments.arms.vit import pretrained_vit, vit_data, vit_lr

        pre = vit_data(scale, device=device)
        source = pretrained_vit(scale, pre, seed=0, device=device, cache=pretrained_cache)
        return source, test_acc(source, pre.test, device), vit_lr(scale)
    pre = load_arm_data(scale, device=device)
    source = cached_fit(
        pretrained_cache, fit_key(scale, pre.public, seed=0, lr=scale.lr, device=device),
        lambda: build(scale, pre, seed=0, device=device),
        lambda model: train(model, [phase("public", pre.public, scale=scale, steps=scale.source_steps, sigma=None,
                                          seed=0, index=0)], seed=0, device=device),
        device=device, prefix="ke-source")
    return source, test_acc(source, pre.test, device), float(scale.lr)


def ke_arm(scale: ArmScale, *, device="cpu", log: Callable[[str], None] | None = None,
           pretrained_cache: str | Path | None = None) -> dict[str, Any]:
    """Per seed: test accuracy, final and over-time kNN quality of the head-init arms, and the LP-FFT split sweep
    with its validation-selected split (see the module docstring). ``pretrained_cache``: a folder that shares the
    source model between the part jobs of one run (:func:`experiments.arms.model_cache.cached_fit`)."""
    from training.recipes.budget import split_budget
    from training.recipes.finetune import head_seed, new_head

    parts = chosen_parts(scale, "ke_parts", ke_parts(scale))
    down = load_arm_data(scale, downstream=True, device=device)
    source, source_acc, lr = ke_source(scale, device=device, pretrained_cache=pretrained_cache)
    n, t = len(down.private), scale.steps
    bank = down.private.subset(np.arange(min(len(down.private), 1000)))
    t_lp = max(1, t // 2)
    plans: dict[float, list] = {}  # the split's σs do not depend on the seed: calibrate once

    def start(init: str, seed: int) -> tuple[torch.nn.Module, list[str], list[str]]:
        model = copy.deepcopy(source)
        head = new_head(model, down.num_classes, init=init, seed=head_seed(seed))
        return model.to(device), head, [name for name, _ in model.named_parameters()]

    def run(seed: int, init: str, plan: list, curve: list | None) -> torch.nn.Module:
        model, head, every = start(init, seed)
        scales = {h: scale.head_lr_scale for h in head}
        phases = [phase(b.name, down.private, scale=scale, steps=b.steps, sigma=b.noise_multiplier, seed=seed,
                        index=i, lr=lr, trainable=head if b.name == "lp" else every, lr_scales=scales)
                  for i, b in enumerate(plan)]
        hook = None
        if curve is not None:
            curve.append({"step": 0, "knn": knn_quality(model, bank, down.val, device=device)})

            def hook(g, _name, _stats, net):
                if g % scale.knn_every == 0:
                    curve.append({"step": g, "knn": knn_quality(net, bank, down.val, device=device)})
        return train(model, phases, seed=seed, device=device, on_step=hook)

    def one(seed: int) -> dict[str, Any]:
        from training.recipes.budget import PhaseBudget

        out: dict[str, Any] = {}
        fft = [PhaseBudget(name="fft", steps=t, noise_multiplier=sigma_for(scale, n=n, steps=t))]
        for init in (i for i in HEAD_INITS if i in parts):
            curve: list = []
            model = run(seed, init, fft, curve)
            out.update({f"{init}_acc": test_acc(model, down.test, device), f"{init}_val": test_acc(model, down.val,
                                                                                                    device),
                        f"{init}_knn": curve[-1]["knn"], f"{init}_knn_curve": curve})
        for f in sorted(set(scale.lp_fractions) | {0.5}):  # 0.5 is also the lp_aligned head-init arm
            if _split_key(f) not in parts:
                continue
            if scale.noise_multiplier is not None:  # a fixed σ (tests): the same phases, no ε split
                plan = [PhaseBudget(name=p, steps=k, noise_multiplier=scale.noise_multiplier)
                        for p, k in (("lp", t_lp), ("fft", t))]
            else:
                plan = plans.get(f) or plans.setdefault(f, split_budget(
                    strategy="lp_fft", split_by="epsilon", lp_fraction=f, total_steps=t_lp + t,
                    sample_rate=scale.batch_size / n, delta=scale.delta, accountant=scale.accountant,
                    target_epsilon=scale.epsilon, lp_steps_fraction=t_lp / (t_lp + t)))
            curve = [] if f == 0.5 else None
            model = run(seed, "random", plan, curve)
            key = _split_key(f)
            out.update({f"{key}_acc": test_acc(model, down.test, device), f"{key}_val": test_acc(model, down.val,
                                                                                                  device),
                        f"{key}_sigmas": [b.noise_multiplier for b in plan]})
            if curve is not None:
                out.update({"lp_aligned_acc": out[f"{key}_acc"], "lp_aligned_knn": curve[-1]["knn"],
                            "lp_aligned_knn_curve": curve})
        if "lp" in parts:  # DP-LP: the head alone, LP-FFT's total DP steps, the whole ε
            k = t_lp + t
            plan = [PhaseBudget(name="lp", steps=k, noise_multiplier=sigma_for(scale, n=n, steps=k))]
            model = run(seed, "random", plan, None)
            out.update({"lp_acc": test_acc(model, down.test, device), "lp_val": test_acc(model, down.val, device)})
        out.update(select_split(out, scale.lp_fractions))
        return out

    return {"arm": "ke", "scale": scale.name, "seeds": list(scale.seeds), "source": scale.ke_source,
            "source_arch": scale.vit_arch if scale.ke_source == "vit" else scale.arch, "source_test_acc": source_acc,
            "lr": lr, "fft_steps": t, "lp_steps": t_lp, "head_lr_scale": scale.head_lr_scale,
            "per_seed": per_seed(scale, one, log)}
