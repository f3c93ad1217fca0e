"""The ViT representation-law arm (experiments.arms.vit) on a tiny 12-block ViT over 8×8 digits, in seconds."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from experiments.arms import ArmScale
from experiments.arms.common import build, load_arm_data, phase, train
from experiments.arms.vit import block_profile, eps_tag, lr_search, probe_set, public_parts, vit_arm
from audit.transfer.separability import fit_geometric_decay, least_squares_residual, separation_fuzziness

TINY = ArmScale(name="tiny", dataset="digits", root=None, private=120, public=80, val=20, test=60, batch_size=20,
                steps=3, source_steps=4, seeds=(0,), hessian_batch=16, accountant="rdp",
                vit_kwargs={"embed_dim": 8, "num_heads": 2, "depth": 12}, vit_epsilons=(1.0, 8.0, math.inf),
                vit_trials=2, vit_trial_steps=2, vit_probe_images=50)


@pytest.fixture(scope="module")
def data():
    return load_arm_data(TINY)


@pytest.fixture(scope="module")
def result(data):
    return vit_arm(TINY, data=data)


def _trained_phases(monkeypatch) -> list[str]:
    """The names of the phases the ViT arm trains from now on (its ``train`` wrapped), in order."""
    import experiments.arms.vit as vit

    calls: list[str] = []
    real = vit.train

    def counting(model, specs, **kw):
        calls.extend(s.name for s in specs)
        return real(model, specs, **kw)

    monkeypatch.setattr(vit, "train", counting)
    return calls


def _vit(data, seed=0):
    return build(TINY, data, seed=seed, arch=TINY.vit_arch, kwargs=TINY.vit_kwargs)


def _manual_cls_tokens(model, images) -> list[np.ndarray]:
    """The reference: run the timm ViT's stages by hand, block by block, and keep token 0 after each."""
    from training.data import to_float_tensor

    net = model.net
    model.eval()
    with torch.no_grad():
        h = net.patch_embed(model.normalize(to_float_tensor(np.asarray(images.x))))
        h = net.norm_pre(net.patch_drop(net.pos_drop(net.token_embed(h))))
        out = []
        for blk in net.blocks:
            h = blk(h)
            out.append(h[:, 0].numpy().astype(np.float64))
    return out


def test_block_profile_matches_a_manual_pass_through_the_twelve_blocks(data):
    model = _vit(data)
    probe = probe_set(data.test, TINY.vit_probe_images)
    prof = block_profile(model, probe)
    ref = _manual_cls_tokens(model, probe)
    assert len(ref) == len(prof["D"]) == len(prof["residual"]) == 12
    np.testing.assert_allclose(prof["D"], [separation_fuzziness(f, probe.y) for f in ref], rtol=1e-4)
    np.testing.assert_allclose(prof["residual"], [least_squares_residual(f, probe.y) for f in ref], rtol=1e-4)
    fit = fit_geometric_decay([separation_fuzziness(f, probe.y) for f in ref])
    assert prof["rho_D"] == pytest.approx(fit.rho, rel=1e-4) and prof["r2_D"] == pytest.approx(fit.r_squared,
                                                                                                 rel=1e-3)


class _Sealed:
    """Stands in for the private images: any use raises."""

    def __getattr__(self, name):
        raise AssertionError(f"the search read the private images ({name})")

    def __len__(self):
        raise AssertionError("the search read the private images (len)")


def test_lr_search_reads_only_public_images_and_is_reproducible(data):
    model = _vit(data)
    sealed = dataclasses.replace(data, private=_Sealed(), val=_Sealed())
    a = lr_search(model, sealed, scale=TINY, sigma=1.0, seed=3)
    b = lr_search(model, sealed, scale=TINY, sigma=1.0, seed=3)
    c = lr_search(model, sealed, scale=TINY, sigma=1.0, seed=4)
    assert a == b and [t["lr"] for t in a["trials"]] != [t["lr"] for t in c["trials"]]
    lo, hi = (TINY.lr * f for f in TINY.vit_lr_range)
    assert len(a["trials"]) == TINY.vit_trials and all(lo <= t["lr"] <= hi for t in a["trials"])
    assert a["lr"] in [t["lr"] for t in a["trials"]]
    parts = public_parts(data.public, TINY.vit_tune_fraction)
    sets = [parts.pretrain.x, parts.tune_train.x, parts.tune_val.x]
    assert sum(len(s) for s in sets) == len(data.public)
    assert len({s.tobytes() for x in sets for s in x}) == len(data.public)  # three disjoint parts


def test_vit_arm_reports_every_epsilon_and_arm_with_twelve_block_fits(result):
    per = result["per_seed"]
    assert result["blocks"] == 12 and result["fit_dof"] == 10 and result["tuning_privacy_cost"].startswith("none")
    assert result["epsilons"] == ["eps1", "eps8", "epsinf"]
    for tag in result["epsilons"]:
        for arm in ("untuned", "tuned"):
            key = f"{tag}_{arm}"
            assert 0 <= per[f"{key}_acc"][0] <= 1
            assert len(per[f"{key}_D"][0]) == 12 and len(per[f"{key}_residual"][0]) == 12
            for stat in ("rho_D", "r2_D", "rho_res", "r2_res"):
                assert math.isfinite(per[f"{key}_{stat}"][0])
        assert per[f"{tag}_untuned_lr"][0] == TINY.lr
        trials = per[f"{tag}_tuned_trials"][0]
        assert per[f"{tag}_tuned_lr"][0] == max(trials, key=lambda t: (t["val_acc"], -t["val_loss"]))["lr"]
    # ε = ∞ is non-DP; σ grows as ε shrinks
    assert per["epsinf_untuned_sigma"][0] is None and result["sigmas"]["epsinf"] is None
    assert result["sigmas"]["eps1"] > result["sigmas"]["eps8"] > 0
    assert per["eps1_tuned_sigma"][0] == result["sigmas"]["eps1"]


def test_private_images_drive_the_final_runs_but_not_the_search(data, result):
    """Scrambling the private labels changes the fine-tuned models, never the (public) search."""
    rng = np.random.default_rng(1)
    scrambled = dataclasses.replace(data, private=dataclasses.replace(
        data.private, y=rng.permutation(data.private.y)))
    small = TINY.with_(vit_epsilons=(8.0,))
    per, again = result["per_seed"], vit_arm(small, data=scrambled)["per_seed"]
    assert again["eps8_tuned_trials"] == per["eps8_tuned_trials"]
    assert again["pretrain_D"] == per["pretrain_D"]
    assert again["eps8_untuned_D"] != per["eps8_untuned_D"]


def test_eps_tags_are_key_safe():
    assert [eps_tag(e) for e in (1.0, 3.0, 8.0, math.inf, 0.25)] == ["eps1", "eps3", "eps8", "epsinf", "eps0p25"]
    with pytest.raises(ValueError):
        vit_arm(TINY.with_(vit_epsilons=(0.0,)), data=load_arm_data(TINY))


def test_seed_and_epsilon_parts_merge_to_the_whole_run(tmp_path, monkeypatch):
    """`experiments arms`: one (seed, ε) part per GPU job, merged, equals the arm run over every seed and ε."""
    from experiments.arms import runner

    two = TINY.with_(name="tiny_parts", seeds=(0, 1), vit_epsilons=(8.0, math.inf))
    monkeypatch.setattr(runner, "OUT", tmp_path)
    monkeypatch.setitem(runner.SCALES, "tiny_parts", two)
    whole = vit_arm(two)
    for seed in (1, 0):
        for e in (math.inf, 8.0):
            runner.run_arm("vit", "tiny_parts", seed, e)
    merged = runner.merge("vit", "tiny_parts")
    assert merged["seeds"] == [0, 1] and merged["epsilons"] == ["eps8", "epsinf"]
    assert merged["scale_settings"]["vit_epsilons"] == [8.0, math.inf]  # the run's ε, not the first part's one
    assert merged["sigmas"] == whole["sigmas"] and set(merged["per_seed"]) == set(whole["per_seed"])
    for k in ("pretrain_acc", "eps8_tuned_acc", "eps8_untuned_r2_D", "epsinf_tuned_lr", "eps8_tuned_D"):
        assert np.allclose(np.asarray(merged["per_seed"][k], float), np.asarray(whole["per_seed"][k], float)), k
    (tmp_path / "tiny_parts" / "parts" / "vit.s1.epsinf.json").unlink()  # a seed missing an ε: only shared ε kept
    again = runner.merge("vit", "tiny_parts")
    assert again["epsilons"] == ["eps8"] and again["scale_settings"]["vit_epsilons"] == [8.0]


def test_pretraining_augmentation_is_seeded_and_reaches_only_the_public_phase(data):
    """vit_pretrain_augment changes the pre-trained model (the crops and flips are applied), repeats exactly for a
    seed (the draws come from the run's seeded stream), and the fine-tuning phases stay un-augmented."""
    from experiments.arms.common import CROP_FLIP, phase

    one = TINY.with_(vit_epsilons=(math.inf,), vit_trials=1)
    aug = one.with_(vit_pretrain_augment=True)
    plain, a1, a2 = (vit_arm(s, data=data) for s in (one, aug, aug))
    assert a1["per_seed"]["pretrain_D"] == a2["per_seed"]["pretrain_D"]
    assert a1["per_seed"]["pretrain_D"] != plain["per_seed"]["pretrain_D"]
    assert a1["pretrain_augment"] == CROP_FLIP.model_dump() and plain["pretrain_augment"] is None
    spec = phase("p", data.public, scale=aug, steps=3, sigma=None, seed=0, index=0, augment=CROP_FLIP)
    assert spec.training.augment.active and phase("p", data.public, scale=aug, steps=3, sigma=None, seed=0,
                                                  index=0).training is None


def test_pretrained_cache_trains_once_per_seed_and_matches_a_plain_run(data, tmp_path, monkeypatch):
    """Two (seed, ε) jobs with one cache pre-train once and start from the weights a run without the cache
    trains; a cache file of another key, or a corrupt one, is trained again rather than trusted."""
    calls = _trained_phases(monkeypatch)
    one = TINY.with_(vit_epsilons=(8.0,), vit_trials=1)
    plain = vit_arm(one, data=data)["per_seed"]
    calls.clear()
    a = vit_arm(one, data=data, pretrained_cache=tmp_path)["per_seed"]
    b = vit_arm(one.with_(vit_epsilons=(math.inf,)), data=data, pretrained_cache=tmp_path)["per_seed"]
    assert calls.count("public") == 1  # the second job loaded the first one's weights
    assert a["pretrain_D"] == b["pretrain_D"] == plain["pretrain_D"] and a["eps8_tuned_D"] == plain["eps8_tuned_D"]
    files = list(tmp_path.glob("*.safetensors"))
    assert len(files) == 1
    files[0].write_bytes(b"not safetensors")
    calls.clear()
    c = vit_arm(one, data=data, pretrained_cache=tmp_path)["per_seed"]
    assert calls.count("public") == 1 and c["pretrain_D"] == plain["pretrain_D"]
    calls.clear()
    vit_arm(one.with_(source_steps=TINY.source_steps + 1), data=data, pretrained_cache=tmp_path)  # another key
    assert calls.count("public") == 1 and len(list(tmp_path.glob("*.safetensors"))) == 2


def test_a_shared_pretraining_is_trained_once_for_every_seed_with_its_schedule(data, tmp_path, monkeypatch):
    """vit_shared_pretrain: every seed fine-tunes the one public model (seed 0), trained once per process and once
    across the (seed, ε) jobs of a cache; the seeds still vary the fine-tuning. The schedule reaches the
    pre-training phase only, and changes what it learns."""
    import experiments.arms.vit as vit

    specs = []
    real = vit.train

    def recording(model, phases, **kw):
        specs.extend(phases)
        return real(model, phases, **kw)

    monkeypatch.setattr(vit, "train", recording)
    two = TINY.with_(seeds=(0, 1), vit_epsilons=(8.0,), vit_trials=1, vit_shared_pretrain=True,
                     vit_pretrain_schedule="cosine", vit_pretrain_warmup=2)
    per = vit_arm(two, data=data)["per_seed"]
    public = [s for s in specs if s.name == "public"]
    assert len(public) == 1 and public[0].optim.schedule == "cosine" and public[0].optim.warmup_steps == 2
    assert all(s.optim.schedule == "constant" for s in specs if s.name != "public")
    assert per["pretrain_D"][0] == per["pretrain_D"][1]  # one model for both seeds
    assert per["eps8_untuned_D"][0] != per["eps8_untuned_D"][1]  # the seeds vary the fine-tuning
    own = vit_arm(two.with_(vit_shared_pretrain=False, seeds=(1,)), data=data)["per_seed"]
    assert own["pretrain_D"][0] != per["pretrain_D"][1]  # seed 1's own pre-training is another model
    flat = vit_arm(two.with_(vit_pretrain_schedule="constant", vit_pretrain_warmup=0, seeds=(0,)),
                   data=data)["per_seed"]
    assert flat["pretrain_D"][0] != per["pretrain_D"][0]  # the schedule changed the pre-training
    specs.clear()
    for seed in (1, 0):  # (seed, ε) jobs of two seeds with one cache: one pre-training in all
        vit_arm(two.with_(seeds=(seed,)), data=data, pretrained_cache=tmp_path)
    assert sum(s.name == "public" for s in specs) == 1


def test_the_vits_dp_fine_tuning_is_dominated_by_its_noise(data):
    """The ViT arm's DP phase (bk, as gpu_full_vit runs it) adds the noise: at σ = 3 the weights move about as far
    as clipping alone moves them (AdamW normalises the step) but in a nearly orthogonal direction, while two
    clipping-only runs move them identically. (Why DP costs the arm's models no accuracy is not a missing noise.)"""
    import copy

    sc = TINY.with_(grad_sample_mode="bk", clip=0.1)
    start = _vit(data)
    flat = lambda m: torch.cat([p.detach().flatten() for p in m.parameters()])  # noqa: E731
    w0 = flat(start)

    def move(sigma):
        m = train(copy.deepcopy(start), [phase("private", data.private, scale=sc, steps=6, sigma=sigma, seed=0,
                                               index=1, lr=1e-3)], seed=0)
        return flat(m) - w0

    clip, clip_again, noisy = move(0.0), move(0.0), move(3.0)
    cos = torch.nn.functional.cosine_similarity
    assert torch.allclose(clip, clip_again)
    assert abs(float(cos(noisy, clip, dim=0))) < 0.3
    assert 0.3 < float(noisy.norm() / clip.norm()) < 3


def test_pretrained_accuracy_scores_the_jobs_cached_model_on_the_whole_test_split(tmp_path, monkeypatch):
    """`experiments arms pretrained`: the model a (seed, ε) part job cached, loaded (not trained again) and
    scored; on the arm's own test images it gives the part's pre-training accuracy, by default the whole split."""
    import experiments.arms.vit as vit
    from experiments.arms import runner

    shared = TINY.with_(name="tiny_shared", seeds=(0, 1), vit_epsilons=(8.0,), vit_trials=1, vit_shared_pretrain=True)
    monkeypatch.setattr(runner, "OUT", tmp_path)
    monkeypatch.setitem(runner.SCALES, "tiny_shared", shared)
    runner.run_arm("vit", "tiny_shared", 1, 8.0)  # seed 1's job pre-trains the shared (seed-0) model
    part = json.loads(runner.part_path("tiny_shared", "vit", 1, 8.0).read_text())
    real = vit.train

    def no_pretraining(model, specs, **kw):
        assert all(s.name != "public" for s in specs), "the cached pre-training was trained again"
        return real(model, specs, **kw)

    monkeypatch.setattr(vit, "train", no_pretraining)
    acc, n = runner.pretrained_accuracy("tiny_shared", test_images=TINY.test)
    assert n == TINY.test and acc == part["per_seed"]["pretrain_acc"][0]
    acc_all, n_all = runner.pretrained_accuracy("tiny_shared")
    assert n_all > TINY.test and 0.0 <= acc_all <= 1.0


#: a different value for every field that fit_key leaves out as read only after the shared model is trained
_AFTER_FIT_VALUES = {
    "name": "other", "downstream": "digits", "downstream_root": "elsewhere", "downstream_private": 50,
    "downstream_val": 10, "head_lr_scale": 2.0, "steps": 9, "switch": 1, "public_steps": (0, 1), "epsilon": 2.0,
    "delta": 1e-6, "clip": 0.5, "hessian_probes": 3, "hessian_every": 7, "trace_steps": 5, "knn_every": 2,
    "barrier_points": 4, "lp_fractions": (0.5,), "accountant": "pld", "noise_multiplier": 2.0, "vit_trials": 5,
    "vit_trial_steps": 7, "vit_lr_range": (0.5, 2.0), "vit_probe_images": 9, "grad_sample_mode": "bk",
    "ke_source": "vit", "membership_models": 8}


def test_fields_left_out_of_the_cache_key_do_not_change_the_pretrained_model(data):
    """fit_key drops AFTER_FIT_FIELDS so that two scales share a pre-trained model (the Ke et al. arm on the ViT
    arm's): changing any of them leaves the key *and* the trained weights as they are, while a field the
    pre-training reads changes the key."""
    from experiments.arms.common import AFTER_FIT_FIELDS
    from experiments.arms.model_cache import fit_key
    from experiments.arms.vit import pretrained_vit, vit_lr

    assert set(_AFTER_FIT_VALUES) == set(AFTER_FIT_FIELDS)
    base = TINY.with_(source_steps=3)
    key = fit_key(base, data.public, seed=0, lr=vit_lr(base), device="cpu")
    ref = pretrained_vit(base, data, seed=0).state_dict()
    for name, value in _AFTER_FIT_VALUES.items():
        other = base.with_(**{name: value})
        assert getattr(other, name) != getattr(base, name), name
        assert fit_key(other, data.public, seed=0, lr=vit_lr(other), device="cpu") == key, name
        got = pretrained_vit(other, data, seed=0).state_dict()
        assert all(torch.equal(got[k], ref[k]) for k in ref), name
    for name, value in (("source_steps", 4), ("batch_size", 10), ("vit_kwargs", {**TINY.vit_kwargs, "depth": 11}),
                        ("vit_pretrain_schedule", "cosine"), ("augment", True)):
        assert fit_key(base.with_(**{name: value}), data.public, seed=0, lr=vit_lr(base), device="cpu") != key, name


def test_ke_arm_on_the_vit_source_fine_tunes_the_vit_arms_pretrained_model(data, tmp_path, monkeypatch):
    """ke_source='vit': the Ke et al. arm starts from the ViT arm's pre-trained model (loaded from the ViT arm's
    cache, not trained again) at the ViT's learning rate, and reports the source's accuracy and arch."""
    import experiments.arms.ke as ke
    import experiments.arms.vit as vit
    from experiments.arms.common import test_acc

    vit_scale = TINY.with_(vit_lr=3e-3)
    scale = vit_scale.with_(name="tiny_ke", ke_source="vit", downstream="digits", downstream_root=None,
                            downstream_private=60, downstream_val=20, steps=4, knn_every=2, lp_fractions=(0.5,),
                            noise_multiplier=1.0, grad_sample_mode="bk")
    pre = vit.pretrained_vit(vit_scale, data, seed=0, cache=tmp_path)  # the ViT arm's job, at its own scale
    calls, lrs = [], []
    real = vit.train

    def counting(model, specs, **kw):
        calls.extend(s.name for s in specs)
        lrs.extend(s.optim.lr for s in specs)
        return real(model, specs, **kw)

    monkeypatch.setattr(vit, "train", counting)
    monkeypatch.setattr(ke, "train", counting)
    res = ke.ke_arm(scale, pretrained_cache=tmp_path)
    assert "public" not in calls and set(lrs) == {3e-3}  # loaded, not pre-trained; fine-tuned at vit_lr
    assert res["source"] == "vit" and res["source_arch"] == TINY.vit_arch and res["lr"] == 3e-3
    assert res["source_test_acc"] == test_acc(pre, data.test)
    per = res["per_seed"]
    assert {"random_acc", "zero_acc", "lp_aligned_acc", "lpfft50_acc", "selected_split"} <= set(per)
    first = {k: per[f"{k}_knn_curve"][0][0]["knn"] for k in ("random", "zero", "lp_aligned")}
    assert len(set(first.values())) == 1  # every head init starts from the same ViT backbone
    with pytest.raises(ValueError, match="ke_source"):
        TINY.with_(ke_source="resnet")


def test_a_pretraining_from_another_machine_is_adopted_not_retrained_and_says_where_it_ran(data, tmp_path,
                                                                                          monkeypatch):
    """adopt_cached: a lease's cached pre-training (another device and torch in its key) becomes this machine's
    cache entry; the arm then fine-tunes those very weights without training the public phase again and records
    where they were trained. A file of other settings, or without a key, is refused; a plain run records itself."""
    import experiments.arms.vit as vit
    from experiments.arms.model_cache import adopt_cached, cache_path, cached_fit

    one = TINY.with_(vit_epsilons=(8.0,), vit_trials=1, vit_shared_pretrain=True)
    lease = {**vit.pretrain_key(one, data, seed=0), "device": "cuda", "torch": "2.11.0+cu130"}
    lease_model = cached_fit(tmp_path / "lease", lease, lambda: _vit(data), lambda m: m.apply(_bump))
    src = cache_path(tmp_path / "lease", lease, prefix="model")
    here = tmp_path / "here"
    adopt_cached(src, here, vit.pretrain_key(one, data, seed=0), prefix=vit.PRETRAIN_PREFIX)
    calls = _trained_phases(monkeypatch)
    got = vit_arm(one, data=data, pretrained_cache=here)
    assert "public" not in calls  # the adopted weights were fine-tuned, not trained again
    assert got["pretrained_on"] == {"0": {"device": "cuda", "torch": "2.11.0+cu130", "adopted": True}}
    assert got["per_seed"]["pretrain_D"][0] == block_profile(lease_model, probe_set(data.test,
                                                                                    TINY.vit_probe_images))["D"]
    plain = vit_arm(one, data=data, pretrained_cache=tmp_path / "plain")
    assert plain["pretrained_on"] == {"0": {"device": "cpu", "torch": torch.__version__, "adopted": False}}
    assert plain["per_seed"]["pretrain_D"] != got["per_seed"]["pretrain_D"]
    other = vit.pretrain_key(one.with_(source_steps=TINY.source_steps + 1), data, seed=0)
    with pytest.raises(ValueError, match="source_steps"):
        adopt_cached(src, tmp_path / "x", other)
    with pytest.raises(ValueError, match="seed"):
        adopt_cached(src, tmp_path / "x", {**lease, "seed": 1})
    from foundation.io import save_safetensors

    bare = save_safetensors(tmp_path / "bare.safetensors", lease_model.state_dict())
    with pytest.raises(ValueError, match="no cache key"):
        adopt_cached(bare, tmp_path / "x", lease)
    (tmp_path / "half.safetensors").write_bytes(src.read_bytes()[:1000])  # one of two pieces, say
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        adopt_cached(tmp_path / "half.safetensors", tmp_path / "x", lease)
    assert not (tmp_path / "x").exists()


def _bump(module):
    """A visible change to a model's weights (what a lease's training would have made of them)."""
    for p in module.parameters(recurse=False):
        p.data.add_(0.05)


def test_adopt_command_checks_the_leases_checksum_and_exits_2_on_bad_input(data, tmp_path, monkeypatch, capsys):
    """`experiments arms adopt`: a file whose sha256 is not the lease's, or a missing file, is a one-line
    error and exit 2, nothing adopted; the right file is adopted under this machine's key."""
    import hashlib
    import experiments.arms.vit as vit
    from experiments.arms import runner
    from experiments.arms.model_cache import cache_path, cached_fit

    shared = TINY.with_(name="tiny_adopt", vit_epsilons=(8.0,), vit_trials=1, vit_shared_pretrain=True)
    monkeypatch.setattr(runner, "OUT", tmp_path / "out")
    monkeypatch.setitem(runner.SCALES, "tiny_adopt", shared)
    monkeypatch.setattr(vit, "vit_data", lambda scale, device="cpu": data)
    lease = {**vit.pretrain_key(shared, data, seed=0), "device": "cuda", "torch": "2.11.0+cu130"}
    cached_fit(tmp_path / "lease", lease, lambda: _vit(data), lambda m: m)
    src = cache_path(tmp_path / "lease", lease)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert runner.main(["adopt", str(src), "--scale", "tiny_adopt", "--sha256", "0" * 64]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "sha256" in err
    assert runner.main(["adopt", str(tmp_path / "missing.safetensors"), "--scale", "tiny_adopt"]) == 2
    assert not (tmp_path / "out").exists()
    assert runner.main(["adopt", str(src), "--scale", "tiny_adopt", "--sha256", digest]) == 0
    assert len(list((tmp_path / "out/tiny_adopt/pretrained").glob("vit-pretrained-*.safetensors"))) == 1
