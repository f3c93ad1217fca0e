"""The run directory (training.run): opened once per command, the report's thumbnails with input canaries, and one
rule for whether an output is current."""

from __future__ import annotations

import collections
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from audit.cli import main
from training.config import TrainConfig
from foundation.errors import CheckpointError
from training.run import (CONFIG_FILE, MEMBERSHIP_FILE, WEIGHTS_FILE, VerifiedRun, inputs_digest, inputs_record,
                          is_current, open_run)

TINY = {
    "name": "tiny",
    "data": {"dataset": "synthetic", "split": "train:n=64,classes=4,noise=250",
             "test_split": "test:n=32,classes=4,noise=250", "audit_split": True},
    "model": {"arch": "mlp", "kwargs": {"hidden": [16]}},
    "privacy": {"noise_multiplier": 0.5, "max_grad_norm": 1.0, "delta": 1e-3},
    "optim": {"name": "sgd", "lr": 0.5},
    "training": {"steps": 4, "batch_size": 16, "progress": False, "log_every": 100, "checkpoint_every": 100,
                 "canaries": {"count": 8, "kind": "ood", "seed": 1}},
    "attack": {"n_reference": 2, "attacks": ["loss", "lira_online"], "population": 10, "n_bootstrap": 5,
               "executor": "batched", "device": "cpu", "flip": False, "top_vulnerable": 4},
    "epsilon": {"sources": ["pool", "input_canaries", "gradient_canaries"], "attack": "lira_online"},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny DP run whose pool ends with 8 input canaries (training.canaries.count > 0)."""
    from training.trainer import train

    cfg = TrainConfig.model_validate({k: v for k, v in TINY.items() if k not in ("attack", "epsilon")}
                                     | {"output_dir": str(tmp_path_factory.mktemp("runs"))})
    return train(cfg, progress=False).run_dir


@pytest.fixture
def run_copy(trained: Path, tmp_path: Path) -> Path:
    dst = tmp_path / trained.name
    shutil.copytree(trained, dst)
    return dst


# ----------------------------------------------------------------------------------------------- counting reads


class Reads:
    """Counts, per run directory, every read of the files open_run verifies, wherever it happens.

    Each counted function is replaced in every loaded module that holds a reference to it, so a module that
    bypassed training.run (its own sha256_file of the weights, its own build_pool) would be counted too.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.mp = monkeypatch
        import training.config
        import training.data
        import foundation.io
        import training.pool
        import training.run.manifest
        import training.run.verified as verified
        from training.run.manifest import Manifest

        self._spy(training.run.manifest, "read_manifest", lambda a, k: ("manifest", a[0]))
        self._spy(verified, "read_weights", lambda a, k: ("weights", a[0]))
        self._spy(verified, "read_membership", lambda a, k: ("membership", a[0]))
        self._spy(verified, "read_config", lambda a, k: ("config", a[0]))
        self._spy(training.pool, "build_pool", lambda a, k: ("pool", "*"))
        self._spy(training.data, "split_rows", lambda a, k: ("pool decode", "*"))  # the one pool draw
        self._spy(foundation.io, "sha256_file", self._file_key)
        self._spy(training.config, "load_yaml", self._file_key)
        original = Manifest.model_validate.__func__

        def validate(cls, *a, **k):
            self.counts["*"]["manifest parse"] += 1
            return original(cls, *a, **k)

        monkeypatch.setattr(Manifest, "model_validate", classmethod(validate))

    @staticmethod
    def _file_key(args, kwargs):
        path = Path(args[0])
        what = {WEIGHTS_FILE: "weights hash", MEMBERSHIP_FILE: "membership hash", CONFIG_FILE: "config read"}
        return (what.get(path.name), path.parent)

    def _spy(self, module, name, key) -> None:
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            what, where = key(args, kwargs)
            if what is not None:
                self.counts[str(Path(where).resolve()) if where != "*" else "*"][what] += 1
            return original(*args, **kwargs)

        for mod in list(sys.modules.values()):
            for attr, value in list(vars(mod).items()) if hasattr(mod, "__dict__") else []:
                if value is original:
                    self.mp.setattr(mod, attr, wrapper)

    def of(self, run: Path) -> dict[str, int]:
        return dict(self.counts.get(str(run.resolve()), {}))

    def reset(self) -> None:
        self.counts.clear()


def _cli(*args: str) -> None:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output


ONCE = {"manifest": 1, "weights": 1, "membership": 1, "config": 1}


def test_each_command_reads_and_verifies_each_file_once(run_copy: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    reads = Reads(monkeypatch)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(TINY))

    _cli("attack", str(run_copy), "--config", str(cfg), "--no-progress")
    assert reads.of(run_copy) == ONCE
    assert reads.counts["*"] == {"pool": 1, "pool decode": 1, "manifest parse": 1 + 2}  # target + 2 references
    for k in range(2):  # the reference models: weights and membership verified once, the pool is the target's
        assert reads.of(run_copy / "shadows" / str(k)) == {"manifest": 1, "weights": 1, "membership": 1}

    reads.reset()
    _cli("epsilon", str(run_copy), "--config", str(cfg))
    # scores.npz covers the canaries: the pool is not needed, so config and pool are not read at all
    assert reads.of(run_copy) == {"manifest": 1, "weights": 1, "membership": 1}
    assert reads.counts["*"] == {"manifest parse": 1}

    reads.reset()
    _cli("report", str(run_copy))
    # the report needs the pool (thumbnails), hence the config; it hashes weights and membership once (the
    # identity its evidence must be signed for)
    assert reads.of(run_copy) == {"manifest": 1, "config": 1, "weights": 1, "membership": 1}
    assert reads.counts["*"] == {"pool": 1, "pool decode": 1, "manifest parse": 1}


def test_the_pipeline_opens_its_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from audit.config import load_run_config
    from audit.pipeline import run_pipeline

    data = {**TINY, "output_dir": str(tmp_path / "results")}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    config = load_run_config(path)
    reads = Reads(monkeypatch)
    [result] = run_pipeline(config=config, steps=("train", "attack", "epsilon", "report"), progress=False,
                            log=lambda m: None)
    assert [s.status for s in result.steps] == ["ran"] * 4
    # the trainer wrote the manifest and built the pool; the audit steps check them, never re-parse or rebuild
    assert reads.of(result.run_dir) == {"weights": 1, "membership": 1, "config": 1}
    assert reads.counts["*"] == {"pool": 1, "pool decode": 1, "manifest parse": 2}  # the 2 reference models
    reads.reset()
    [again] = run_pipeline(config=config, steps=("train", "attack", "epsilon", "report"), progress=False,
                           log=lambda m: None)
    assert all(s.status.startswith("skipped") for s in again.steps)
    # a complete run: the trainer reads the manifest (and hashes config.yaml) once; currentness needs only the
    # verified weights and membership
    assert reads.of(result.run_dir) == {"manifest": 1, "weights": 1, "membership": 1, "config read": 1}
    assert reads.counts["*"] == {"manifest parse": 1}


# ------------------------------------------------------------------------------------------ report thumbnails


def test_report_of_a_run_with_input_canaries_has_its_thumbnails(run_copy: Path) -> None:
    from attacks.runner import run_attack
    from attacks.config import AttackConfig
    from audit.reporting import write_report
    from training.data import load_pool

    run = open_run(run_copy)
    manifest = run.manifest
    assert manifest.data.canaries["count"] == 8 and len(run.pool) == 64 + 8
    # the bug this guards against: the data loader alone gives the pool without its canaries
    assert load_pool(run.config.data).fingerprint() != manifest.data.pool_fingerprint
    result = run_attack(run_dir=run, progress=False, config=AttackConfig(
        attacks=("loss",), n_reference=0, n_bootstrap=5, population=0, flip=False, device="cpu", top_vulnerable=6))
    vulnerable = result.report.attacks["loss"].most_vulnerable
    html = write_report(run_dir=run_copy).html.read_text()
    uris = re.findall(r'src="data:image/png;base64,[^"]+"', html)
    assert len(vulnerable) == 6 and len(uris) == 6
    assert "could not be re-loaded" not in html and "does not match" not in html


# ---------------------------------------------------------------------------------------------- verification


def test_open_run_refuses_each_tampered_file(trained: Path, tmp_path: Path) -> None:
    for name, match in ((WEIGHTS_FILE, "does not match the manifest"), (MEMBERSHIP_FILE, "membership file"),
                        (CONFIG_FILE, "config sha256")):
        run = tmp_path / name
        shutil.copytree(trained, run)
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        with pytest.raises(CheckpointError, match=match):
            open_run(run)
        lazy = open_run(run, verify=False)  # deferred: the manifest is fine, the file is refused on first use
        with pytest.raises(CheckpointError, match=match):
            lazy.verify()


def test_model_is_built_from_the_weights_read_once(trained: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    run = open_run(trained)
    monkeypatch.setattr("training.run.verified.read_weights", lambda *a: pytest.fail("weights read again"))
    model = run.model()
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in run.state_dict.items())


# ------------------------------------------------------------------------------------------------ freshness


def test_an_output_is_current_only_for_the_same_run_and_step_keys(trained: Path, tmp_path: Path) -> None:
    run = open_run(trained, verify=False)
    rec = inputs_record(run, config_sha256="abc")
    assert set(rec) == {"weights_sha256", "membership_sha256", "pool_fingerprint", "config_sha256"}
    assert is_current(json.loads(json.dumps(rec)), run, config_sha256="abc")
    assert is_current(inputs_digest(run, config_sha256="abc"), run, config_sha256="abc")
    assert not is_current(rec, run, config_sha256="abd")
    assert not is_current({**rec, "extra": 1}, run, config_sha256="abc")
    assert not is_current(None, run, config_sha256="abc")
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    mask = np.load(other / MEMBERSHIP_FILE)
    np.save(other / MEMBERSHIP_FILE, ~mask)  # another membership with a manifest that records it
    man = json.loads((other / "manifest.json").read_text())
    from foundation.io import sha256_file

    man["data"]["membership_sha256"] = sha256_file(other / MEMBERSHIP_FILE)
    man["data"]["membership"]["scheme"] = "explicit"  # not a re-drawable seed (that is refused: test_hostile_runs)
    (other / "manifest.json").write_text(json.dumps(man))
    assert not is_current(rec, open_run(other, verify=False), config_sha256="abc")
    with pytest.raises(ValueError, match="identity"):
        inputs_record(run, weights_sha256="x")


def test_verified_run_passes_through_as_run(trained: Path) -> None:
    from training.run import as_run

    run = open_run(trained, verify=False)
    assert as_run(run, verify=False) is run and isinstance(as_run(trained), VerifiedRun)
