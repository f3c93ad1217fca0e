"""The audit of the DP implementation itself (mechanism.json) decides the report's headline and the gate.

Each run is the fixture run with one full-batch DP phase (σ = 2, q = 1, T = 4, claimed ε = 4.5 at δ = 1e-5) and a
black-box epsilon.json that is CONSISTENT (ε_lb 1.23, ceiling 12); its mechanism.json is made by the real audit:
of the honest engine, or of the engine with its noise multiplier planted at σ × 0.8 (audit.mechanism.mutants),
8,000 Dirac-canary trials (under a second).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from audit.cli import main
from audit.gating import evaluate_gate, parse_policy
from audit.mechanism.api import audit_mechanism, audit_run_mechanism
from audit.reporting import write_report
from fixtures_runs import make_run, update_json
from foundation.errors import UserError
from foundation.evidence import EVIDENCE_KEY, sign_json
from foundation.io import read_json, write_json
from training.run.freshness import evidence_identity
from training.run.manifest import read_manifest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_POLICY = REPO / "eval_configs" / "gates" / "default.yaml"
CLAIM = dict(noise_multiplier=2.0, sample_rate=1.0, steps=4, delta=1e-5, claimed_epsilon=4.5)


def _run(path: Path, *, seed: int, mechanism: str | None) -> Path:
    """A run whose DP phase the mechanism audit can replay; ``mechanism``: None (no mechanism.json), ``honest``
    or a planted bug of :mod:`audit.mechanism.mutants`."""
    run = make_run(path, seed=seed, epsilon=4.5, ceiling=12.0, with_transfer=False)
    update_json(run, "manifest.json", lambda d: d["privacy"]["phases"][0].update(
        noise_multiplier=2.0, sample_rate=1.0, steps=4, max_grad_norm=1.0, clipping="flat", grad_sample_mode="hooks"))
    eps = read_json(run / "epsilon.json")  # the claim's phase changed: re-sign it for the run as it is now
    eps.pop(EVIDENCE_KEY)
    write_json(run / "epsilon.json", sign_json(eps, identity=evidence_identity(read_manifest(run))))
    if mechanism == "honest":
        assert str(audit_run_mechanism(run, trials=2000).verdict.status) == "CONSISTENT"
    elif mechanism is not None:
        r = audit_mechanism(**CLAIM, trials=8000, seed=0, mutant=mechanism, run_dir=run)
        assert str(r.verdict.status) == "VIOLATION" and r.epsilon_lb > 4.5
    return run


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return _run(tmp_path / "base", seed=1, mechanism=None)


def _gate(base: Path, cand: Path, out: Path):
    return CliRunner().invoke(main, ["gate", str(base), str(cand), "--policy", str(DEFAULT_POLICY),
                                     "--out", str(out)])


def test_honest_mechanism_keeps_the_headline_and_adds_a_line(tmp_path: Path, base: Path) -> None:
    plain = write_report(run_dir=base, load_images=False).report.glance
    run = _run(tmp_path / "honest", seed=1, mechanism="honest")
    g = write_report(run_dir=run, load_images=False).report.glance
    assert (g.status, g.headline, g.summary) == (plain.status, plain.headline, plain.summary) == (
        "CONSISTENT", "No violation found", plain.summary)
    assert plain.mechanism is None
    m = read_json(run / "mechanism.json")
    assert g.mechanism.startswith(f"Mechanism audit (engine hooks/flat, {m['trials_in'] + m['trials_out']:,} "
                                  "Dirac-canary trials, white box): CONSISTENT. The DP implementation delivered its "
                                  f"claimed (ε = 4.500, δ = 1.00e-05) in these trials (ε ≥ {m['epsilon_lb']:.3f} "
                                  "with 95% confidence")
    assert "strengthens the claim but does not prove it" in g.mechanism
    for name in ("report.md", "report.html"):
        assert "strengthens the claim but does not prove it" in (run / name).read_text()
    res = _gate(base, run, tmp_path / "gate.json")
    assert res.exit_code == 0, res.output
    rule = read_json(tmp_path / "gate.json")["rules"][-1]
    assert rule["rule"] == "mechanism_consistent" and rule["outcome"] == "PASS"


def test_planted_bug_makes_the_headline_violation_and_fails_the_gate_unless_edited(tmp_path: Path, base: Path) -> None:
    run = _run(tmp_path / "bug", seed=2, mechanism="noise_0.8")
    m = read_json(run / "mechanism.json")
    g = write_report(run_dir=run, load_images=False).report.glance
    assert g.status == "VIOLATION" and g.headline == "Privacy claim violated: the DP implementation does not deliver it"
    assert g.summary.startswith("The DP implementation itself was audited (engine hooks/flat, 8,000 Dirac-canary "
                                "trials, white box) and does not deliver the claimed (ε = 4.500, δ = 1.00e-05): "
                                f"with 95% confidence its ε is at least {m['epsilon_lb']:.3f}")
    assert "whatever the bounds measured on the trained model say" in g.summary
    assert "best ε ≥ 1.235" in g.summary  # the black-box bound is named, not presented as evidence for the claim
    md = (run / "report.md").read_text()
    assert "**VIOLATION: Privacy claim violated: the DP implementation does not deliver it.**" in md
    out = tmp_path / "gate.json"
    res = _gate(base, run, out)
    assert res.exit_code == 1, res.output
    assert "FAIL mechanism_consistent: mechanism audit VIOLATION" in " ".join(res.output.split())
    data = read_json(out)
    assert data["status"] == "FAIL" and data["exit_code"] == 1
    assert [r["outcome"] for r in data["rules"]] == ["PASS", "PASS", "PASS", "PASS", "PASS", "FAIL"]
    assert data["mechanism"]["status"] == "VIOLATION" and data["mechanism"]["epsilon_lb"] == pytest.approx(
        m["epsilon_lb"]) and data["mechanism"]["claimed_epsilon"] == pytest.approx(4.5)
    # a forger turns the verdict around: refused in one line (exit 2; the gate's FAIL above cannot be edited away)
    out.unlink()
    update_json(run, "mechanism.json", lambda d: d["verdict"].update(status="CONSISTENT") or d.update(
        epsilon_lb=0.1), resign=False)
    res = _gate(base, run, out)
    assert res.exit_code == 2 and "Traceback" not in res.output and not out.exists()
    assert len(res.output.strip().splitlines()) == 1 and "mechanism.json" in res.output
    assert f"audit mechanism {run}" in res.output


def test_no_mechanism_json_leaves_the_gate_as_it_was(tmp_path: Path, base: Path) -> None:
    cand = _run(tmp_path / "cand", seed=2, mechanism=None)
    out = tmp_path / "gate.json"
    res = _gate(base, cand, out)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "NOT RUN" in text and "5/5 rules pass, 1 not run" in text
    data = read_json(out)
    rule = data["rules"][-1]
    assert (rule["rule"], rule["outcome"], rule["ran"], rule["passed"]) == ("mechanism_consistent", "NOT_RUN", False,
                                                                           True)
    assert data["status"] == "PASS" and data["mechanism"] is None
    strict = parse_policy({"rules": [{"rule": "mechanism_consistent", "required": True}]})
    with pytest.raises(UserError, match=f"mechanism.json is missing.*audit mechanism {cand}"):
        evaluate_gate(baseline=base, candidate=cand, policy=strict)


def test_a_mechanism_audit_of_another_claim_decides_nothing(tmp_path: Path, base: Path) -> None:
    """``audit mechanism --sigma ... --out RUN`` signs a result into the run, but of other settings: the report
    shows why it is not used; the gate refuses it (exit 2) rather than decide on it."""
    run = _run(tmp_path / "other", seed=2, mechanism=None)
    audit_mechanism(**{**CLAIM, "steps": 8, "claimed_epsilon": None}, trials=2000, mutant="noise_0.8", run_dir=run)
    g = write_report(run_dir=run, load_images=False).report.glance
    assert g.status == "CONSISTENT" and "not used in this verdict: it audited the claim" in g.mechanism
    with pytest.raises(UserError, match="not an audit of this run's claim"):
        evaluate_gate(baseline=base, candidate=run, policy=DEFAULT_POLICY)
