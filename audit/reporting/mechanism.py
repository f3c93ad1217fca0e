"""The mechanism audit (``mechanism.json``) in the report's verdict at a glance.

``audit mechanism RUN`` audits the DP implementation itself (:mod:`audit.mechanism`: white box, Dirac gradient
canaries, every update observed), the strongest attacker the DP definition allows, at the run's own σ, q, T, C,
clipping, engine and sampler. Every bound the report takes from the trained model (``epsilon.json``) is a lower
bound against a weaker attacker, so none of them can overrule that audit:

* a mechanism **VIOLATION** of the run's own claimed (ε, δ) makes the headline VIOLATION, with a sentence saying
  that the implementation was audited and does not deliver the claim (its ε lower bound, the claim, the
  confidence), whatever the model's bounds say;
* a mechanism **CONSISTENT** adds one line to the verdict box: it strengthens the claim (the implementation behaved
  as its claim assumes) but does not prove it (finitely many trials of the optimizer step on a probe model, not
  a replay of this training run), so the headline stays what the model's evidence says.

Only a file that verifies takes part: :func:`audit.reporting.inputs.load_run` reads it through
:func:`audit.mechanism.result.read_mechanism`, which refuses an unsigned, edited or stale ``mechanism.json`` in
one line. A result judged against another claim than the run's (``audit mechanism --sigma ... --out RUN``;
:func:`audit.mechanism.result.claim_mismatch`) is shown in the ε section with the reason and takes no part.
"""

from __future__ import annotations

from audit.mechanism.result import claim_mismatch
from audit.reporting import fmt
from audit.reporting.inputs import RunFiles
from audit.reporting.model import MechanismRow

__all__ = ["mechanism_row", "mechanism_verdict", "mechanism_line", "MECHANISM_HEADLINE"]

#: The headline when the mechanism audit alone finds the violation.
MECHANISM_HEADLINE = "Privacy claim violated: the DP implementation does not deliver it"


def _remake(run: RunFiles) -> str:
    if run.manifest.training.get("recipe") == "opacus":
        return "auditor.audit_mechanism() in the training script"
    return f"audit mechanism {run.run_dir}"


def mechanism_row(run: RunFiles) -> MechanismRow | None:
    """The row of ``mechanism.json`` (verified when the run was loaded), or None when ``audit mechanism`` was not
    run; ``not_this_claim`` says why a result of another claim takes no part in the verdict."""
    m = run.mechanism
    if m is None:
        return None
    why = claim_mismatch(m, run.manifest.privacy)
    return MechanismRow(status=str(m.verdict.status), target=m.target, claimed_epsilon=m.claimed_epsilon,
                        epsilon_lb=m.epsilon_lb, tightness=m.tightness, trials=m.trials_in + m.trials_out,
                        alpha=m.alpha, delta=m.delta,
                        not_this_claim=None if why is None else f"{why}; re-make it with '{_remake(run)}'")


def _deciding(row: MechanismRow | None) -> bool:
    return row is not None and row.not_this_claim is None


def _confidence(row: MechanismRow) -> str:
    return f"{fmt.num(100 * (1 - row.alpha))}%"


def mechanism_verdict(row: MechanismRow | None, *, status: str, summary: str, lb: float | None,
                      epsilon_command: str) -> tuple[str, str, str] | None:
    """``(status, headline, summary)`` of the verdict box when the mechanism audit decides it (a VIOLATION of the
    run's own claim), else None (the model's evidence decides).

    Args:
        row: the mechanism row (:func:`mechanism_row`), or None.
        status, summary: the verdict and summary from the model's evidence (``epsilon.json``).
        lb: the model's best ε lower bound when one was estimated.
        epsilon_command: the command that estimates the model's bounds.

    >>> row = MechanismRow(status="VIOLATION", target="engine hooks/flat", claimed_epsilon=4.5, epsilon_lb=5.03,
    ...                    tightness=1.118, trials=8000, alpha=0.05, delta=1e-5)
    >>> s, h, text = mechanism_verdict(row, status="CONSISTENT", summary="...", lb=1.2, epsilon_command="e")
    >>> s, h
    ('VIOLATION', 'Privacy claim violated: the DP implementation does not deliver it')
    >>> "does not deliver the claimed (ε = 4.500, δ = 1.00e-05): with 95% confidence its ε is at least 5.030" in text
    True
    """
    if not _deciding(row) or row.status != "VIOLATION" or status == "NO_CLAIM":
        return None
    found = (f"The DP implementation itself was audited ({row.target}, {fmt.count(row.trials)} Dirac-canary trials, "
             f"white box) and does not deliver the claimed (ε = {fmt.eps(row.claimed_epsilon)}, "
             f"δ = {fmt.sci(row.delta)}): with {_confidence(row)} confidence its ε is at least "
             f"{fmt.eps(row.epsilon_lb)} (ε_lb/ε = {fmt.num(row.tightness)})")
    if status == "VIOLATION":  # the model's evidence found it too
        return "VIOLATION", "Privacy claim violated", f"{summary} {found}."
    found += ", whatever the bounds measured on the trained model say."
    if status == "NOT_AUDITED":
        found += f" The trained model's own ε lower bound has not been estimated yet ('{epsilon_command}')."
    elif lb is not None:
        found += (f" Those bounds (best ε ≥ {fmt.eps(lb)}) come from weaker attackers than the one the claim must "
                  f"hold against, so they cannot outweigh it.")
    return "VIOLATION", MECHANISM_HEADLINE, found


def mechanism_line(row: MechanismRow | None) -> str | None:
    """The verdict box's line on the mechanism audit: for a CONSISTENT audit of the run's claim what it adds, for a
    result of another claim why it takes no part; None otherwise (none run, or a VIOLATION already in the
    summary).

    >>> row = MechanismRow(status="CONSISTENT", target="engine hooks/flat", claimed_epsilon=4.5, epsilon_lb=4.2,
    ...                    tightness=0.933, trials=2000, alpha=0.05, delta=1e-5)
    >>> print(mechanism_line(row)[:108])
    Mechanism audit (engine hooks/flat, 2,000 Dirac-canary trials, white box): CONSISTENT. The DP implementation
    """
    if row is None:
        return None
    head = f"Mechanism audit ({row.target}, {fmt.count(row.trials)} Dirac-canary trials, white box)"
    if row.not_this_claim is not None:
        return f"{head}: not used in this verdict: {row.not_this_claim}."
    if row.status != "CONSISTENT":
        return None
    return (f"{head}: CONSISTENT. The DP implementation delivered its claimed (ε = {fmt.eps(row.claimed_epsilon)}, "
            f"δ = {fmt.sci(row.delta)}) in these trials (ε ≥ {fmt.eps(row.epsilon_lb)} with {_confidence(row)} "
            f"confidence, ε_lb/ε = {fmt.num(row.tightness)}). This strengthens the claim but does not prove it: it "
            f"tests the optimizer step, sampler, clipping and noise at the run's settings on a probe model, a finite "
            f"number of times, not this training run itself.")
