"""Tests for audit.bounds.verdict: VIOLATION only when a lower bound exceeds the claim, honest notes otherwise."""

from __future__ import annotations

import json
import math

import pydantic
import pytest

from audit.bounds import EpsilonEstimate, Finding, Verdict, VerdictStatus, epsilon_one_run, verdict


def _est(method: str, eps_lb: float, *, ceiling: float = 10.0, alpha: float = 0.05, delta: float = 1e-5,
         assumptions: str = "") -> EpsilonEstimate:
    return EpsilonEstimate(method=method, epsilon_lb=eps_lb, alpha=alpha, delta=delta, counts={"r": 100, "v": 90},
                           ceiling=ceiling, assumptions=assumptions)


def test_violation_only_when_some_bound_exceeds_the_claim() -> None:
    ests = [_est("clopper_pearson", 1.0), _est("one_run", 3.2), _est("gdp", 2.0)]
    v = verdict(claimed_epsilon=3.0, estimates=ests)
    assert v.status is VerdictStatus.VIOLATION
    assert v.violating == ("one_run",)
    assert v.best_method == "one_run" and v.best_epsilon_lb == 3.2
    assert any("one_run: ε_lb = 3.2 > claimed ε = 3" in n for n in v.notes)
    assert verdict(claimed_epsilon=3.2, estimates=ests).status is VerdictStatus.CONSISTENT  # equal is not above
    assert verdict(claimed_epsilon=8.0, estimates=ests).status is VerdictStatus.CONSISTENT
    assert verdict(claimed_epsilon=0.5, estimates=ests).violating == ("clopper_pearson", "one_run", "gdp")


def test_tightness_and_confidence() -> None:
    ests = [_est("a", 1.0, alpha=0.05), _est("b", 2.0, alpha=0.01)]
    v = verdict(claimed_epsilon=4.0, estimates=ests)
    assert v.tightness == 0.5 and v.best_method == "b"
    assert v.confidence == pytest.approx(0.94)
    assert any("Σα = 0.06" in n for n in v.notes)


def test_inconclusive_note_when_ceilings_are_below_the_claim() -> None:
    ests = [_est("one_run", 0.0, ceiling=2.5), _est("gdp", 0.3, ceiling=3.1)]
    low = verdict(claimed_epsilon=8.0, estimates=ests)
    assert low.status is VerdictStatus.CONSISTENT
    assert low.max_ceiling == 3.1 and low.inconclusive_above == 3.1
    assert any(n.startswith("inconclusive for violations above 3.1") for n in low.notes)
    high = verdict(claimed_epsilon=3.0, estimates=ests)
    assert not any(n.startswith("inconclusive") for n in high.notes) and high.inconclusive_above is None


def test_real_estimator_ceiling_drives_the_note() -> None:
    # 100 perfect one-run guesses at α = 0.05 can certify at most ε ≈ ln(100 / ln 20) ≈ 3.5.
    est = epsilon_one_run(m=1000, r=100, v=100, delta=0.0, alpha=0.05)
    assert verdict(claimed_epsilon=3.0, estimates=[est]).status is VerdictStatus.VIOLATION
    v = verdict(claimed_epsilon=8.0, estimates=[est])
    assert v.status is VerdictStatus.CONSISTENT
    assert any(n.startswith(f"inconclusive for violations above {est.ceiling:.4g}") for n in v.notes)


def test_non_dp_claim_gives_no_claim_with_bounds_reported() -> None:
    ests = [_est("one_run", 5.0), _est("gdp", 7.0, assumptions="Gaussian trade-off curve")]
    v = verdict(claimed_epsilon=math.inf, estimates=ests)
    assert v.status is VerdictStatus.NO_CLAIM
    assert v.violating == () and v.tightness is None
    assert v.inconclusive_above is None
    assert v.best_epsilon_lb == 7.0 and v.best_method == "gdp"
    assert any("no DP claim" in n for n in v.notes)
    assert any("gdp assumes: Gaussian trade-off curve" in n for n in v.notes)


def test_zero_claim() -> None:
    assert verdict(claimed_epsilon=0.0, estimates=[_est("a", 0.1)]).status is VerdictStatus.VIOLATION
    v = verdict(claimed_epsilon=0.0, estimates=[_est("a", 0.0)])
    assert v.status is VerdictStatus.CONSISTENT and v.tightness is None


def test_the_verdict_is_a_frozen_result_model_that_round_trips() -> None:
    v = verdict(claimed_epsilon=2.0, estimates=[_est("one_run", 2.5), _est("gdp", 1.0)], claimed_delta=1e-5,
                sources=["pool", "input_canaries"])
    d = json.loads(json.dumps(v.model_dump(mode="json")))
    assert d["status"] == "VIOLATION" and d["claimed_delta"] == 1e-5 and d["violating"] == ["one_run"]
    assert d["tightness"] == 1.25 and d["best_source"] == "pool" and d["findings"] == []
    assert d["best_method"] == "one_run" and d["best_epsilon_lb"] == 2.5 and d["inconclusive_above"] is None
    assert Verdict.model_validate_json(json.dumps(d)) == v
    assert isinstance(v, Verdict)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        v.status = VerdictStatus.CONSISTENT  # type: ignore[misc]
    with pytest.raises(ValueError, match="one source per estimate"):
        verdict(claimed_epsilon=2.0, estimates=[_est("a", 1.0)], sources=["pool", "pool"])


def test_findings_attach_to_the_verdict() -> None:
    v = verdict(claimed_epsilon=8.0, estimates=[_est("one_run", 0.5)])
    assert v.findings == () and v.errors == ()
    bad = Finding(kind="claim_not_from_mechanism", severity="error",
                  message="claim does not follow from the stated mechanism: ε(PLD) = 12.3 > 8")
    w = v.with_findings(bad, Finding(kind="x", severity="warning", message="m"))
    assert w.errors == (bad,) and len(w.findings) == 2 and v.findings == ()  # a new verdict; v unchanged
    assert Verdict.model_validate_json(w.model_dump_json()) == w
    with pytest.raises(pydantic.ValidationError):
        Finding(kind="k", severity="fatal", message="m")  # type: ignore[arg-type]


def test_no_evidence_verdict() -> None:
    v = Verdict.no_evidence(claimed_epsilon=4.0, claimed_delta=1e-5, reason="every source was skipped")
    assert v.status is VerdictStatus.CONSISTENT and v.inconclusive_above == 0.0 and v.tightness == 0.0
    assert v.notes[0].startswith("no evidence: every source was skipped") and v.best_method is None
    inf = Verdict.no_evidence(claimed_epsilon=math.inf, claimed_delta=None, reason="r")
    assert inf.status is VerdictStatus.NO_CLAIM and inf.tightness is None and inf.inconclusive_above is None


def test_delta_mismatch_and_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"estimates\[1\] \(gdp\) bounds ε at delta=0.001, but claimed_delta=1e-05"):
        verdict(claimed_epsilon=1.0, estimates=[_est("a", 0.5), _est("gdp", 0.5, delta=1e-3)], claimed_delta=1e-5)
    with pytest.raises(ValueError, match=r"estimates must hold at least one EpsilonEstimate"):
        verdict(claimed_epsilon=1.0, estimates=[])
    with pytest.raises(ValueError, match=r"claimed_epsilon must be in \[0, inf\], got -1.0"):
        verdict(claimed_epsilon=-1.0, estimates=[_est("a", 0.5)])
    with pytest.raises(ValueError, match=r"claimed_epsilon must be in \[0, inf\], got nan"):
        verdict(claimed_epsilon=math.nan, estimates=[_est("a", 0.5)])
    with pytest.raises(ValueError, match=r"claimed_delta must be in \[0, 1\), got 1.0"):
        verdict(claimed_epsilon=1.0, estimates=[_est("a", 0.5)], claimed_delta=1.0)
    with pytest.raises(TypeError, match=r"estimates\[0\] must be an EpsilonEstimate, got dict"):
        verdict(claimed_epsilon=1.0, estimates=[{"epsilon_lb": 3.0}])  # type: ignore[list-item]
    mixed = verdict(claimed_epsilon=1.0, estimates=[_est("a", 0.5, delta=0.0), _est("b", 0.5)])
    assert any("different δ" in n for n in mixed.notes)
