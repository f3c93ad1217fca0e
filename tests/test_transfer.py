"""Transfer evaluation with models and data: suites, the feature cache, the runner and fine-tuning (the pure math is in
tests/test_transfer_math.py)."""

from __future__ import annotations

from pathlib import Path
from foundation.shared_root import missing_reason, shared_root

import numpy as np
import pytest
import yaml

from audit.transfer.suite import TransferSuite, load_suite, parse_suite
from foundation.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SHARED = shared_root()  # $DP_AUDIT_SHARED, default ../shared


# ---------------------------------------------------------------------------------------------- suites


@pytest.mark.parametrize("path", sorted((REPO / "eval_configs" / "transfer").glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_suites_validate(path):
    suite = load_suite(path)
    assert suite.datasets


def test_full_suite_lists_the_six_datasets():
    names = [d.name for d in load_suite(REPO / "eval_configs" / "transfer" / "full.yaml").datasets]
    assert names == ["cifar10", "cifar100", "food101", "svhn", "places365", "inat2021"]


def test_suite_unknown_key_is_rejected_naming_it(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"datasets": [{"name": "digits", "rot": "/data"}]}))
    with pytest.raises(ConfigError, match=r"unknown key 'datasets\.0\.rot'.*did you mean 'root'"):
        load_suite(path)
    path.write_text(yaml.safe_dump({"datasets": [{"name": "digits"}], "protocols": {"knn": {"kk": 5}}}))
    with pytest.raises(ConfigError, match=r"unknown key 'protocols\.knn\.kk'"):
        load_suite(path)


@pytest.mark.parametrize("data,match", [
    ({"datasets": []}, "at least one dataset"),
    ({"datasets": [{"name": "digits"}, {"name": "digits"}]}, "labels must be unique"),
    ({"datasets": [{"name": "digits"}], "protocols": {"finetune": {"dp": True}}}, "exactly one of"),
    ({"datasets": [{"name": "digits"}], "protocols": {"finetune": {"epsilon": 2.0}}}, "dp is false"),
    ({"datasets": [{"name": "digits"}], "protocols": {"knn": {"k": 0}}}, "protocols.knn.k"),
    ({"datasets": [{"name": "digits"}], "budget": {"max_test_examples": -1}}, "budget.max_test_examples"),
])
def test_suite_rejects_bad_values(data, match):
    with pytest.raises(ConfigError, match=match):
        parse_suite(data)


def test_suite_is_frozen_and_overrides_apply(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"datasets": [{"name": "digits"}]}))
    suite = load_suite(path, ["protocols.knn.k=7", "seed=3"])
    assert suite.protocols.knn.k == 7 and suite.seed == 3
    with pytest.raises(Exception):
        suite.seed = 4  # type: ignore[misc]
    assert isinstance(suite, TransferSuite)


# ---------------------------------------------------------------------------------------------- features


def test_pool_output_rules():
    import torch

    from audit.transfer.features import pool_output

    conv = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)
    assert torch.equal(pool_output(conv), conv.mean(dim=(2, 3)))
    tokens = torch.randn(2, 5, 4)
    assert torch.equal(pool_output(tokens, cls=True), tokens[:, 0])
    assert torch.allclose(pool_output(tokens, prefix_tokens=1), tokens[:, 1:].mean(dim=1))
    flat = torch.randn(3, 7)
    assert pool_output(flat) is flat
    with pytest.raises(ValueError, match="cannot pool"):
        pool_output(torch.ones(3))


def _tiny_model(num_classes=4, size=8, seed=0):
    from training.config import ModelConfig
    from training.models import build_model

    return build_model(ModelConfig(arch="small_cnn"), num_classes=num_classes, input_shape=(3, size, size),
                       seed=seed).module.eval()


def test_extract_features_matches_forward_features_and_manual_block_pooling():
    import torch

    from audit.transfer.features import FINAL_LAYER, block_names, extract_features

    model = _tiny_model()
    images = np.random.default_rng(0).integers(0, 256, size=(10, 8, 8, 3), dtype=np.uint8)
    names = block_names(model)
    assert names == ["net.blocks.0", "net.blocks.1", "net.blocks.2"]
    feats = extract_features(model, images, layers=[FINAL_LAYER, *names], batch_size=3)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        np.testing.assert_allclose(feats[FINAL_LAYER], model.forward_features(x).numpy(), rtol=1e-5, atol=1e-6)
        h = model.normalize(x)
        for name, block in zip(names, model.feature_blocks()):
            h = block(h)
            np.testing.assert_allclose(feats[name], h.mean(dim=(2, 3)).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown layer"):
        extract_features(model, images, layers=["nope"])


def test_feature_cache_hits_and_never_serves_stale_features(tmp_path):
    from audit.transfer.features import FINAL_LAYER, cached_features

    model = _tiny_model()
    images = np.random.default_rng(1).integers(0, 256, size=(6, 8, 8, 3), dtype=np.uint8)
    kw = dict(layers=[FINAL_LAYER, "net.blocks.1"], image_size=8, cache_dir=tmp_path)
    first, hits = cached_features(model, images, model_id="m1", data_fingerprint="d1", **kw)
    assert not any(hits.values()) and len(list(tmp_path.glob("*.npz"))) == 2
    again, hits = cached_features(model, images, model_id="m1", data_fingerprint="d1", **kw)
    assert all(hits.values()) and np.array_equal(again[FINAL_LAYER], first[FINAL_LAYER])
    other = _tiny_model(seed=1)  # another checkpoint: another key, recomputed
    moved, hits = cached_features(other, images, model_id="m2", data_fingerprint="d1", **kw)
    assert not any(hits.values()) and not np.allclose(moved[FINAL_LAYER], first[FINAL_LAYER])
    for f in tmp_path.glob("*.npz"):  # corrupt files are recomputed, not trusted
        f.write_bytes(b"garbage")
    fixed, hits = cached_features(model, images, model_id="m1", data_fingerprint="d1", **kw)
    assert not any(hits.values()) and np.allclose(fixed[FINAL_LAYER], first[FINAL_LAYER])


def test_features_this_auditor_did_not_sign_are_never_used(tmp_path):
    """The cache key is computable by anyone: a vendor's fabricated features under the right name and key, or a
    symbolic link to them, are recomputed, not served (issue 37)."""
    from audit.transfer.features import FINAL_LAYER, cached_features, feature_cache_key

    model = _tiny_model()
    images = np.random.default_rng(1).integers(0, 256, size=(6, 8, 8, 3), dtype=np.uint8)
    kw = dict(layers=[FINAL_LAYER], image_size=8, model_id="m1", data_fingerprint="d1")
    truth, _ = cached_features(model, images, cache_dir=None, **kw)
    key = feature_cache_key(model_id="m1", data_fingerprint="d1", image_size=8, layer=FINAL_LAYER)
    forged = np.full_like(truth[FINAL_LAYER], 7.0)
    np.savez(tmp_path / f"{key[:32]}.npz", features=forged, key=np.array(key), layer=np.array(FINAL_LAYER))
    got, hits = cached_features(model, images, cache_dir=tmp_path, **kw)
    assert not hits[FINAL_LAYER] and np.allclose(got[FINAL_LAYER], truth[FINAL_LAYER])
    signed = tmp_path / f"{key[:32]}.npz"  # now this auditor's own entry: a hit
    assert cached_features(model, images, cache_dir=tmp_path, **kw)[1][FINAL_LAYER]
    elsewhere = tmp_path / "elsewhere.npz"
    signed.rename(elsewhere)
    signed.symlink_to(elsewhere)  # a link, even to a signed entry, is not this auditor's file
    got, hits = cached_features(model, images, cache_dir=tmp_path, **kw)
    assert not hits[FINAL_LAYER] and not signed.is_symlink() and elsewhere.is_file()


# ---------------------------------------------------------------------------------------------- runner


def _write_run(run_dir: Path, *, num_classes=4, size=8, seed=0) -> Path:
    """A run directory by hand: weights + manifest, as `audit train` / `audit import` would write them."""
    from datetime import datetime, timezone

    from foundation.io import fingerprint_arrays, save_safetensors, sha256_file, write_npy
    from training.run.manifest import (DataInfo, Manifest, MembershipInfo, ModelInfo, PrivacyInfo, Provenance,
                                   write_manifest)

    model = _tiny_model(num_classes=num_classes, size=size, seed=seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_safetensors(run_dir / "model.safetensors", model.state_dict())
    write_npy(run_dir / "membership.npy", np.ones(4, dtype=bool))
    n_params = sum(p.numel() for p in model.parameters())
    manifest = Manifest(
        run_name="tiny",
        model=ModelInfo(arch="small_cnn", num_classes=num_classes, input_shape=(3, size, size), param_count=n_params,
                        trainable_param_count=n_params, weights_sha256=sha256_file(run_dir / "model.safetensors")),
        data=DataInfo(dataset="synthetic", split="train", pool_size=4,
                      pool_fingerprint=fingerprint_arrays(np.zeros(4)),
                      membership_sha256=sha256_file(run_dir / "membership.npy"),
                      membership=MembershipInfo(scheme="all", n_members=4, n_pool=4)),
        privacy=PrivacyInfo(dp=False),
        provenance=Provenance(package_version="test", created=datetime.now(timezone.utc).isoformat()))
    write_manifest(run_dir, manifest)
    return run_dir


def _write_npz_dataset(root: Path, *, n_train=60, n_test=30, classes=3, size=8, seed=0) -> Path:
    """Class-coloured noisy images: class c is bright in channel c, so any features separate them."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        y = np.arange(n) % classes
        x = rng.normal(70, 25, size=(n, size, size, 3))
        x[np.arange(n), :, :, y % 3] += 120
        np.savez(root / f"{split}.npz", x=np.clip(x, 0, 255).astype(np.uint8), y=y.astype(np.int64))
    (root / "classes.txt").write_text("\n".join(f"c{i}" for i in range(classes)) + "\n")
    return root


def _suite(**kw):
    base = {"name": "t", "device": "cpu", "batch_size": 16,
            "protocols": {"linear_probe": {"c_grid": [0.1, 10.0]}, "diagnostics": {"max_examples": 40},
                          "finetune": {"enabled": False}}}
    base.update(kw)
    return parse_suite(base)


def test_runner_reports_missing_dataset_as_a_row_and_evaluates_the_rest(tmp_path):
    from audit.transfer.runner import evaluate_transfer
    from audit.transfer.transfer_file import read_transfer_file
    from foundation.io import read_json

    run = _write_run(tmp_path / "run")
    data_root = _write_npz_dataset(tmp_path / "colours")
    suite = _suite(datasets=[{"name": "npz", "label": "colours", "root": str(data_root)},
                             {"name": "svhn", "root": str(tmp_path / "absent")}])
    result = evaluate_transfer(run_dir=run, suite=suite)
    assert result.path == run / "transfer.json"
    written = read_json(result.path)
    assert [r["dataset"] for r in written["datasets"]] == ["colours", "svhn"]
    assert set(written["datasets"][1]) == {"dataset", "name", "root", "status", "reason"}  # no empty blocks
    missing = result.row("svhn")
    assert missing.status == "missing" and missing.reason.startswith("missing:")
    assert str(tmp_path / "absent") in missing.reason
    ok = result.row("colours")
    assert ok.status == "ok" and ok.train.n == 60 and ok.test.n == 30 and ok.finetune is None
    assert ok.linear_probe.accuracy.accuracy > 0.9 and ok.knn.accuracy.accuracy > 0.9
    assert "finetune" not in written["datasets"][0]
    diag = ok.diagnostics
    assert diag.n_examples == 40 and [r.layer for r in diag.layers] == [
        "net.blocks.0", "net.blocks.1", "net.blocks.2"]
    assert diag.decay.n_layers == 3 and diag.decay.rho > 0
    assert read_transfer_file(result.path) == result.data
    assert written["model"]["arch"] == "small_cnn" and written["image_size"] == 8


def test_runner_is_deterministic_and_uses_the_cache(tmp_path):
    from audit.transfer.runner import evaluate_transfer

    run = _write_run(tmp_path / "run")
    root = _write_npz_dataset(tmp_path / "d", seed=3)
    suite = _suite(datasets=[{"name": "npz", "root": str(root)}], budget={"max_train_examples": 45,
                                                                          "max_test_examples": 21})
    first = evaluate_transfer(run_dir=run, suite=suite, out_path=tmp_path / "a.json").row("npz")
    assert first.features_cached is False and first.train.n == 45 and first.test.n == 21
    assert len(list((run / "features").glob("*.npz"))) == 5  # train + test final, 3 blocks
    second = evaluate_transfer(run_dir=run, suite=suite, out_path=tmp_path / "b.json").row("npz")
    assert second.features_cached is True
    for key in ("linear_probe", "knn", "diagnostics"):
        assert getattr(second, key) == getattr(first, key)


def test_runner_refuses_tampered_weights(tmp_path):
    from audit.transfer.runner import evaluate_transfer
    from foundation.errors import CheckpointError

    run = _write_run(tmp_path / "run")
    with open(run / "model.safetensors", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(CheckpointError, match="does not match"):
        evaluate_transfer(run_dir=run, suite=_suite(datasets=[{"name": "digits"}]))


def test_cli_transfer_prints_table_and_maps_user_errors(tmp_path):
    from click.testing import CliRunner

    from audit.cli import main

    run = _write_run(tmp_path / "run")
    suite_path = tmp_path / "suite.yaml"
    suite_path.write_text(yaml.safe_dump({
        "name": "cli", "device": "cpu",
        "datasets": [{"name": "npz", "root": str(_write_npz_dataset(tmp_path / "d"))},
                     {"name": "food101", "root": str(tmp_path / "nowhere")}],
        "protocols": {"linear_probe": {"c_grid": [1.0]}, "diagnostics": {"enabled": False}}}))
    res = CliRunner().invoke(main, ["transfer", str(run), "--suite", str(suite_path), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "npz" in res.output and "missing" in res.output and (run / "transfer.json").is_file()
    bad = CliRunner().invoke(main, ["transfer", str(run), "--suite", str(suite_path), "--set", "protocols.knn.kk=1"])
    assert bad.exit_code == 2 and "unknown key 'protocols.knn.kk'" in bad.output



def test_cli_transfer_with_no_data_exits_2_in_one_line_naming_the_suite_key(tmp_path):
    """A suite none of whose datasets loads is an input error (exit 2, nothing written), and the hint names the
    suite's own key (datasets.N.root), not a training config's data.root."""
    from click.testing import CliRunner

    from audit.cli import main

    run = _write_run(tmp_path / "run")
    suite_path = tmp_path / "suite.yaml"
    suite_path.write_text(yaml.safe_dump({
        "name": "none", "device": "cpu",
        "datasets": [{"name": "food101", "root": str(tmp_path / "nowhere")},
                     {"name": "svhn", "root": str(tmp_path / "absent")}]}))
    res = CliRunner().invoke(main, ["transfer", str(run), "--suite", str(suite_path), "--quiet"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: none of the suite's 2 dataset(s) could be evaluated")
    assert "datasets.0.root" in lines[0] and "data.root" not in lines[0].replace("datasets.0.root", "")
    assert not (run / "transfer.json").exists()


@pytest.mark.skipif(not (SHARED / "data" / "svhn").is_dir(), reason=missing_reason("data/svhn"))
def test_runner_on_shared_real_data(tmp_path):
    from audit.transfer.runner import evaluate_transfer

    run = _write_run(tmp_path / "run", num_classes=10, size=32)
    suite = load_suite(REPO / "eval_configs" / "transfer" / "cifar_suite.yaml", [
        "budget.max_train_examples=200", "budget.max_test_examples=100", "device=cpu",
        "protocols.diagnostics.max_examples=100", "protocols.linear_probe.c_grid=[1.0]"])
    suite = suite.model_copy(update={"datasets": tuple(
        d.model_copy(update={"root": str((REPO / d.root).resolve())}) for d in suite.datasets
        if d.key in ("svhn", "cifar10_exact"))})
    result = evaluate_transfer(run_dir=run, suite=suite)
    for key in ("svhn", "cifar10_exact"):
        row = result.row(key)
        assert row.status == "ok" and row.train.n == 200 and row.test.n == 100
        assert 0.0 <= row.linear_probe.accuracy.accuracy <= 1.0


# ---------------------------------------------------------------------------------------------- fine-tuning


def _colour_sets(tmp_path, **kw):
    from training.data import load_dataset

    root = _write_npz_dataset(tmp_path / "ft", **kw)
    return load_dataset("npz", root=root, split="train"), load_dataset("npz", root=root, split="test")


def test_finetune_non_dp_learns_new_classes_and_leaves_checkpoint_untouched(tmp_path):
    import torch

    from audit.transfer.finetune import finetune_evaluate
    from audit.transfer.suite import FinetuneProtocol

    train, test = _colour_sets(tmp_path, n_train=90, n_test=45)
    model = _tiny_model(num_classes=7)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = finetune_evaluate(model, train, test, protocol=FinetuneProtocol(enabled=True, steps=15, batch_size=30,
                                                                          lr=0.05), seed=0)
    assert res.accuracy.accuracy > 0.9 and res.accuracy.total == 45
    assert res.dp is False and res.epsilon is None and res.noise_multiplier is None
    assert model.num_classes == 7 and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    again = finetune_evaluate(model, train, test, protocol=FinetuneProtocol(enabled=True, steps=15, batch_size=30,
                                                                            lr=0.05), seed=0)
    assert again.accuracy == res.accuracy and again.final_loss == res.final_loss


def test_finetune_dp_noise_is_applied_and_accounted(tmp_path):
    from audit.transfer.finetune import finetune_evaluate
    from audit.transfer.suite import FinetuneProtocol
    from training.accounting import DPPhase, epsilon_for

    train, test = _colour_sets(tmp_path, n_train=90, n_test=45)
    model = _tiny_model(num_classes=3)
    kw = dict(enabled=True, dp=True, steps=8, batch_size=30, lr=2.0, momentum=0.0, train_backbone=False,
              accountant="rdp", delta=1e-3)
    quiet = finetune_evaluate(model, train, test, protocol=FinetuneProtocol(noise_multiplier=0.3, **kw), seed=1)
    loud = finetune_evaluate(model, train, test, protocol=FinetuneProtocol(noise_multiplier=300.0, **kw), seed=1)
    assert quiet.trainable_params == 64 * 3 + 3  # only the new head under train_backbone: false
    assert quiet.epsilon == pytest.approx(epsilon_for(phases=[DPPhase(0.3, 30 / 90, 8)], delta=1e-3,
                                                      accountant="rdp"))
    assert loud.epsilon < 0.1 < quiet.epsilon
    assert quiet.accuracy.accuracy > 0.8 and loud.accuracy.accuracy < 0.7


@pytest.mark.parametrize("dp, train_backbone", [(True, True), (True, False), (False, True)])
def test_finetune_protocol_is_the_one_loop_called_directly(tmp_path, dp, train_backbone):
    """The protocol adds nothing of its own to the training: a zero head, one ``fft``/``lp`` phase, the loop."""
    import copy

    from audit.transfer.finetune import _int_seed, finetune_evaluate
    from audit.transfer.suite import FinetuneProtocol
    from training.config import OptimConfig, PrivacyConfig
    from training.evaluate import predict
    from training.recipes.budget import PhaseBudget
    from training.recipes.finetune import finetune, finetune_phases, new_head

    train, test = _colour_sets(tmp_path, n_train=90, n_test=45)
    model = _tiny_model(num_classes=3)
    dp_kw = dict(dp=True, noise_multiplier=0.8, accountant="rdp", delta=1e-3, max_grad_norm=0.5) if dp else {}
    proto = FinetuneProtocol(enabled=True, steps=5, batch_size=30, physical_batch_size=7, lr=0.3, momentum=0.5,
                             train_backbone=train_backbone, **dp_kw)
    res = finetune_evaluate(model, train, test, protocol=proto, seed=11)

    net = copy.deepcopy(model)
    head = new_head(net, 3, init="zero")
    net.train()
    privacy = (PrivacyConfig(enabled=True, noise_multiplier=0.8, max_grad_norm=0.5, accountant="rdp") if dp
               else PrivacyConfig(enabled=False, sampling="shuffle"))
    phases = finetune_phases([PhaseBudget(name="fft" if train_backbone else "lp", steps=5,
                                          noise_multiplier=0.8 if dp else 0.0)],
                             head=head, backbone=[n for n, _ in net.named_parameters()], x=train.x, y=train.y,
                             dataset="npz", batch_size=30, privacy=privacy,
                             optim=OptimConfig(name="sgd", lr=0.3, momentum=0.5), seed=_int_seed(11, 0))
    out = finetune(net, phases, seed=_int_seed(11, 0), device="cpu", physical_batch_size=7)
    assert res.final_loss == out.final_loss
    assert res.accuracy.correct == int((predict(out.model, test.x, device="cpu") == test.y).sum())
    assert res.trainable_params == sum(p.numel() for p in out.model.parameters() if p.requires_grad)


def test_runner_runs_finetune_protocol(tmp_path):
    from audit.transfer.runner import evaluate_transfer
    from foundation.io import read_json

    run = _write_run(tmp_path / "run")
    root = _write_npz_dataset(tmp_path / "d")
    suite = _suite(datasets=[{"name": "npz", "root": str(root)}],
                   protocols={"linear_probe": {"enabled": False}, "knn": {"enabled": False},
                              "diagnostics": {"enabled": False},
                              "finetune": {"enabled": True, "steps": 10, "batch_size": 20, "lr": 0.05}})
    result = evaluate_transfer(run_dir=run, suite=suite)
    written = read_json(result.path)["datasets"][0]
    assert "linear_probe" not in written and "knn" not in written and "diagnostics" not in written
    row = result.row("npz")
    assert row.linear_probe is None and row.accuracies().keys() == {"finetune"}
    assert row.finetune.accuracy.accuracy > 0.9 and row.finetune.dp is False


def test_suite_rejects_unknown_dataset_or_split_at_load_time():
    with pytest.raises(ConfigError, match=r"datasets\.0: unknown dataset 'cifar11'.*did you mean 'cifar10'"):
        parse_suite({"datasets": [{"name": "cifar11"}]})
    with pytest.raises(ConfigError, match=r"datasets\.0: places365: unknown split 'tst'"):
        parse_suite({"datasets": [{"name": "places365", "test_split": "tst"}]})
