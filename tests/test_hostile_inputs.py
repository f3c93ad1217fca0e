"""Hostile inputs, part 1: configs, datasets and weights files a careless user or a dishonest vendor hands over.

This file and tests/test_hostile_runs.py (run directories and checkpoints; with test_hostile_claims.py,
test_hostile_reports.py, test_hostile_writes.py, test_hostile_disk.py, test_hostile_code.py and
test_hostile_evidence.py) are the regression suite of issue 11: every bad input must end the same way
(:func:`hostile_common.assert_error`): exit code 2, one line on stderr starting with ``error:`` that names the
problem, no traceback, no half-written output, and no code from the input ever runs (:class:`hostile_common.Payload` writes a marker file when unpickled). Cases
tested in detail elsewhere are indexed in :data:`test_hostile_runs.ELSEWHERE`.
"""

from __future__ import annotations

import errno
import os
import pickle
import re

import numpy as np
import pytest
import torch
from hostile_common import Payload, assert_error, cli, write_cfg

from audit.cli import main
from foundation.io import save_safetensors

# ------------------------------------------------------------------------------------------ configs (train)

BAD_VALUES = [
    # non-finite and out-of-range numbers
    (["optim.lr=.inf"], r"optim\.lr: Input should be a finite number, got inf"),
    (["optim.lr=.nan"], r"optim\.lr: Input should be a finite number"),
    (["optim.lr=1e400"], r"optim\.lr: Input should be a finite number"),
    (["privacy.max_grad_norm=.inf"], r"privacy\.max_grad_norm: Input should be a finite number"),
    (["privacy.noise_multiplier=.inf"], r"privacy\.noise_multiplier: Input should be a finite number"),
    (["privacy.noise_multiplier=-1"], r"privacy\.noise_multiplier: Input should be greater than or equal to 0"),
    (["privacy.noise_multiplier=0"], r"privacy\.noise_multiplier must be > 0 when privacy is enabled"),
    (["privacy.delta=.nan"], r"privacy\.delta: Input should be a finite number"),
    (["optim.momentum=-.inf"], r"optim\.momentum: Input should be a finite number"),
    (["optim.momentum=1"], r"optim\.momentum: Input should be less than 1"),
    (["optim.weight_decay=-1"], r"optim\.weight_decay: Input should be greater than or equal to 0"),
    (["data.image_size=4096"], r"data\.image_size: Input should be less than or equal to 1024, got 4096"),
    # issue 37: values that used to end in a traceback, or pass silently
    (["optim.lr=1e308"], r"optim\.lr must be at most 1e\+38 .*float32.*got 1e\+308"),
    (["optim.name=adam", "optim.betas=[2.0, -1]"], r"optim\.betas must both be in \[0, 1\)"),
    (["optim.betas=[2.0, -1]"], r"optim\.betas must both be in \[0, 1\)"),  # with SGD: was silently accepted
    (["privacy.noise_multiplier=1e-300"], r"noise_multiplier must be 0 or at least 0\.001, got 1e-300"),
    (["privacy.noise_multiplier=1e308"], r"noise_multiplier: Input should be less than or equal to 10000"),
    (["training.seed=18446744073709551617"], r"training\.seed: Input should be less than or equal to 9223372036854775807"),
    (["data.membership_seed=-1"], r"data\.membership_seed: Input should be greater than or equal to 0"),
    (["model.arch=small_cnn", "model.kwargs={channels: [100000, 100000]}"],
     r"would have 9e\+10 parameters, more than 1e\+10 .*refusing to allocate"),
    (["privacy..enabled=true"], r"--set key 'privacy\.\.enabled' has an empty part"),
    (["data.image_size=0"], r"data\.image_size: Input should be greater than 0"),
    (["data.pool_size=0"], r"data\.pool_size: Input should be greater than 0"),
    (["data.pool_size=100000"], r"data\.pool_size=100000 but digits split 'train' has only \d+ examples"),
    (["data.member_prob=1"], r"data\.member_prob: Input should be less than 1"),
    (["data.member_prob=0"], r"data\.member_prob: Input should be greater than 0"),
    (["training.steps=0"], r"training\.steps: Input should be greater than 0"),
    (["training.epochs=0"], r"training\.epochs: Input should be greater than 0"),
    (["training.batch_size=0"], r"training\.batch_size: Input should be greater than 0"),
    (["training.physical_batch_size=0"], r"training\.physical_batch_size: Input should be greater than 0"),
    (["training.batch_size=100000"], r"larger than the \d+ training examples"),
    (["training.log_every=0"], r"training\.log_every: Input should be greater than 0"),
    (["training.seed=-1"], r"training\.seed: Input should be greater than or equal to 0"),
    (["training.canaries.count=-1"], r"training\.canaries\.count: Input should be greater than or equal to 0"),
    # impossible privacy parameters
    (["privacy.delta=1.5"], r"privacy\.delta must be in \(0, 1\), got 1\.5"),
    (["privacy.delta=0"], r"privacy\.delta must be in \(0, 1\), got 0\.0"),
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=0"], r"privacy\.target_epsilon must be > 0"),
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=-1"], r"privacy\.target_epsilon must be > 0"),
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=.inf"], r"privacy\.target_epsilon: .* finite"),
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=1e-6"],
     r"target epsilon 1e-06 is unreachable .* raise the target epsilon or delta"),
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=1e9"],
     r"privacy\.target_epsilon=1e\+09 is above 100: .*bounds no attack.* set privacy\.enabled: false"),
    (["privacy.noise_multiplier=null", "privacy.target_epsilon=100.5"], r"privacy\.target_epsilon=100\.5 is above 100"),
    (["privacy.target_epsilon=2"], r"give privacy\.noise_multiplier or privacy\.target_epsilon, not both"),
    (["privacy.noise_multiplier=null"], r"set privacy\.target_epsilon or privacy\.noise_multiplier"),
    # wrong types
    (["training.steps=abc"], r"training\.steps: Input should be a valid integer"),
    (["training.steps=1.5"], r"training\.steps: Input should be a valid integer, got a number with a fractional"),
    (["training.steps=yes"], r"training\.steps: Input should not be a boolean"),
    (["optim.lr=true"], r"optim\.lr: Input should not be a boolean"),
    (["privacy.enabled=1"], r"privacy\.enabled: Input should be true or false \(a YAML boolean\), got 1"),
    (["privacy.enabled=0"], r"privacy\.enabled: Input should be true or false \(a YAML boolean\), got 0"),
    (["privacy.enabled='no'"], r"privacy\.enabled: Input should be true or false \(a YAML boolean\), got 'no'"),
    (["data.stream=1"], r"data\.stream: Input should be true or false \(a YAML boolean\) or 'auto', got 1"),
    (["training.augment.flip=1"], r"training\.augment\.flip: Input should be true or false"),
    (["optim.lr=fast"], r"optim\.lr: Input should be a valid number"),
    (["data=5"], r"data: Input should be a valid dictionary"),
    (["name=null"], r"name: Input should be a valid string"),
    (["optim.lr.x=1"], r"cannot set optim\.lr\.x: lr is a value, not a section"),
    # choices and names
    (["training.device=tpu"], r"training\.device: Input should be 'auto', 'cpu' or 'cuda'"),
    (["optim.name=lion"], r"optim\.name: Input should be 'sgd', 'adam' or 'adamw', got 'lion'"),
    (["privacy.accountant=gdp"], r"privacy\.accountant: Input should be 'prv', 'rdp' or 'pld'"),
    (["privacy.sampling=foo"], r"privacy\.sampling: Input should be 'poisson' or 'shuffle'"),
    (["privacy.clipping=none"], r"privacy\.clipping"),
    (["training.canaries.kind=x"], r"training\.canaries\.kind: Input should be 'mislabel' or 'ood'"),
    (["name=../escape"], r"name: String should match pattern"),
    (["data.dataset=nope"], r"unknown dataset 'nope'; valid names: digits"),
    (["data.split=bogus"], r"digits: unknown split 'bogus'; valid splits: train, test"),
    (["data.test_split=train"], r"data\.test_split 'train' is the training split"),
    (["data.download=true"], r"digits: cannot be downloaded; set data\.download: false"),
    (["model.arch=nope"], r"unknown model\.arch 'nope': use one of small_cnn"),
    (["model.arch=hf-hub:timm/resnet18"], r"asks timm to fetch a model from hf-hub; dp-audit never downloads"),
    (["model.arch=resnet18", "model.kwargs={checkpoint_path: /etc/passwd}"],
     r"model\.kwargs may not set checkpoint_path: dp-audit never downloads"),
    (["model.kwargs={hidden: x}"], r"model\.kwargs for 'mlp' are invalid"),
    (["model.kwargs={bogus: 1}"], r"model\.kwargs \['bogus'\] are not accepted by 'mlp'; allowed"),
    (["model.freeze=[nomatch*]"], r"model\.freeze pattern 'nomatch\*' matches no parameter"),
    (["training.recipe=finetune"], r"finetune needs training\.finetune\.checkpoint"),
    # misspelt keys
    (["optim.nesterov=true"], r"unknown key 'optim\.nesterov'"),
    (["nosection.key=1"], r"unknown key 'nosection'"),
    (["privacy.epsilon=1"], r"unknown key 'privacy\.epsilon' .*did you mean"),
]


@pytest.mark.parametrize("overrides, pattern", BAD_VALUES, ids=[",".join(o) for o, _ in BAD_VALUES])
def test_bad_config_values_stop_before_training(tmp_path, overrides, pattern):
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs")
    assert_error(cli("train", cfg, "--no-progress", *[a for o in overrides for a in ("--set", o)]), pattern)
    assert not (tmp_path / "runs" / "tiny").exists()  # refused before any work: no run directory


def _switches(model, prefix=""):
    """Every field of ``model`` and its sections whose values include true/false, as (dotted name, field)."""
    from pydantic import BaseModel
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from _switches(field.annotation, f"{prefix}{name}.")
        elif field.annotation is bool or bool in getattr(field.annotation, "__args__", ()):
            yield f"{prefix}{name}", field


def test_every_switch_of_every_config_section_takes_only_true_or_false():
    """pydantic's lax mode reads 1, 0, "yes" and "off" as booleans: ``privacy.enabled: 1`` would pass as True."""
    from audit.config import RunConfig
    from audit.transfer.suite import FinetuneProtocol, KnnProtocol, LinearProbeProtocol, TransferDataset
    from training.config import apply_overrides, validate_config
    from foundation.errors import ConfigError

    base = {"privacy": {"enabled": True, "target_epsilon": 8.0}, "training": {"steps": 1}}
    switches = list(_switches(RunConfig))
    assert {"privacy.enabled", "data.stream", "attack.flip", "epsilon.fdp", "report.pdf",
            "training.continual.public.audit_split"} <= {n for n, _ in switches}
    for name, _ in switches:
        for value in (True, False):  # YAML true/false keep working
            cfg = validate_config(apply_overrides(base, [f"{name}={str(value).lower()}"]), RunConfig)
            assert cfg.model_dump()[name.split(".")[0]] is not None
        for value in (1, 0, "yes", "false", 1.0, None):
            with pytest.raises(ConfigError, match=rf"{re.escape(name)}: Input should be true or false"):
                validate_config(apply_overrides(base, [f"{name}={value!r}" if isinstance(value, str) else
                                                       f"{name}={'null' if value is None else value}"]), RunConfig)
    assert validate_config(apply_overrides(base, ["data.stream=auto"]), RunConfig).data.stream == "auto"
    for section in (TransferDataset, LinearProbeProtocol, KnnProtocol, FinetuneProtocol):
        for name, _ in _switches(section):
            with pytest.raises(Exception, match="Input should be true or false"):
                section.model_validate({name: 1})


DEEP = "[" * 20000 + "]" * 20000
YAML_FILES = [
    ("- a\n- b\n", "must hold a mapping"),
    ("just a string\n", "must hold a mapping"),
    ("", "is empty"),
    ("data: {dataset: [unclosed\n", "not valid YAML at line"),
    ("!!python/object/apply:os.system ['touch PWNED']\n", "not valid YAML"),
    ("name: a\nname: b\n", r"duplicate key 'name'"),
    (DEEP, "nested too deeply"),
    (b"name: \xff\xfe\x80\n", "is not UTF-8 text"),
]


@pytest.mark.parametrize("text, pattern", YAML_FILES,
                         ids=["list", "scalar", "empty", "unclosed", "python-tag", "duplicate-key", "deep", "binary"])
def test_bad_yaml_files(tmp_path, monkeypatch, text, pattern):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cfg.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_error(cli("train", path, "--no-progress"), pattern)
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "results").exists()


CLI_ARGS = [
    (["train", "{cfg}", "--set", "privacy.delta"], "--set expects KEY=VALUE"),
    (["train", "{cfg}", "--variant", "x"], "defines no variants"),
    (["train", "{tmp}/missing.yaml"], "config file not found"),
    (["train", "{tmp}"], r"Invalid value for 'CONFIG': File .* is a directory \(see 'audit train --help'\)"),
    (["run", "{cfg}", "--steps", "train,fly"], r"unknown step\(s\) \['fly'\]"),
    (["train", "{cfg}", "--bogus"], r"No such option '--bogus' \(see 'audit train --help'\)"),
    (["fly"], r"No such command 'fly'"),
    (["attack"], r"Missing argument 'RUN'"),
    (["epsilon", "{tmp}", "--alpha", "x"], r"'x' is not a valid float"),
    (["gate", "{tmp}", "{tmp}"], r"Missing option '--policy'"),
]


@pytest.mark.parametrize("args, pattern", CLI_ARGS, ids=[" ".join(a) for a, _ in CLI_ARGS])
def test_bad_command_lines(tmp_path, args, pattern):
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs")
    assert_error(cli(*[a.format(cfg=cfg, tmp=tmp_path) for a in args]), pattern)


# -------------------------------------------------------------------------------------------------- data


def _npz(path, *, y, x=None):
    y = np.asarray(y)
    x = np.zeros((len(y), 8, 8, 3), np.uint8) if x is None else x
    np.savez(path, x=x, y=y)


def _pickled_npz(d):
    with open(d / "train.npz", "wb") as fh:
        pickle.dump({"x": Payload(d.parent / "PWNED")}, fh)


NPZ_FILES = [
    ("huge-label", lambda d: _npz(d / "train.npz", y=[0, 1, 10**9, 2]),
     r"label 1000000000 .* implies 1000000001 classes"),
    ("negative-label", lambda d: _npz(d / "train.npz", y=[0, -1, 1, 2]), r"labels in .* must be >= 0, got -1"),
    ("float-labels", lambda d: _npz(d / "train.npz", y=[0.5, 1.0, 0.0, 1.0]), "must hold integer labels"),
    ("label-beyond-classes-txt",
     lambda d: (_npz(d / "train.npz", y=[0, 1, 2, 5]), (d / "classes.txt").write_text("a\nb\nc\n")),
     r"must lie in \[0, 3\)"),
    ("float-images", lambda d: _npz(d / "train.npz", y=[0, 1, 2, 3], x=np.zeros((4, 8, 8, 3), np.float32)),
     "must be uint8"),
    ("gray-images", lambda d: _npz(d / "train.npz", y=[0, 1, 2, 3], x=np.zeros((4, 8, 8), np.uint8)),
     r"shape \(N, H, W, 3\)"),
    ("length-mismatch", lambda d: _npz(d / "train.npz", y=[0, 1, 2], x=np.zeros((4, 8, 8, 3), np.uint8)),
     r"must have shape \(4,\)"),
    ("object-labels", lambda d: _npz(d / "train.npz", y=np.array([0, 1, "a", None], dtype=object)),
     "without unpickling"),
    ("object-images", lambda d: _npz(d / "train.npz", y=[0, 1], x=np.array([Payload(d.parent / "PWNED"), 1],
                                                                           dtype=object)), "without unpickling"),
    ("pickle-not-npz", _pickled_npz, "cannot read"),
    ("truncated", lambda d: (d / "train.npz").write_bytes(b"PK\x03\x04 truncated"), "cannot read"),
    ("no-y", lambda d: np.savez(d / "train.npz", x=np.zeros((4, 8, 8, 3), np.uint8)), r"lacks array\(s\) y"),
    ("missing-file", lambda d: None, r"npz: no data at"),
]


@pytest.mark.parametrize("make, pattern", [(m, p) for _, m, p in NPZ_FILES], ids=[i for i, _, _ in NPZ_FILES])
def test_bad_npz_data(tmp_path, make, pattern):
    data = tmp_path / "data"
    data.mkdir()
    make(data)
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs", **{"data.dataset": "npz", "data.root": str(data),
                                                                  "data.pool_size": None, "data.test_split": None})
    assert_error(cli("train", cfg, "--no-progress"), pattern)
    assert not (tmp_path / "runs" / "tiny").exists() and not (tmp_path / "PWNED").exists()


CIFAR_FILES = ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]


@pytest.mark.parametrize("batch, pattern", [
    (lambda m: pickle.dumps({b"data": Payload(m), b"labels": [0]}, protocol=2), r"refusing to unpickle"),
    (lambda m: pickle.dumps(Payload(m), protocol=2), r"refusing to unpickle"),
    (lambda m: pickle.dumps({b"data": np.array([Payload(m)], dtype=object), b"labels": [0]}, protocol=2),
     r"refusing to unpickle"),
    (lambda m: pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]}, protocol=2)[:40],
     r"corrupt|truncated|cannot read"),
], ids=["payload-inside", "payload-at-top", "object-array", "truncated"])
def test_bad_cifar_pickles_run_no_code(tmp_path, batch, pattern):
    marker = tmp_path / "PWNED"
    folder = tmp_path / "cifar" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in ["batches.meta", *CIFAR_FILES]:
        (folder / name).write_bytes(batch(marker))
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs",
                    **{"data.dataset": "cifar10", "data.root": str(tmp_path / "cifar")})
    assert_error(cli("train", cfg, "--no-progress"), pattern)
    assert not marker.exists() and not (tmp_path / "runs" / "tiny").exists()


# ------------------------------------------------------------------ weights files named by a config


def _mlp_state():
    from training.config import ModelConfig
    from training.models import build_model

    return build_model(ModelConfig(arch="mlp", kwargs={"hidden": [16]}), num_classes=10,
                       input_shape=(3, 8, 8)).module.net.state_dict()


WEIGHTS_FILES = [
    ("payload.pt", lambda p, m: torch.save({"w": Payload(m)}, p), r"never unpickles .*posix\.system"),
    ("raw-pickle.pth", lambda p, m: p.write_bytes(pickle.dumps(Payload(m))), "never unpickles"),
    ("whole-module.pt", lambda p, m: torch.save(torch.nn.Linear(2, 2), p), r"never unpickles .*Linear"),
    ("garbage.pt", lambda p, m: p.write_bytes(b"garbage"), "corrupt"),
    ("payload.safetensors", lambda p, m: p.write_bytes(pickle.dumps(Payload(m))), "corrupt or not safetensors"),
    ("truncated.safetensors", lambda p, m: (save_safetensors(p, _mlp_state()), p.write_bytes(p.read_bytes()[:-9])),
     "corrupt or not safetensors"),
    ("wrong-shapes.safetensors", lambda p, m: save_safetensors(p, {k: torch.zeros(2) for k in _mlp_state()}),
     r"model\.pretrained .* size mismatch|do not fit|shape"),
    ("not-weights.yaml", lambda p, m: p.write_text("a: 1"), "unsupported suffix '.yaml'"),
    ("missing.pt", lambda p, m: None, r"weights file not found|checkpoint .* does not exist"),
]


@pytest.mark.parametrize("name, make, pattern", WEIGHTS_FILES, ids=[n for n, _, _ in WEIGHTS_FILES])
@pytest.mark.parametrize("field", ["model.pretrained", "training.finetune.checkpoint"])
def test_weights_files_named_by_a_config_run_no_code(tmp_path, field, name, make, pattern):
    marker = tmp_path / "PWNED"
    path = tmp_path / name
    make(path, marker)
    over = {field: str(path)} | ({"training.recipe": "finetune"} if field.startswith("training") else {})
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs", **over)
    assert_error(cli("train", cfg, "--no-progress"), pattern)
    assert not marker.exists() and not (tmp_path / "runs" / "tiny" / "manifest.json").exists()


def test_a_finetune_checkpoint_that_is_not_a_run_directory(tmp_path):
    (tmp_path / "base").mkdir()
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs",
                    **{"training.recipe": "finetune", "training.finetune.checkpoint": str(tmp_path / "base")})
    assert_error(cli("train", cfg, "--no-progress"), "no manifest at .*base/manifest.json")


# ------------------------------------------------------------------------------------------ training outputs


def test_nan_loss_stops_training_with_an_error(tmp_path):
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs", **{"privacy.enabled": False,
                                                                  "privacy.noise_multiplier": None})
    assert_error(cli("train", cfg, "--no-progress", "--set", "optim.lr=1e38"),
                 r"training diverged at step \d+ \(phase 'non-private'\): the loss is (nan|inf)")
    assert not (tmp_path / "runs" / "tiny" / "manifest.json").exists()  # no claim, no "done"


def test_output_dir_that_is_a_file(tmp_path):
    (tmp_path / "runs").write_text("not a directory")
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs")
    assert_error(cli("train", cfg, "--no-progress"), r"runs is a file, not a directory")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write into read-only dirs")
def test_read_only_output_dir(tmp_path):
    (tmp_path / "runs").mkdir(mode=0o500)
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs")
    assert_error(cli("train", cfg, "--no-progress"), "is not writable")


def test_overwrite_refuses_a_symlinked_run_dir(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "tiny").symlink_to(precious)
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs")
    assert_error(cli("train", cfg, "--no-progress", "--overwrite"), "--overwrite refuses .* symbolic link")
    assert (precious / "thesis.tex").read_text() == "years of work"


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path):
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "runs" / "tiny" / "notes.txt").write_text("mine")
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs")
    assert_error(cli("train", cfg, "--no-progress", "--overwrite"), "not a run directory")
    assert (tmp_path / "runs" / "tiny" / "notes.txt").exists()


@pytest.mark.parametrize("code, pattern", [(errno.ENOSPC, r"no space left on device writing .*model\.safetensors"),
                                           (errno.EACCES, r"permission denied on .*model\.safetensors"),
                                           (errno.EROFS, r"permission denied on .*model\.safetensors")],
                         ids=["disk-full", "permission", "read-only-fs"])
def test_disk_errors_while_writing_weights_are_one_line(tmp_path, monkeypatch, code, pattern):
    def fail(*_a, **_k):
        raise OSError(code, os.strerror(code), str(tmp_path / "runs" / "tiny" / "model.safetensors"))

    monkeypatch.setattr("training.run.writer.write_weights", fail)
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs")
    assert_error(cli("train", cfg, "--no-progress"), pattern)
    assert not (tmp_path / "runs" / "tiny" / "manifest.json").exists()


@pytest.mark.parametrize("command, target, hint", [
    ("train", "training.trainer.train", "re-run with --resume"),
    ("attack", "attacks.runner.run_attack", "re-run the same command"),
    ("run", "audit.pipeline.run_pipeline", "re-run the same command"),
])
def test_interrupt_messages_name_flags_that_exist(tmp_path, monkeypatch, command, target, hint):
    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    module, name = target.rsplit(".", 1)
    monkeypatch.setattr(f"{module}.{name}", interrupted)
    if command == "run":
        monkeypatch.setattr("audit.commands.run.run_pipeline", interrupted)
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs")
    (tmp_path / "r").mkdir()
    args = {"train": ["train", cfg], "attack": ["attack", tmp_path / "r"], "run": ["run", cfg]}[command]
    r = cli(*args)
    assert r.exit_code == 130 and hint in r.output, r.output
    flags = set(re.findall(r"--[a-z-]+", r.output))
    have = {p.opts[0] for p in main.commands[command].params if p.opts[0].startswith("--")}
    assert flags <= have, (flags, have)


@pytest.mark.parametrize("over, pattern", [
    ({"attack.n_reference": 3, "attack.attacks": ["loss", "lira_online"]},
     r"attack\.n_reference must be an even number >= 2.*got 3"),
    ({"attack.n_reference": 0, "attack.attacks": ["lira_online"]}, r"attack\.n_reference must be an even number"),
    ({"epsilon.attack": "lira_online"}, r"epsilon\.attack is 'lira_online', but attack\.attacks"),
    ({"transfer.suite": "{tmp}/nope.yaml"}, "not found"),
    ({"attack.attacks": ["os:system"]}, r"attack\.attacks.*os:system"),
], ids=["odd-references", "no-references", "epsilon-attack-not-run", "missing-suite", "unknown-attack"])
def test_audit_run_checks_every_step_before_training(tmp_path, over, pattern):
    over = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in over.items()}
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs", **over)
    assert_error(cli("run", cfg, "--no-progress"), pattern)
    assert not (tmp_path / "runs" / "tiny").exists()


def test_transfer_default_suite_does_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    from audit.commands.transfer import default_suite
    from audit.transfer.suite import load_suite

    monkeypatch.chdir(tmp_path)
    assert default_suite().is_absolute() and load_suite(default_suite()).datasets


def test_progress_bar_labels_its_epsilon_as_the_rdp_bound(tmp_path):
    from types import SimpleNamespace

    from training.progress import EPSILON_LABEL, TrainLogger

    logger = TrainLogger(tmp_path / "tb", total=10, show=True)
    seen = []
    logger._progress.update = lambda _task, **kw: seen.append(kw.get("info"))
    stats = SimpleNamespace(loss=1.0, lr=0.1, batch_size=8, noise_std=0.1, clipped_fraction=0.5, grad_norm_mean=1.0)
    logger.log(1, stats, epsilon=9.17)
    logger.close()
    assert EPSILON_LABEL == "ε (RDP, upper bound)" and seen == [f"loss 1.000  {EPSILON_LABEL} 9.17"]
    prv = TrainLogger(tmp_path / "tb2", total=10, show=True, claim_accountant="prv")  # both bounds named
    seen.clear()
    prv._progress.update = lambda _task, **kw: seen.append(kw.get("info"))
    prv.log(1, stats, epsilon=9.17)
    prv.close()
    assert seen == ["loss 1.000  ε (RDP bound; claim: PRV) 9.17"]
