"""`audit train`: run directory contents, exact resume, membership reproducibility, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from audit.cli import main
from training.config import TrainConfig, apply_overrides
from foundation.errors import CheckpointError, ConfigError, DataError, UserError
from foundation.io import load_safetensors, sha256_file
from training.run import open_run
from training.pool import draw_membership
from training.evaluate import accuracy
from training.trainer import train

from fixtures_runs import TINY_TRAIN as TINY


def tiny(tmp_path: Path, **over) -> TrainConfig:
    return TrainConfig.model_validate(apply_overrides(TINY, {"output_dir": str(tmp_path), **over}))


def test_run_directory_is_complete_and_verifiable(tmp_path):
    res = train(tiny(tmp_path))
    run = res.run_dir
    for name in ("model.safetensors", "model_init.safetensors", "manifest.json", "membership.npy", "metrics.json",
                 "config.yaml"):
        assert (run / name).is_file(), name
    assert any((run / "tb").iterdir()), "TensorBoard events missing"
    assert not (run / "state").exists(), "resume state must be removed once the run completes"
    assert not list(run.glob("**/*.tmp")), "temporary files left behind"
    opened = open_run(run)                  # weights, membership, config and pool verified
    m, mask = opened.manifest, opened.membership
    assert m.data.membership.scheme == "bernoulli" and m.data.membership.n_members == int(mask.sum())
    assert m.data.pool_size == 240 and len(m.data.pool_fingerprint) == 64
    assert m.privacy.dp and m.privacy.phases[0].noise_multiplier == 1.0
    q = 32 / mask.sum()
    assert m.privacy.phases[0].sample_rate == pytest.approx(q)
    assert m.privacy.epsilon > 0 and m.privacy.epsilon_cross_check["epsilon"] > 0
    # PRV claim and PLD cross-check agree closely
    assert m.privacy.epsilon == pytest.approx(m.privacy.epsilon_cross_check["epsilon"], rel=0.05)
    assert m.provenance.config_sha256 == sha256_file(run / "config.yaml")
    # the saved model reproduces the recorded test accuracy
    model = opened.model()
    acc = accuracy(model, opened.population, device=torch.device("cpu"))
    assert acc == pytest.approx(res.metrics["test_accuracy"])


def test_rerun_of_a_complete_run_is_a_no_op(tmp_path):
    first = train(tiny(tmp_path))
    sha = sha256_file(first.run_dir / "model.safetensors")
    again = train(tiny(tmp_path))
    assert again.already_complete and sha256_file(again.run_dir / "model.safetensors") == sha
    with pytest.raises(CheckpointError, match="different config"):
        train(tiny(tmp_path, **{"optim.lr": 0.25}))


@pytest.mark.parametrize("stop", [3, 4])
def test_interrupted_then_resumed_equals_uninterrupted(tmp_path, stop):
    ref = train(tiny(tmp_path / "a"))
    cfg = tiny(tmp_path / "b")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, stop_after=stop)
    assert (cfg.run_dir() / "state" / "checkpoint.pt").exists()
    with pytest.raises(CheckpointError, match="--resume"):
        train(cfg)
    res = train(cfg, resume=True)
    assert res.resumed_from == stop
    a = load_safetensors(ref.run_dir / "model.safetensors")
    b = load_safetensors(res.run_dir / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert res.manifest.privacy.epsilon == pytest.approx(ref.manifest.privacy.epsilon)
    assert res.manifest.privacy.phases[0].steps == 8


def test_resume_with_another_config_or_corrupt_state_is_refused(tmp_path):
    cfg = tiny(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, stop_after=2)
    with pytest.raises(CheckpointError, match="different config"):
        # same run name, other settings: the stored state belongs to another config
        from training.run.state import load_state

        load_state(cfg.run_dir(), config_sha256="0" * 64)
    (cfg.run_dir() / "state" / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        train(cfg, resume=True)


def test_membership_is_reproducible_from_its_seed(tmp_path):
    res = train(tiny(tmp_path))
    mask = np.load(res.run_dir / "membership.npy")
    info = res.manifest.data.membership
    assert np.array_equal(mask, draw_membership(info.n_pool, p=info.p, seed=info.seed))
    other = draw_membership(info.n_pool, p=info.p, seed=info.seed + 1)
    assert not np.array_equal(mask, other)
    assert abs(mask.mean() - 0.5) < 0.1


def test_non_dp_run_makes_no_claim_and_whole_pool_without_audit_split(tmp_path):
    res = train(tiny(tmp_path, **{"privacy.enabled": False, "privacy.noise_multiplier": None,
                                 "data.audit_split": False}))
    m = res.manifest
    assert not m.privacy.dp and m.privacy.epsilon is None and m.privacy.claimed_epsilon == float("inf")
    assert m.data.membership.scheme == "all" and m.data.membership.n_members == 240


def test_shuffled_sampling_is_labelled_in_the_claim(tmp_path):
    res = train(tiny(tmp_path, **{"privacy.sampling": "shuffle"}))
    assert res.manifest.privacy.phases[0].sampling == "shuffle"
    assert any("Poisson" in n for n in res.manifest.privacy.notes)


def test_target_epsilon_is_met_by_the_claim(tmp_path):
    res = train(tiny(tmp_path, **{"privacy.noise_multiplier": None, "privacy.target_epsilon": 4.0,
                                 "privacy.accountant": "rdp"}))
    assert res.manifest.privacy.epsilon == pytest.approx(4.0, rel=0.02)
    assert res.manifest.privacy.epsilon <= 4.0 * 1.001


# ------------------------------------------------------------------------------------------ bad input (CLI)


def write_cfg(tmp_path: Path, **over) -> Path:
    data = json.loads(json.dumps(TINY))
    data["output_dir"] = str(tmp_path / "results")
    for key, value in over.items():
        node = data
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("over, sets, pattern", [
    ({"data.dataset": "cifar11"}, [], "unknown dataset"),
    ({"model.arch": "no_such_net_xyz"}, [], "no_such_net_xyz"),
    ({"data.dataset": "cifar10", "data.root": "/nonexistent/cifar"}, [], "expected"),
    ({}, ["privacy.noise_multiplyer=1"], "unknown key 'privacy.noise_multiplyer'.*did you mean 'noise_multiplier'"),
    ({"privacy.noise_multiplier": None}, ["privacy.target_epsilon=0"], "target_epsilon must be > 0"),
    ({"privacy.noise_multiplier": None}, ["privacy.target_epsilon=-1"], "target_epsilon must be > 0"),
    ({}, ["privacy.delta=1.5"], r"delta must be in \(0, 1\)"),
    ({}, ["privacy.delta=0"], r"delta must be in \(0, 1\)"),
    ({}, ["training.batch_size=100000"], "larger than the"),
])
def test_bad_input_gives_one_line_error_and_exit_2(tmp_path, over, sets, pattern):
    import re

    cfg = write_cfg(tmp_path, **over)
    args = ["train", str(cfg), "--no-progress"] + [a for s in sets for a in ("--set", s)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    err = result.output.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    assert re.search(pattern, err), err
    assert not (tmp_path / "results" / "tiny" / "manifest.json").exists()


def test_missing_config_file_and_bad_yaml(tmp_path):
    r = CliRunner().invoke(main, ["train", str(tmp_path / "nope.yaml")])
    assert r.exit_code == 2 and "config file not found" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    r = CliRunner().invoke(main, ["train", str(bad)])
    assert r.exit_code == 2 and "not valid YAML" in r.output


def test_large_delta_warns_on_the_cli(tmp_path):
    cfg = write_cfg(tmp_path, **{"privacy.delta": 0.05, "training.steps": 2})
    r = CliRunner().invoke(main, ["train", str(cfg), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "warning: privacy.delta=0.05 >= 1/n" in r.stderr and "warning" not in r.stdout


def test_corrupt_weights_are_refused_when_loading(tmp_path):
    res = train(tiny(tmp_path))
    path = res.run_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(CheckpointError, match="does not match the manifest"):
        open_run(res.run_dir, verify=False).model()


def test_cli_train_writes_run_and_reports(tmp_path):
    cfg = write_cfg(tmp_path)
    r = CliRunner().invoke(main, ["train", str(cfg), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "epsilon=" in r.output and (tmp_path / "results" / "tiny" / "manifest.json").exists()
    assert issubclass(ConfigError, UserError) and issubclass(DataError, UserError)


def test_a_weak_delta_is_reported_through_warn_and_returned_not_printed(tmp_path, capsys):
    heard: list[str] = []
    res = train(tiny(tmp_path, **{"privacy.delta": 0.5, "training.steps": 2}), warn=heard.append)
    assert heard == list(res.warnings) and len(heard) == 1
    assert heard[0].startswith("privacy.delta=0.5 >= 1/n") and "use a smaller delta" in heard[0]
    assert any("the guarantee is weak" in n for n in res.manifest.privacy.notes)
    out = capsys.readouterr()
    assert "delta" not in out.err and "delta" not in out.out  # the library prints nothing; the CLI does
    quiet = train(tiny(tmp_path / "q", **{"training.steps": 2}))
    assert quiet.warnings == ()
