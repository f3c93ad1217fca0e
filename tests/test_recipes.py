"""Training recipes, the parts: switch rules, budget splits, carried optimizer state, public/private overlap.

Whole runs: tests/test_recipe_runs.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from training.accounting import DPPhase, epsilon_for, noise_multiplier_for
from foundation.errors import ConfigError
from training.recipes.budget import sigma_for_remaining, split_budget, split_steps
from training.recipes.switch import Evaluation, SwitchRule, plateau_reached


# ------------------------------------------------------------------------------------------ switch rules


def _first_switch(rule: SwitchRule, values: dict[int, float] | None = None, limit: int = 1000) -> tuple[int, str]:
    """Drive ``rule`` like the trainer does: evaluate where asked, decide after every step."""
    evals: list[Evaluation] = []
    for step in range(limit + 1):
        if rule.evaluates_at(step):
            evals.append(Evaluation(step=step, value=values[step]))
        reason = rule.decide(step=step, evaluations=evals)
        if reason is not None:
            return step, reason
    raise AssertionError("the rule never switched")


def test_steps_rule_switches_at_its_step_and_max_caps_it():
    assert _first_switch(SwitchRule(kind="steps", switch_steps=37, max_public_steps=100)) == (37, "steps")
    assert _first_switch(SwitchRule(kind="steps", switch_steps=0, max_public_steps=100)) == (0, "steps")
    assert _first_switch(SwitchRule(kind="steps", switch_steps=370, max_public_steps=100)) == (100, "max_public_steps")


def test_plateau_rule_on_a_constructed_loss_sequence():
    # evaluations every 10 steps; best 1.0 at step 40, then 1.001 (not better by > min_delta), 0.995 (better by
    # 0.005 < 0.01: still no improvement), 1.2: third non-improving evaluation at step 70 -> switch there.
    losses = {10: 2.0, 20: 1.5, 30: 1.2, 40: 1.0, 50: 1.001, 60: 0.995, 70: 1.2, 80: 0.1}
    rule = SwitchRule(kind="plateau", eval_every=10, patience=3, min_delta=0.01, max_public_steps=1000)
    assert _first_switch(rule, losses) == (70, "plateau")
    rule2 = SwitchRule(kind="plateau", eval_every=10, patience=4, min_delta=0.01, max_public_steps=1000)
    assert _first_switch(rule2, losses | {90: 1.0, 100: 1.0, 110: 1.0, 120: 1.0}) == (120, "plateau")


def test_plateau_reached_against_a_naive_reference():
    rng = np.random.default_rng(0)
    for _ in range(300):
        values = [float(v) for v in np.round(rng.normal(size=rng.integers(0, 12)), 1)]
        patience, delta = int(rng.integers(1, 4)), float(rng.choice([0.0, 0.1]))
        # reference: index of the last value that beat everything before it by more than delta
        improved = [i for i in range(len(values)) if values[i] < min(values[:i], default=math.inf) - delta]
        ref = bool(improved) and len(values) - 1 - improved[-1] >= patience
        assert plateau_reached(values, patience=patience, min_delta=delta) == ref, (values, patience, delta)


def test_decelerator_rule_with_a_stubbed_trace():
    sigma, batch, clip = 2.0, 64, 1.0
    traces = {5: 400.0, 10: 300.0, 15: 100.0, 20: 10.0, 25: 5.0}  # stub tr(H) falling over training
    from training.hessian import decelerator

    values = {s: decelerator(sigma=sigma, trace_h=t, batch_size=batch, clip_norm=clip) for s, t in traces.items()}
    # values: 25, 18.75, 6.25, 0.625, 0.3125 -> first below 1.0 at step 20
    rule = SwitchRule(kind="decelerator", eval_every=5, threshold=1.0, max_public_steps=100)
    assert _first_switch(rule, values) == (20, "decelerator")
    rule = SwitchRule(kind="decelerator", eval_every=5, threshold=0.1, max_public_steps=30)
    assert _first_switch(rule, values | {30: 0.0}) == (30, "max_public_steps")


def test_decelerator_rule_ignores_negative_curvature_and_switches_on_zero_noise():
    """tr(H) < 0 (as at initialisation: the gpu_full runs' held-out tr(H) is -6,502 at step 0) makes the decelerator
    negative; that is not 'noise is harmless', so it must not switch. σ = 0 gives exactly 0: switch."""
    from training.hessian import decelerator

    traces = {5: -6502.0, 10: -40.0, 15: 300.0, 20: 10.0}
    values = {s: decelerator(sigma=2.0, trace_h=t, batch_size=64, clip_norm=1.0) for s, t in traces.items()}
    assert values[5] < 0 < 1.0 < values[15]
    rule = SwitchRule(kind="decelerator", eval_every=5, threshold=1.0, max_public_steps=100)
    assert _first_switch(rule, values) == (20, "decelerator")  # not at 5 or 10, where the value is negative
    zero = {s: decelerator(sigma=0.0, trace_h=t, batch_size=64, clip_norm=1.0) for s, t in traces.items()}
    assert math.copysign(1.0, zero[5]) == -1.0  # 0 × a negative trace is -0.0, which still counts as 0
    assert _first_switch(rule, zero) == (5, "decelerator")


def test_switch_rule_validation():
    with pytest.raises(ValueError, match="kind"):
        SwitchRule(kind="never", max_public_steps=1)
    with pytest.raises(ValueError, match="eval_every"):
        SwitchRule(kind="plateau", max_public_steps=1, eval_every=0)
    with pytest.raises(ValueError, match="threshold"):
        SwitchRule(kind="decelerator", max_public_steps=1, threshold=0.0)
    with pytest.raises(ValueError, match="patience"):
        SwitchRule(kind="plateau", max_public_steps=1, patience=0)
    e = Evaluation(step=3, value=0.5, extra=(("trace_h", 2.0),))
    assert Evaluation.from_dict(e.as_dict()) == e


# ------------------------------------------------------------------------------------------ budget split


def test_split_steps_bounds():
    assert split_steps(100, 0.3) == (30, 70)
    assert split_steps(2, 0.9) == (1, 1)
    with pytest.raises(ConfigError):
        split_steps(1, 0.5)


def test_steps_split_uses_one_sigma_calibrated_for_all_steps():
    q, T, delta = 0.05, 60, 1e-5
    plan = split_budget(strategy="lp_fft", split_by="steps", lp_fraction=0.5, total_steps=T, sample_rate=q,
                        delta=delta, accountant="rdp", target_epsilon=4.0)
    assert [(p.name, p.steps) for p in plan] == [("lp", 30), ("fft", 30)]
    assert plan[0].noise_multiplier == plan[1].noise_multiplier == noise_multiplier_for(
        target_epsilon=4.0, sample_rate=q, steps=T, delta=delta, accountant="rdp")
    eps = epsilon_for(phases=[p.dp_phase(q) for p in plan], delta=delta, accountant="rdp")
    assert 4.0 - 0.011 <= eps <= 4.0


@pytest.mark.parametrize("fraction", [0.25, 0.75])
def test_epsilon_split_gives_lp_its_share_and_composes_to_the_target(fraction):
    q, T, delta, target = 0.05, 40, 1e-5, 3.0
    plan = split_budget(strategy="lp_fft", split_by="epsilon", lp_fraction=fraction, total_steps=T, sample_rate=q,
                        delta=delta, accountant="rdp", target_epsilon=target, lp_steps_fraction=0.5)
    lp, fft = plan
    assert (lp.steps, fft.steps) == (20, 20)
    eps_lp = epsilon_for(phases=[lp.dp_phase(q)], delta=delta, accountant="rdp")
    assert fraction * target - 0.011 <= eps_lp <= fraction * target
    total = epsilon_for(phases=[lp.dp_phase(q), fft.dp_phase(q)], delta=delta, accountant="rdp")
    assert target - 0.011 <= total <= target
    # a larger LP share leaves less for FFT: more noise there
    other = split_budget(strategy="lp_fft", split_by="epsilon", lp_fraction=1 - fraction, total_steps=T,
                         sample_rate=q, delta=delta, accountant="rdp", target_epsilon=target, lp_steps_fraction=0.5)
    assert (fft.noise_multiplier < other[1].noise_multiplier) == (fraction < 0.5)


def test_budget_split_errors():
    common = dict(total_steps=10, sample_rate=0.1, delta=1e-5, accountant="rdp")
    with pytest.raises(ConfigError, match="target_epsilon"):
        split_budget(strategy="lp_fft", split_by="epsilon", lp_fraction=0.5, noise_multiplier=1.0, **common)
    with pytest.raises(ConfigError, match="exactly one"):
        split_budget(strategy="fft", split_by="steps", lp_fraction=0.5, **common)
    lp = DPPhase(noise_multiplier=0.3, sample_rate=0.1, steps=10)
    with pytest.raises(ConfigError, match="lp_fraction"):
        sigma_for_remaining(first=lp, steps=10, sample_rate=0.1, target_epsilon=1.0, delta=1e-5, accountant="rdp")
    single = split_budget(strategy="lp", split_by="epsilon", lp_fraction=0.5, noise_multiplier=1.5, **common)
    assert [(p.name, p.steps, p.noise_multiplier) for p in single] == [("lp", 10, 1.5)]
    assert math.isfinite(single[0].noise_multiplier)


# ---------------------------------------------------------------------------------------- optimizer carry


def _adam_with_state(shapes: dict[str, tuple[int, ...]]) -> tuple[torch.optim.Optimizer, list[str]]:
    params = [torch.nn.Parameter(torch.ones(s)) for s in shapes.values()]
    opt = torch.optim.AdamW(params, lr=0.1)
    for p in params:
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    return opt, list(shapes)


def test_carry_optimizer_state_by_name_and_mode():
    from training.phases import carry_optimizer_state

    old, old_names = _adam_with_state({"a": (2,), "head.weight": (3, 2), "b": (4,)})
    new_params = [torch.nn.Parameter(torch.zeros(s)) for s in [(4,), (5, 2), (2,)]]
    new = torch.optim.AdamW(new_params, lr=0.01)
    names = ["b", "head.weight", "a"]  # other order; head has another shape (other classes)
    keep = carry_optimizer_state(old.state_dict(), old_names, target=new, target_names=names, mode="keep")
    assert sorted(keep["state"]) == [0, 2]  # b and a moved, the reshaped head starts fresh
    assert torch.equal(keep["state"][0]["exp_avg"], old.state_dict()["state"][2]["exp_avg"])
    assert torch.equal(keep["state"][2]["exp_avg_sq"], old.state_dict()["state"][0]["exp_avg_sq"])
    assert keep["param_groups"][0]["lr"] == 0.01  # the new phase's hyper-parameters
    first = carry_optimizer_state(old.state_dict(), old_names, target=new, target_names=names, mode="reset_first")
    assert not first["state"][0]["exp_avg"].any() and first["state"][0]["exp_avg_sq"].gt(0).all()
    both = carry_optimizer_state(old.state_dict(), old_names, target=new, target_names=names, mode="reset_both")
    assert both["state"] == {}
    new.load_state_dict(keep)  # loads
    with pytest.raises(ValueError, match="target_names"):
        carry_optimizer_state(old.state_dict(), old_names, target=new, target_names=["a"], mode="keep")


def test_public_images_equal_to_private_ones_are_dropped():
    from training.config import DataConfig
    from training.data import load_pool
    from training.recipes.public import load_public, overlap_mask

    private = load_pool(DataConfig(dataset="digits", pool_size=300, pool_seed=0))
    public = load_public(DataConfig(dataset="digits", pool_size=300, pool_seed=1, audit_split=False),
                         private=private)
    assert public.dropped > 0 and len(public.train) == 300 - public.dropped
    assert not overlap_mask(public.train.x, private.x).any()
