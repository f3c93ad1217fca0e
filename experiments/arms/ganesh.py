"""Ganesh et al. 2023: why public pre-training is necessary for private model training (Ganesh, Haghifam, Nasr,
Oh, Steinke, Thakkar, Thakurta, Wang, "Why Is Public Pretraining Necessary for Private Model Training?", ICML 2023).

Their account: non-convex training has an early phase of choosing a basin, which DP noise does badly and a
little public data does well; within a basin, DP training is close to convex. Two measurements per seed:

* the sweep: ``public_steps`` non-DP steps on the public images (snapshots of one run with a constant learning
  rate), then ``steps`` DP steps on the private images at ε (σ by PLD), test accuracy per public budget;
* the basin test: the loss barrier (:func:`loss_barrier`) on the private images along the straight line between
  two DP runs that start from the *same public* initialisation (the largest public budget; different batches and
  noise), against two DP runs from two *different random* initialisations. The hypothesis predicts a small
  barrier for the first pair (one basin) and a larger one for the second;
* its control: two DP runs from the *same random* initialisation (the 0 budget's; different batches and noise).
  Two different random inits are separated by permutation symmetry alone, so "same public < random" could hold
  without any public data; the hypothesis needs "same public < same random" too;
* the private-vs-non-private contrast: the same private steps *without* DP (no clipping, no noise) after 0 and after
  the largest public budget; the paper's account predicts that public pre-training buys much more under DP.

>>> alphas = [0.0, 0.5, 1.0]
>>> loss_barrier(alphas, [1.0, 3.0, 2.0])  # 3 - (1 + 2) / 2
1.5
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from experiments.arms.common import (ArmScale, build, chosen_parts, load_arm_data, per_seed, phase, sigma_for, test_acc,
                                    train)

__all__ = ["interpolate", "loss_barrier", "barrier_curve", "ganesh_arm", "ganesh_parts"]


def ganesh_parts(scale: ArmScale) -> list[str]:
    """The arm's independent parts of one seed (``ArmScale.ganesh_parts`` picks some; a GPU queue runs one each):
    ``public<k>`` for each public budget strictly between 0 and the largest (one DP run), ``same`` (the largest
    budget's DP run, its second run from the same public start and their barrier), ``random`` (the 0 budget's DP
    run, a run from another random initialisation and their barrier) and ``same_random`` (the control: the 0
    budget's DP run, a second DP run from that same random initialisation and their barrier). Together: the whole
    arm; run as parts, ``random`` and ``same_random`` each train the 0 budget's DP run (the only run done twice);
    ``nondp`` trains the private steps without DP after 0 and after the largest public budget."""
    budgets = sorted(set(scale.public_steps) | {0})
    return [f"public{k}" for k in budgets[1:-1]] + ["same", "random", "same_random", "nondp"]


def interpolate(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], alpha: float
                ) -> dict[str, torch.Tensor]:
    """(1 − α)·a + α·b for every floating tensor of two state dicts of one architecture (others taken from a).

    Raises:
        ValueError: different keys or shapes.
    """
    if a.keys() != b.keys() or any(a[k].shape != b[k].shape for k in a):
        raise ValueError("the two state dicts must have the same keys and shapes")
    return {k: torch.lerp(a[k], b[k], float(alpha)) if torch.is_floating_point(a[k]) else a[k].clone() for k in a}


def loss_barrier(alphas: Sequence[float], losses: Sequence[float]) -> float:
    """max over α of L(α) − [(1 − α)·L(0) + α·L(1)]: how far the loss rises above the chord between the two end
    points (0 at the end points, so ≥ 0; 0 for a convex loss; Frankle et al. 2020's linear mode connectivity).

    Raises:
        ValueError: fewer than 2 points, alphas not from 0 to 1 increasing, or lengths differ.
    """
    a, v = np.asarray(alphas, dtype=np.float64), np.asarray(losses, dtype=np.float64)
    if a.shape != v.shape or a.size < 2 or a[0] != 0.0 or a[-1] != 1.0 or np.any(np.diff(a) <= 0):
        raise ValueError("alphas must increase from 0 to 1 and match losses in length (>= 2 points)")
    return float(np.max(v - ((1 - a) * v[0] + a * v[-1])))


def barrier_curve(loss_at: Callable[[dict[str, torch.Tensor]], float], a: Mapping[str, torch.Tensor],
                  b: Mapping[str, torch.Tensor], *, points: int) -> tuple[list[float], list[float]]:
    """(alphas, losses) of ``loss_at`` at ``points`` evenly spaced states on the line from ``a`` to ``b``."""
    alphas = [float(x) for x in np.linspace(0.0, 1.0, int(points))]
    return alphas, [float(loss_at(interpolate(a, b, x))) for x in alphas]


def ganesh_arm(scale: ArmScale, *, device="cpu", log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Per seed: test accuracy after each public budget then DP, and the loss barriers of the two pairs."""
    from training.evaluate import mean_loss

    data = load_arm_data(scale, device=device)
    n, t = len(data.private), scale.steps
    sigma = sigma_for(scale, n=n, steps=t)
    budgets = sorted(set(scale.public_steps) | {0})
    top = budgets[-1]
    parts = chosen_parts(scale, "ganesh_parts", ganesh_parts(scale))
    # the DP runs the parts need: each middle budget's own, the largest for 'same', 0 for 'random'
    needed = [k for k in budgets if f"public{k}" in parts or (k == top and "same" in parts)
              or (k == 0 and ("random" in parts or "same_random" in parts))]

    def dp(start: dict[str, torch.Tensor], seed: int, run_seed: int) -> torch.nn.Module:
        model = build(scale, data, seed=seed, device=device)
        model.load_state_dict(start)
        return train(model, [phase("private", data.private, scale=scale, steps=t, sigma=sigma, seed=run_seed,
                                   index=1)], seed=run_seed, device=device)

    def one(seed: int) -> dict[str, Any]:
        model = build(scale, data, seed=seed, device=device)
        snaps = {0: copy.deepcopy(model.state_dict())}

        def snap(g, _name, _stats, net):
            if g in budgets:
                snaps[g] = copy.deepcopy(net.state_dict())

        if top > 0:
            train(model, [phase("public", data.public, scale=scale, steps=top, sigma=None, seed=seed, index=0)],
                  seed=seed, device=device, on_step=snap)
        out: dict[str, Any] = {}
        if "nondp" in parts:  # the contrast: the same private steps without DP, after 0 and the largest budget
            for k in (0, top):
                model = build(scale, data, seed=seed, device=device)
                model.load_state_dict(snaps[k])
                model = train(model, [phase("private", data.private, scale=scale, steps=t, sigma=None, seed=seed,
                                            index=1)], seed=seed, device=device)
                out[f"nondp_public{k}_acc"] = test_acc(model, data.test, device)
        ends = {}
        for k in needed:
            trained = dp(snaps[k], seed, seed)
            out[f"public{k}_acc"] = test_acc(trained, data.test, device)
            ends[k] = trained
        probe = build(scale, data, seed=seed, device=device)

        def loss_at(state):
            probe.load_state_dict(state)
            return mean_loss(probe, data.private, device=device)

        pairs = {}
        if "same" in parts:
            pairs["same_public"] = (ends[top].state_dict(), dp(snaps[top], seed, seed + 1000).state_dict())
        if "random" in parts:
            other_init = build(scale, data, seed=seed + 1000, device=device).state_dict()
            pairs["random"] = (ends[0].state_dict(), dp(other_init, seed + 1000, seed + 1000).state_dict())
        if "same_random" in parts:  # the control: one random init, two DP runs (other batches and noise)
            pairs["same_random"] = (ends[0].state_dict(), dp(snaps[0], seed, seed + 1000).state_dict())
        for name, (a, b) in pairs.items():
            alphas, losses = barrier_curve(loss_at, a, b, points=scale.barrier_points)
            out[f"barrier_{name}"] = loss_barrier(alphas, losses)
            out[f"barrier_{name}_curve"] = losses
        return out

    return {"arm": "ganesh", "scale": scale.name, "seeds": list(scale.seeds), "sigma": sigma, "budgets": budgets,
            "per_seed": per_seed(scale, one, log)}
