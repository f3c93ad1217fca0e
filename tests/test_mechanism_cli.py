"""`audit mechanism`: the command on a run directory and on options, and the report's mechanism line."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from audit.cli import main
from audit.mechanism.result import read_mechanism
from audit.reporting import write_report
from fixtures_runs import make_run, update_json


def _cheap_phase(data: dict) -> None:
    ph = data["privacy"]["phases"][0]
    ph.update(noise_multiplier=2.0, sample_rate=1.0, steps=4, max_grad_norm=1.0, clipping="per_layer",
              grad_sample_mode="bk")


def test_command_on_a_run_writes_mechanism_json_and_the_report_shows_it(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", epsilon=4.5, with_epsilon=False, with_transfer=False)
    update_json(run, "manifest.json", _cheap_phase, resign=False)
    res = CliRunner().invoke(main, ["mechanism", str(run), "--trials", "4000"])
    assert res.exit_code == 0, res.output
    assert "engine bk/per_layer" in res.output and "verdict: CONSISTENT" in res.output
    m = read_mechanism(run)
    trials = m.trials_in + m.trials_out  # whole runs of the run's n examples (2 n canaries each) from 4,000 up
    assert m is not None and m.claimed_epsilon == 4.5 and 4000 <= trials < 4000 + m.canaries_per_run
    md = write_report(run_dir=run, load_images=False, generated="2025-01-02T03:04:05+00:00").markdown.read_text()
    assert f"Mechanism audit (`audit mechanism`, engine bk/per\\_layer, {trials:,} Dirac-canary trials): **CONSISTENT**" in md


def test_command_on_options_and_bad_input(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["mechanism", "--sigma", "2", "--sample-rate", "1", "--steps", "4", "--delta",
                                    "1e-5", "--trials", "4000", "--json", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["verdict"]["status"] == "CONSISTENT"
    assert read_mechanism(tmp_path / "o") is not None
    bad = CliRunner().invoke(main, ["mechanism", "--sigma", "2", "--steps", "4"])
    assert bad.exit_code == 2 and "all required" in bad.output and "Traceback" not in bad.output
    bad = CliRunner().invoke(main, ["mechanism", "--sigma", "2", "--sample-rate", "0.33", "--steps", "4", "--delta",
                                    "1e-5", "--trials", "100", "--canaries-per-run", "100"])
    assert bad.exit_code == 2 and "whole number" in bad.output
