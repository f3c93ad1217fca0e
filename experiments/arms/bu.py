"""Bu et al. 2024's claims the continual-pretraining configs do not test (Bu, Zhang, Hong, Zha, Karypis,
"Pre-training Differentially Private Models with Limited Public Data", NeurIPS 2024).

:func:`continual_arm`, per seed, on the same members (a seeded random half of the private images) and the same
total steps: non-DP; DP-SGD with σ = 0 (clipping only: "noise, not clipping, causes the degradation"); DP from
scratch; DP continual pre-training switched after a fixed number of public steps; and switched by the plateau rule
(:mod:`training.recipes.switch`, public validation loss on the held-out ``val`` images). The DP arms' σ is
calibrated by PLD for their DP steps at ε. Every checkpoint is then attacked through the attack API (LOSS and
Attack-P scores of :mod:`attacks.baselines`, metrics of :mod:`attacks.metrics`) on members vs the other half.

:func:`trace_arm`, per seed: tr(H) on the fixed held-out test batch over ``trace_steps`` steps of non-DP
pre-training, DP pre-training from scratch, and DP fine-tuning from a public pre-trained model (the paper: tr(H)
is large early in pre-training and small in fine-tuning; it rises, peaks and falls).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from experiments.arms.common import (CONTINUAL_ARMS, TRACE_RUNS, ArmScale, TraceLogger, build, chosen_parts,
                                    load_arm_data, per_seed, phase, sigma_for, test_acc, train, train_dynamic)

__all__ = ["continual_arm", "trace_arm", "membership_metrics", "plateau_switch_run", "continual_phases", "member_half",
           "FIXED_ARMS", "CONTINUAL_ARMS", "TRACE_RUNS"]


def membership_metrics(model: torch.nn.Module, images, members: np.ndarray, *, device="cpu", seed: int = 0
                       ) -> dict[str, float]:
    """LOSS and Attack-P membership inference on ``images`` (``members``: bool mask of the trained rows): AUC with
    its bootstrap 95 % interval and TPR at 1 % FPR of each; Attack-P's population is the test-free non-members."""
    from attacks.metrics import compute_metrics
    from attacks.registry import AttackInputs, build_attack
    from attacks.signals import AugmentationSpec, compute_signals

    phi = compute_signals(model, images.x, images.y, spec=AugmentationSpec(), device=device)
    rng = np.random.default_rng(seed)
    out_idx = np.flatnonzero(~members)
    pop = rng.choice(out_idx, size=len(out_idx) // 2, replace=False)  # population: half of the non-members
    query = np.setdiff1d(np.arange(len(members)), pop)
    res: dict[str, float] = {}
    for name in ("loss", "attack_p"):
        inputs = AttackInputs(target=phi[query], pop_target=phi[pop]) if name == "attack_p" else AttackInputs(
            target=phi[query])
        scores = build_attack(name).score(inputs)
        m = compute_metrics(scores, members[query], rng=seed, n_boot=200)
        res.update({f"{name}_auc": m.auc, f"{name}_auc_lo": m.auc_ci[0], f"{name}_auc_hi": m.auc_ci[1],
                    f"{name}_tpr1": m.tpr_at[0.01]})
    return res


def plateau_switch_run(model, data, scale: ArmScale, *, members: np.ndarray, seed: int, max_public: int,
                       eval_every: int, patience: int = 2, min_delta: float = 0.0, device="cpu"
                       ) -> tuple[torch.nn.Module, int, str]:
    """Public non-DP phase ended by the plateau rule on the public validation loss (``data.val``), then DP on the
    members for the steps left of ``scale.steps`` (σ by PLD for those). Returns (model, switch step, reason)."""
    from training.evaluate import mean_loss
    from training.loop import NextPhase
    from training.recipes.switch import Evaluation, SwitchRule

    rule = SwitchRule(kind="plateau", max_public_steps=max_public, patience=patience, min_delta=min_delta,
                      eval_every=eval_every)
    evals: list[Evaluation] = []

    def decide(step: int, net) -> str | None:
        if rule.evaluates_at(step):
            evals.append(Evaluation(step=step, value=mean_loss(net, data.val, device=device)))
        return rule.decide(step=step, evaluations=evals)

    public = phase("public", data.public, scale=scale, steps=max_public, sigma=None, seed=seed, index=0)

    def next_phase(done: list[dict[str, Any]]):
        if not done:
            return NextPhase(spec=public, decide=decide)
        if len(done) == 1:
            t = scale.steps - done[0]["steps"]
            return NextPhase(spec=phase("private", data.private, scale=scale, steps=t, members=members, seed=seed,
                                        index=1, sigma=sigma_for(scale, n=len(members), steps=t)))
        return None

    trained, done = train_dynamic(model, next_phase, seed=seed, device=device)
    return trained, int(done[0]["steps"]), str(done[0].get("reason") or "max_public_steps")


#: the continual arm's trainings with a fixed schedule (:func:`continual_phases`); the plateau rule's switch is
#: decided as it runs
FIXED_ARMS = ("nondp", "clip_only", "scratch", "continual")


def member_half(n: int, seed: int) -> np.ndarray:
    """The bool mask of the member half of ``n`` private rows for ``seed`` (exactly ``n // 2``: every seed has the
    same q, and so the same σ)."""
    members = np.zeros(n, dtype=bool)
    members[np.random.default_rng([seed, 0x4D49]).permutation(n)[: n // 2]] = True
    return members


def continual_phases(name: str, scale: ArmScale, data, *, members: np.ndarray, seed: int) -> list:
    """The phases of one of :data:`FIXED_ARMS` on the private rows ``members``: ``nondp`` (non-DP), ``clip_only``
    (DP-SGD with σ = 0), ``scratch`` (DP for ``scale.steps``), ``continual`` (``scale.switch`` public non-DP steps,
    then DP for the rest); the DP phases' σ by ``scale.accountant`` for their own steps at ``scale.epsilon``."""
    n, t = len(members), scale.steps

    def priv(steps: int, sigma: float | None, index: int = 0):
        return phase("private", data.private, scale=scale, steps=steps, sigma=sigma, members=members, seed=seed,
                     index=index)

    if name == "nondp":
        return [priv(t, None)]
    if name == "clip_only":
        return [priv(t, 0.0)]
    if name == "scratch":
        return [priv(t, sigma_for(scale, n=n, steps=t))]
    if name == "continual":
        return [phase("public", data.public, scale=scale, steps=scale.switch, sigma=None, seed=seed, index=0),
                priv(t - scale.switch, sigma_for(scale, n=n, steps=t - scale.switch), 1)]
    raise ValueError(f"not a fixed training of the continual arm: {name!r}; one of {', '.join(FIXED_ARMS)}")


def continual_arm(scale: ArmScale, *, device="cpu", log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Per seed: test accuracy and membership-inference metrics of the five arms (see the module docstring)."""
    chosen = chosen_parts(scale, "continual_arms", CONTINUAL_ARMS)
    if scale.switch >= scale.steps:
        raise ValueError(f"switch ({scale.switch}) must be below steps ({scale.steps})")
    data = load_arm_data(scale, device=device)
    n_priv = len(data.private)

    def one(seed: int) -> dict[str, Any]:
        members = member_half(n_priv, seed)  # exactly half, so every seed has the same q (and σ)
        idx = np.flatnonzero(members)
        n = len(idx)
        t = scale.steps
        out: dict[str, Any] = {}
        for name in (k for k in FIXED_ARMS if k in chosen):
            phases = continual_phases(name, scale, data, members=idx, seed=seed)
            model = train(build(scale, data, seed=seed, device=device), phases, seed=seed, device=device)
            out[f"{name}_acc"] = test_acc(model, data.test, device)
            out.update({f"{name}_{k}": v for k, v in membership_metrics(model, data.private, members, device=device,
                                                                         seed=seed).items()})
        if "plateau" in chosen:
            every = max(1, scale.switch // 3)
            model, sw, reason = plateau_switch_run(build(scale, data, seed=seed, device=device), data, scale,
                                                   members=idx, seed=seed, max_public=2 * scale.switch,
                                                   eval_every=every, device=device)
            out.update({"plateau_acc": test_acc(model, data.test, device), "plateau_switch": sw,
                        "plateau_reason": reason})
            out.update({f"plateau_{k}": v for k, v in membership_metrics(model, data.private, members,
                                                                          device=device, seed=seed).items()})
        out["sigma_scratch"] = sigma_for(scale, n=n, steps=t)
        return out

    return {"arm": "continual", "scale": scale.name, "seeds": list(scale.seeds), "n_members_mean": n_priv / 2,
            "per_seed": per_seed(scale, one, log)}


def trace_arm(scale: ArmScale, *, device="cpu", log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Per seed: tr(H) curves (step, value, standard error) of non-DP and DP pre-training from scratch and of DP
    fine-tuning from a model pre-trained without DP on the public images for ``source_steps``."""
    data = load_arm_data(scale, device=device)
    n = len(data.private)
    t = scale.trace_steps
    sigma = sigma_for(scale, n=n, steps=t)

    chosen = chosen_parts(scale, "trace_runs", TRACE_RUNS)

    def one(seed: int) -> dict[str, Any]:
        out: dict[str, Any] = {}

        def start(name: str) -> tuple[torch.nn.Module, float | None]:
            model = build(scale, data, seed=seed, device=device)
            if name == "finetune_dp":  # from this seed's public pre-trained model
                model = train(model, [phase("public", data.public, scale=scale, steps=scale.source_steps,
                                            sigma=None, seed=seed, index=0)], seed=seed, device=device)
            return model, (None if name == "pretrain_nondp" else sigma)

        for name in (r for r in TRACE_RUNS if r in chosen):
            model, sig = start(name)
            logger = TraceLogger(model, data, scale=scale, seed=seed, every=scale.hessian_every)
            logger.at_start(model)
            trained = train(model, [phase("private", data.private, scale=scale, steps=t, sigma=sig, seed=seed,
                                          index=1)], seed=seed, device=device, on_step=logger.on_step)
            out[f"{name}_trace"] = logger.rows
            out[f"{name}_acc"] = test_acc(trained, data.test, device)
        return out

    return {"arm": "trace", "scale": scale.name, "seeds": list(scale.seeds), "sigma": sigma,
            "per_seed": per_seed(scale, one, log)}
