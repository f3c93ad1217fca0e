"""Reference (shadow) models: balanced keep masks, recipe copying, re-use and refusal of mismatched directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from attacks.recipe import batched_unsupported, recipe_hash, shadow_config, shadow_recipe
from attacks.shadow_train import resolve_executor, train_shadow_models
from attacks.shadows import INDEX_FILE, balanced_keep_masks, prepare_shadows, shadow_seeds
from training.config import TrainConfig
from training.data import load_dataset
from foundation.errors import CheckpointError, ConfigError, UserError
from foundation.evidence import sign_json
from training.run import open_run
from training.run.manifest import DataInfo, Manifest, MembershipInfo, ModelInfo, PhaseInfo, PrivacyInfo, Provenance

K = 4
SPLIT = "train:n=96,classes=4,noise=250"


def tiny_config(output_dir: Path, name: str = "target", **privacy) -> TrainConfig:
    """A seconds-long recipe on synthetic 8x8 images (noisy classes: the model memorises its members)."""
    return TrainConfig.model_validate({
        "name": name, "output_dir": str(output_dir),
        "data": {"dataset": "synthetic", "split": SPLIT, "test_split": "test:n=40,classes=4,noise=250"},
        "privacy": privacy or {"enabled": False}, "optim": {"name": "adam", "lr": 0.01},
        "training": {"steps": 12, "batch_size": 16, "progress": False, "log_every": 100, "checkpoint_every": 100}})


@pytest.fixture(scope="module")
def target_run(tmp_path_factory) -> Path:
    from training.trainer import train

    out = tmp_path_factory.mktemp("runs")
    return train(tiny_config(out), progress=False).run_dir


@pytest.fixture(scope="module")
def trained(target_run: Path, tmp_path_factory) -> Path:
    """A target with K batched reference models already trained (copy it before changing anything)."""
    prepare_shadows(target=open_run(target_run), n_models=K, seed=0, executor="batched", device="cpu")
    return target_run


@pytest.fixture
def run_copy(trained: Path, tmp_path: Path) -> Path:
    dst = tmp_path / trained.name
    shutil.copytree(trained, dst)
    return dst


# ------------------------------------------------------------------------------------------------ keep masks


@pytest.mark.parametrize("k", [2, 4, 16])
def test_keep_masks_are_balanced(k: int) -> None:
    keep = balanced_keep_masks(k, 500, rng=3)
    assert keep.dtype == np.bool_ and keep.shape == (k, 500)
    assert (keep.sum(axis=0) == k // 2).all()                      # every example IN for exactly K/2 models
    assert np.allclose(keep.mean(axis=1), 0.5, atol=0.1)           # every model trains on about half the pool
    assert not (keep == balanced_keep_masks(k, 500, rng=4)).all()  # the seed matters
    assert (keep == balanced_keep_masks(k, 500, rng=3)).all()


def test_keep_masks_choose_uniform_subsets() -> None:
    keep = balanced_keep_masks(4, 30000, rng=0)
    # each of the C(4, 2) = 6 subsets should appear about 1/6 of the time
    codes = (keep * (1 << np.arange(4))[:, None]).sum(axis=0)
    freq = np.bincount(codes, minlength=16)[[3, 5, 6, 9, 10, 12]] / keep.shape[1]
    assert np.allclose(freq, 1 / 6, atol=0.01)


@pytest.mark.parametrize("k", [0, 1, 3, 15])
def test_keep_masks_refuse_odd_or_tiny_k(k: int) -> None:
    with pytest.raises(ValueError, match="even integer"):
        balanced_keep_masks(k, 10, rng=0)


def test_shadow_seeds_are_distinct_and_reproducible() -> None:
    seeds = shadow_seeds(64, 5)
    assert len(set(seeds)) == 64 and all(0 <= s < 2**31 for s in seeds) and seeds == shadow_seeds(64, 5)


# -------------------------------------------------------------------------------------------------- recipe


def _manifest(*, dp: bool, sigma: float | None, q: float, steps: int, pool: int = 96) -> Manifest:
    phase = PhaseInfo(name="private" if dp else "non-private", dp=dp, noise_multiplier=sigma, sample_rate=q,
                      steps=steps, max_grad_norm=0.7 if dp else None)
    return Manifest(
        run_name="m", model=ModelInfo(arch="small_cnn", num_classes=4, input_shape=(3, 8, 8), param_count=1,
                                      trainable_param_count=1, weights_sha256="0" * 64),
        data=DataInfo(dataset="synthetic", split=SPLIT, pool_size=pool, pool_fingerprint="0" * 64,
                      membership_sha256="0" * 64,
                      membership=MembershipInfo(scheme="bernoulli", p=0.5, seed=0, n_members=pool // 2, n_pool=pool)),
        privacy=PrivacyInfo(dp=dp, delta=1e-3 if dp else None, accountant="rdp" if dp else None,
                            epsilon=2.0 if dp else None, phases=[phase]),
        provenance=Provenance(package_version="0", created="2025-01-01T00:00:00+00:00"))


def test_recipe_hash_ignores_names_and_seeds_only(tmp_path: Path) -> None:
    base = tiny_config(tmp_path)
    same = base.model_copy(update={"name": "other", "output_dir": "elsewhere",
                                   "data": base.data.model_copy(update={"membership_seed": 9})})
    assert recipe_hash(base) == recipe_hash(same)
    for changed in (base.model_copy(update={"optim": base.optim.model_copy(update={"lr": 0.02})}),
                    base.model_copy(update={"data": base.data.model_copy(update={"pool_size": 50})}),
                    tiny_config(tmp_path, noise_multiplier=1.0)):
        assert recipe_hash(changed) != recipe_hash(base)


def test_shadow_config_pins_the_targets_dp_recipe(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, target_epsilon=3.0, max_grad_norm=0.7)
    recipe = shadow_recipe(config=cfg, manifest=_manifest(dp=True, sigma=1.3, q=0.25, steps=12))
    assert (recipe.dp, recipe.noise_multiplier, recipe.max_grad_norm, recipe.steps) == (True, 1.3, 0.7, 12)
    assert recipe.batch_size == 12                                  # round(q * n_pool / 2) = round(0.25 * 48)
    c = shadow_config(recipe, name="t-ref0", seed=11, output_dir=str(tmp_path))
    assert c.privacy.noise_multiplier == 1.3 and c.privacy.target_epsilon is None and c.privacy.delta == 1e-3
    assert (c.training.steps, c.training.batch_size, c.training.seed, c.name) == (12, 12, 11, "t-ref0")
    assert recipe_hash(c) != recipe.hash  # sigma is pinned instead of calibrated: a different config, same model


def test_executor_resolution(tmp_path: Path) -> None:
    shape = (3, 8, 8)
    ok = shadow_recipe(config=tiny_config(tmp_path), manifest=_manifest(dp=False, sigma=None, q=0.3, steps=5))
    assert batched_unsupported(ok, num_classes=4, input_shape=shape) is None
    assert resolve_executor("auto", recipe=ok, num_classes=4, input_shape=shape) == "batched"
    bn = TrainConfig.model_validate({**tiny_config(tmp_path).model_dump(), "model": {"arch": "resnet20_cifar",
                                                                                      "fix_batchnorm": False}})
    rec = shadow_recipe(config=bn, manifest=_manifest(dp=False, sigma=None, q=0.3, steps=5))
    assert resolve_executor("auto", recipe=rec, num_classes=4, input_shape=shape) == "sequential"
    assert resolve_executor("ray", recipe=rec, num_classes=4, input_shape=shape) == "ray"
    assert resolve_executor("processes", recipe=rec, num_classes=4, input_shape=shape) == "processes"
    with pytest.raises(ConfigError, match="attack.executor must be one of"):
        resolve_executor("process", recipe=rec, num_classes=4, input_shape=shape)
    with pytest.raises(ConfigError, match="batched cannot train"):
        resolve_executor("batched", recipe=rec, num_classes=4, input_shape=shape)


def test_batched_dp_shadows_record_the_targets_sigma(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, noise_multiplier=0.8, max_grad_norm=0.7)
    recipe = shadow_recipe(config=cfg, manifest=_manifest(dp=True, sigma=0.8, q=0.25, steps=3))
    pool = load_dataset("synthetic", split=SPLIT)
    keep = balanced_keep_masks(2, len(pool), rng=0)
    train_shadow_models(recipe=recipe, pool=pool, test=None, keep=keep, seeds=[1, 2], todo=[0, 1], root=tmp_path,
                        target_name="m", executor="batched")
    for k in range(2):
        opened = open_run(tmp_path / str(k), verify=False)
        man = opened.manifest
        phase = man.privacy.phases[0]
        assert man.privacy.dp and phase.dp and phase.noise_multiplier == 0.8 and phase.max_grad_norm == 0.7
        assert phase.steps == 3 and phase.sample_rate == pytest.approx(12 / keep[k].sum())
        assert (opened.membership == keep[k]).all()
        assert man.data.pool_fingerprint == pool.fingerprint()


# ------------------------------------------------------------------------------------- re-use and refusal


def test_shadows_are_trained_then_reused(trained: Path) -> None:
    target = open_run(trained)
    first = json.loads((trained / "shadows" / INDEX_FILE).read_text())
    assert first["complete"] and first["n_reference"] == K and first["executor"] == "batched"
    assert first["recipe_hash"] == recipe_hash(target.config)
    again = prepare_shadows(target=target, n_models=K, seed=0, executor="batched", device="cpu")
    assert again.trained == 0 and again.index == {k: v for k, v in first.items() if k != "evidence"}
    assert "mac" in first["evidence"]  # signed by this auditor: the only reference models it re-uses
    for k, run in enumerate(again.runs):
        man = run.manifest
        assert (run.membership == again.keep[k]).all()
        assert man.data.pool_fingerprint == target.pool_fingerprint
        assert man.model.weights_sha256 == first["models"][k]["weights_sha256"]
    assert (again.keep.sum(axis=0) == K // 2).all()


def _corrupt_index(run: Path) -> None:
    (run / "shadows" / INDEX_FILE).write_text("{not json")


def _resign(path: Path, mutate) -> None:
    """Edit a shadow index and sign it again with the test session's key (as this auditor would have made it)."""
    index = json.loads(path.read_text())
    record = index.pop("evidence")
    mutate(index)
    path.write_text(json.dumps(sign_json(index, identity=record["identity"])))


def _other_recipe(run: Path) -> None:
    _resign(run / "shadows" / INDEX_FILE, lambda index: index.__setitem__("recipe_hash", "f" * 64))


def _unsigned(run: Path) -> None:
    """A shadows/ folder shipped with the run: its index was never signed by this auditor."""
    path = run / "shadows" / INDEX_FILE
    index = json.loads(path.read_text())
    index.pop("evidence")
    path.write_text(json.dumps(index))


def _tamper_weights(run: Path) -> None:
    path = run / "shadows" / "1" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _drop_keep(run: Path) -> None:
    (run / "shadows" / "keep.npy").unlink()


def _drop_weights(run: Path) -> None:
    (run / "shadows" / "3" / "model.safetensors").unlink()


def _drop_model(run: Path) -> None:
    shutil.rmtree(run / "shadows" / "2")


@pytest.mark.parametrize(("damage", "message"), [
    (_corrupt_index, "index.json is corrupt"),
    (_other_recipe, "another recipe"),
    (_unsigned, "not signed by this auditor's evidence key"),
    (_tamper_weights, "model 1 is corrupt"),
    (_drop_keep, "keep.npy is missing"),
    (_drop_weights, "model 3 is corrupt .*missing"),
    (_drop_model, "model 2 is missing"),
])
def test_mismatched_or_corrupt_shadows_are_refused(run_copy: Path, damage, message: str) -> None:
    damage(run_copy)
    with pytest.raises(CheckpointError, match=message) as err:
        prepare_shadows(target=open_run(run_copy), n_models=K, seed=0, device="cpu")
    assert "--retrain-shadows" in str(err.value) and "\n" not in str(err.value)


def test_wrong_k_or_seed_is_refused(run_copy: Path) -> None:
    target = open_run(run_copy)
    with pytest.raises(CheckpointError, match="there are 4 of them but attack.n_reference is 6"):
        prepare_shadows(target=target, n_models=6, seed=0, device="cpu")
    with pytest.raises(CheckpointError, match="attack.seed=0, not 1"):
        prepare_shadows(target=target, n_models=K, seed=1, device="cpu")


def test_retrain_recovers_from_a_corrupt_directory(run_copy: Path) -> None:
    _corrupt_index(run_copy)
    fresh = prepare_shadows(target=open_run(run_copy), n_models=K, seed=0, executor="batched", device="cpu",
                            retrain=True)
    assert fresh.trained == K and fresh.index["complete"]
    assert prepare_shadows(target=open_run(run_copy), n_models=K, seed=0, device="cpu").trained == 0


def test_interrupted_training_continues_with_missing_models(run_copy: Path) -> None:
    _resign(run_copy / "shadows" / INDEX_FILE, lambda index: index.__setitem__("complete", False))
    shutil.rmtree(run_copy / "shadows" / "2")
    done = prepare_shadows(target=open_run(run_copy), n_models=K, seed=0, executor="batched", device="cpu")
    assert done.trained == 1 and done.index["complete"]


def test_odd_k_and_missing_recipe_are_user_errors(target_run: Path, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    shutil.copytree(target_run, fresh, ignore=shutil.ignore_patterns("shadows", "signals.npz"))
    with pytest.raises(ValueError, match="even"):  # the library precondition; configs refuse it when built
        prepare_shadows(target=open_run(fresh), n_models=3, device="cpu")
    assert not (fresh / "shadows" / "0").exists()
    bare = tmp_path / "bare"
    shutil.copytree(target_run, bare, ignore=shutil.ignore_patterns("shadows", "signals.npz", "config.yaml"))
    with pytest.raises(UserError, match="reference models need the target's training recipe"):
        prepare_shadows(target=open_run(bare, verify=False), n_models=2, device="cpu")


def test_sequential_executor_uses_the_trainer(target_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "seq"
    shutil.copytree(target_run, run, ignore=shutil.ignore_patterns("shadows", "signals.npz"))
    shadows = prepare_shadows(target=open_run(run), n_models=2, seed=3, executor="sequential", device="cpu")
    assert shadows.trained == 2 and shadows.executor == "sequential"
    for k, (d, opened) in enumerate(zip([r.run_dir for r in shadows.runs], shadows.runs)):
        man = opened.manifest
        assert man.data.membership.scheme == "explicit" and (opened.membership == shadows.keep[k]).all()
        assert (d / "config.yaml").is_file() and man.training["steps"] == 12


@pytest.mark.slow
def test_processes_executor_trains_what_sequential_trains(target_run: Path, tmp_path: Path) -> None:
    """Two worker processes (spawned) train the same reference models, bit for bit, as one after another."""
    runs = {}
    for executor in ("sequential", "processes"):
        run = tmp_path / executor
        shutil.copytree(target_run, run, ignore=shutil.ignore_patterns("shadows", "signals.npz"))
        runs[executor] = prepare_shadows(target=open_run(run), n_models=2, seed=3, executor=executor, device="cpu",
                                         workers=2)
    assert runs["processes"].executor == "processes" and runs["processes"].trained == 2
    for a, b in zip(runs["sequential"].runs, runs["processes"].runs):
        assert a.manifest.model.weights_sha256 == b.manifest.model.weights_sha256
        assert (a.membership == b.membership).all()


def test_recipe_hash_survives_new_options_with_defaults(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    data = cfg.model_dump(mode="json")
    del data["training"]["continual"]          # a config written before these options existed
    del data["optim"]["min_lr_ratio"]
    assert recipe_hash(TrainConfig.model_validate(data)) == recipe_hash(cfg)


@pytest.mark.parametrize("privacy", [{"enabled": False}, {"noise_multiplier": 0.5, "max_grad_norm": 1.0}],
                         ids=["non-dp", "dp"])
def test_reference_models_copy_augmentation_smoothing_and_ema(tmp_path: Path, privacy) -> None:
    """A target trained with augmentation (multiplicity 2), label smoothing and EMA: both executors' reference models
    train with the same options (the batched engine's TrainRecipe, the trainer's config), which change the models
    (the engines' agreement for one seed is tests/test_dp_agreement.py)."""
    from training.trainer import train

    plain = tiny_config(tmp_path, **privacy).model_dump(mode="json")
    data = json.loads(json.dumps(plain))
    data["training"].update(augment={"crop_padding": 1, "flip": True, "multiplicity": 2}, label_smoothing=0.1,
                            ema={"decay": 0.9})
    weights = {}
    for name, cfg in (("plain", plain), ("options", data)):
        cfg["name"] = name
        target = train(TrainConfig.model_validate(cfg), progress=False).run_dir
        recipe = shadow_recipe(config=open_run(target).config, manifest=open_run(target).manifest)
        assert batched_unsupported(recipe, num_classes=4, input_shape=(3, 8, 8)) is None
        shadows = prepare_shadows(target=open_run(target), n_models=2, seed=5, executor="batched", device="cpu")
        weights[name] = open_run(shadows.runs[0].run_dir, verify=False).state_dict
        if name == "options":
            assert recipe.train.augment.multiplicity == 2 and recipe.train.label_smoothing == 0.1
            assert recipe.train.ema.decay == 0.9
            seq = shadow_config(recipe, name="s", seed=1, output_dir=str(tmp_path)).training
            assert seq.augment == recipe.train.augment and seq.ema == recipe.train.ema
            assert seq.label_smoothing == 0.1
    a, b = weights["plain"], weights["options"]
    assert max(float((a[k] - b[k]).abs().max()) for k in a) > 1e-3
