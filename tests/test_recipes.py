"""Training recipes: switch rules, budget splits, continual pre-training and fine-tuning runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from training.accounting import DPPhase, epsilon_for, noise_multiplier_for
from training.errors import ConfigError
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


# -------------------------------------------------------------------------------------------- full runs

from training.config import TrainConfig  # noqa: E402

BASE = {"data": {"dataset": "digits", "pool_size": 240}, "model": {"arch": "small_cnn"},
        "privacy": {"noise_multiplier": 1.0, "accountant": "rdp"}, "optim": {"name": "adamw", "lr": 0.003},
        "training": {"steps": 6, "batch_size": 24, "progress": False, "log_every": 2, "checkpoint_every": 2}}
PUBLIC = {"dataset": "digits", "pool_size": 200, "pool_seed": 7, "audit_split": False, "test_size": 60}


def _cfg(**updates) -> TrainConfig:
    from training.config import apply_overrides

    return TrainConfig.model_validate(apply_overrides(BASE, updates))


def _continual(**updates) -> TrainConfig:
    return _cfg(**{"training.recipe": "continual_pretrain", "training.continual.public": PUBLIC,
                   "training.continual.switch_steps": 4, **updates})


def _weights(run_dir) -> dict[str, torch.Tensor]:
    from training.io import load_safetensors

    return load_safetensors(run_dir / "model.safetensors")


def test_continual_manifest_lists_both_phases_and_accounts_only_the_private_one(tmp_path):
    from training.trainer import train

    res = train(_continual(), run_dir=tmp_path / "run")
    phases = res.manifest.privacy.phases
    assert [(p.name, p.dp, p.steps, p.dataset) for p in phases] == [("public", False, 4, "digits"),
                                                                    ("private", True, 6, "digits")]
    assert phases[0].noise_multiplier is None and phases[0].epsilon is None
    private = phases[1]
    expected = epsilon_for(phases=[DPPhase(noise_multiplier=1.0, sample_rate=private.sample_rate, steps=6)],
                           delta=res.manifest.privacy.delta, accountant="rdp")
    assert res.manifest.privacy.epsilon == pytest.approx(expected, rel=1e-12)
    assert res.metrics["continual"]["switch_step"] == 4 and res.metrics["continual"]["switch_reason"] == "steps"
    assert [h["phase"] for h in res.metrics["history"]] == ["public", "public", "private", "private", "private"]


def test_continual_sigma_is_calibrated_for_the_private_steps_alone(tmp_path):
    from training.trainer import train

    cfg = _continual(**{"privacy": {"target_epsilon": 3.0, "accountant": "rdp"},
                        "training.continual.count_public_steps": True, "training.steps": 10})
    res = train(cfg, run_dir=tmp_path / "run")
    public, private = res.manifest.privacy.phases
    assert (public.steps, private.steps) == (4, 6)  # the private phase gets what the public phase left
    sigma = noise_multiplier_for(target_epsilon=3.0, sample_rate=private.sample_rate, steps=6,
                                 delta=res.manifest.privacy.delta, accountant="rdp")
    assert private.noise_multiplier == pytest.approx(sigma)
    assert 3.0 - 0.011 <= res.manifest.privacy.epsilon <= 3.0


@pytest.mark.parametrize("rule", [
    {"training.continual.switch": "decelerator", "training.continual.decelerator_threshold": 1e9},
    {"training.continual.switch": "decelerator", "training.continual.decelerator_threshold": 1e-9},
])
def test_decelerator_switch_in_a_run(tmp_path, rule):
    from training.trainer import train

    cfg = _continual(**{"training.continual.eval_every": 2, "training.continual.max_public_steps": 5,
                        "training.hessian.probes": 2, "training.hessian.batch_size": 32, **rule})
    res = train(cfg, run_dir=tmp_path / "run")
    c = res.metrics["continual"]
    if rule["training.continual.decelerator_threshold"] > 1:
        assert (c["switch_step"], c["switch_reason"]) == (2, "decelerator")  # the first evaluation is below
    else:
        assert (c["switch_step"], c["switch_reason"]) == (5, "max_public_steps")
        assert [e["step"] for e in c["evaluations"]] == [2, 4]
    ev = c["evaluations"][0]
    assert ev["value"] == pytest.approx(ev["sigma"] ** 2 * ev["trace_h"] / 24)


@pytest.mark.parametrize("stop", [2, 4, 7])  # before, exactly at, and after the switch at step 4
def test_resume_across_the_switch_equals_an_uninterrupted_run(tmp_path, stop):
    from training.trainer import train

    cfg = _continual(**{"training.continual.optimizer_state": "reset_first", "training.checkpoint_every": 100})
    full = train(cfg, run_dir=tmp_path / "full")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run_dir=tmp_path / "cut", stop_after=stop)
    resumed = train(cfg, run_dir=tmp_path / "cut", resume=True)
    assert resumed.resumed_from == stop
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.manifest.privacy.epsilon == full.manifest.privacy.epsilon
    assert resumed.metrics["continual"]["switch_step"] == 4
    assert [h["step"] for h in resumed.metrics["history"]] == [h["step"] for h in full.metrics["history"]]


def test_plateau_rule_resume_keeps_its_evaluations(tmp_path):
    from training.trainer import train

    cfg = _continual(**{"training.continual.switch": "plateau", "training.continual.eval_every": 1,
                        "training.continual.plateau_patience": 1, "training.continual.plateau_min_delta": 10.0,
                        "training.continual.max_public_steps": 6})
    full = train(cfg, run_dir=tmp_path / "full")
    # min_delta 10: nothing after the first evaluation counts as an improvement -> switch at the second one
    assert (full.metrics["continual"]["switch_step"], full.metrics["continual"]["switch_reason"]) == (2, "plateau")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, run_dir=tmp_path / "cut", stop_after=1)
    resumed = train(cfg, run_dir=tmp_path / "cut", resume=True)
    assert resumed.metrics["continual"]["evaluations"] == full.metrics["continual"]["evaluations"]
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_hessian_logging_in_a_standard_run(tmp_path):
    from training.trainer import train

    cfg = _cfg(**{"training.hessian": {"every": 3, "probes": 2, "batch_size": 16}})
    res = train(cfg, run_dir=tmp_path / "run")
    rows = {h["step"]: h for h in res.metrics["history"]}
    assert sorted(s for s, h in rows.items() if "trace_h" in h) == [0, 3, 6]  # at init, then every 3 steps
    q = 24 / res.manifest.data.membership.n_members
    row = rows[3]
    assert row["decelerator"] == pytest.approx(1.0 ** 2 * row["trace_h"] / 24)
    assert math.isfinite(row["trace_h_stderr"]) and q > 0
    assert any(p.name.startswith("events") for p in (tmp_path / "run" / "tb").iterdir())
    with pytest.raises(ConfigError, match="held-out"):
        train(_cfg(**{"data.test_split": None, "training.hessian.every": 2}), run_dir=tmp_path / "none")


def test_every_arm_measures_trace_h_on_the_same_held_out_test_batch(tmp_path):
    """Continual and from-scratch arms (and every seed) use one fixed batch of test images for tr(H): at step 0 the
    same initial weights give the same estimate (same images, same probes), the public images are never used."""
    from training.recipes.common import make_monitor
    from training.trainer import train

    hc = {"training.hessian": {"every": 3, "probes": 3, "batch_size": 16}}
    scratch = train(_cfg(**hc), run_dir=tmp_path / "scratch")
    continual = train(_continual(**hc), run_dir=tmp_path / "continual")
    first = [next(h for h in r.metrics["history"] if "trace_h" in h) for r in (scratch, continual)]
    assert first[0]["step"] == first[1]["step"] == 0
    assert first[0]["trace_h"] == first[1]["trace_h"] and math.isfinite(first[0]["trace_h_stderr"])
    from training.data import load_test

    test = load_test(_cfg().data)
    model = torch.nn.Linear(1, 1)
    a, b = (make_monitor(_cfg(**hc, **{"training.seed": s}), model, test, sigma=None, batch_size=1,
                         device=torch.device("cpu"), what="t") for s in (0, 5))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    """A small non-DP checkpoint to fine-tune from."""
    from training.trainer import train

    run = tmp_path_factory.mktemp("src") / "run"
    train(_cfg(**{"privacy": {"enabled": False}, "training.steps": 8}), run_dir=run)
    return run


def _finetune(source, **updates) -> TrainConfig:
    return _cfg(**{"training.recipe": "finetune", "training.finetune.checkpoint": str(source),
                   "data.pool_seed": 3, **updates})


def test_dp_lp_leaves_the_backbone_bit_identical(tmp_path, source_run):
    from training.io import load_safetensors
    from training.trainer import train

    res = train(_finetune(source_run, **{"training.finetune.strategy": "lp",
                                         "training.finetune.head_init": "random"}), run_dir=tmp_path / "lp")
    src, out = load_safetensors(source_run / "model.safetensors"), _weights(tmp_path / "lp")
    head = set(res.metrics["finetune"]["head_parameters"])
    assert head and set(src) == set(out)
    assert all(torch.equal(src[k], out[k]) for k in src if k not in head)
    init = load_safetensors(tmp_path / "lp" / "model_init.safetensors")
    assert any(not torch.equal(init[k], out[k]) for k in head)  # the head did train
    assert set(res.manifest.model.frozen) == set(src) - head
    assert res.manifest.model.trainable_param_count == sum(out[k].numel() for k in head)


def test_lp_fft_epsilon_split_composes_phases_with_different_sigma(tmp_path, source_run):
    from training.trainer import train

    cfg = _finetune(source_run, **{"privacy": {"target_epsilon": 2.0, "accountant": "rdp"},
                                   "training.finetune.strategy": "lp_fft", "training.finetune.split_by": "epsilon",
                                   "training.finetune.lp_fraction": 0.3, "training.finetune.head_init": "zero"})
    res = train(cfg, run_dir=tmp_path / "lpfft")
    lp, fft = res.manifest.privacy.phases
    assert (lp.name, fft.name, lp.steps, fft.steps) == ("lp", "fft", 2, 4)
    assert lp.noise_multiplier != fft.noise_multiplier
    composed = epsilon_for(phases=[DPPhase(noise_multiplier=p.noise_multiplier, sample_rate=p.sample_rate,
                                           steps=p.steps) for p in (lp, fft)],
                           delta=res.manifest.privacy.delta, accountant="rdp")
    assert res.manifest.privacy.epsilon == pytest.approx(composed, rel=1e-12)
    assert 2.0 - 0.011 <= composed <= 2.0
    assert 0.6 - 0.011 <= lp.epsilon <= 0.6  # LP alone gets its 30 %
    assert lp.epsilon + fft.epsilon > composed  # composition is sub-additive: not a sum


@pytest.mark.parametrize("head_init", ["random", "zero"])
def test_finetune_recipe_is_the_one_loop_called_directly(tmp_path, source_run, head_init):
    """The recipe's run directory holds what the in-memory loop gives for the same start, plan and seed."""
    from training.run import open_run
    from training.io import load_safetensors
    from training.pool import build_pool
    from training.recipes.budget import PhaseBudget
    from training.recipes.finetune import finetune, finetune_phases, head_seed, new_head
    from training.trainer import train

    cfg = _finetune(source_run, **{"training.finetune.strategy": "lp_fft", "training.finetune.head_init": head_init,
                                   "training.finetune.lp_lr": 0.01, "training.physical_batch_size": 10,
                                   "training.seed": 5})
    run = tmp_path / "ft"
    res = train(cfg, run_dir=run)

    model = open_run(source_run, verify=False).model()
    pool = build_pool(cfg)
    head = new_head(model.train(), len(pool.images.classes), init=head_init,
                    seed=head_seed(cfg.training.seed))
    init = load_safetensors(run / "model_init.safetensors")
    assert all(torch.equal(init[k], v) for k, v in model.state_dict().items())
    plan = [PhaseBudget(name=p.name, steps=p.steps, noise_multiplier=p.noise_multiplier)
            for p in res.manifest.privacy.phases]
    assert [b.name for b in plan] == ["lp", "fft"]
    phases = finetune_phases(plan, head=head, backbone=[n for n, _ in model.named_parameters()], x=pool.images.x,
                             y=pool.images.y, index=np.flatnonzero(np.load(run / "membership.npy")),
                             dataset="digits", batch_size=cfg.training.batch_size, privacy=cfg.privacy,
                             optim=cfg.optim, lp_optim=cfg.optim.model_copy(update={"lr": 0.01}),
                             seed=cfg.training.seed)
    out = finetune(model, phases, seed=cfg.training.seed, device="cpu", physical_batch_size=10)
    final = _weights(run)
    assert set(final) == set(out.model.state_dict())
    assert all(torch.equal(final[k], v) for k, v in out.model.state_dict().items())
    assert [c["steps"] for c in out.completed] == [b.steps for b in plan]


def test_head_init_zero_and_keep_rules(tmp_path, source_run):
    from training.io import load_safetensors
    from training.trainer import train

    res = train(_finetune(source_run, **{"training.finetune.strategy": "fft",
                                         "training.finetune.head_init": "zero"}), run_dir=tmp_path / "zero")
    init = load_safetensors(tmp_path / "zero" / "model_init.safetensors")
    assert all(not init[k].any() for k in res.metrics["finetune"]["head_parameters"])
    keep = train(_finetune(source_run, **{"training.finetune.strategy": "fft",
                                          "training.finetune.head_init": "keep"}), run_dir=tmp_path / "keep")
    src = load_safetensors(source_run / "model.safetensors")
    init = load_safetensors(tmp_path / "keep" / "model_init.safetensors")
    assert all(torch.equal(src[k], init[k]) for k in src)  # everything, the head included, starts as the source
    assert keep.manifest.model.arch == "small_cnn"
    rng = np.random.default_rng(0)  # a 3-class task: the checkpoint's 10-class head cannot be kept
    np.savez(tmp_path / "train.npz", x=rng.integers(0, 256, (60, 8, 8, 3), dtype=np.uint8), y=np.arange(60) % 3)
    three = {"data": {"dataset": "npz", "root": str(tmp_path / "train.npz"), "test_split": None}}
    with pytest.raises(ConfigError, match="keep"):
        train(_finetune(source_run, **three, **{"training.finetune.head_init": "keep"}), run_dir=tmp_path / "k3")
    new = train(_finetune(source_run, **three, **{"training.finetune.strategy": "lp"}), run_dir=tmp_path / "z3")
    assert new.manifest.model.num_classes == 3


@pytest.mark.parametrize("updates, pattern", [
    ({"training.continual.switch": "plateau", "training.continual.public": {**PUBLIC, "test_split": None}},
     "public validation"),
    ({"training.continual.switch": "decelerator", "privacy": {"enabled": False}}, "privacy.enabled"),
    ({"training.continual.count_public_steps": True, "training.continual.switch_steps": 6}, "counts the public"),
    ({"training.continual.public_batch_size": 10_000}, "public batch"),
])
def test_continual_config_errors_are_one_line_user_errors(tmp_path, updates, pattern):
    from training.trainer import train

    with pytest.raises(ConfigError, match=pattern):
        train(_continual(**updates), run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_finetune_needs_a_checkpoint(tmp_path):
    from training.errors import CheckpointError
    from training.trainer import train

    with pytest.raises(ConfigError, match="checkpoint"):
        train(_cfg(**{"training.recipe": "finetune"}), run_dir=tmp_path / "a")
    with pytest.raises(CheckpointError, match="does not exist"):
        train(_finetune(tmp_path / "nope"), run_dir=tmp_path / "b")
