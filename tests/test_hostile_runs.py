"""Hostile inputs, part 2: run directories and checkpoints a dishonest vendor hands to the auditor.

Tampered, corrupt or mismatched files end like every bad input (:func:`hostile_common.assert_error`) and before
any work: nothing is written into the run directory. Forged claims are not input errors: they turn the verdict
into ``VIOLATION`` with the reason. No code a run directory names runs without ``--trust-code``; no pickle is
ever loaded; a received config never downloads. Cases tested in detail elsewhere are indexed in :data:`ELSEWHERE`.

One tiny DP run (digits, an MLP, 6 steps) is trained and attacked once per module; each test works on a copy.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_runs import make_run, update_json, write_signed
from hostile_common import ATTACK_ARGS, Payload, assert_error, cli, edit_json, rehash, write_cfg

from foundation.evidence import read_signed_npz, sign_json
from foundation.io import load_safetensors, save_safetensors, write_npz


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The tiny DP run, attacked with the reference-free attacks (so epsilon's pool source has scores)."""
    root = tmp_path_factory.mktemp("hostile")
    r = cli("train", write_cfg(root / "cfg.yaml", root / "runs"), "--no-progress")
    assert r.exit_code == 0, r.output
    run = root / "runs" / "tiny"
    r = cli("attack", run, *ATTACK_ARGS)
    assert r.exit_code == 0, r.output
    return run


@pytest.fixture
def run(base: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "tiny"
    shutil.copytree(base, dst)
    return dst


def _put(data, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        data = data[p]
    data[last] = value


def _manifest(key: str, value) -> callable:
    def edit(run: Path) -> None:
        edit_json(run / "manifest.json", lambda m: _put(m, key, value))
    return edit


def _weights(fn) -> callable:
    def edit(run: Path) -> None:
        state = load_safetensors(run / "model.safetensors")
        save_safetensors(run / "model.safetensors", fn(state))
        rehash(run)
    return edit


def _raw(file: str, data, *, keep_hash: bool = False) -> callable:
    def edit(run: Path) -> None:
        path = run / file
        path.write_bytes(data(run) if callable(data) else data)
        if not keep_hash:
            rehash(run, file)
    return edit


def _membership(fn) -> callable:
    def edit(run: Path) -> None:
        np.save(run / "membership.npy", fn(np.load(run / "membership.npy")), allow_pickle=True)
        rehash(run, "membership.npy")
    return edit


def _config(old: str, new: str) -> callable:
    return _raw("config.yaml", lambda r: (r / "config.yaml").read_text().replace(old, new, 1).encode())


def _first(state, value):
    key = next(k for k, v in state.items() if v.is_floating_point())
    return {**state, key: value(state[key])}


def _as_dir(file: str) -> callable:
    def edit(run: Path) -> None:
        (run / file).unlink()
        (run / file).mkdir()
    return edit


# -------------------------------------------------------------------- tampered run directories (attack)

TAMPERED = [
    # weights
    ("weights-sha", _raw("model.safetensors", lambda r: b"x" + (r / "model.safetensors").read_bytes()[1:],
                         keep_hash=True), "does not match the manifest"),
    ("weights-missing", lambda r: (r / "model.safetensors").unlink(), "weights file .* in the manifest is missing"),
    ("weights-nan", _weights(lambda s: _first(s, lambda t: torch.full_like(t, float("nan")))),
     r"weights in .* are not finite .* NaN or inf"),
    ("weights-inf", _weights(lambda s: _first(s, lambda t: torch.full_like(t, float("inf")))), "are not finite"),
    ("weights-garbage", _raw("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage"),
     "corrupt or not safetensors"),
    ("weights-empty", _raw("model.safetensors", b""), "corrupt or not safetensors"),
    ("weights-truncated", _raw("model.safetensors", lambda r: (r / "model.safetensors").read_bytes()[:-100]),
     "corrupt or not safetensors"),
    ("weights-huge-header", _raw("model.safetensors", (2**40).to_bytes(8, "little") + b"{}"),
     "corrupt or not safetensors"),
    ("weights-pickle", _raw("model.safetensors", lambda r: pickle.dumps(Payload(r.parent / "PWNED"))),
     "corrupt or not safetensors"),
    ("weights-torch-save", lambda r: (torch.save({"w": Payload(r.parent / "PWNED")}, r / "model.safetensors"),
                                      rehash(r)), "corrupt or not safetensors"),
    ("weights-missing-key", _weights(lambda s: dict(list(s.items())[1:])), r"do not fit .* Missing key\(s\)"),
    ("weights-extra-key", _weights(lambda s: {**s, "evil": torch.zeros(1)}), r"do not fit .* Unexpected key\(s\)"),
    ("weights-shape", _weights(lambda s: _first(s, lambda t: torch.zeros(3, 3))), "do not fit .* size mismatch"),
    ("weights-traversal", _manifest("model.weights_file", "../../../../etc/passwd"),
     r"invalid at 'model\.weights_file'"),
    ("weights-dir", _as_dir("model.safetensors"), "weights file .* is missing"),
    ("num-classes", _manifest("model.num_classes", 3), r"do not fit architecture mlp with .* num_classes=3"),
    ("arch-unknown", _manifest("model.arch", "nope"), r"unknown model\.arch 'nope'"),
    # membership
    ("membership-sha", lambda r: np.save(r / "membership.npy", ~np.load(r / "membership.npy")),
     "does not match the manifest's sha256"),
    ("membership-missing", lambda r: (r / "membership.npy").unlink(), "membership file .* is missing"),
    ("membership-object", _membership(lambda m: np.array([True, None], dtype=object)),
     r"membership file .* is not a plain \.npy bool array"),
    ("membership-pickle", _raw("membership.npy", lambda r: pickle.dumps(Payload(r.parent / "PWNED"))),
     r"is not a plain \.npy bool array"),
    ("membership-truncated", _raw("membership.npy", lambda r: (r / "membership.npy").read_bytes()[:60]),
     r"is not a plain \.npy bool array"),
    ("membership-short", _membership(lambda m: m[:-1]), r"must be a bool vector of length 240, got bool \(239,\)"),
    ("membership-int", _membership(lambda m: m.astype(np.int64)), "must be a bool vector .* got int64"),
    ("membership-2d", _membership(lambda m: m.reshape(-1, 1)), r"must be a bool vector .* \(240, 1\)"),
    ("membership-all-in", _membership(np.ones_like), r"not the Bernoulli\(p=0.5\) draw of the recorded seed 0"),
    ("membership-permuted", _membership(lambda m: np.random.default_rng(1).permutation(m)),
     r"not the Bernoulli\(p=0.5\) draw of the recorded seed 0 \(\d+ of 240 entries differ: permuted"),
    ("membership-traversal", _manifest("data.membership_file", "/etc/passwd"), r"invalid at 'data\.membership_file'"),
    ("pool-size", _manifest("data.pool_size", 10**12), "must be a bool vector of length 1000000000000"),
    # config.yaml
    ("config-edited", lambda r: (r / "config.yaml").write_text((r / "config.yaml").read_text().replace(
        "lr: 0.5", "lr: 0.25")), "recipe was edited"),
    ("config-bad-yaml", _raw("config.yaml", b"a: [unclosed"), r"config\.yaml is not valid YAML"),
    ("config-python-tag", _raw("config.yaml", b"!!python/object/apply:os.system ['touch PWNED']\n"),
     r"config\.yaml is not valid YAML .*could not determine a constructor"),
    ("config-binary", _raw("config.yaml", b"\xff\xfe\x80"), r"config\.yaml is not valid YAML .*utf-8"),
    ("config-duplicate-key", _raw("config.yaml", lambda r: (r / "config.yaml").read_bytes() + b"name: other\n"),
     r"config\.yaml is not valid YAML .*duplicate key 'name'"),
    ("config-invalid", _config("lr: 0.5", "lr: -1"), r"is not a valid training config .*optim\.lr"),
    ("config-list", _raw("config.yaml", b"- a\n"), "the pool rebuilt for .* does not match the manifest"),
    ("config-missing", lambda r: (r / "config.yaml").unlink(), "has neither config.yaml .* nor import.json"),
    ("dataset-mismatch", _manifest("data.dataset", "cifar10"), r"manifest's data\.dataset = 'cifar10' differs"),
    ("pool-fingerprint", _manifest("data.pool_fingerprint", "0" * 64), "the pool rebuilt for .* does not match"),
    # manifest.json
    ("manifest-not-json", _raw("manifest.json", b"{not json", keep_hash=True), "manifest .* is not valid JSON"),
    ("manifest-empty", _raw("manifest.json", b"", keep_hash=True), "manifest .* is not valid JSON"),
    ("manifest-binary", _raw("manifest.json", b"\xff\xfe{", keep_hash=True), "manifest .* is not valid JSON"),
    ("manifest-deep", _raw("manifest.json", b"[" * 100000 + b"]" * 100000, keep_hash=True), "nested too deeply"),
    ("manifest-list", _raw("manifest.json", b"[]", keep_hash=True), "manifest .* is invalid at ''"),
    ("manifest-missing", lambda r: (r / "manifest.json").unlink(), "no manifest"),
    ("manifest-dir", _as_dir("manifest.json"), "manifest not found"),
    ("manifest-bad-value", _manifest("privacy.epsilon", "lots"), r"manifest .* is invalid at 'privacy\.epsilon'"),
    ("manifest-extra-key", _manifest("extra", 1), "is invalid at 'extra'"),
    ("claim-negative", _manifest("privacy.epsilon", -1), r"privacy\.epsilon must be a finite number >= 0"),
    ("claim-delta", _manifest("privacy.delta", 2.0), r"privacy\.delta must be in \(0, 1\)"),
    # issue 37: bounds on a received manifest, checked before anything is allocated from it
    ("num-classes-0", _manifest("model.num_classes", 0), r"invalid at 'model\.num_classes': .*greater than or equal to 1"),
    ("num-classes-neg", _manifest("model.num_classes", -1), r"invalid at 'model\.num_classes'"),
    ("num-classes-1e9", _manifest("model.num_classes", 10**9), r"model\.num_classes': .*less than or equal to 100000"),
    ("input-shape-0", _manifest("model.input_shape", [3, 0, 8]), r"model\.input_shape must be \(C, H, W\) with"),
    ("input-shape-bomb", _manifest("model.input_shape", [3, 100000, 100000]), r"1 <= H, W <= 4096, got \[3, 100000"),
    ("param-count-bomb", _manifest("model.param_count", 10**15), r"invalid at 'model\.param_count'"),
    ("channels-bomb", lambda r: edit_json(r / "manifest.json", lambda m: m["model"].update(
        arch="small_cnn", kwargs={"channels": [100000, 100000]})),
     r"model 'small_cnn' with kwargs .* would have .* parameters, more than 1e\+10 .*refusing to allocate it"),
    ("channels-bomb-mlp", _manifest("model.kwargs", {"hidden": [100000, 100000]}),
     r"model 'mlp' with kwargs .* would have .* parameters, more than 1e\+10 .*refusing to allocate it"),
    ("sigma-1e308", _manifest("privacy.phases", [{"name": "p", "dp": True, "noise_multiplier": 1e308,
                                                   "sample_rate": 0.1, "steps": 6}]),
     r"privacy\.phases\.0\.noise_multiplier': Input should be less than or equal to 10000"),
    ("dp-yes-string", _manifest("privacy.dp", "yes"), r"invalid at 'privacy\.dp': Input should be a valid boolean"),
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


# ------------------------------------------------------------------------------------------ epsilon and scores


def _rewrite_scores(run_dir: Path, change) -> None:
    """scores.npz with its arrays changed by ``change`` and its evidence record kept, as a forger would."""
    with np.load(run_dir / "scores.npz") as z:
        arrays = dict(z)
    write_npz(run_dir / "scores.npz", **change(arrays))


def _randomised(a: dict) -> dict:
    rng = np.random.default_rng(0)
    return a | {k: rng.normal(size=v.shape) for k, v in a.items() if k.startswith("score_")}


def _infinite(a: dict) -> dict:
    return a | {k: np.where(a["membership"], np.inf, -np.inf) for k in a if k.startswith("score_")}


def _duplicated(a: dict) -> dict:
    top = np.flatnonzero(a["membership"])[:5]
    rows = np.concatenate([np.arange(a["pool_index"].size), np.repeat(top, 20)])
    return {k: (v[rows] if v.shape == a["pool_index"].shape else v) for k, v in a.items()}


STALE_SCORES = [
    ("weights-swapped", _weights(lambda s: _first(s, lambda t: t + 0.01)), "scores.npz is stale"),
    ("no-identity", lambda r: write_npz(r / "scores.npz", **{k: v for k, v in np.load(r / "scores.npz").items()
                                                           if not k.startswith(("inputs_digest", "evidence_"))}),
     "carries no evidence signature"),
    ("other-run", lambda r: _rewrite_scores(r, lambda a: a | {"inputs_digest": np.array("0" * 64)}),
     "not signed by this auditor's evidence key"),
    ("randomised", lambda r: _rewrite_scores(r, _randomised), "not signed by this auditor's evidence key"),
    ("infinite", lambda r: _rewrite_scores(r, _infinite), "not signed by this auditor's evidence key"),
    ("rows-duplicated", lambda r: _rewrite_scores(r, _duplicated), "not signed by this auditor's evidence key"),
    ("rows-duplicated-signed", lambda r: write_signed(r, "scores.npz", **{
        k: v for k, v in _duplicated(read_signed_npz(r / "scores.npz", remake="x")).items()}), "repeated"),
    ("not-npz", lambda r: (r / "scores.npz").write_bytes(b"PK\x03\x04"), r"not a readable \.npz"),
    ("pickled", lambda r: np.savez(r / "scores.npz", inputs_digest=np.array([Payload(r.parent / "PWNED")],
                                                                           dtype=object)), r"not a readable \.npz"),
    ("missing", lambda r: (r / "scores.npz").unlink(), "scores.npz not found: run 'audit attack"),
]


@pytest.mark.parametrize("damage, pattern", [(d, p) for _, d, p in STALE_SCORES], ids=[i for i, _, _ in STALE_SCORES])
def test_epsilon_refuses_scores_not_made_from_this_run(run, damage, pattern):
    damage(run)
    assert_error(cli("epsilon", run, "--sources", "pool", "--attack", "loss"), pattern)
    assert not (run / "epsilon.json").exists() and not (run.parent / "PWNED").exists()


def test_truncated_or_edited_signals_are_recomputed(run):
    honest = np.load(run / "scores.npz")["score_loss"]
    with np.load(run / "signals.npz") as z:
        arrays = dict(z)
    arrays["pool"] = arrays["pool"][:, ::-1].copy()  # the vendor's "improvement"
    write_npz(run / "signals.npz", **arrays)  # content_sha256 no longer matches
    assert cli("attack", run, *ATTACK_ARGS).exit_code == 0
    np.testing.assert_allclose(np.load(run / "scores.npz")["score_loss"], honest, rtol=1e-6)

    from attacks.signal_cache import content_sha256

    arrays.pop("content_sha256")
    write_npz(run / "signals.npz", **arrays, content_sha256=np.array(content_sha256(arrays)))  # a forged hash
    assert cli("attack", run, *ATTACK_ARGS).exit_code == 0  # caught by recomputing the target's own signals
    np.testing.assert_allclose(np.load(run / "scores.npz")["score_loss"], honest, rtol=1e-6)

    (run / "signals.npz").write_bytes((run / "signals.npz").read_bytes()[:200])
    r = cli("attack", run, *ATTACK_ARGS)
    assert r.exit_code == 0 and "BadZipFile" not in r.output, r.output
    np.testing.assert_allclose(np.load(run / "scores.npz")["score_loss"], honest, rtol=1e-6)

    np.savez(run / "signals.npz", pool=np.array([Payload(run.parent / "PWNED")], dtype=object))
    assert cli("attack", run, *ATTACK_ARGS).exit_code == 0 and not (run.parent / "PWNED").exists()
    np.testing.assert_allclose(np.load(run / "scores.npz")["score_loss"], honest, rtol=1e-6)


def test_a_second_writer_fails_fast_naming_the_lock_and_holder(run):
    from foundation.lock import LOCK_FILE

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / LOCK_FILE).write_text(json.dumps(sign_json({"pid": proc.pid, "host": socket.gethostname(),
                                                           "command": "audit attack tiny", "started": "now"},
                                                          identity={})))  # taken by this auditor
        shadows = run / "shadows"
        shadows.mkdir()
        (shadows / "keep.npy").write_bytes(b"theirs")
        line = assert_error(cli("attack", run, "--retrain-shadows", *ATTACK_ARGS),
                            rf"is in use: lock .*\.lock is held by pid {proc.pid}")
        assert "audit attack tiny" in line
        assert (shadows / "keep.npy").read_bytes() == b"theirs"  # --retrain-shadows deleted nothing
        assert_error(cli("epsilon", run), f"held by pid {proc.pid}")
    finally:
        proc.kill()
        proc.wait()
    # the holder is gone: its lock is stale and taken over
    assert cli("attack", run, *ATTACK_ARGS).exit_code == 0
    assert not (run / LOCK_FILE).exists()


@pytest.mark.parametrize("holder", [{"pid": 1, "host": "this-host"}, {"pid": 1, "host": "vendor-build-07"},
                                    {"pid": 1, "host": "x", "evidence": {"identity": {}, "mac": "0" * 64}}])
def test_a_lock_shipped_with_the_run_never_blocks_the_auditor(run, holder):
    """A .lock received inside the run directory (pid 1 is always alive; another host is never presumed gone)
    was not taken by this auditor: unsigned or forged, it is taken over."""
    from foundation.lock import LOCK_FILE

    holder = {**holder, "host": socket.gethostname() if holder["host"] == "this-host" else holder["host"]}
    (run / LOCK_FILE).write_text(json.dumps({**holder, "command": "audit attack", "started": "2026-01-01"}))
    r = cli("epsilon", run, "--sources", "pool", "--attack", "loss")
    assert r.exit_code == 0, r.output
    assert not (run / LOCK_FILE).exists()


# ----------------------------------------------------------------------------------------- forged claims


@pytest.mark.parametrize("forge, pattern", [
    (_manifest("privacy.epsilon", 0.5), r"claim does not follow from the stated mechanism: ε\(PLD\) = [\d.]+ > "
                                        r"claimed ε = 0\.5"),
    (lambda r: edit_json(r / "manifest.json", lambda m: [p.__setitem__("dp", False) for p in m["privacy"]["phases"]]),
     "no phase is DP"),
    (lambda r: edit_json(r / "metrics.json", lambda m: m.__setitem__("epsilon_spent", None)),
     "metrics.json contradicts the claim: epsilon_spent = None"),
    (_manifest("provenance.command", "audit train q.yaml --set privacy.enabled=false"),
     "the recorded command contradicts the claim"),
    (lambda r: (r / "config.yaml").write_text((r / "config.yaml").read_text().replace(
        "enabled: true", "enabled: false", 1)), "config.yaml contradicts the claim"),
], ids=["epsilon-edited", "phases-not-dp", "metrics-null", "command-no-dp", "config-no-dp"])
def test_forged_claims_are_violations(run, forge, pattern):
    forge(run)
    r = cli("epsilon", run, "--sources", "pool", "--attack", "loss")
    assert r.exit_code == 0, r.output
    data = json.loads((run / "epsilon.json").read_text())
    assert data["verdict"]["status"] == "VIOLATION" and r.output.lstrip().count("VIOLATION") >= 1
    assert any(re.search(pattern, n) for n in data["verdict"]["notes"]), data["verdict"]["notes"]
    assert data["verdict"]["findings"][0]["severity"] == "error"


def test_honest_claim_passes_the_claim_check(run):
    r = cli("epsilon", run, "--sources", "pool", "--attack", "loss")
    assert r.exit_code == 0, r.output
    data = json.loads((run / "epsilon.json").read_text())
    assert data["verdict"]["findings"] == [] and data["verdict"]["status"] == "CONSISTENT"


# --------------------------------------------------------------------------------------- report and gate

def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


PAYLOAD = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.mark.parametrize("where", ["run_name", "model.arch", "data.dataset", "data.split", "privacy.notes",
                                   "provenance.command", "provenance.git_commit"])
def test_html_in_a_run_directory_is_escaped_in_the_report(tmp_path, where):
    run = make_run(tmp_path / "r")
    value = [PAYLOAD] if where.endswith("notes") else PAYLOAD
    update_json(run, "manifest.json", lambda m: _put(m, where, value))
    if where.startswith("privacy."):  # the claim changed: the evidence bound to it is stale (tested below)
        for name in ("epsilon.json", "transfer.json"):
            (run / name).unlink(missing_ok=True)
    r = cli("report", run)
    assert r.exit_code == 0, r.output
    html = (run / "report.html").read_text()
    assert "<script>alert" not in html and "<img src=x" not in html and "&lt;script&gt;" in html


@pytest.mark.parametrize("where", ["run_name", "provenance.command", "provenance.git_commit", "model.arch"])
def test_no_link_from_a_run_directory_is_live(tmp_path, where):
    """A javascript: URL in Markdown link syntax stays text in report.md (escaped, or in a code span) and never
    becomes an attribute in report.html."""
    run = make_run(tmp_path / "r")
    update_json(run, "manifest.json", lambda m: _put(m, where, "[click](javascript:alert(1)) <javascript:alert(2)>"))
    r = cli("report", run)
    assert r.exit_code == 0, r.output
    html, md = (run / "report.html").read_text(), (run / "report.md").read_text()
    assert not re.search(r"""(href|src|action)\s*=\s*["']?\s*javascript""", html, re.I)
    outside_code = re.sub(r"`[^`]*`", "", md)  # code spans render literally
    assert "javascript" in md and not re.search(r"(?<!\\)\]\(javascript|(?<!\\)<javascript", outside_code)


def test_mathtext_in_names_renders_literally(tmp_path):
    """An attack named like matplotlib mathtext ("$\\frac{a}{$", unbalanced) neither crashes the figures nor is
    typeset: the SVG holds the characters as written."""
    run = make_run(tmp_path / "r")
    name = "$\\frac{a}{$"

    def rename(d: dict) -> None:
        d["attacks"] = {name: next(iter(d["attacks"].values()))}

    update_json(run, "attack.json", rename)
    r = cli("report", run)
    assert r.exit_code == 0, r.output
    assert "$\\frac{a}{$" in (run / "report.html").read_text()


@pytest.mark.parametrize("damage, pattern", [
    (lambda r: (r / "attack.json").write_text("{broken"), r"attack.* is not valid JSON"),
    (lambda r: update_json(r, "attack.json", lambda a: a.__setitem__("format", "evil/9")), "attack"),
    (lambda r: (r / "epsilon.json").write_text("[]"), "epsilon"),
    (lambda r: (r / "manifest.json").write_text("{broken"), "manifest .* is not valid JSON"),
    # result files made for other weights or data: stale after a retrain, or copied from another run
    (lambda r: (_write(r / "model.safetensors", b"retrained"), rehash(r)),
     r"attack\.json is stale: it was made for another weights_sha256 .* re-run 'audit attack "),
    (lambda r: shutil.copy(make_run(r.parent / "other", seed=1) / "epsilon.json", r / "epsilon.json"),
     r"epsilon\.json is stale: it was made for another membership_sha256, pool_fingerprint .*'audit epsilon "),
    (lambda r: update_json(r, "attack.json", lambda a: a.__setitem__("inputs", {})),
     r"attack\.json was not made for this run \(weights_sha256 None"),
], ids=["attack-not-json", "attack-format", "epsilon-list", "manifest-not-json", "weights-changed-after-attack",
        "epsilon-of-another-run", "attack-without-inputs"])
@pytest.mark.parametrize("command", ["report", "gate"])
def test_report_and_gate_refuse_corrupt_result_files(tmp_path, damage, pattern, command):
    run = make_run(tmp_path / "r")
    damage(run)
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - rule: max_claimed_epsilon\n    budget: 8.0\n")
    args = ["report", run] if command == "report" else ["gate", run, run, "--policy", policy,
                                                        "--out", tmp_path / "gate.json"]
    assert_error(cli(*args), pattern)
    assert not (run / "report.html").exists() and not (tmp_path / "gate.json").exists()


@pytest.mark.parametrize("policy, pattern", [
    ("rules: [{rule: os.system, budget: 1}]", r"os\.system"),
    ("!!python/object/apply:os.system ['touch PWNED']", "not valid YAML"),
    ("rules: [{rule: max_claimed_epsilon, budget: .nan}]", "budget"),
    ("", "empty"),
], ids=["unknown-rule", "python-tag", "nan-budget", "empty"])
def test_bad_gate_policies(tmp_path, monkeypatch, policy, pattern):
    monkeypatch.chdir(tmp_path)
    run = make_run(tmp_path / "r")
    (tmp_path / "policy.yaml").write_text(policy)
    assert_error(cli("gate", run, run, "--policy", tmp_path / "policy.yaml", "--out", tmp_path / "gate.json"),
                 pattern)
    assert not (tmp_path / "gate.json").exists() and not (tmp_path / "PWNED").exists()


SUITES = {
    "unknown-dataset": ("datasets: [{name: nope}]", r"datasets\.0: unknown dataset 'nope'; valid names"),
    "unknown-split": ("datasets: [{name: digits, train_split: bogus}]", r"digits: unknown split 'bogus'"),
    "unknown-key": ("datasets: [{name: digits}]\nbogus: 1", r"unknown key 'bogus' \(valid keys here"),
    "no-datasets": ("datasets: []", "list at least one dataset"),
    "label-escape": ("datasets: [{name: digits, label: ../x}]", r"datasets\.0\.label: String should match"),
    "duplicate-label": ("datasets: [{name: digits}, {name: digits}]", "labels must be unique"),
    "empty-c-grid": ("datasets: [{name: digits}]\nprotocols: {linear_probe: {c_grid: []}}", "at least 1 item"),
    "nan-c-grid": ("datasets: [{name: digits}]\nprotocols: {linear_probe: {c_grid: [.nan]}}", "finite number"),
    "zero-limit": ("datasets: [{name: digits, train_limit: 0}]", r"train_limit: Input should be greater than 0"),
    "bad-device": ("device: tpu\ndatasets: [{name: digits}]", r"device: Input should be 'auto', 'cpu' or 'cuda'"),
    "python-tag": ("!!python/object/apply:os.system ['touch PWNED']", "could not determine a constructor"),
}


@pytest.mark.parametrize("text, pattern", list(SUITES.values()), ids=list(SUITES))
def test_bad_transfer_suites(run, tmp_path, monkeypatch, text, pattern):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.yaml").write_text(("name: t\n" if "python" not in text else "") + text + "\n")
    assert_error(cli("transfer", run, "--suite", tmp_path / "suite.yaml", "--quiet"), pattern)
    assert not (run / "transfer.json").exists() and not (tmp_path / "PWNED").exists()


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


# ------------------------------------------------------------------------ white-box evidence (gradient canaries)


@pytest.fixture(scope="module")
def gc_base(tmp_path_factory) -> Path:
    """The tiny DP run trained with 50 gradient canaries (model_init.safetensors is θ_0)."""
    root = tmp_path_factory.mktemp("hostile_gc")
    r = cli("train", write_cfg(root / "cfg.yaml", root / "runs", **{"training.gradient_canaries.count": 50}),
            "--no-progress")
    assert r.exit_code == 0, r.output
    return root / "runs" / "tiny"


def _gc_record_rehash(run: Path, key: str, file: str) -> None:
    from foundation.io import sha256_file

    digest = sha256_file(run / file)
    edit_json(run / "manifest.json", lambda m: m["training"]["gradient_canaries"].__setitem__(key, digest))


def test_zero_update_is_a_finding(gc_base, tmp_path):
    """model_init replaced by the final weights (θ_0 = θ_T, hashes fixed): every canary score would be 0. The
    gradient canaries are skipped and the verdict is VIOLATION with the finding zero_update."""
    run = tmp_path / "tiny"
    shutil.copytree(gc_base, run)
    shutil.copy(run / "model.safetensors", run / "model_init.safetensors")
    _gc_record_rehash(run, "init_weights_sha256", "model_init.safetensors")
    r = cli("epsilon", run, "--sources", "gradient_canaries")
    assert r.exit_code == 0, r.output
    data = json.loads((run / "epsilon.json").read_text())
    assert data["verdict"]["status"] == "VIOLATION"
    assert [f["kind"] for f in data["verdict"]["findings"]][:1] == ["zero_update"]
    assert data["skipped"][0]["source"] == "gradient_canaries" and "zero update" in data["skipped"][0]["reason"]


def test_pickled_gradient_canary_mask_is_never_loaded(gc_base, tmp_path):
    run = tmp_path / "tiny"
    shutil.copytree(gc_base, run)
    np.save(run / "gradient_canaries.npy", np.array([Payload(tmp_path / "PWNED")], dtype=object), allow_pickle=True)
    _gc_record_rehash(run, "included_sha256", "gradient_canaries.npy")
    assert_error(cli("epsilon", run, "--sources", "gradient_canaries"), r"gradient_canaries\.npy is not a plain \.npy")
    assert not (tmp_path / "PWNED").exists() and not (run / "epsilon.json").exists()


def test_an_empty_received_config_is_a_finding_not_a_traceback(gc_base, tmp_path):
    run = tmp_path / "tiny"
    shutil.copytree(gc_base, run)
    (run / "config.yaml").write_text("")
    rehash(run, "config.yaml")
    r = cli("epsilon", run, "--sources", "gradient_canaries")
    assert r.exit_code in (0, 2) and "Traceback" not in r.output, r.output
    if r.exit_code == 0:
        findings = json.loads((run / "epsilon.json").read_text())["verdict"]["findings"]
        assert any(f["kind"] == "claim_vs_config" for f in findings)
    else:
        assert_error(r, r"config\.yaml")


def test_symlinked_shadows_are_never_written_through(run, tmp_path):
    """A shadows/ folder shipped as a symbolic link (to a path the vendor chose) is refused, and with
    --retrain-shadows the link is removed, never followed: the vendor's target is left as it was."""
    target = tmp_path / "vendor_chosen"
    target.mkdir()
    (target / "index.json").write_text("{}")
    (run / "shadows").symlink_to(target, target_is_directory=True)
    args = ["--set", "attack.n_reference=2", "--set", "attack.attacks=[lira_offline]", "--set",
            "attack.population=20", "--set", "attack.n_bootstrap=5", "--set", "attack.device=cpu", "--no-progress"]
    assert_error(cli("attack", run, *args), "symbolic link")
    assert sorted(p.name for p in target.iterdir()) == ["index.json"]
