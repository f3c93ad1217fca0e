"""Honest, automatically generated caveats for the report.

Each check is a small rule over the run's files and the built report; the report lists every caveat that
applies, most important first. Thresholds are module constants so a reviewer can see exactly when a caveat
fires.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from attacks.config import reference_free_attacks
from audit.bounds.auditor_source import AUDITOR_CANARY_LIMITS
from audit.reporting import fmt

if TYPE_CHECKING:  # pragma: no cover
    from audit.reporting.inputs import RunFiles
    from audit.reporting.model import Report

__all__ = ["limitations", "FEW_REFERENCE_MODELS", "CROSS_CHECK_RTOL", "AUDITOR_CANARY_LIMITS"]

#: Fewer reference models than this are flagged (LiRA/RMIA papers report 64 to 256).
FEW_REFERENCE_MODELS = 16
#: A relative gap between the claimed epsilon and the second accountant's above this is flagged.
CROSS_CHECK_RTOL = 0.05


def _lower_bounds(report: Report) -> list[str]:
    out = []
    eps = report.epsilon
    if eps.ran:
        out.append("Empirical ε values are lower bounds: they can show that a claim is false, never that it is "
                   "true. 'No violation found' means only that these attacks could not refute the claim.")
    claimed = eps.claimed_epsilon
    if eps.ran and claimed is not None and math.isfinite(claimed):
        ceilings = [r.ceiling for r in eps.rows if r.ceiling is not None and not math.isnan(r.ceiling)]
        limit = eps.inconclusive_above
        if limit is None and ceilings and max(ceilings) < claimed:
            limit = max(ceilings)
        if limit is not None and limit < claimed:
            out.append(f"With these counts no estimator could certify ε above {fmt.eps(limit)} (its ceiling), "
                       f"below the claimed ε = {fmt.eps(claimed)}: the audit is inconclusive about leakage "
                       f"between {fmt.eps(limit)} and the claim. More examples or canaries raise the ceiling.")
    return out


def _claim(run: RunFiles, report: Report) -> list[str]:
    out = []
    c = report.claim
    if not c.dp:
        out.append("The model was trained without differential privacy: no formal guarantee applies, whatever "
                   "the attacks show.")
        return out
    for ph in c.phases:
        if ph.dp and not ph.poisson:
            out.append(f"Phase '{ph.name}' drew batches by {ph.sampling} sampling, but the accountant's ε "
                       f"assumes Poisson subsampling: the claimed ε is not a proven guarantee for this training "
                       f"(shuffled batches can leak more than the Poisson analysis says).")
        if not ph.dp:
            out.append(f"Phase '{ph.name}' was not differentially private: the claim covers only the data of "
                       f"the DP phases, not '{ph.dataset or 'its data'}'.")
    n = run.manifest.data.membership.n_members
    if c.delta is not None and n > 0 and c.delta >= 1.0 / n:
        out.append(f"δ = {fmt.sci(c.delta)} is not below 1/n = {fmt.sci(1.0 / n)} for n = {n:,} training "
                   f"examples: a mechanism that publishes a random training example in full meets such a δ, so "
                   f"the claim is weak whatever ε says.")
    if (c.claimed_epsilon is not None and c.cross_check_epsilon is not None
            and math.isfinite(c.cross_check_epsilon) and c.claimed_epsilon > 0):
        gap = abs(c.cross_check_epsilon - c.claimed_epsilon) / c.claimed_epsilon
        if gap > CROSS_CHECK_RTOL:
            out.append(f"The claimed ε = {fmt.eps(c.claimed_epsilon)} ({c.accountant}) and the "
                       f"{c.cross_check_accountant} cross-check ε = {fmt.eps(c.cross_check_epsilon)} differ by "
                       f"{fmt.num(100 * gap)}%: the accounting should be checked.")
    return out


def _attacks(run: RunFiles, report: Report) -> list[str]:
    out = []
    a = report.attacks
    if not a.ran:
        return out
    names = {r.name for r in a.rows}
    k = run.attack.setup.n_reference if run.attack else None
    if names and names <= set(reference_free_attacks()):
        out.append("Only reference-free attacks (LOSS, Attack-P) were run; attacks with reference models "
                   "(LiRA, RMIA) are much stronger at low false-positive rates.")
    elif k is not None and k < FEW_REFERENCE_MODELS:
        out.append(f"Only {k} reference model{'s' if k != 1 else ''} were trained; LiRA and RMIA are reported "
                   f"with 64 to 256 in the literature, so these attack numbers likely underestimate what a "
                   f"better-resourced attacker achieves.")
    unresolved = []
    for lv in a.levels:
        counts = [r.n_nonmembers for r in a.rows if r.n_nonmembers]
        if counts and min(counts) * float(lv) < 1.0:
            unresolved.append(fmt.fpr_label(float(lv)))
    if unresolved:
        n = min(r.n_nonmembers for r in a.rows if r.n_nonmembers)
        out.append(f"With {n:,} non-members, TPR at FPR {', '.join(unresolved)} would rest on less than one false "
                   f"positive: those columns read \"not resolvable with {n:,} non-members\"; audit at least "
                   f"{math.ceil(1 / min(float(lv) for lv in a.levels)):,} non-members to resolve them all.")
    if run.attack is not None and run.attack.setup.evaluation == "target":
        out.append("Attack metrics come from one target model; their confidence intervals cover the choice of "
                   "examples, not the randomness of training.")
    return out


def _estimates(run: RunFiles, report: Report) -> list[str]:
    out = []
    methods = {r.method for r in report.epsilon.rows if r.source != "auditor_canaries"}
    scheme = run.manifest.data.membership.scheme
    if any(r.source == "auditor_canaries" for r in report.epsilon.rows):
        out.append(AUDITOR_CANARY_LIMITS)
    if methods & {"one_run", "one_run_fdp"} and scheme != "bernoulli":
        out.append(f"One-run estimates assume every audited example was included independently with probability "
                   f"1/2, but this run's membership scheme is '{scheme}'.")
    return out


def _missing(report: Report) -> list[str]:
    out = []
    def how(command: str) -> str:  # a command to run, or why the step cannot run on this run (no dead hint)
        return f"('{command}')" if command.startswith("audit ") else f"({command})"

    if not report.attacks.ran:
        out.append(f"No membership-inference attacks were run {how(report.attacks.command)}.")
    if not report.epsilon.ran:
        out.append(f"No empirical ε lower bound was computed {how(report.epsilon.command)}.")
    if not report.utility.transfer_ran:
        out.append(f"Transfer evaluation was not run {how(report.utility.transfer_command)}.")
    for row in report.utility.transfer:
        if row.status != "ok":
            out.append(f"Transfer dataset '{row.dataset}' was skipped: {row.reason or 'no reason given'}.")
    if not report.utility.metrics_ran:
        out.append("The run has no metrics.json: training metrics are not shown.")
    return out


def limitations(run: RunFiles, report: Report) -> list[str]:
    """Every caveat that applies to this run, most important first.

    Args:
        run: the parsed run directory.
        report: the report built so far (its ``limitations`` field is ignored).

    Returns:
        Plain-language caveats, one sentence or two each.
    """
    return (_claim(run, report) + _lower_bounds(report) + _estimates(run, report) + _attacks(run, report)
            + _missing(report))
