"""Hostile inputs, part 2: run directories and checkpoints a dishonest vendor hands to the auditor.

Tampered, corrupt or mismatched files end like every bad input (:func:`hostile_common.assert_error`) and before
any work: nothing is written into the run directory, no code a run directory names runs without ``--trust-code``,
no pickle is ever loaded, a received config never downloads, and a received manifest is bounds-checked before
anything is allocated from it. The other run-directory suites: tests/test_hostile_claims.py (derived evidence and
forged claims), tests/test_hostile_reports.py (report, gate, transfer suites), tests/test_hostile_writes.py (locks,
symbolic links, disk faults). Cases tested in detail elsewhere are indexed in :data:`ELSEWHERE`.

The tiny DP run (tests/hostile_runs_common.py) is trained and attacked once per module; each test works on a copy.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hostile_common import ATTACK_ARGS, Payload, assert_error, cli, edit_json, rehash
from hostile_runs_common import (as_dir, config_edit, first_float, manifest_edit, membership_edit, raw_edit,
                                 run_fixtures, weights_edit)

base, run = run_fixtures()


# -------------------------------------------------------------------- tampered run directories (attack)

TAMPERED = [
    # weights
    ("weights-sha", raw_edit("model.safetensors", lambda r: b"x" + (r / "model.safetensors").read_bytes()[1:],
                             keep_hash=True), "does not match the manifest"),
    ("weights-missing", lambda r: (r / "model.safetensors").unlink(), "weights file .* in the manifest is missing"),
    ("weights-nan", weights_edit(lambda s: first_float(s, lambda t: torch.full_like(t, float("nan")))),
     r"weights in .* are not finite .* NaN or inf"),
    ("weights-inf", weights_edit(lambda s: first_float(s, lambda t: torch.full_like(t, float("inf")))),
     "are not finite"),
    ("weights-garbage", raw_edit("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage"),
     "corrupt or not safetensors"),
    ("weights-empty", raw_edit("model.safetensors", b""), "corrupt or not safetensors"),
    ("weights-truncated", raw_edit("model.safetensors", lambda r: (r / "model.safetensors").read_bytes()[:-100]),
     "corrupt or not safetensors"),
    ("weights-huge-header", raw_edit("model.safetensors", (2**40).to_bytes(8, "little") + b"{}"),
     "corrupt or not safetensors"),
    ("weights-pickle", raw_edit("model.safetensors", lambda r: pickle.dumps(Payload(r.parent / "PWNED"))),
     "corrupt or not safetensors"),
    ("weights-torch-save", lambda r: (torch.save({"w": Payload(r.parent / "PWNED")}, r / "model.safetensors"),
                                      rehash(r)), "corrupt or not safetensors"),
    ("weights-missing-key", weights_edit(lambda s: dict(list(s.items())[1:])), r"do not fit .* Missing key\(s\)"),
    ("weights-extra-key", weights_edit(lambda s: {**s, "evil": torch.zeros(1)}),
     r"do not fit .* Unexpected key\(s\)"),
    ("weights-shape", weights_edit(lambda s: first_float(s, lambda t: torch.zeros(3, 3))),
     "do not fit .* size mismatch"),
    ("weights-traversal", manifest_edit("model.weights_file", "../../../../etc/passwd"),
     r"invalid at 'model\.weights_file'"),
    ("weights-dir", as_dir("model.safetensors"), "weights file .* is missing"),
    ("num-classes", manifest_edit("model.num_classes", 3), r"do not fit architecture mlp with .* num_classes=3"),
    ("arch-unknown", manifest_edit("model.arch", "nope"), r"unknown model\.arch 'nope'"),
    # membership
    ("membership-sha", lambda r: np.save(r / "membership.npy", ~np.load(r / "membership.npy")),
     "does not match the manifest's sha256"),
    ("membership-missing", lambda r: (r / "membership.npy").unlink(), "membership file .* is missing"),
    ("membership-object", membership_edit(lambda m: np.array([True, None], dtype=object)),
     r"membership file .* is not a plain \.npy bool array"),
    ("membership-pickle", raw_edit("membership.npy", lambda r: pickle.dumps(Payload(r.parent / "PWNED"))),
     r"is not a plain \.npy bool array"),
    ("membership-truncated", raw_edit("membership.npy", lambda r: (r / "membership.npy").read_bytes()[:60]),
     r"is not a plain \.npy bool array"),
    ("membership-short", membership_edit(lambda m: m[:-1]), r"must be a bool vector of length 240, got bool \(239,\)"),
    ("membership-int", membership_edit(lambda m: m.astype(np.int64)), "must be a bool vector .* got int64"),
    ("membership-2d", membership_edit(lambda m: m.reshape(-1, 1)), r"must be a bool vector .* \(240, 1\)"),
    ("membership-all-in", membership_edit(np.ones_like), r"not the Bernoulli\(p=0.5\) draw of the recorded seed 0"),
    ("membership-permuted", membership_edit(lambda m: np.random.default_rng(1).permutation(m)),
     r"not the Bernoulli\(p=0.5\) draw of the recorded seed 0 \(\d+ of 240 entries differ: permuted"),
    ("membership-traversal", manifest_edit("data.membership_file", "/etc/passwd"),
     r"invalid at 'data\.membership_file'"),
    ("pool-size", manifest_edit("data.pool_size", 10**12), "must be a bool vector of length 1000000000000"),
    # config.yaml
    ("config-edited", lambda r: (r / "config.yaml").write_text((r / "config.yaml").read_text().replace(
        "lr: 0.5", "lr: 0.25")), "recipe was edited"),
    ("config-bad-yaml", raw_edit("config.yaml", b"a: [unclosed"), r"config\.yaml is not valid YAML"),
    ("config-python-tag", raw_edit("config.yaml", b"!!python/object/apply:os.system ['touch PWNED']\n"),
     r"config\.yaml is not valid YAML .*could not determine a constructor"),
    ("config-binary", raw_edit("config.yaml", b"\xff\xfe\x80"), r"config\.yaml is not valid YAML .*utf-8"),
    ("config-duplicate-key", raw_edit("config.yaml", lambda r: (r / "config.yaml").read_bytes() + b"name: other\n"),
     r"config\.yaml is not valid YAML .*duplicate key 'name'"),
    ("config-invalid", config_edit("lr: 0.5", "lr: -1"), r"is not a valid training config .*optim\.lr"),
    ("config-list", raw_edit("config.yaml", b"- a\n"), "the pool rebuilt for .* does not match the manifest"),
    ("config-missing", lambda r: (r / "config.yaml").unlink(), "has neither config.yaml .* nor import.json"),
    ("dataset-mismatch", manifest_edit("data.dataset", "cifar10"), r"manifest's data\.dataset = 'cifar10' differs"),
    ("pool-fingerprint", manifest_edit("data.pool_fingerprint", "0" * 64), "the pool rebuilt for .* does not match"),
    # manifest.json
    ("manifest-not-json", raw_edit("manifest.json", b"{not json", keep_hash=True), "manifest .* is not valid JSON"),
    ("manifest-empty", raw_edit("manifest.json", b"", keep_hash=True), "manifest .* is not valid JSON"),
    ("manifest-binary", raw_edit("manifest.json", b"\xff\xfe{", keep_hash=True), "manifest .* is not valid JSON"),
    ("manifest-deep", raw_edit("manifest.json", b"[" * 100000 + b"]" * 100000, keep_hash=True), "nested too deeply"),
    ("manifest-list", raw_edit("manifest.json", b"[]", keep_hash=True), "manifest .* is invalid at ''"),
    ("manifest-missing", lambda r: (r / "manifest.json").unlink(), "no manifest"),
    ("manifest-dir", as_dir("manifest.json"), "manifest not found"),
    ("manifest-bad-value", manifest_edit("privacy.epsilon", "lots"), r"manifest .* is invalid at 'privacy\.epsilon'"),
    ("manifest-extra-key", manifest_edit("extra", 1), "is invalid at 'extra'"),
    ("claim-negative", manifest_edit("privacy.epsilon", -1), r"privacy\.epsilon must be a finite number >= 0"),
    ("claim-delta", manifest_edit("privacy.delta", 2.0), r"privacy\.delta must be in \(0, 1\)"),
    # issue 37: bounds on a received manifest, checked before anything is allocated from it
    ("num-classes-0", manifest_edit("model.num_classes", 0),
     r"invalid at 'model\.num_classes': .*greater than or equal to 1"),
    ("num-classes-neg", manifest_edit("model.num_classes", -1), r"invalid at 'model\.num_classes'"),
    ("num-classes-1e9", manifest_edit("model.num_classes", 10**9),
     r"model\.num_classes': .*less than or equal to 100000"),
    ("input-shape-0", manifest_edit("model.input_shape", [3, 0, 8]), r"model\.input_shape must be \(C, H, W\) with"),
    ("input-shape-bomb", manifest_edit("model.input_shape", [3, 100000, 100000]),
     r"1 <= H, W <= 4096, got \[3, 100000"),
    ("param-count-bomb", manifest_edit("model.param_count", 10**15), r"invalid at 'model\.param_count'"),
    ("channels-bomb", lambda r: edit_json(r / "manifest.json", lambda m: m["model"].update(
        arch="small_cnn", kwargs={"channels": [100000, 100000]})),
     r"model 'small_cnn' with kwargs .* would have .* parameters, more than 1e\+10 .*refusing to allocate it"),
    ("channels-bomb-mlp", manifest_edit("model.kwargs", {"hidden": [100000, 100000]}),
     r"model 'mlp' with kwargs .* would have .* parameters, more than 1e\+10 .*refusing to allocate it"),
    ("sigma-1e308", manifest_edit("privacy.phases", [{"name": "p", "dp": True, "noise_multiplier": 1e308,
                                                       "sample_rate": 0.1, "steps": 6}]),
     r"privacy\.phases\.0\.noise_multiplier': Input should be less than or equal to 10000"),
    ("dp-yes-string", manifest_edit("privacy.dp", "yes"), r"invalid at 'privacy\.dp': Input should be a valid boolean"),
    ("claim-nan", lambda r: (r / "manifest.json").write_text(re.sub(
        r'"epsilon": [0-9.e+-]+', '"epsilon": NaN', (r / "manifest.json").read_text(), count=1)),
     r"privacy\.epsilon must be a finite number"),
]


@pytest.mark.parametrize("damage, pattern", [(d, p) for _, d, p in TAMPERED], ids=[i for i, _, _ in TAMPERED])
def test_tampered_run_directories_are_refused_before_any_work(run, damage, pattern):
    damage(run)
    before = sorted(p.name for p in run.iterdir())
    assert_error(cli("attack", run, *ATTACK_ARGS), pattern)
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written, no lock left behind
    assert not (run.parent / "PWNED").exists() and not Path("PWNED").exists()


@pytest.mark.parametrize("command", ["attack", "epsilon", "transfer", "report"])
@pytest.mark.parametrize("path", ["missing", "file"])
def test_a_run_dir_that_is_not_a_directory(tmp_path, command, path):
    target = tmp_path / "r"
    if path == "file":
        target.write_text("x")
    assert_error(cli(command, target), r"not found|is a file|does not exist")


#: Hostile inputs tested in detail in other files (kept there, listed here so these files are the index).
ELSEWHERE = {
    "no code from a run dir: payload markers, --trust-code recorded, shadows, report/gate": "tests/test_trust_code.py",
    "unknown dataset / arch, misspelt keys, target ε ≤ 0, δ out of range": "tests/test_trainer.py",
    "resume with another config or corrupt state, kill -9 and exact resume": "tests/test_trainer.py",
    "malicious, truncated, object-dtype and codec pickles in CIFAR files": "tests/test_datasets.py",
    "missing roots, missing batches, bad SVHN .mat, unknown Food101 classes": "tests/test_datasets.py",
    "corrupt / unsafe weight files, head and key mismatches": "tests/test_models_weights.py",
    "imported weights that do not fit, claims without δ": "tests/test_import.py",
    "weights, membership, pool fingerprint and recipe mismatches (library level)": "tests/test_attack_runner.py",
    "the claim check on edited manifests, config, metrics and commands": "tests/test_claim_check.py",
    "missing report inputs, self-contained HTML": "tests/test_report.py",
}


def test_the_index_points_at_files_that_exist():
    root = Path(__file__).resolve().parents[1]
    assert all((root / f).is_file() for f in ELSEWHERE.values())
