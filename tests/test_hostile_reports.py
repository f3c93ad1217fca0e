"""Hostile inputs: what a run directory can do to the report, the gate and a transfer suite.

No markup, attribute or URL from a run directory is ever live in ``report.html`` or ``report.md``; a matplotlib
mathtext string renders literally; corrupt, edited or stale result files and hostile gate policies or transfer
suites are refused in one line with nothing written. See tests/test_hostile_runs.py for the suite's index.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from fixtures_runs import make_run, update_json
from hostile_common import assert_error, cli, rehash
from hostile_runs_common import put_key, run_fixtures

from foundation.io import read_json, sha256_file, write_json

base, run = run_fixtures()


# --------------------------------------------------------------------------------------- report and gate

def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _swap_weights_and_forge_identity(run: Path) -> None:
    """Unloadable weights swapped in (the manifest's sha256 fixed) and attack.json's identity rewritten to match
    them, its evidence record included: what a vendor would do to keep a good attack.json for other weights."""
    _write(run / "model.safetensors", b"not a model at all")
    rehash(run)
    digest = sha256_file(run / "model.safetensors")
    data = read_json(run / "attack.json")
    data["inputs"]["weights_sha256"] = data["evidence"]["identity"]["weights_sha256"] = digest
    write_json(run / "attack.json", data)


PAYLOAD = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.mark.parametrize("where", ["run_name", "model.arch", "data.dataset", "data.split", "privacy.notes",
                                   "provenance.command", "provenance.git_commit"])
def test_html_in_a_run_directory_is_escaped_in_the_report(tmp_path, where):
    run = make_run(tmp_path / "r")
    value = [PAYLOAD] if where.endswith("notes") else PAYLOAD
    update_json(run, "manifest.json", lambda m: put_key(m, where, value))
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
    update_json(run, "manifest.json", lambda m: put_key(m, where, "[click](javascript:alert(1)) <javascript:alert(2)>"))
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
    (_swap_weights_and_forge_identity, r"attack\.json is not signed by this auditor's evidence key.*'audit attack "),
], ids=["attack-not-json", "attack-format", "epsilon-list", "manifest-not-json", "weights-changed-after-attack",
        "epsilon-of-another-run", "attack-without-inputs", "attack-identity-forged"])
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
