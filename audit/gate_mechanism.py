"""The gate's ``mechanism_consistent`` rule: the candidate's DP implementation, audited, delivers its claim.

``audit mechanism RUN`` audits the DP-SGD implementation itself at the run's settings (:mod:`audit.mechanism`) and
writes a signed ``mechanism.json`` into the run directory. The rule reads it as the report does (verified when the
run is loaded: an unsigned, edited or stale file is refused, exit 2) and:

* FAIL when its verdict is ``VIOLATION``: the implementation does not deliver the claimed (ε, δ), whatever the
  bounds measured on the trained model say;
* PASS when it is ``CONSISTENT``;
* NOT RUN (neither passes nor fails: the gate's outcome is decided by the other rules) when the run directory has
  no ``mechanism.json``, unless the policy says ``required: true`` (then a missing file is bad input, exit 2, as
  for every other rule's file). ``gate.json`` records the outcome ``NOT_RUN`` and ``ran: false``;
* bad input (exit 2) when the file audits another claim than the run's
  (:func:`audit.mechanism.result.claim_mismatch`): it cannot decide this run.

``gate.json`` records the verdict used (status, ε lower bound, claimed ε and δ, target, trials, α) in the rule's
values and in its top-level ``mechanism`` block.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from audit.mechanism.result import MechanismResult, claim_mismatch
from audit.reporting import fmt
from audit.reporting.inputs import RunFiles
from foundation.errors import UserError
from foundation.files import MECHANISM_FILE

__all__ = ["MechanismConsistent", "mechanism_summary", "remake_command", "eval_mechanism"]


class MechanismConsistent(BaseModel):
    """The candidate's ``mechanism.json`` (``audit mechanism``), when present, must not say VIOLATION."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: Literal["mechanism_consistent"]
    required: bool = False


def remake_command(run: RunFiles) -> str:
    """The command that (re-)makes ``run``'s ``mechanism.json``."""
    if run.manifest.training.get("recipe") == "opacus":
        return "auditor.audit_mechanism() in the training script"
    return f"audit mechanism {run.run_dir}"


def mechanism_summary(m: MechanismResult | None) -> dict[str, Any] | None:
    """What ``gate.json`` records of a mechanism audit (None when none was run)."""
    if m is None:
        return None
    return {"status": str(m.verdict.status), "epsilon_lb": m.epsilon_lb, "claimed_epsilon": m.claimed_epsilon,
            "delta": m.delta, "tightness": m.tightness, "target": m.target, "trials": m.trials_in + m.trials_out,
            "alpha": m.alpha, "file": MECHANISM_FILE}


def _shown(m: MechanismResult | None) -> str:
    return fmt.MISSING if m is None else f"{m.verdict.status} (ε_lb {fmt.eps(m.epsilon_lb)})"


def eval_mechanism(rule: MechanismConsistent, baseline: RunFiles, candidate: RunFiles) -> Any:
    """Evaluate the rule (see the module docstring) into an :class:`audit.gate_rules.RuleResult`.

    Raises:
        UserError: ``required`` and no ``mechanism.json``, or one that audits another claim than the run's.
    """
    from audit.gate_rules import RuleResult as result_type  # gate_rules registers this rule

    m = candidate.mechanism
    label, threshold = "mechanism audit", "not VIOLATION"
    values: dict[str, Any] = {"required": rule.required, "candidate": mechanism_summary(m),
                              "baseline": mechanism_summary(baseline.mechanism)}
    if m is None:
        if rule.required:
            raise UserError(f"{MECHANISM_FILE} is missing from {candidate.run_dir}: run "
                            f"'{remake_command(candidate)}' first (the policy's mechanism_consistent rule says "
                            f"required: true)")
        return result_type(rule=rule.rule, label=label, baseline=_shown(baseline.mechanism), candidate="not run",
                           threshold=threshold, passed=True, ran=False, values=values,
                           detail=f"no {MECHANISM_FILE} in the candidate: the DP implementation was not audited "
                                  f"(run '{remake_command(candidate)}'); this rule does not decide the gate")
    why = claim_mismatch(m, candidate.manifest.privacy)
    if why is not None:
        raise UserError(f"{candidate.run_dir / MECHANISM_FILE} is not an audit of this run's claim ({why}): "
                        f"re-make it with '{remake_command(candidate)}'")
    status = str(m.verdict.status)
    ok = status != "VIOLATION"
    conf = f"{fmt.num(100 * (1 - m.alpha))}% confidence"
    detail = (f"mechanism audit {status} ({m.target}, {fmt.count(m.trials_in + m.trials_out)} Dirac-canary trials): "
              f"ε_lb {fmt.eps(m.epsilon_lb)} at {conf} "
              + ("≤" if m.epsilon_lb <= m.claimed_epsilon else ">")
              + f" claimed ε = {fmt.eps(m.claimed_epsilon)}")
    if not ok:
        detail += ": the DP implementation does not deliver the claimed (ε, δ)"
    return result_type(rule=rule.rule, label=label, baseline=_shown(baseline.mechanism), candidate=_shown(m),
                       threshold=threshold, passed=ok, detail=detail, values=values)
