"""`audit import`: external checkpoints become auditable run directories; reference-free attacks run on them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from attacks.runner import run_attack
from training.run import CONFIG_FILE, IMPORT_FILE, open_run
from audit.cli import main
from attacks.config import AttackConfig
from audit.importer import import_checkpoint, parse_source
from training.config import ModelConfig
from training.data import load_dataset, to_float_tensor
from foundation.errors import CheckpointError, ConfigError, UserError
from training.run.manifest import read_manifest

N_MEMBERS, N_NON, N_POP = 60, 60, 20
MEMBERS = parse_source("digits:train", limit=N_MEMBERS)
NONMEMBERS = parse_source("digits:test", limit=N_NON)
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A small CNN that memorised 60 digits, saved elsewhere-style: torch.save({"state_dict": ...}) with the
    ``module.`` prefix DataParallel adds."""
    from training.models import build_model

    torch.manual_seed(0)
    net = build_model(ModelConfig(arch="small_cnn", normalize_mean=MEAN, normalize_std=STD), num_classes=10,
                      input_shape=(3, 8, 8)).module
    data = load_dataset("digits", split="train", limit=N_MEMBERS)
    x, y = to_float_tensor(data.x), torch.from_numpy(np.array(data.y))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    path = tmp_path_factory.mktemp("external") / "ckpt.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.net.state_dict().items()}, "epoch": 3}, path)
    return path


@pytest.fixture(scope="module")
def imported(weights: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "external"
    import_checkpoint(weights=weights, arch="small_cnn", normalize_mean=MEAN, normalize_std=STD, members=MEMBERS,
                      nonmembers=NONMEMBERS, population=N_POP, out=out, device="cpu")
    return out


def test_import_writes_a_verifiable_run(imported: Path, weights: Path) -> None:
    manifest = read_manifest(imported)
    assert manifest.data.membership.scheme == "explicit"
    assert manifest.data.pool_size == N_MEMBERS + N_NON - N_POP and manifest.data.membership.n_members == N_MEMBERS
    assert manifest.privacy.dp is False and manifest.privacy.claimed_epsilon == float("inf")
    assert manifest.model.arch == "small_cnn" and manifest.model.normalize_mean == MEAN
    target = open_run(imported)                         # pool rebuilt from the sources, fingerprint checked
    mask = target.membership
    assert mask[:N_MEMBERS].all() and not mask[N_MEMBERS:].any()
    record = json.loads((imported / IMPORT_FILE).read_text())
    assert record["members"]["dataset"] == "digits" and record["nonmembers"]["split"] == "test"
    assert len(record["population"]["indices"]) == N_POP
    assert not (imported / CONFIG_FILE).exists() and not target.has_recipe
    assert len(target.pool) == manifest.data.pool_size and len(target.population) == N_POP
    model = target.model()                               # the saved weights are the external ones
    original = torch.load(weights, weights_only=True)["state_dict"]
    for name, value in model.net.state_dict().items():
        assert torch.equal(value, original[f"module.{name}"])
    metrics = json.loads((imported / "metrics.json").read_text())
    assert metrics["train_accuracy"] > metrics["test_accuracy"]


def test_reference_free_attacks_run_on_an_import(imported: Path) -> None:
    result = run_attack(run_dir=imported, progress=False, config=AttackConfig(
        attacks=("loss", "attack_p"), n_reference=0, n_bootstrap=20, population=N_POP, flip=False))
    setup = result.report.setup
    assert setup.n_population == N_POP and setup.n_reference == 0 and setup.recipe_hash is None
    for name in ("loss", "attack_p"):
        assert result.report.attacks[name].metrics.auc > 0.6   # the model memorised its members


def test_attacks_needing_a_recipe_are_refused_clearly(imported: Path) -> None:
    with pytest.raises(UserError, match="lira_online.*no config.yaml"):
        run_attack(run_dir=imported, progress=False, config=AttackConfig(attacks=("loss", "lira_online")))


def test_hand_written_manifest_without_import_record(weights: Path, tmp_path: Path) -> None:
    out = tmp_path / "hand"
    import_checkpoint(weights=weights, arch="small_cnn", normalize_mean=MEAN, normalize_std=STD, out=out,
                      members=parse_source("digits:train"), nonmembers=parse_source("digits:test"), device="cpu")
    (out / IMPORT_FILE).unlink()            # what remains is what a person would write by hand
    target = open_run(out)                  # pool = data.split + data.nonmember_split of data.dataset
    assert target.population is None and int(target.membership.sum()) == 1347 and len(target.pool) == 1797


def test_import_refuses_mismatched_weights_and_bad_claims(weights: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="do not match the model"):
        import_checkpoint(weights=weights, arch="mlp", members=MEMBERS, nonmembers=NONMEMBERS, out=tmp_path / "a")
    with pytest.raises(ConfigError, match="--claimed-epsilon and --delta together"):
        import_checkpoint(weights=weights, arch="small_cnn", members=MEMBERS, nonmembers=NONMEMBERS,
                          out=tmp_path / "b", claimed_epsilon=2.0)
    with pytest.raises(ConfigError, match="DATASET:SPLIT"):
        parse_source("digits")
    bad = tmp_path / "evil.pt"
    torch.save({"state_dict": {"w": torch.ones(1)}, "obj": _Opaque()}, bad)
    with pytest.raises(CheckpointError, match="never unpickles"):
        import_checkpoint(weights=bad, arch="small_cnn", members=MEMBERS, nonmembers=NONMEMBERS, out=tmp_path / "c")


class _Opaque:
    """A pickled class instance: loading it would need unsafe unpickling."""


def test_cli_import_then_attack(weights: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli"
    args = ["import", "--weights", str(weights), "--arch", "small_cnn", "--normalize-mean", "0.5", "0.5", "0.5",
            "--normalize-std", "0.25", "0.25", "0.25", "--members", "digits:train", "--nonmembers", "digits:test",
            "--limit", "40", "--population", "10", "--claimed-epsilon", "3", "--delta", "1e-5", "--out", str(out)]
    done = runner.invoke(main, args)
    assert done.exit_code == 0, done.output
    assert read_manifest(out).privacy.epsilon == 3.0 and read_manifest(out).privacy.dp
    again = runner.invoke(main, args)
    assert again.exit_code == 2 and "--overwrite" in again.output
    attack = runner.invoke(main, ["attack", str(out), "--set", "attack.n_bootstrap=10", "--no-progress"])
    assert attack.exit_code == 0, attack.output
    assert "only loss, attack_p" in attack.output and "attack_p" in attack.output
    assert "not resolvable with 30 non-members" in attack.output        # 0.1 % and 0.01 % FPR, 30 non-members
    lira = runner.invoke(main, ["attack", str(out), "--set", "attack.attacks=[lira_online]", "--no-progress"])
    assert lira.exit_code == 2 and lira.output.startswith("error:") and "config.yaml" in lira.output


def test_forged_import_claim_is_not_passed_by_the_default_gate(weights: Path, tmp_path: Path) -> None:
    """Non-DP weights imported with --claimed-epsilon 0.5: the claim lists no mechanism (claim_unverifiable) and
    the default gate answers UNVERIFIABLE (exit 3), not PASS."""
    runner = CliRunner()
    out = tmp_path / "forged"
    args = ["import", "--weights", str(weights), "--arch", "small_cnn", "--normalize-mean", "0.5", "0.5", "0.5",
            "--normalize-std", "0.25", "0.25", "0.25", "--members", "digits:train", "--nonmembers", "digits:test",
            "--limit", "40", "--population", "10", "--claimed-epsilon", "0.5", "--delta", "1e-5", "--out", str(out)]
    assert runner.invoke(main, args).exit_code == 0
    assert runner.invoke(main, ["attack", str(out), "--set", "attack.n_bootstrap=10", "--no-progress"]).exit_code == 0
    eps = runner.invoke(main, ["epsilon", str(out), "--sources", "pool"])
    assert eps.exit_code == 0, eps.output
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - rule: no_violation\n")
    gate = runner.invoke(main, ["gate", str(out), str(out), "--policy", str(policy), "--out", str(tmp_path / "g.json")])
    status = json.loads((tmp_path / "g.json").read_text())["status"] if (tmp_path / "g.json").is_file() else None
    assert (gate.exit_code, status) in ((3, "UNVERIFIABLE"), (1, "FAIL")), gate.output  # never a pass
