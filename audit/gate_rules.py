"""Gate policy: strict rule models and the evaluation of each rule on a (baseline, candidate) pair.

A policy is a YAML file::

    format: dp-audit-gate/1
    rules:
      - rule: max_claimed_epsilon     # candidate's claimed epsilon <= budget (no DP claim = infinite = FAIL)
        budget: 8.0
      - rule: no_violation            # candidate's epsilon.json verdict is not VIOLATION
      - rule: tpr_at_fpr              # candidate leaks no more than baseline at a fixed FPR, with CIs
        attack: strongest             # an attack name, or "strongest" (alias "max"): attacks/strongest.py
        fpr: 0.001
        tolerance: 0.0
      - rule: min_accuracy_delta      # candidate test accuracy >= baseline - tolerance
        tolerance: 0.01
      - rule: max_auc                 # candidate AUC (attack or "strongest") <= threshold
        attack: strongest
        threshold: 0.6
      - rule: mechanism_consistent    # candidate's mechanism.json (audit mechanism) is not VIOLATION
        required: false               # no mechanism.json: the rule is NOT RUN (false) or bad input (true)

**Which attack.** ``attack: strongest`` (the default; ``max`` is an alias kept for older policies) is each run's
strongest attack by the one definition used by ``audit run``'s summary and the report
(:func:`attacks.strongest.strongest`: highest TPR at the lowest FPR every attack resolves, at least 0.1 %, ties
broken by AUC), whatever metric the rule compares; a named attack is used as named. ``gate.json`` records, per
rule, the attack used for each run and how it was chosen (``attack_selection``).

Exact pass/fail conditions (``b`` = baseline, ``c`` = candidate; attack scores are "higher = member"):

* ``max_claimed_epsilon``: PASS iff ``eps_c <= budget``; a run without a DP claim has ``eps_c = inf``.
* ``no_violation``: PASS iff the candidate's verdict is not ``VIOLATION``, when it claims a finite epsilon its
  best epsilon lower bound does not exceed the claim, its claimed δ is at most ``1/n`` (n = training examples: a
  larger δ lets the mechanism publish a whole example with probability δ), and the audit could have detected a
  violation. UNVERIFIABLE (neither pass nor fail) when the verdict is ``CONSISTENT`` but no violation of the
  claim could have been detected: every deciding bound's ceiling is below the claim (``inconclusive_above``), or
  the claim check found ``claim_unverifiable``. A policy passes such a rule only with ``accept_unverifiable: true``.
* ``tpr_at_fpr``: with ``[lo, hi]`` the confidence interval of TPR at ``fpr`` (the point value when no interval
  was written), FAIL iff ``lo_c > hi_b + tolerance``: the candidate is flagged only when its interval lies
  entirely above the baseline's, by more than the tolerance. Overlapping intervals PASS.
* ``min_accuracy_delta``: PASS iff ``acc_c >= acc_b - tolerance`` (test accuracy as ``audit attack`` measured it
  on the auditor's own data, read from the signed ``attack.json``; without one, measured here on the same data
  (:func:`attacks.runner.measure_utility`); never the run's own ``metrics.json``; 1e-12 slack for rounding).
* ``max_auc``: PASS iff ``auc_c <= threshold`` (point estimate).
* ``mechanism_consistent``: FAIL iff the candidate's ``mechanism.json`` (the DP implementation audited white box,
  :mod:`audit.mechanism`) says ``VIOLATION`` of the run's own claim; PASS when it says ``CONSISTENT``; NOT RUN
  (outcome ``NOT_RUN``: it neither passes nor fails the gate) without one, unless ``required: true``
  (:mod:`audit.gate_mechanism`).

Files a rule needs must exist (``epsilon.json`` of the candidate for ``no_violation``; both ``attack.json`` for
``tpr_at_fpr``; the candidate's for ``max_auc``; the candidate's ``mechanism.json`` only for
``mechanism_consistent`` with ``required: true``), signed by this auditor's evidence key
for the run as it is now (:mod:`foundation.evidence`); a missing, unsigned, edited or stale one is a
:class:`foundation.errors.UserError` (exit code 2), never a silent pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from attacks.attack_file import AttackFile
from attacks.registry import attack_names
from attacks.resolution import not_resolvable, resolvable
from attacks.strongest import DEFINITION, strongest
from audit.gate_mechanism import MechanismConsistent, eval_mechanism
from audit.reporting import fmt
from audit.reporting.inputs import RunFiles, level_key
from foundation.errors import UserError
from foundation.files import ATTACK_FILE, EPSILON_FILE

__all__ = [
    "STRONGEST",
    "delta_limit",
    "strongest_of",
    "MaxClaimedEpsilon",
    "NoViolation",
    "TprAtFpr",
    "MinAccuracyDelta",
    "MaxAuc",
    "MechanismConsistent",
    "Rule",
    "GatePolicy",
    "RuleResult",
    "evaluate_rule",
]

_ACCURACY_SLACK = 1e-12


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: The policy values that select each run's strongest attack (:mod:`attacks.strongest`); ``max`` is the old name.
STRONGEST = ("strongest", "max")


def _check_attack(value: str) -> str:
    if value not in STRONGEST and value not in attack_names():
        raise ValueError(f"attack must be 'strongest' (or 'max') or one of {', '.join(attack_names())}, "
                         f"got {value!r}")
    return value


class MaxClaimedEpsilon(_Rule):
    """The candidate's claimed epsilon must not exceed ``budget``."""

    rule: Literal["max_claimed_epsilon"]
    budget: float = Field(gt=0.0)


class NoViolation(_Rule):
    """The candidate's empirical epsilon lower bound must not refute its claim."""

    rule: Literal["no_violation"]


class TprAtFpr(_Rule):
    """The candidate's TPR at ``fpr`` must not exceed the baseline's beyond their confidence intervals."""

    rule: Literal["tpr_at_fpr"]
    attack: str = "strongest"
    fpr: float = Field(0.001, gt=0.0, lt=1.0)
    tolerance: float = Field(0.0, ge=0.0, le=1.0)

    @field_validator("attack")
    @classmethod
    def _attack_name(cls, value: str) -> str:
        return _check_attack(value)


class MinAccuracyDelta(_Rule):
    """The candidate's test accuracy must be at least the baseline's minus ``tolerance``."""

    rule: Literal["min_accuracy_delta"]
    tolerance: float = Field(0.0, ge=0.0, le=1.0)


class MaxAuc(_Rule):
    """The candidate's attack AUC must not exceed ``threshold``."""

    rule: Literal["max_auc"]
    attack: str = "strongest"
    threshold: float = Field(gt=0.0, le=1.0)

    @field_validator("attack")
    @classmethod
    def _attack_name(cls, value: str) -> str:
        return _check_attack(value)


Rule = Annotated[MaxClaimedEpsilon | NoViolation | TprAtFpr | MinAccuracyDelta | MaxAuc | MechanismConsistent,
                 Field(discriminator="rule")]
RULE_MODELS: dict[str, type[BaseModel]] = {
    "max_claimed_epsilon": MaxClaimedEpsilon, "no_violation": NoViolation, "tpr_at_fpr": TprAtFpr,
    "min_accuracy_delta": MinAccuracyDelta, "max_auc": MaxAuc, "mechanism_consistent": MechanismConsistent,
}


class GatePolicy(BaseModel):
    """A gate policy: a named, ordered list of rules (all must pass)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["dp-audit-gate/1"] = "dp-audit-gate/1"
    name: str | None = None
    accept_unverifiable: bool = Field(False, description="pass a rule whose claim the audit could not have "
                                      "refuted (UNVERIFIABLE); off by default: an unverified claim does not pass")
    rules: list[Rule] = Field(min_length=1)


@dataclass(frozen=True, kw_only=True)
class RuleResult:
    """The outcome of one rule.

    Attributes:
        rule: the rule's name (``tpr_at_fpr``, ...).
        label: a short human description (e.g. ``TPR at 0.1% FPR (max)``).
        baseline, candidate, threshold: display strings, as printed in the table.
        passed: whether the rule passed.
        detail: one sentence explaining the outcome.
        values: the raw numbers compared (for ``gate.json``).
        unverifiable: the rule did not fail, but the evidence could not have made it fail (``passed`` is then
            False; the policy's ``accept_unverifiable`` decides).
        ran: False when the rule's optional evidence does not exist (``mechanism_consistent`` without
            ``mechanism.json``): outcome ``NOT_RUN``, ``passed`` True (it does not decide the gate).
    """

    rule: str
    label: str
    baseline: str
    candidate: str
    threshold: str
    passed: bool
    detail: str
    values: dict[str, Any] = field(default_factory=dict)
    unverifiable: bool = False
    ran: bool = True

    @property
    def outcome(self) -> str:
        """``PASS``, ``FAIL``, ``UNVERIFIABLE`` or ``NOT_RUN``."""
        if not self.ran:
            return "NOT_RUN"
        return "PASS" if self.passed else ("UNVERIFIABLE" if self.unverifiable else "FAIL")


def _need(obj: Any, what: str, run: RunFiles, command: str) -> Any:
    if obj is None:
        raise UserError(f"{what} is missing from {run.run_dir}: run '{command} {run.run_dir}' first")
    return obj


def strongest_of(attack: AttackFile) -> str | None:
    """The run's strongest attack by the one definition (:func:`attacks.strongest.strongest`), as ``audit run``'s
    summary and the report pick it; None when ``attack.json`` holds no attacks."""
    return strongest({k: (e.metrics.auc, e.metrics.tpr_at_fpr, e.metrics.n_nonmembers)
                      for k, e in attack.attacks.items()})


def _pick(attack: AttackFile, name: str, run: RunFiles) -> tuple[str, Any]:
    if name in STRONGEST:
        best = strongest_of(attack)
        return best, attack.attacks[best]
    if name not in attack.attacks:
        raise UserError(f"attack '{name}' is not in {run.run_dir / ATTACK_FILE} (it has "
                        f"{', '.join(attack.attacks) or 'none'}): run it or set attack: strongest in the policy")
    return name, attack.attacks[name]


def _selection(rule: Any) -> dict[str, str]:
    """How the rule chose its attack, for ``gate.json``."""
    if rule.attack in STRONGEST:
        return {"attack_selection": "strongest", "strongest_definition": DEFINITION}
    return {"attack_selection": "named"}


def _attack_label(rule: Any) -> str:
    return "strongest attack" if rule.attack in STRONGEST else rule.attack


def _n_non(run: RunFiles, attack: str) -> int:
    return run.attack.attacks[attack].metrics.n_nonmembers


def _tpr_interval(run: RunFiles, rule: TprAtFpr) -> tuple[str, float, float, float]:
    attack = _need(run.attack, ATTACK_FILE, run, "audit attack")
    if not attack.attacks:
        raise UserError(f"{run.run_dir / ATTACK_FILE} holds no attacks: re-run 'audit attack {run.run_dir}'")

    def key_of(entry) -> str:
        key = level_key(entry.metrics.tpr_at_fpr, rule.fpr)
        if key is None:
            raise UserError(f"{run.run_dir / ATTACK_FILE} has no TPR at FPR {rule.fpr} (levels: "
                            f"{', '.join(entry.metrics.tpr_at_fpr)}): change the policy's fpr or re-run the attack")
        return key

    name, entry = _pick(attack, rule.attack, run)
    key = key_of(entry)
    tpr = entry.metrics.tpr_at_fpr[key]
    lo, hi = entry.metrics.tpr_at_fpr_ci.get(key) or (tpr, tpr)  # no interval written: the point value
    return name, tpr, lo, hi


def _eval_claimed(rule: MaxClaimedEpsilon, baseline: RunFiles, candidate: RunFiles) -> RuleResult:
    b, c = baseline.manifest.privacy.claimed_epsilon, candidate.manifest.privacy.claimed_epsilon
    ok = c <= rule.budget
    detail = (f"candidate claims ε = {fmt.eps(c)}" + (" (no DP claim)" if math.isinf(c) else "")
              + (f" ≤ budget {fmt.eps(rule.budget)}" if ok else f" > budget {fmt.eps(rule.budget)}"))
    return RuleResult(rule=rule.rule, label="claimed ε", baseline=fmt.eps(b), candidate=fmt.eps(c),
                      threshold=f"≤ {fmt.eps(rule.budget)}", passed=ok, detail=detail,
                      values={"baseline": b, "candidate": c, "budget": rule.budget})


def delta_limit(candidate: RunFiles) -> tuple[float | None, float | None]:
    """The candidate's claimed δ and ``1/n`` (n: its training examples, members of the pool), None when unknown.

    A δ above 1/n permits a mechanism that publishes one whole training example with probability δ·n ≥ 1: no
    meaningful guarantee, whatever ε says."""
    privacy, n = candidate.manifest.privacy, candidate.manifest.data.membership.n_members
    if not privacy.dp or privacy.delta is None or n <= 0:
        return privacy.delta, None
    return float(privacy.delta), 1.0 / n


def _undetectable(eps: Any, claimed: float) -> str | None:
    """Why no violation of a finite claim could have been detected, or None when one could."""
    v = eps.verdict
    if not math.isfinite(claimed) or str(v.status) != "CONSISTENT":
        return None
    unverifiable = [f for f in v.findings if f.kind == "claim_unverifiable"]
    if v.inconclusive_above is not None:
        return (f"the audit could not have detected a violation of this claim: every deciding bound's ceiling "
                f"(at most {fmt.eps(v.inconclusive_above)}) is below the claimed ε = {fmt.eps(claimed)}")
    if unverifiable:
        return (f"the audit could not have detected a violation of this claim (claim_unverifiable: "
                f"{unverifiable[0].message})")
    return None


def _eval_violation(rule: NoViolation, baseline: RunFiles, candidate: RunFiles) -> RuleResult:
    eps = _need(candidate.epsilon, EPSILON_FILE, candidate, "audit epsilon")
    claimed = eps.claimed_epsilon
    status, lb = str(eps.verdict.status), eps.verdict.best_epsilon_lb
    over = lb is not None and math.isfinite(claimed) and lb > claimed
    delta, limit = delta_limit(candidate)
    big_delta = limit is not None and delta is not None and delta > limit
    ok = status != "VIOLATION" and not over and not big_delta
    why_not = _undetectable(eps, claimed) if ok else None
    b_status = str(baseline.epsilon.verdict.status) if baseline.epsilon is not None else fmt.MISSING
    relation = "does not refute the claim" if ok else "exceeds the claimed"
    detail = f"verdict {status}: best ε lower bound {fmt.eps(lb)} {relation} ε = {fmt.eps(claimed)}"
    if status == "VIOLATION" and not over:
        detail = f"verdict {status}: {eps.verdict.notes[0] if eps.verdict.notes else 'the claim check found an error'}"
    if big_delta:
        detail = (f"claimed δ = {delta:.3g} exceeds 1/n = {limit:.3g} (n = {round(1 / limit)} training examples): "
                  f"the claim allows publishing whole training examples")
    if why_not is not None:
        detail = f"verdict {status} (ε_lb {fmt.eps(lb)}), but {why_not}"
    shown = "UNVERIFIABLE" if why_not is not None else status
    return RuleResult(rule=rule.rule, label="ε verdict", baseline=b_status,
                      candidate=f"{shown} (ε_lb {fmt.eps(lb)})", threshold="not VIOLATION, verifiable",
                      passed=ok and why_not is None, unverifiable=why_not is not None,
                      detail=detail, values={"baseline_status": None if b_status == fmt.MISSING else b_status,
                                             "candidate_status": status, "candidate_epsilon_lb": lb,
                                             "candidate_claimed_epsilon": claimed,
                                             "candidate_inconclusive_above": eps.verdict.inconclusive_above,
                                             "candidate_delta": delta, "delta_limit": limit,
                                             "verifiable": why_not is None})


def _eval_tpr(rule: TprAtFpr, baseline: RunFiles, candidate: RunFiles) -> RuleResult:
    bn, bt, blo, bhi = _tpr_interval(baseline, rule)
    cn, ct, clo, chi = _tpr_interval(candidate, rule)
    limit = bhi + rule.tolerance
    ok = not clo > limit
    detail = (f"candidate CI low {fmt.prob(clo)} {'≤' if ok else '>'} baseline CI high {fmt.prob(bhi)} + tolerance "
              f"{fmt.prob(rule.tolerance)} = {fmt.prob(limit)}")
    unresolved = [f"{who} {not_resolvable(n)}" for who, n in (("baseline", _n_non(baseline, bn)),
                                                                 ("candidate", _n_non(candidate, cn)))
                  if not resolvable(rule.fpr, n)]
    if unresolved:   # the comparison is then of TPR at zero false positives, not at this FPR: say so
        detail += (f"; TPR at {fmt.fpr_label(rule.fpr)} FPR is {' and '.join(unresolved)}: this compares TPR at "
                   f"zero false positives")
    def shown(run: RunFiles, name: str, tpr: float, lo: float, hi: float) -> str:
        """The table's cell: never a rate below 1/N printed as a number."""
        n = _n_non(run, name)
        if not resolvable(rule.fpr, n):
            return f"{not_resolvable(n)} ({name})"
        return f"{fmt.prob(tpr)} {fmt.ci(lo, hi)} {name}"

    return RuleResult(
        rule=rule.rule, label=f"TPR at {fmt.fpr_label(rule.fpr)} FPR ({_attack_label(rule)})",
        baseline=shown(baseline, bn, bt, blo, bhi), candidate=shown(candidate, cn, ct, clo, chi),
        threshold=f"CI low ≤ {fmt.prob(limit)}", passed=ok, detail=detail,
        values={"fpr": rule.fpr, "tolerance": rule.tolerance,
                "baseline": {"attack": bn, "tpr": bt, "ci": [blo, bhi]},
                "candidate": {"attack": cn, "tpr": ct, "ci": [clo, chi]}, "limit": limit, **_selection(rule)})


def _measured_accuracy(run: RunFiles) -> float:
    """Test accuracy the auditor measured: the signed ``attack.json``'s, else measured now on the run's test data
    (builds the model; a run that names code needs ``--trust-code`` for that, as ``audit attack`` does)."""
    if run.measured_test_accuracy is not None:
        return run.measured_test_accuracy
    from attacks.runner import measure_utility

    if run.run is None:
        raise UserError(f"test accuracy of {run.run_dir} is unknown: run 'audit attack {run.run_dir}' first")
    acc = measure_utility(run.run)["test_accuracy"]
    return _need(acc, "test accuracy", run, "audit attack")


def _eval_accuracy(rule: MinAccuracyDelta, baseline: RunFiles, candidate: RunFiles) -> RuleResult:
    b, c = _measured_accuracy(baseline), _measured_accuracy(candidate)
    limit = b - rule.tolerance
    ok = c >= limit - _ACCURACY_SLACK
    detail = (f"candidate accuracy {fmt.prob(c)} {'≥' if ok else '<'} baseline {fmt.prob(b)} − tolerance "
              f"{fmt.prob(rule.tolerance)}")
    return RuleResult(rule=rule.rule, label="test accuracy", baseline=fmt.prob(b), candidate=fmt.prob(c),
                      threshold=f"≥ {fmt.prob(limit)}", passed=ok, detail=detail,
                      values={"baseline": b, "candidate": c, "tolerance": rule.tolerance, "limit": limit})


def _auc(run: RunFiles, rule: MaxAuc) -> tuple[str, float]:
    attack = _need(run.attack, ATTACK_FILE, run, "audit attack")
    if not attack.attacks:
        raise UserError(f"{run.run_dir / ATTACK_FILE} holds no attacks: re-run 'audit attack {run.run_dir}'")
    name, entry = _pick(attack, rule.attack, run)
    return name, entry.metrics.auc


def _eval_auc(rule: MaxAuc, baseline: RunFiles, candidate: RunFiles) -> RuleResult:
    cn, c = _auc(candidate, rule)
    b_text, b, bn = fmt.MISSING, None, None
    if baseline.attack is not None and baseline.attack.attacks:
        bn, b = _auc(baseline, rule)
        b_text = f"{fmt.prob(b)} {bn}"
    ok = not math.isnan(c) and c <= rule.threshold
    detail = f"candidate AUC {fmt.prob(c)} ({cn}) {'≤' if ok else '>'} threshold {fmt.prob(rule.threshold)}"
    return RuleResult(rule=rule.rule, label=f"attack AUC ({_attack_label(rule)})", baseline=b_text,
                      candidate=f"{fmt.prob(c)} {cn}", threshold=f"≤ {fmt.prob(rule.threshold)}", passed=ok,
                      detail=detail, values={"baseline": b, "candidate": c, "baseline_attack": bn,
                                             "candidate_attack": cn, "threshold": rule.threshold,
                                             **_selection(rule)})


_EVALUATORS = {MaxClaimedEpsilon: _eval_claimed, NoViolation: _eval_violation, TprAtFpr: _eval_tpr,
               MinAccuracyDelta: _eval_accuracy, MaxAuc: _eval_auc, MechanismConsistent: eval_mechanism}


def evaluate_rule(rule: Rule, *, baseline: RunFiles, candidate: RunFiles) -> RuleResult:
    """Evaluate one policy rule (see the module docstring for each rule's exact condition).

    Raises:
        UserError: a file or value the rule needs is missing.
    """
    return _EVALUATORS[type(rule)](rule, baseline, candidate)
