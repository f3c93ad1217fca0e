"""The seed-paper arms (experiments.arms) on tiny digits scales: each arm's defining invariant, in seconds."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from experiments.arms import ArmScale
from experiments.arms.common import build, load_arm_data, phase, train

TINY = ArmScale(name="tiny", dataset="digits", root=None, downstream="digits", downstream_root=None, private=120,
                public=60, val=40, test=60, batch_size=20, steps=6, switch=2, source_steps=4, public_steps=(0, 2, 4),
                seeds=(0,), hessian_batch=32, hessian_probes=2, hessian_every=3, trace_steps=6, knn_every=3,
                barrier_points=3, lp_fractions=(0.25, 0.5), noise_multiplier=1.0, accountant="rdp")


@pytest.fixture(scope="module")
def data():
    return load_arm_data(TINY)


def test_arm_data_is_disjoint_and_the_hessian_batch_is_fixed(data):
    from training.recipes.public import overlap_mask

    assert (len(data.private), len(data.public), len(data.val)) == (120, 60, 40)
    assert not overlap_mask(data.public.x, data.private.x).any() and not overlap_mask(data.val.x, data.private.x).any()
    again = load_arm_data(TINY.with_(seeds=(5,)))
    assert torch.equal(again.hessian_x, data.hessian_x)



def test_arm_splits_mix_classes_of_a_file_sorted_by_class(tmp_path):
    """Food-101's arrays are sorted by class: an index split would give the val set classes never trained on."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 300), ("test", 50)):
        np.savez(tmp_path / f"{split}.npz", x=rng.integers(0, 255, (n, 8, 8, 3), dtype=np.uint8),
                 y=np.repeat(np.arange(10), n // 10).astype(np.int64))
    d = load_arm_data(TINY.with_(dataset="npz", root=str(tmp_path)))
    assert all(len(np.unique(s.y)) == 10 for s in (d.private, d.public, d.val))


def test_sigma_zero_phase_clips_but_adds_no_noise(data):
    """The clipping-only arm: a DP step with σ = 0 reports noise std 0 (and clips), σ = 1 does not."""
    seen = {}
    for sigma in (0.0, 1.0):
        stats = []
        train(build(TINY, data, seed=0), [phase("private", data.private, scale=TINY.with_(clip=1e-3), steps=3,
                                                sigma=sigma, seed=0, index=0)],
              seed=0, on_step=lambda g, n, s, m: stats.append(s))
        seen[sigma] = stats
    assert all(s.noise_std == 0.0 for s in seen[0.0]) and all(s.noise_std > 0 for s in seen[1.0])
    assert all(s.clipped_fraction > 0.9 for s in seen[0.0])


@pytest.mark.parametrize("min_delta, patience, expected",
                         [(1e6, 1, (2, "plateau")), (0.0, 50, (4, "max_public_steps"))])
def test_plateau_switch_run_switches_as_specified(data, min_delta, patience, expected):
    from experiments.arms.bu import plateau_switch_run

    members = np.arange(0, 120, 2)
    _, step, reason = plateau_switch_run(build(TINY, data, seed=0), data, TINY, members=members, seed=0,
                                         max_public=4, eval_every=1, patience=patience, min_delta=min_delta)
    # min_delta huge: nothing after the first evaluation improves -> switch at the second one; else the cap
    assert (step, reason) == expected


def test_continual_arm_reports_every_arm_with_membership_metrics():
    from experiments.arms.bu import continual_arm

    res = continual_arm(TINY)["per_seed"]
    for arm in ("nondp", "clip_only", "scratch", "continual", "plateau"):
        acc, auc = res[f"{arm}_acc"][0], res[f"{arm}_loss_auc"][0]
        lo, hi = res[f"{arm}_loss_auc_lo"][0], res[f"{arm}_loss_auc_hi"][0]
        assert 0 <= acc <= 1 and lo <= auc <= hi
    assert 1 <= res["plateau_switch"][0] <= 2 * TINY.switch


def test_trace_arm_measures_every_arm_on_the_same_batch():
    from experiments.arms.bu import trace_arm

    res = trace_arm(TINY)["per_seed"]
    rows = {k: res[f"{k}_trace"][0] for k in ("pretrain_nondp", "pretrain_dp", "finetune_dp")}
    assert [r["step"] for r in rows["pretrain_dp"]] == [0, 3, 6]
    assert all(math.isfinite(r["trace_h_stderr"]) for rs in rows.values() for r in rs)
    # same initial weights, same held-out images, same probes -> the same number at step 0
    assert rows["pretrain_nondp"][0]["trace_h"] == rows["pretrain_dp"][0]["trace_h"]
    assert rows["finetune_dp"][0]["trace_h"] != rows["pretrain_dp"][0]["trace_h"]


def test_trace_arm_under_bk_measures_what_it_measures_under_hooks():
    """A scale's DP steps by book-keeping (gpu_full's since its tr(H) arm was part-way): the same clipped sums
    and noise, so the DP runs' tr(H) curves and accuracies agree with the hooks run's to rounding."""
    from experiments.arms.bu import trace_arm

    runs = {m: trace_arm(TINY.with_(grad_sample_mode=m, clip=0.05))["per_seed"] for m in ("hooks", "bk")}
    for k in ("pretrain_dp", "finetune_dp"):
        a, b = runs["hooks"][f"{k}_trace"][0], runs["bk"][f"{k}_trace"][0]
        assert [r["step"] for r in a] == [r["step"] for r in b]
        np.testing.assert_allclose([r["trace_h"] for r in a], [r["trace_h"] for r in b], rtol=1e-3, atol=1e-3)
        assert a[-1]["trace_h"] != a[0]["trace_h"]  # the DP steps moved the model
        assert runs["hooks"][f"{k}_acc"] == runs["bk"][f"{k}_acc"]


def test_ke_arm_equal_backbone_start_and_validation_selection():
    from experiments.arms.ke import ke_arm

    res = ke_arm(TINY)
    per = res["per_seed"]
    # every head init starts from the same backbone: kNN quality of the features at step 0 is identical
    first = {k: per[f"{k}_knn_curve"][0][0]["knn"] for k in ("random", "zero", "lp_aligned")}
    assert len(set(first.values())) == 1
    keys = ["lpfft25", "lpfft50"]
    assert per["selected_split"][0] == max(keys, key=lambda k: per[f"{k}_val"][0])
    assert per["lp_aligned_knn_curve"][0][-1]["step"] == res["lp_steps"] + res["fft_steps"]


def test_ke_lp_part_trains_the_head_alone_for_lp_ffts_total_steps(monkeypatch):
    """DP-LP, the other end of Ke et al.'s comparison: one phase, the head's parameters only, as many DP steps
    as LP-FFT (LP then FFT), at the σ of the whole ε for those steps."""
    import experiments.arms.ke as ke
    from experiments.arms.common import head_names, sigma_for

    specs = []
    real_train = ke.train
    monkeypatch.setattr(ke, "train", lambda *a, **k: specs.append(list(a[1])) or real_train(*a, **k))
    res = ke.ke_arm(TINY.with_(ke_parts=("lp",)))
    (source,), (spec,) = specs  # the source's public phase, then the one DP-LP phase
    assert source.name == "public" and spec.name == "lp"
    assert spec.steps == res["lp_steps"] + res["fft_steps"] and spec.dp
    assert spec.sigma == sigma_for(TINY, n=TINY.private, steps=spec.steps)
    down = load_arm_data(TINY, downstream=True)
    assert set(spec.trainable) == set(head_names(build(TINY, down, seed=0)))
    assert {"lp_acc", "lp_val"} <= set(res["per_seed"]) and "random_acc" not in res["per_seed"]


def test_loss_barrier_and_interpolation():
    from experiments.arms.ganesh import barrier_curve, interpolate, loss_barrier

    a, b = {"w": torch.tensor([-1.0]), "n": torch.tensor(3)}, {"w": torch.tensor([1.0]), "n": torch.tensor(4)}
    assert torch.equal(interpolate(a, b, 0.0)["w"], a["w"]) and torch.equal(interpolate(a, b, 1.0)["w"], b["w"])
    assert int(interpolate(a, b, 0.7)["n"]) == 3
    alphas, losses = barrier_curve(lambda s: float((s["w"] ** 2 - 1) ** 2), a, b, points=11)
    assert loss_barrier(alphas, losses) == pytest.approx(1.0)  # the double well: 1 at w = 0
    alphas, losses = barrier_curve(lambda s: float(s["w"] ** 2), a, b, points=11)
    assert loss_barrier(alphas, losses) == pytest.approx(0.0, abs=1e-12)  # convex: never above the chord
    with pytest.raises(ValueError):
        loss_barrier([0.0, 0.6, 0.5, 1.0], [1, 2, 3, 4])
    with pytest.raises(ValueError):
        interpolate(a, {"w": torch.zeros(2), "n": torch.tensor(1)}, 0.5)


def test_ganesh_arm_sweeps_public_budgets_and_measures_both_barriers():
    from experiments.arms.ganesh import ganesh_arm

    res = ganesh_arm(TINY)
    per = res["per_seed"]
    assert res["budgets"] == [0, 2, 4] and all(f"public{k}_acc" in per for k in (0, 2, 4))
    for name in ("same_public", "random", "same_random"):
        curve = per[f"barrier_{name}_curve"][0]
        assert len(curve) == TINY.barrier_points and per[f"barrier_{name}"][0] >= 0
    assert 0 <= per["nondp_public0_acc"][0] <= 1 and 0 <= per["nondp_public4_acc"][0] <= 1


def test_downstream_sizes_give_private_and_val_only():
    d = load_arm_data(TINY.with_(downstream_private=50, downstream_val=30), downstream=True)
    assert (len(d.private), len(d.public), len(d.val)) == (50, 0, 30)
    same = load_arm_data(TINY, downstream=True)  # without them: the pre-training sizes, as before
    assert (len(same.private), len(same.public), len(same.val)) == (120, 60, 40)


def test_per_seed_parts_merge_to_the_all_seeds_run(tmp_path, monkeypatch):
    """`experiments arms merge`: one job per seed, joined, equals one job over all seeds."""
    from experiments.arms import runner

    from experiments.arms.ganesh import ganesh_arm

    two = TINY.with_(name="tiny2", seeds=(0, 1))
    monkeypatch.setattr(runner, "OUT", tmp_path)
    monkeypatch.setitem(runner.SCALES, "tiny2", two)
    whole = ganesh_arm(two)
    for s in (1, 0):
        runner.run_arm("ganesh", "tiny2", s)
    merged = runner.merge("ganesh", "tiny2")
    assert merged["seeds"] == [0, 1] and merged["scale_settings"]["seeds"] == [0, 1]
    for k, v in whole["per_seed"].items():
        assert np.allclose(np.asarray(merged["per_seed"][k], float), np.asarray(v, float)), k
    assert (tmp_path / "tiny2" / "ganesh.json").is_file()


def test_scale_augmentation_reaches_every_phase_and_changes_training():
    """ArmScale.augment puts the crop-and-flip in every phase (DP ones too) unless a phase names its own, and it
    changes what a seeded run learns while repeating exactly for the same seed."""
    from experiments.arms.common import CROP_FLIP

    data = load_arm_data(TINY)
    aug = TINY.with_(augment=True)
    for sigma in (None, 0.0, 1.0):
        assert phase("p", data.private, scale=aug, steps=2, sigma=sigma, seed=0, index=0).training.augment == CROP_FLIP
        assert phase("p", data.private, scale=TINY, steps=2, sigma=sigma, seed=0, index=0).training is None

    def weights(scale):
        model = train(build(scale, data, seed=0), [phase("p", data.private, scale=scale, steps=3, sigma=1.0, seed=0,
                                                         index=0)], seed=0)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    a, b, plain = weights(aug), weights(aug), weights(TINY)
    assert torch.equal(a, b) and not torch.allclose(a, plain)


def test_grad_sample_mode_reaches_the_dp_phases_and_bk_trains_the_hooks_model(data):
    """``ArmScale.grad_sample_mode`` sets the DP phases' mode (non-DP phases have none); bk's clipped sums equal
    the per-example ones, so the same seed trains the same weights (the noise draws are shared)."""
    bk = TINY.with_(grad_sample_mode="bk", clip=0.05)  # a small clip: every example is clipped
    spec = phase("private", data.private, scale=bk, steps=3, sigma=1.0, seed=0, index=0)
    assert spec.privacy.grad_sample_mode == "bk"
    assert phase("p", data.public, scale=bk, steps=3, sigma=None, seed=0, index=0).privacy.enabled is False
    weights = {}
    for mode in ("hooks", "bk"):
        sc = TINY.with_(grad_sample_mode=mode, clip=0.05)
        model = train(build(sc, data, seed=0), [phase("private", data.private, scale=sc, steps=3, sigma=1.0, seed=0,
                                                      index=0)], seed=0)
        weights[mode] = [p.detach().clone() for p in model.parameters()]
    start = [p.detach() for p in build(TINY, data, seed=0).parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(weights["hooks"], start))  # it trained
    for a, b in zip(weights["hooks"], weights["bk"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arm", ["continual", "trace"])
def test_training_parts_merge_to_the_whole_arm(tmp_path, monkeypatch, arm):
    """`experiments arms`: the continual and tr(H) arms split into one part per (seed, training), as the GPU
    queue runs them, merge to the arm run whole (each training is seeded on its own); a missing part drops that
    training."""
    from experiments.arms import runner

    from experiments.arms.bu import continual_arm, trace_arm
    from experiments.arms.common import CONTINUAL_ARMS, TRACE_RUNS

    fn, names, field = {"continual": (continual_arm, CONTINUAL_ARMS, "continual_arms"),
                        "trace": (trace_arm, TRACE_RUNS, "trace_runs")}[arm]
    monkeypatch.setattr(runner, "OUT", tmp_path)
    monkeypatch.setitem(runner.SCALES, "tiny_split", TINY.with_(name="tiny_split"))
    whole = fn(TINY)
    for part in reversed(names):  # any order
        runner.run_arm(arm, "tiny_split", 0, part)
    assert len(list((tmp_path / "tiny_split" / "parts").glob(f"{arm}.s0.*.json"))) == len(names)
    merged = runner.merge(arm, "tiny_split")
    assert set(merged["per_seed"]) == set(whole["per_seed"])
    for k, v in whole["per_seed"].items():
        if k == "plateau_reason" or k.endswith("_trace"):
            assert merged["per_seed"][k] == v, k
        else:
            assert np.allclose(np.asarray(merged["per_seed"][k], float), np.asarray(v, float)), k
    assert merged["scale_settings"][field] == list(names)
    (tmp_path / "tiny_split" / "parts" / f"{arm}.s0.{names[1]}.json").unlink()
    again = runner.merge(arm, "tiny_split")
    assert f"{names[1]}_acc" not in again["per_seed"] and f"{names[0]}_acc" in again["per_seed"]
    assert again["scale_settings"][field] == [a for a in names if a != names[1]]
    with pytest.raises(ValueError, match=field):
        fn(TINY.with_(**{field: ("noisy",)}))
    with pytest.raises(ValueError, match="seed"):
        runner.run_arm(arm, "tiny_split", None, names[0])  # a part is one seed's


def test_ganesh_parts_merge_to_the_whole_arm_without_running_anything_twice(tmp_path, monkeypatch):
    """The Ganesh et al. arm split per (seed, public budget or barrier pair) merges to the arm run whole, and the
    parts' DP runs add up to the whole arm's (each middle budget once, 2 runs for each barrier pair)."""
    from experiments.arms import runner

    import experiments.arms.ganesh as ganesh

    assert ganesh.ganesh_parts(TINY) == ["public2", "same", "random", "same_random",
                                            "nondp"]  # budgets 0, 2, 4
    monkeypatch.setattr(runner, "OUT", tmp_path)
    monkeypatch.setitem(runner.SCALES, "tiny_g", TINY.with_(name="tiny_g"))
    calls = []
    real_train = ganesh.train
    monkeypatch.setattr(ganesh, "train", lambda *a, **k: calls.append(a[1][0].name) or real_train(*a, **k))
    whole = ganesh.ganesh_arm(TINY)
    n_whole = calls.count("private")
    calls.clear()
    for part in ("random", "public2", "same", "same_random", "nondp"):
        runner.run_arm("ganesh", "tiny_g", 0, part)
    assert n_whole == 8  # budgets 0, 2, 4 once, one more run per pair, and 2 non-DP runs
    assert calls.count("private") == n_whole + 1  # as parts, random and same_random each train the 0 budget's run
    merged = runner.merge("ganesh", "tiny_g")
    assert set(merged["per_seed"]) == set(whole["per_seed"])
    for k, v in whole["per_seed"].items():
        assert np.allclose(np.asarray(merged["per_seed"][k], float), np.asarray(v, float)), k
    assert merged["scale_settings"]["ganesh_parts"] == ["public2", "same", "random", "same_random", "nondp"]
    assert merged["per_seed"]["barrier_same_random"][0] >= 0
    with pytest.raises(ValueError, match="ganesh_parts"):
        ganesh.ganesh_arm(TINY.with_(ganesh_parts=("public3",)))


def test_ke_parts_share_one_source_and_merge_to_the_whole_arm_with_its_selection(tmp_path, monkeypatch):
    """The Ke et al. arm split per (seed, run): the source model is trained once for all parts (a cache of
    safetensors), the parts merge to the whole arm, and the validation-selected split is chosen after the join."""
    from experiments.arms import runner

    import experiments.arms.ke as ke

    assert ke.ke_parts(TINY) == ["random", "zero", "lpfft25", "lpfft50", "lp"]
    monkeypatch.setattr(runner, "OUT", tmp_path)
    monkeypatch.setitem(runner.SCALES, "tiny_k", TINY.with_(name="tiny_k"))
    calls = []
    real_train = ke.train
    monkeypatch.setattr(ke, "train", lambda *a, **k: calls.extend(p.name for p in a[1]) or real_train(*a, **k))
    whole = ke.ke_arm(TINY)
    assert calls.count("public") == 1
    calls.clear()
    for part in ("lpfft50", "zero", "lp", "lpfft25", "random"):
        runner.run_arm("ke", "tiny_k", 0, part)
    assert calls.count("public") == 1  # the source: trained by the first part, loaded by the others
    assert len(list((tmp_path / "tiny_k" / "pretrained").glob("ke-source-*.safetensors"))) == 1
    one = json.loads((tmp_path / "tiny_k" / "parts" / "ke.s0.lpfft25.json").read_text())
    assert "selected_split" not in one["per_seed"]  # a part alone cannot choose
    merged = runner.merge("ke", "tiny_k")
    assert set(merged["per_seed"]) == set(whole["per_seed"])
    for k, v in whole["per_seed"].items():
        if k.endswith("_curve") or k == "selected_split":
            assert merged["per_seed"][k] == v, k
        else:
            assert np.allclose(np.asarray(merged["per_seed"][k], float), np.asarray(v, float)), k
    assert merged["source_test_acc"] == whole["source_test_acc"]
    assert merged["scale_settings"]["ke_parts"] == ke.ke_parts(TINY)
    with pytest.raises(ValueError, match="ke_parts"):
        ke.ke_arm(TINY.with_(ke_parts=("lpfft99",)))


def test_the_gpu_queue_splits_every_arm_into_parts(tmp_path, monkeypatch):
    from experiments.arms import runner
    from experiments.gpu import cli as gpu_cli, queue

    from experiments.arms.common import CONTINUAL_ARMS

    monkeypatch.setattr(runner, "OUT", tmp_path)
    todo = queue.jobs(["vit", "continual", "ganesh", "trace", "ke"], False, scale="gpu_full")
    seeds = runner.SCALES["gpu_full"].seeds
    assert len(todo) == len(seeds) * (4 + len(CONTINUAL_ARMS) + 7 + 3 + 6)
    assert [j[4] for j in todo if j[1] == "continual" and j[2] == seeds[0]] == list(CONTINUAL_ARMS)
    assert [j[4] for j in todo if j[1] == "ganesh" and j[2] == seeds[0]] == ["public10", "public30", "public100",
                                                                           "same", "random", "same_random",
                                                                           "nondp"]
    assert [j[4] for j in todo if j[1] == "trace" and j[2] == seeds[0]] == ["pretrain_nondp", "pretrain_dp",
                                                                          "finetune_dp"]
    assert [j[4] for j in todo if j[1] == "ke" and j[2] == seeds[0]] == ["random", "zero", "lpfft25", "lpfft50",
                                                                       "lpfft75", "lp"]
    done = runner.part_path("gpu_full", "continual", seeds[0], "plateau")
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    assert len(queue.jobs(["continual"], False, scale="gpu_full")) == len(seeds) * len(CONTINUAL_ARMS) - 1
    # an arm job names its own scale: gpu_full's ViT by default, another one by --arm-scale
    assert {j[3] for j in todo if j[1] == "vit"} == {"gpu_full_vit"} and {j[3] for j in todo if j[1] == "ke"} == {
        "gpu_full"}
    long = queue.jobs(["vit"], False, scale="gpu_full", overrides={"vit": "gpu_full_vit_long"})
    assert len(long) == 20 and {j[3] for j in long} == {"gpu_full_vit_long"}
    for bad in (["vit"], ["vit=nowhere"], ["nope=gpu_full"]):
        with pytest.raises(SystemExit) as exc:
            gpu_cli.main(["run", "--scale", "gpu_full", "--arm-scale", *bad])
        assert exc.value.code == 2
    # parts running on this CPU meanwhile are left out of the lease's queue, by their file's stem
    skip = frozenset({"ganesh.s4.same", "ganesh.s4.random"})
    left = queue.jobs(["ganesh"], False, scale="gpu_full", skip=skip)
    assert len(left) == len(seeds) * 7 - 2 and not [j for j in left if j[2] == 4 and j[4] in ("same", "random")]
    for bad in (["ganesh.s9.same"], ["ganesh.s4.nope"], ["trace.s0.pretrain_dp"]):  # no such part of --arms
        with pytest.raises(SystemExit) as exc:
            gpu_cli.main(["run", "--scale", "gpu_full", "--arms", "ganesh", "--skip", *bad])
        assert exc.value.code == 2
