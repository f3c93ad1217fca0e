"""Training recipes, whole runs: continual pre-training (phases, switch in a run, resume across it, tr(H)) and
fine-tuning (LP, LP-FFT, head init) through the trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from training.accounting import DPPhase, epsilon_for, noise_multiplier_for
from foundation.errors import ConfigError
from training.config import TrainConfig

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
    from foundation.io import load_safetensors

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
    from foundation.io import load_safetensors
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


def test_lp_fft_under_bk_trains_what_hooks_trains(tmp_path, source_run):
    """The fine-tuning table at `gpu_full` runs under bk on the CPU: an LP-FFT run (frozen backbone, then all
    parameters) gives the hooks run's weights to rounding, with the same phases, σ and ε."""
    from training.trainer import train

    res, out = {}, {}
    for mode in ("hooks", "bk"):
        cfg = _finetune(source_run, **{"privacy": {"target_epsilon": 4.0, "accountant": "rdp",
                                                   "grad_sample_mode": mode},
                                       "training.finetune.strategy": "lp_fft", "training.finetune.lp_fraction": 0.5,
                                       "training.finetune.head_init": "random", "training.seed": 2})
        res[mode] = train(cfg, run_dir=tmp_path / mode)
        out[mode] = _weights(tmp_path / mode)
    (ph, pb) = (r.manifest.privacy for r in res.values())
    assert [(p.name, p.steps, p.noise_multiplier) for p in ph.phases] == \
        [(p.name, p.steps, p.noise_multiplier) for p in pb.phases]
    assert ph.epsilon == pb.epsilon
    src = _weights(source_run)
    assert any(not torch.allclose(src[k], out["bk"][k]) for k in src if k in out["bk"])  # the backbone trained
    for k, v in out["hooks"].items():
        torch.testing.assert_close(out["bk"][k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("head_init", ["random", "zero"])
def test_finetune_recipe_is_the_one_loop_called_directly(tmp_path, source_run, head_init):
    """The recipe's run directory holds what the in-memory loop gives for the same start, plan and seed."""
    from training.run import open_run
    from foundation.io import load_safetensors
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
    from foundation.io import load_safetensors
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
    from foundation.errors import CheckpointError
    from training.trainer import train

    with pytest.raises(ConfigError, match="checkpoint"):
        train(_cfg(**{"training.recipe": "finetune"}), run_dir=tmp_path / "a")
    with pytest.raises(CheckpointError, match="does not exist"):
        train(_finetune(tmp_path / "nope"), run_dir=tmp_path / "b")
