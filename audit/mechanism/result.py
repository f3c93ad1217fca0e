"""``mechanism.json``: the result of a mechanism audit (:func:`audit.mechanism.api.audit_mechanism`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.verdict import Verdict, verdict
from audit.mechanism.estimate import MechanismClaim, mechanism_estimate
from audit.mechanism.scoring import trial_scores
from foundation.files import MECHANISM_FILE
from foundation.result_json import Real, ResultModel, read_result, write_result

__all__ = ["MECHANISM_FORMAT", "MechanismResult", "score_and_judge", "make_result", "write_mechanism", "read_mechanism",
           "claim_mismatch"]

MECHANISM_FORMAT = "dp-audit-mechanism/1"


class MechanismResult(ResultModel):
    """What a mechanism audit found: the claim, the trials, the ε lower bound and the verdict.

    Attributes:
        format: :data:`MECHANISM_FORMAT`.
        target: what was audited, e.g. ``"engine hooks/flat"`` or ``"opacus DPOptimizer"``.
        noise_multiplier, sample_rate, steps, max_grad_norm, delta: the claim's σ, q, T, C, δ.
        claimed_epsilon: ε of the claim (its accountant at σ, q, T, δ); accountant: which one.
        runs, canaries_per_run, trials_in, trials_out: how many runs and trials (one canary = one trial).
        epsilon_lb: ε lower bound at confidence 1 − alpha (:func:`audit.mechanism.estimate.mechanism_estimate`).
        tightness: epsilon_lb / claimed_epsilon.
        sigma_ub: every noise multiplier above it is refuted; claim_refuted: σ > sigma_ub.
        mu_lb: GDP μ lower bound (full batch), else None.
        epsilon_lb_direct: the assumption-free Clopper–Pearson (ε, δ) bound of the same trials (at alpha).
        threshold, fpr_ub, fnr_ub, n_thresholds: the deciding test.
        alpha: significance level; cpu_seconds: CPU time of the audit; seed; mutant: a planted bug or None.
        verdict: the :class:`~audit.bounds.verdict.Verdict` against the claimed (ε, δ).
    """

    format: str
    target: str
    noise_multiplier: Real
    sample_rate: Real
    steps: int
    max_grad_norm: Real
    delta: Real
    claimed_epsilon: Real
    accountant: str
    runs: int
    canaries_per_run: int
    trials_in: int
    trials_out: int
    epsilon_lb: Real
    tightness: Real
    sigma_ub: Real
    claim_refuted: bool
    mu_lb: Real | None
    epsilon_lb_direct: Real
    threshold: Real
    fpr_ub: Real
    fnr_ub: Real
    n_thresholds: int
    alpha: Real
    cpu_seconds: Real
    seed: int
    mutant: str | None
    verdict: Verdict


def score_and_judge(*, x: np.ndarray, members: np.ndarray, claim: MechanismClaim, alpha: float
                    ) -> tuple[EpsilonEstimate, Verdict]:
    """Score every trial exactly, bound ε and judge the claim."""
    s = trial_scores(x, noise_multiplier=claim.noise_multiplier, sample_rate=claim.sample_rate)
    members = np.asarray(members, dtype=bool)
    est = mechanism_estimate(scores_in=s[members], scores_out=s[~members], claim=claim, alpha=alpha)
    return est, verdict(claimed_epsilon=claim.epsilon, estimates=[est], claimed_delta=claim.delta,
                        sources=["dirac_canaries"])


def make_result(*, target: str, claim: MechanismClaim, max_grad_norm: float, runs: int, canaries_per_run: int,
                members: np.ndarray, est: EpsilonEstimate, v: Verdict, cpu_seconds: float, seed: int,
                mutant: str | None) -> MechanismResult:
    """Assemble the :class:`MechanismResult` of an audit."""
    e = est.extra
    return MechanismResult.from_data(dict(
        format=MECHANISM_FORMAT, target=target, noise_multiplier=claim.noise_multiplier,
        sample_rate=claim.sample_rate, steps=claim.steps, max_grad_norm=float(max_grad_norm), delta=claim.delta,
        claimed_epsilon=claim.epsilon, accountant=claim.accountant, runs=int(runs),
        canaries_per_run=int(canaries_per_run), trials_in=int(np.sum(members)),
        trials_out=int(np.size(members) - np.sum(members)), epsilon_lb=est.epsilon_lb,
        tightness=est.epsilon_lb / claim.epsilon, sigma_ub=e["sigma_ub"], claim_refuted=e["claim_refuted"],
        mu_lb=e["mu_lb"], epsilon_lb_direct=e["epsilon_lb_direct"], threshold=e["threshold"], fpr_ub=e["fpr_ub"],
        fnr_ub=e["fnr_ub"], n_thresholds=e["n_thresholds"], alpha=est.alpha, cpu_seconds=float(cpu_seconds),
        seed=int(seed), mutant=mutant, verdict=v.model_dump(mode="json")))


def _run(run_dir: Path):
    """``run_dir``'s manifest when it is a run directory, else None."""
    from foundation.files import MANIFEST_FILE
    from training.run.manifest import read_manifest

    return read_manifest(run_dir) if (run_dir / MANIFEST_FILE).is_file() else None


def _identity(manifest) -> dict | None:
    """The run's claim-bound evidence identity, or None outside a run directory."""
    from training.run.freshness import evidence_identity

    return None if manifest is None else evidence_identity(manifest)


def write_mechanism(run_dir: str | Path, result: MechanismResult) -> Path:
    """Write ``mechanism.json`` into ``run_dir`` (atomically, signed with the auditor's evidence key; in a run
    directory bound to the run and its claim, so an edited claim makes it stale)."""
    path = Path(run_dir) / MECHANISM_FILE
    ident = _identity(_run(Path(run_dir)))
    write_result(path, result, identity=ident if ident is not None else {"mechanism": "standalone"})
    return path


def read_mechanism(run_dir: str | Path) -> MechanismResult | None:
    """``run_dir``'s ``mechanism.json`` (signature and, in a run directory, freshness checked), or None."""
    path = Path(run_dir) / MECHANISM_FILE
    if not path.is_file():
        return None
    manifest = _run(Path(run_dir))
    remake = f"audit mechanism {run_dir}"
    if manifest is not None and manifest.training.get("recipe") == "opacus":
        remake = "auditor.audit_mechanism() in the training script"
    return read_result(path, MechanismResult, fmt=MECHANISM_FORMAT, remake=remake, identity=_identity(manifest))



def _close(a: float | None, b: float | None) -> bool:
    import math

    return a is not None and b is not None and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-6)


def claim_mismatch(result: MechanismResult, privacy) -> str | None:
    """Why ``result`` is not an audit of a run's claim, or None when it is.

    A ``mechanism.json`` written into a run directory is bound to that run's claim by its signature, but
    ``audit mechanism --sigma ... --out RUN`` could have audited other settings: only a result judged against the
    run's own claimed ε and δ (and, when the run records one DP phase, at its σ, q and T) may decide the run's
    verdict (:mod:`audit.reporting.mechanism`, the gate's ``mechanism_consistent`` rule).

    Args:
        result: the verified ``mechanism.json``.
        privacy: the run manifest's ``privacy`` block.

    >>> from types import SimpleNamespace as N
    >>> r = MechanismResult.model_construct(claimed_epsilon=4.5, delta=1e-5, noise_multiplier=2.0, sample_rate=1.0,
    ...                                     steps=4)
    >>> ph = N(dp=True, noise_multiplier=2.0, sample_rate=1.0, steps=4)
    >>> claim_mismatch(r, N(dp=True, epsilon=4.5, delta=1e-5, phases=[ph])) is None
    True
    >>> print(claim_mismatch(r, N(dp=True, epsilon=8.0, delta=1e-5, phases=[ph])))
    it audited the claim ε = 4.5, δ = 1e-05, not the run's ε = 8, δ = 1e-05
    >>> print(claim_mismatch(r, N(dp=True, epsilon=4.5, delta=1e-5, phases=[N(**{**vars(ph), "steps": 40})])))
    it audited σ = 2, q = 1, T = 4, not the run's σ = 2, q = 1, T = 40
    """
    if not privacy.dp or privacy.epsilon is None:
        return "the run makes no DP claim"
    if not (_close(result.claimed_epsilon, privacy.epsilon) and _close(result.delta, privacy.delta)):
        run_delta = "none" if privacy.delta is None else f"{privacy.delta:.3g}"
        return (f"it audited the claim ε = {result.claimed_epsilon:.4g}, δ = {result.delta:.3g}, not the run's "
                f"ε = {privacy.epsilon:.4g}, δ = {run_delta}")
    dp = [ph for ph in privacy.phases if ph.dp]
    if len(dp) == 1 and None not in (dp[0].noise_multiplier, dp[0].sample_rate, dp[0].steps):
        ph = dp[0]
        if not (_close(result.noise_multiplier, ph.noise_multiplier) and _close(result.sample_rate, ph.sample_rate)
                and int(result.steps) == int(ph.steps)):
            return (f"it audited σ = {result.noise_multiplier:.4g}, q = {result.sample_rate:.4g}, T = {result.steps}, "
                    f"not the run's σ = {ph.noise_multiplier:.4g}, q = {ph.sample_rate:.4g}, T = {ph.steps}")
    return None
