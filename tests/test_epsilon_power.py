"""The power of an ε audit, fixed before its scores are read and recorded in the signed ``epsilon.json``
(``power``), printed by `audit epsilon` and shown in the report (issue 37: "power before the audit").

The statement must equal :func:`audit.bounds.power.kit_power` at the bound's own m, level and guess grid (that
function is checked against Monte Carlo runs of the estimator in tests/test_kit_power.py), must not depend on the
scores, and must be covered by the evidence signature like the rest of the file.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from epsilon_runs import make_run, read, write_scores

from audit.bounds.epsilon_file import read_epsilon_file
from audit.bounds.power import kit_power
from audit.bounds.runner import k_grids, run_epsilon
from audit.cli import main
from audit.config import EpsilonConfig
from foundation.errors import CheckpointError


def test_epsilon_json_records_the_power_of_each_deciding_bound_whatever_the_scores(tmp_path):
    run = make_run(tmp_path / "r", epsilon=1.0, pool=600)
    write_scores(run, signal=0.0)
    cfg = EpsilonConfig(sources=("pool",))
    quiet = run_epsilon(run_dir=run, config=cfg)
    (entry,) = read(run)["power"]
    # q = 0.1: only the one-run bound decides, at the full α, over the default (k_pos, k_neg) grid of 600
    expect = kit_power(m=600, claim=1.0, delta=1e-5, alpha=0.05, grid=k_grids(600, points=4, guesses="in_out"))
    assert (entry["source"], entry["method"], entry["m"], entry["alpha"], entry["delta"]) == (
        "pool", "one_run", 600, 0.05, 1e-5)
    assert entry["computed"] and entry["power"] == 0.5 and entry["claimed_epsilon"] == 1.0
    assert entry["epsilon_detectable"] == pytest.approx(expect.epsilon_detectable)
    assert entry["accuracy_needed"] == pytest.approx(expect.accuracy_needed)
    assert entry["ceiling"] == pytest.approx(expect.ceiling) and entry["guesses"] == expect.guesses
    assert 1.0 < entry["epsilon_detectable"] < entry["ceiling"]  # 600 examples can refute ε = 1, not just any ε
    assert entry["statement"].endswith(expect.summary()) and entry["statement"].startswith("power of pool (m = 600")
    # stated before the scores were read: a strong attack's scores change the verdict, not the power
    write_scores(run, signal=6.0)
    loud = run_epsilon(run_dir=run, config=cfg)
    assert loud.verdict.status == "VIOLATION" != quiet.verdict.status and loud.power == quiet.power
    # the CLI prints what the file records
    r = CliRunner().invoke(main, ["epsilon", str(run), "--sources", "pool"])
    assert r.exit_code == 0 and read(run)["power"][0]["statement"] in r.output, r.output


def test_the_power_follows_the_level_split_and_is_absent_without_a_finite_claim(tmp_path):
    run = make_run(tmp_path / "g", epsilon=8.0, sample_rate=1.0)  # Gaussian claim: one_run and one_run_fdp decide
    write_scores(run, signal=0.0)
    (entry,) = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",))).power
    assert entry.alpha == pytest.approx(0.025)  # α / 2, as the one-run bound is computed
    assert entry.epsilon_detectable is None and entry.ceiling < 8.0 and "cannot be refuted" in entry.statement
    assert entry.statement.endswith("audit more examples (a larger data.pool_size, members drawn with p = 1/2)")
    none = make_run(tmp_path / "n", epsilon=None, pool=400)
    write_scores(none, signal=0.0)
    assert run_epsilon(run_dir=none, config=EpsilonConfig(sources=("pool",))).power == ()
    assert read(none)["power"] == []


def test_an_edited_power_statement_is_refused_like_any_edit(tmp_path):
    run = make_run(tmp_path / "r", epsilon=1.0, pool=400)
    write_scores(run, signal=0.0)
    run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",)))
    data = read(run)
    data["power"][0]["epsilon_detectable"] = 1.01  # "this audit would have seen any violation"
    (run / "epsilon.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="not signed by this auditor's evidence key.*audit epsilon"):
        read_epsilon_file(run)


def test_the_report_shows_the_power_of_the_audit(tmp_path):
    run = make_run(tmp_path / "r", epsilon=1.0, pool=400)
    write_scores(run, signal=0.0)
    (entry,) = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool",))).power
    r = CliRunner().invoke(main, ["report", str(run)])
    assert r.exit_code == 0, r.output
    md, html = (run / "report.md").read_text(), (run / "report.html").read_text()
    row = f"| pool | 400 | 0.05 | {entry.epsilon_detectable:.3f} | {entry.accuracy_needed:.4f} | {entry.ceiling:.3f} |"
    assert "What the audit could detect" in md and row in md, md
    assert 'data-field="power"' in html and f"<strong>{entry.epsilon_detectable:.3f}</strong>" in html
    power = json.loads((run / "report.json").read_text())["epsilon"]["power"]
    assert power[0]["epsilon_detectable"] == pytest.approx(entry.epsilon_detectable)
