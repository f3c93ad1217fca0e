"""Release gate: compare a candidate checkpoint with a baseline under a policy, for CI.

:func:`evaluate_gate` reads both run directories, checks that they are comparable (same dataset, number of
classes and input shape), evaluates every rule of the policy (:mod:`audit.gate_rules`, where each rule's exact
pass/fail condition is documented) and returns a :class:`GateResult`. The ``audit gate`` command prints it
as a table, writes ``gate.json`` atomically (signed with this auditor's evidence key) and exits

* 0 ``PASS``: every rule passed;
* 1 ``FAIL``: a rule failed (e.g. ``mechanism_consistent`` when the audit of the DP implementation itself,
  ``mechanism.json``, found a violation);
* 2 bad input: missing, unsigned, edited or stale files, unknown policy keys, runs that cannot be compared;
* 3 ``UNVERIFIABLE``: no rule failed, but one could not have failed on this evidence (the audit could not have
  detected a violation of the candidate's claim: :mod:`audit.gate_rules`). It does not pass unless the policy
  says ``accept_unverifiable: true``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from attacks.strongest import DEFINITION
from audit.gate_rules import RULE_MODELS, GatePolicy, RuleResult, evaluate_rule, strongest_of
from audit.reporting.inputs import RunFiles, load_run
from foundation.errors import ConfigError, UserError
from foundation.evidence import sign_json
from foundation.io import json_ready, write_json
from training.config import load_yaml
from training.run import evidence_identity

__all__ = ["GATE_FORMAT", "EXIT_CODES", "GateResult", "GatePolicy", "RuleResult", "load_policy", "parse_policy",
           "check_comparable", "evaluate_gate", "write_gate_file"]

GATE_FORMAT = "dp-audit-gate-result/1"
#: Exit code of each gate outcome (2 is bad input, raised as :class:`~foundation.errors.UserError`).
EXIT_CODES = {"PASS": 0, "FAIL": 1, "UNVERIFIABLE": 3}


@dataclass(frozen=True, kw_only=True)
class GateResult:
    """The outcome of a gate: ``passed`` is True iff ``status`` is ``PASS``.

    Attributes:
        passed: overall outcome.
        status: ``PASS``, ``FAIL`` (a rule failed) or ``UNVERIFIABLE`` (none failed, one could not have failed
            and the policy does not accept that).
        rules: one result per policy rule, in policy order.
        baseline, candidate: the run directories compared.
        policy: the policy's name or path.
        notes: remarks that do not change the outcome (e.g. different data pools).
        strongest_attack: when a rule used each run's strongest attack, the definition
            (:data:`attacks.strongest.DEFINITION`) and the attack it picked on each run (None: no attack.json).
        mechanism: the candidate's mechanism audit verdict (``mechanism.json``, :mod:`audit.gate_mechanism`) the
            ``mechanism_consistent`` rule used; None when the policy has no such rule or the file does not exist.
    """

    passed: bool
    rules: list[RuleResult]
    baseline: str
    candidate: str
    policy: str
    notes: list[str] = field(default_factory=list)
    identity: dict[str, str] = field(default_factory=dict)
    status: str = ""
    strongest_attack: dict[str, str | None] | None = None
    mechanism: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.status:
            object.__setattr__(self, "status", "PASS" if self.passed else "FAIL")
        if self.status not in EXIT_CODES or self.passed != (self.status == "PASS"):
            raise ValueError(f"status {self.status!r} does not match passed={self.passed}")

    @property
    def exit_code(self) -> int:
        """0 ``PASS``, 1 ``FAIL``, 3 ``UNVERIFIABLE`` (:data:`EXIT_CODES`)."""
        return EXIT_CODES[self.status]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (the content of ``gate.json``)."""
        return {"format": GATE_FORMAT, "passed": self.passed, "status": self.status, "exit_code": self.exit_code,
                "baseline": self.baseline, "candidate": self.candidate, "policy": self.policy,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "rules": [{**asdict(r), "outcome": r.outcome} for r in self.rules], "notes": list(self.notes),
                "strongest_attack": self.strongest_attack, "mechanism": self.mechanism}


def _policy_error(exc: ValidationError, source: str) -> str:
    unknown, other = [], []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        if err["type"] == "extra_forbidden":
            key = ".".join(p for p in loc if p not in RULE_MODELS)
            owner = next((RULE_MODELS[p] for p in reversed(loc) if p in RULE_MODELS), GatePolicy)
            unknown.append((key, owner))
        elif err["type"] == "union_tag_invalid":
            got = err.get("ctx", {}).get("tag")
            other.append(f"{'.'.join(loc)}: unknown rule {got!r} (valid rules: {', '.join(RULE_MODELS)})")
        elif err["type"] == "union_tag_not_found":
            other.append(f"{'.'.join(loc)}: each rule needs a 'rule:' key (one of {', '.join(RULE_MODELS)})")
        else:
            key = ".".join(p for p in loc if p not in RULE_MODELS) or "(top level)"
            msg = str(err["msg"]).removeprefix("Value error, ")
            other.append(f"{key}: {msg}")
    if unknown:
        parts = [f"'{k}' (valid keys there: {', '.join(sorted(owner.model_fields))})" for k, owner in unknown]
        return f"{source}: unknown key{'s' if len(unknown) > 1 else ''} " + "; ".join(parts)
    return f"{source}: " + "; ".join(other[:3])


def parse_policy(data: Any, *, source: str = "gate policy") -> GatePolicy:
    """Validate a policy mapping; unknown keys and bad values become one-line :class:`ConfigError`.

    >>> parse_policy({"rules": [{"rule": "max_auc", "threshold": 0.6}]}).rules[0].attack
    'strongest'
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a mapping with a 'rules' list, got {type(data).__name__}")
    try:
        return GatePolicy.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_policy_error(exc, source)) from None


def load_policy(path: str | os.PathLike[str]) -> GatePolicy:
    """Read a policy YAML file (``yaml.safe_load``) and validate it strictly.

    Raises:
        ConfigError: the file is missing, not YAML, or names unknown keys or rules.
    """
    return parse_policy(load_yaml(path), source=f"gate policy {path}")


def check_comparable(baseline: RunFiles, candidate: RunFiles) -> list[str]:
    """Refuse runs that cannot be compared; return notes on differences that do not prevent comparison.

    Raises:
        UserError: the runs differ in dataset, number of classes or input shape.
    """
    b, c = baseline.manifest, candidate.manifest
    checks = [("dataset", b.data.dataset, c.data.dataset),
              ("number of classes", b.model.num_classes, c.model.num_classes),
              ("input shape", tuple(b.model.input_shape), tuple(c.model.input_shape))]
    for what, bv, cv in checks:
        if bv != cv:
            raise UserError(f"baseline and candidate are not comparable: {what} {bv} vs {cv}; gate runs of the same "
                            f"task ({baseline.run_dir} vs {candidate.run_dir})")
    notes = []
    if b.data.pool_fingerprint != c.data.pool_fingerprint:
        notes.append("baseline and candidate were trained on different data pools; attack metrics are "
                     "compared as measured on each run's own pool")
    if baseline.attack is not None and candidate.attack is not None:
        kb, kc = baseline.attack.setup.n_reference, candidate.attack.setup.n_reference
        if kb != kc:
            notes.append(f"attacks used different numbers of reference models (baseline {kb}, candidate {kc})")
    return notes


def write_gate_file(path: str | os.PathLike[str], result: GateResult) -> Path:
    """Write ``gate.json`` atomically, signed with this auditor's evidence key (:mod:`foundation.evidence`) over
    its content and the identities of both runs as the gate read them."""
    return write_json(path, sign_json(json_ready(result.to_dict()), identity=result.identity))


def evaluate_gate(*, baseline: str | os.PathLike[str] | RunFiles, candidate: str | os.PathLike[str] | RunFiles,
                  policy: GatePolicy | str | os.PathLike[str]) -> GateResult:
    """Evaluate every rule of ``policy`` on a baseline and a candidate run.

    Args:
        baseline: the reference run directory (or its parsed files).
        candidate: the run directory to gate (or its parsed files).
        policy: a :class:`GatePolicy` or the path of a policy YAML file.

    Returns:
        The :class:`GateResult` (``passed`` iff every rule passed).

    Raises:
        UserError: a run directory, a file a rule needs, or the policy is missing or invalid, or the runs
            are not comparable.
    """
    runs = [r if isinstance(r, RunFiles) else load_run(r) for r in (baseline, candidate)]
    if isinstance(policy, GatePolicy):
        pol, pol_name = policy, policy.name or "(in memory)"
    else:
        pol, pol_name = load_policy(policy), str(policy)
    notes = check_comparable(runs[0], runs[1])
    results = [evaluate_rule(rule, baseline=runs[0], candidate=runs[1]) for rule in pol.rules]
    if pol.accept_unverifiable:
        results = [dataclasses.replace(r, passed=True) if r.unverifiable else r for r in results]
        notes += [f"{r.rule}: {r.detail} (accepted: the policy says accept_unverifiable)" for r in results
                  if r.unverifiable]
    failed = any(not r.passed and not r.unverifiable for r in results)
    status = "FAIL" if failed else ("PASS" if all(r.passed for r in results) else "UNVERIFIABLE")
    chosen = None
    if any(r.values.get("attack_selection") == "strongest" for r in results):
        chosen = {"definition": DEFINITION, **{who: strongest_of(r.attack) if r.attack is not None else None
                                               for who, r in zip(("baseline", "candidate"), runs)}}
    ident = {f"{who}_{k}": v for who, r in zip(("baseline", "candidate"), runs)
             for k, v in evidence_identity(r.run if r.run is not None else r.manifest).items()}
    used = [r.values["candidate"] for r in results if r.rule == "mechanism_consistent" and r.ran]
    return GateResult(passed=status == "PASS", status=status, rules=results, baseline=str(runs[0].run_dir),
                      candidate=str(runs[1].run_dir), policy=pol_name, notes=notes, identity=ident,
                      strongest_attack=chosen, mechanism=used[0] if used else None)
