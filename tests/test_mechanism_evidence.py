"""mechanism.json is signed evidence bound to the run's claim, for the engine's runs and for OpacusAuditor runs:
an edited result or an edited claim is refused, and the report shows only a result that verifies."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from audit.cli import main
from audit.mechanism.result import read_mechanism
from fixtures_runs import make_run, update_json
from foundation.errors import CheckpointError
from test_mechanism_opacus import _script

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _engine_run(tmp_path):
    run = make_run(tmp_path / "run", epsilon=4.5, with_epsilon=False, with_transfer=False)
    update_json(run, "manifest.json", lambda d: d["privacy"]["phases"][0].update(
        noise_multiplier=2.0, sample_rate=1.0, steps=4, max_grad_norm=1.0, clipping="flat", grad_sample_mode="hooks"),
        resign=False)
    assert CliRunner().invoke(main, ["mechanism", str(run), "--trials", "2000"]).exit_code == 0
    return run


def _opacus_run(tmp_path):
    auditor = _script(tmp_path / "run", sigma=2.0, batch_size=240, steps=4)
    auditor.audit_mechanism(trials=2000, seed=3)
    return auditor.run_dir


@pytest.mark.parametrize("make", [_engine_run, _opacus_run], ids=["engine", "opacus"])
def test_mechanism_json_is_signed_and_bound_to_the_claim(tmp_path, make):
    run = make(tmp_path)
    good = read_mechanism(run)
    assert good is not None
    report = CliRunner().invoke(main, ["report", str(run)])
    assert report.exit_code == 0, report.output
    md = (run / "report.md").read_text() if (run / "report.md").is_file() else ""
    assert f"Mechanism audit (`audit mechanism`, {good.target.replace('_', chr(92) + '_')}" in md
    # a forger turns the verdict around: the signature no longer verifies
    update_json(run, "mechanism.json", lambda d: d["verdict"].update(status="CONSISTENT") or d.update(
        epsilon_lb=0.1), resign=False)
    with pytest.raises(CheckpointError, match="mechanism.json"):
        read_mechanism(run)
    bad = CliRunner().invoke(main, ["report", str(run)])
    assert bad.exit_code == 2 and "mechanism.json" in bad.output and "Traceback" not in bad.output
    remake = "auditor.audit_mechanism()" if make is _opacus_run else "audit mechanism"
    assert remake in bad.output


def test_a_result_made_for_another_claim_is_stale(tmp_path):
    run = _engine_run(tmp_path)
    update_json(run, "manifest.json", lambda d: d["privacy"].update(epsilon=9.0))  # the claim edited afterwards
    with pytest.raises(CheckpointError, match="is stale.*audit mechanism"):
        read_mechanism(run)
