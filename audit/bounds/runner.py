"""`audit epsilon`: every empirical ε lower bound a run directory supports, and the verdict, in ``epsilon.json``.

For each configured source (:mod:`audit.bounds.sources`) the runner computes

* ``one_run`` — Steinke, Nasr, Jagielski (NeurIPS 2023), over a geometric ``(k_pos, k_neg)`` grid with the
  search accounted for by Bonferroni (:func:`~audit.bounds.one_run.epsilon_one_run_from_scores`);
* ``one_run_fdp`` — Mahloujifar, Melis, Chaudhuri (2024), the same guesses tested against Gaussian trade-off
  curves (:func:`~audit.bounds.one_run_fdp.epsilon_one_run_fdp_from_scores`);
* for ``multi_run`` only (listed in ``sources``; it trains models), ``clopper_pearson`` and ``gdp`` over n models
  re-trained with and n without one canary (:mod:`audit.bounds.multi_run_source`; information, not verdict);
* for the pool only, ``clopper_pearson`` and ``gdp`` with a held-out threshold (Jagielski et al. 2020; Nasr et al.
  2023). They treat the pool examples of one model as independent trials, which no theorem grants, so they are
  reported for comparison and never decide the verdict.

Which bounds decide the verdict: every ``one_run`` bound (it assumes nothing beyond the (ε, δ) claim), and the
``one_run_fdp`` bounds when the claimed mechanism is itself Gaussian — every DP phase full-batch (q = 1), so
DP-SGD is a composition of Gaussian mechanisms with μ = sqrt(Σ T/σ²) and rejecting that curve refutes the claim.
With ``split_alpha`` each deciding bound is computed at α/K (K of them), so the verdict ``VIOLATION`` (some
ε_lb > claimed ε) is wrong with probability at most α. δ is the manifest's δ.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from audit.config import EpsilonConfig
from attacks.runner import check_scores_identity
from audit.bounds.claim_check import check_claim
from audit.bounds.clopper_pearson import epsilon_from_scores_cp
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.gdp import epsilon_from_scores_gdp
from audit.bounds.multi_run_source import multi_run_evidence
from audit.bounds.one_run import epsilon_one_run_from_scores, k_grids
from audit.bounds.one_run_fdp import epsilon_one_run_fdp_from_scores
from audit.bounds.power_record import PowerEntry, plan_power
from audit.bounds.sources import (ZERO_UPDATE, Evidence, Skipped, gradient_canary_evidence,
                                   input_canary_evidence, pool_evidence)
from audit.bounds.thresholds import HeldOut
from audit.bounds.epsilon_file import (EpsilonFile, EstimateEntry, SkippedEntry, read_epsilon_file,
                                        write_epsilon_file)
from audit.bounds.verdict import Finding, Verdict, VerdictStatus
from audit.bounds.verdict import verdict as judge
from foundation.files import EPSILON_FILE, SCORES_FILE
from foundation.errors import UserError
from foundation.io import read_json, sha256_bytes, sha256_file
from foundation.result_json import CodeRecord
from training.run import (CONFIG_FILE, METRICS_FILE, VerifiedRun, as_run, evidence_identity, identity,
                          inputs_record, is_current)
from training.run.manifest import Manifest
from foundation.lock import run_lock
from training.trust import CodeTrust

__all__ = ["SourcedEstimate", "EpsilonReport", "judge_estimates", "run_epsilon", "epsilon_is_complete",
           "claim_sha256",
           "config_sha256", "k_grids", "claim_is_gaussian"]

INDEPENDENCE = ("pool examples of one model treated as independent trials (heuristic, not a proven bound; "
                "not used for the verdict)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourcedEstimate:
    """An estimate, the evidence it came from, and whether it takes part in the verdict."""

    source: str
    estimate: EpsilonEstimate
    in_verdict: bool
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_entry(self) -> EstimateEntry:
        """The ``estimates`` entry of ``epsilon.json``."""
        d = self.estimate.to_dict()
        return EstimateEntry.from_data({
            "method": d["method"], "source": self.source, "epsilon_lb": d["epsilon_lb"], "alpha": d["alpha"],
            "delta": d["delta"], "counts": d["counts"], "ceiling": d["ceiling"], "assumptions": d["assumptions"],
            "extra": {**d["extra"], "in_verdict": self.in_verdict, "evidence": dict(self.provenance)}})


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpsilonReport:
    """What :func:`run_epsilon` computed; :meth:`to_file` is the ``epsilon.json`` it writes."""

    run: str
    inputs: dict[str, str | None]
    claimed_epsilon: float
    delta: float
    alpha: float
    estimates: tuple[SourcedEstimate, ...]
    skipped: tuple[Skipped, ...]
    verdict: Verdict
    path: Path | None = None
    code: CodeTrust | None = None
    power: tuple[PowerEntry, ...] = ()

    def to_file(self) -> EpsilonFile:
        """The ``epsilon.json`` content (:class:`~audit.bounds.epsilon_file.EpsilonFile`)."""
        return EpsilonFile(run=self.run, inputs=dict(self.inputs), claimed_epsilon=self.claimed_epsilon,
                           delta=self.delta, alpha=self.alpha, estimates=tuple(e.to_entry() for e in self.estimates),
                           skipped=tuple(SkippedEntry(source=s.source, reason=s.reason) for s in self.skipped),
                           power=self.power, verdict=self.verdict,
                           code=None if self.code is None else CodeRecord.from_data(self.code.to_dict()))


def config_sha256(config: EpsilonConfig) -> str:
    """sha256 of the config's canonical JSON: ``epsilon.json`` is stale when it changes."""
    return sha256_bytes(json.dumps(config.model_dump(mode="json"), sort_keys=True).encode("utf-8"))


def claim_is_gaussian(manifest: Manifest) -> bool:
    """Whether the claimed mechanism is exactly Gaussian: a DP claim whose every DP phase is full-batch (q = 1)."""
    phases = [p for p in manifest.privacy.phases if p.dp]
    return bool(manifest.privacy.dp and phases and all(
        p.sample_rate is not None and math.isclose(p.sample_rate, 1.0, rel_tol=0.0, abs_tol=1e-12)
        and (p.noise_multiplier or 0.0) > 0.0 for p in phases))


#: The order in which ``epsilon.attack: strongest`` picks an attack from ``scores.npz``: the attacks with reference
#: models first (online before offline), RMIA before LiRA (Zarifzadeh et al. 2024), then the reference-free ones.
#: Fixed in advance: picking the attack with the best result on the same scores would overstate the bound.
STRONGEST_FIRST = ("rmia_online", "lira_online", "rmia_offline", "lira_offline", "attack_p", "loss")


def resolve_attack(run: VerifiedRun, attack: str) -> str:
    """``attack``, or for ``"strongest"`` the first of :data:`STRONGEST_FIRST` that the run's ``scores.npz`` holds
    (``lira_online`` when there is none: the pool source then says how to make it)."""
    if attack != "strongest":
        return attack
    path = run.run_dir / SCORES_FILE
    if not path.is_file():
        return "lira_online"
    try:
        with np.load(path, allow_pickle=False) as npz:
            names = set(npz.files)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return "lira_online"  # unreadable: reading it for the evidence says so in one line
    return next((a for a in STRONGEST_FIRST if f"score_{a}" in names), "lira_online")


def _load_evidence(source: str, *, run: VerifiedRun, config: EpsilonConfig,
                   log: Callable[[str], None] | None = None) -> Evidence | Skipped:
    if source in ("pool", "input_canaries"):
        check_scores_identity(run)
    if source == "pool":
        ev = pool_evidence(run=run, attack=resolve_attack(run, config.attack))
    elif source == "input_canaries":
        ev = input_canary_evidence(run=run, attack=resolve_attack(run, config.attack))
    elif source == "auditor_canaries":
        from audit.bounds.auditor_source import auditor_canary_evidence

        ev = auditor_canary_evidence(run=run, secret_path=config.canaries, n_models=config.canary_references,
                                     seed=config.canary_reference_seed, reference_dir=config.canary_reference_dir,
                                     sigma0=config.canary_sigma0, log=log)
    else:
        ev = gradient_canary_evidence(run=run)
    if isinstance(ev, Evidence) and (ev.m < 2 or ev.included.all() or not ev.included.any()):
        return Skipped(source, f"{ev.m} canaries with {int(ev.included.sum())} included: the one-run audit needs "
                               "at least two canaries, some in and some out")
    return ev


def _plan(ev: Evidence, *, delta: float, config: EpsilonConfig, gaussian: bool) -> list[tuple[str, bool]]:
    """(method, in_verdict) for the estimates this evidence supports."""
    plan = [("one_run", True)]
    if config.fdp and delta > 0.0:
        plan.append(("one_run_fdp", gaussian and config.gaussian_in_verdict == "auto"))
    if ev.source == "pool":
        n_in, n_out = int(ev.included.sum()), int((~ev.included).sum())
        f = config.holdout_fraction
        if all(1 <= math.floor(f * n) <= n - 1 for n in (n_in, n_out)):
            plan.append(("clopper_pearson", False))
            if delta > 0.0:
                plan.append(("gdp", False))
    return plan


def _estimate(method: str, ev: Evidence, *, delta: float, alpha: float, config: EpsilonConfig) -> EpsilonEstimate:
    if method in ("one_run", "one_run_fdp"):
        kp, kn = k_grids(ev.m, points=config.k_grid_points, guesses=config.guesses)
        fn = epsilon_one_run_from_scores if method == "one_run" else epsilon_one_run_fdp_from_scores
        return fn(scores=ev.scores, included=ev.included, delta=delta, alpha=alpha, k_pos_grid=kp, k_neg_grid=kn,
                  rng=config.seed)
    fn = epsilon_from_scores_cp if method == "clopper_pearson" else epsilon_from_scores_gdp
    est = fn(scores_in=ev.scores[ev.included], scores_out=ev.scores[~ev.included], delta=delta, alpha=alpha,
             threshold_strategy=HeldOut(fraction=config.holdout_fraction, rng=config.seed))
    assumptions = "; ".join(a for a in (est.assumptions, INDEPENDENCE) if a)
    return dataclasses.replace(est, assumptions=assumptions)


def judge_estimates(*, claimed_epsilon: float, delta: float, estimates: Sequence[SourcedEstimate],
                    notes: Sequence[str] = ()) -> Verdict:
    """The verdict on sourced estimates: only those ``in_verdict`` decide; the others are listed in the notes.

    Args:
        claimed_epsilon: the claim (``inf``: no DP claim).
        delta: the δ every estimate bounds ε at (the claim's δ).
        estimates: the estimates, deciding and informational.
        notes: remarks to append (e.g. where δ came from).
    """
    claim = claimed_epsilon
    notes = list(notes)
    ests = estimates
    deciding = [e for e in ests if e.in_verdict]
    info = [e for e in ests if not e.in_verdict]
    for e in info:
        notes.append(f"not in the verdict: {e.source}/{e.estimate.method} ε_lb = {e.estimate.epsilon_lb:.4g} "
                     f"(assumes: {e.estimate.assumptions or 'a Gaussian trade-off curve, which this claim is not'})")
    if not deciding:
        why = "every source was skipped" if not info else "every bound is for information only"
        return Verdict.no_evidence(claimed_epsilon=claim, claimed_delta=delta if math.isfinite(claim) else None,
                                   reason=why, notes=notes)
    v = judge(claimed_epsilon=claim, estimates=[e.estimate for e in deciding],
              claimed_delta=delta if math.isfinite(claim) else None, sources=[e.source for e in deciding])
    lead: list[str] = []
    if str(v.status) == "VIOLATION":
        lead += [f"{e.source}/{e.estimate.method}: ε_lb = {e.estimate.epsilon_lb:.4g} > claimed ε = {claim:.4g} "
                 f"(lower bound at confidence {1 - e.estimate.alpha:.4g})"
                 for e in deciding if e.estimate.epsilon_lb > claim]
    lead += [n for n in v.notes if n.startswith(("inconclusive", "no DP claim"))]
    lead.append(f"{len(deciding)} bound(s) decide the verdict; the chance that any overstates ε is at most "
                f"Σα = {sum(e.estimate.alpha for e in deciding):.4g}")
    return v.model_copy(update={"notes": tuple(lead + notes)})


def run_epsilon(*, run_dir: str | Path | VerifiedRun, config: EpsilonConfig | None = None,
                write: bool = True, trust_code: bool = False,
                log: Callable[[str], None] | None = None) -> EpsilonReport:
    """Compute every configured ε lower bound for a run, judge the claim, and write ``<run_dir>/epsilon.json``.

    Args:
        run_dir: A run directory written by ``audit train`` (or ``audit import``), or the run already opened
            with :func:`training.run.open_run`.
        config: Sources, α and estimator settings (default :class:`~audit.config.EpsilonConfig`).
        write: Write ``epsilon.json`` atomically (the report's ``path`` is set then).
        trust_code: allow the run to name code to import (``--trust-code``); checked before anything is read
            and recorded in ``epsilon.json`` under ``code``. A run already opened keeps the trust it was opened with.
        log: progress messages (the ``auditor_canaries`` source trains reference models).

    Returns:
        The :class:`EpsilonReport`.

    Raises:
        UntrustedCodeError: the run names code to import and ``trust_code`` is False (nothing was run).
        UserError: missing or mismatching files (manifest, weights, membership, ``scores.npz`` when the pool source
            is configured), or a configured attack absent from ``scores.npz``.
    """
    config = config if config is not None else EpsilonConfig()
    run = as_run(run_dir, trust_code=trust_code, verify=False)  # the code check first, then each part once
    if write:
        with run_lock(run.run_dir):  # multi_run trains models and epsilon.json is written here: one writer at a time
            return _run_epsilon(run=run, config=config, write=write, log=log)
    return _run_epsilon(run=run, config=config, write=write, log=log)


def _run_epsilon(*, run: VerifiedRun, config: EpsilonConfig, write: bool,
                 log: Callable[[str], None] | None = None) -> EpsilonReport:
    """:func:`run_epsilon` on the opened run (with its directory locked when writing)."""
    identity(run)  # weights and membership verified now; config and pool when a source uses them
    run_dir, manifest = run.run_dir, run.manifest
    claim = manifest.privacy.claimed_epsilon
    notes: list[str] = []
    if manifest.privacy.dp and manifest.privacy.delta is not None:
        delta = float(manifest.privacy.delta)
    else:
        from training.accounting import default_delta

        delta = default_delta(max(1, manifest.data.membership.n_members))
        notes.append(f"the manifest records no δ (no DP claim); bounds are at δ = {delta:g} = default for n = "
                     f"{manifest.data.membership.n_members}")
    gaussian = claim_is_gaussian(manifest)

    evidence: list[Evidence] = []
    skipped: list[Skipped] = []
    multi: list[SourcedEstimate] = []
    for source in config.sources:
        if source == "multi_run":
            res = multi_run_evidence(run=run, config=config, delta=delta)
            if isinstance(res, Skipped):
                skipped.append(res)
            else:
                multi += [SourcedEstimate(source="multi_run", estimate=e, in_verdict=False,
                                          provenance={"scores": "scaled logit of one canary in each re-trained model",
                                                      "n_models": config.multi_run_models,
                                                      "canary": config.multi_run_canary}) for e in res]
            continue
        ev = _load_evidence(source, run=run, config=config, log=log)
        (skipped if isinstance(ev, Skipped) else evidence).append(ev)

    if any(ev.source == "auditor_canaries" for ev in evidence):
        from audit.bounds.auditor_source import AUDITOR_CANARY_LIMITS

        notes.append(f"auditor_canaries: {AUDITOR_CANARY_LIMITS}")
    plans = [(ev, _plan(ev, delta=delta, config=config, gaussian=gaussian)) for ev in evidence]
    n_deciding = sum(d for _, plan in plans for _, d in plan)
    a_deciding = config.alpha / n_deciding if (config.split_alpha and n_deciding) else config.alpha
    power = plan_power(plans=plans, claimed_epsilon=claim, delta=delta, alpha_deciding=a_deciding,
                       points=config.k_grid_points, guesses=config.guesses)  # fixed before any score is read
    estimates = tuple(
        SourcedEstimate(source=ev.source, in_verdict=deciding, provenance=dict(ev.provenance),
                        estimate=_estimate(method, ev, delta=delta, alpha=a_deciding if deciding else config.alpha,
                                           config=config))
        for ev, plan in plans for method, deciding in plan) + tuple(multi)
    if gaussian and config.gaussian_in_verdict == "auto" and any(m == "one_run_fdp" for _, p in plans for m, _ in p):
        notes.append("every DP phase is full-batch (q = 1): the claimed mechanism is exactly Gaussian, so the "
                     "Gaussian-curve one-run bounds take part in the verdict")

    scores_path = run_dir / SCORES_FILE
    report = EpsilonReport(
        run=manifest.run_name,
        inputs=inputs_record(run, scores_sha256=sha256_file(scores_path) if scores_path.is_file() else None,
                             config_sha256=config_sha256(config), claim_sha256=claim_sha256(run)),
        claimed_epsilon=claim, delta=delta, alpha=config.alpha, estimates=estimates, skipped=tuple(skipped),
        verdict=with_claim_findings(judge_estimates(claimed_epsilon=claim, delta=delta, estimates=estimates,
                                                    notes=notes),
                                    (*_claim_findings(run), *_evidence_findings(skipped))), code=run.code,
        power=power)
    if write:
        path = write_epsilon_file(run_dir, report.to_file(), identity=evidence_identity(run))
        report = dataclasses.replace(report, path=path)
    return report


def with_claim_findings(v: Verdict, findings: Sequence[Finding]) -> Verdict:
    """``v`` with the claim check's findings attached; any ``error`` makes it ``VIOLATION`` (the claim does not
    follow from the run's own record, whatever the bounds found) and leads its notes."""
    if not findings:
        return v
    errors = [f.message for f in findings if f.severity == "error"]
    warnings = [f"claim check: {f.message}" for f in findings if f.severity == "warning"]
    update: dict[str, Any] = {"notes": (*errors, *warnings, *v.notes)}
    if errors:
        update["status"] = VerdictStatus.VIOLATION
    return v.with_findings(*findings).model_copy(update=update)


def claim_sha256(run: VerifiedRun) -> str:
    """sha256 over what the claim check reads: the manifest, ``config.yaml`` and ``metrics.json`` (absent counts
    as absent); part of ``epsilon.json``'s inputs, so it is stale when any of them changes."""
    metrics = run.metrics_path
    parts = [f"manifest:{sha256_bytes(run.manifest.model_dump_json().encode('utf-8'))}",
             f"{CONFIG_FILE}:{run.config_sha256 or 'absent'}",
             f"{METRICS_FILE}:{sha256_file(metrics) if metrics.is_file() else 'absent'}"]
    return sha256_bytes("\n".join(parts).encode("utf-8"))


def _evidence_findings(skipped: Sequence[Skipped]) -> tuple[Finding, ...]:
    """Findings about the evidence files themselves: θ_0 = θ_T (a zero update) is an error."""
    return tuple(Finding(kind="zero_update", severity="error", message=s.reason) for s in skipped
                 if s.reason == ZERO_UPDATE)


def _claim_findings(run: VerifiedRun) -> tuple[Finding, ...]:
    """Check a DP claim against the run's ``config.yaml`` and ``metrics.json`` (when present)."""
    manifest = run.manifest
    if not manifest.privacy.dp:
        return ()
    config = metrics = None
    unreadable: list[Finding] = []
    if run.has_recipe:
        try:
            config = run.config_data
        except UserError as exc:
            unreadable.append(Finding(kind="claim_vs_config", severity="error",
                                      message=f"{CONFIG_FILE} is unreadable ({exc})"))
        else:
            if config is None:
                unreadable.append(Finding(kind="claim_vs_config", severity="error",
                                          message=f"{CONFIG_FILE} is not a mapping of sections"))
    if run.metrics_path.is_file():
        try:
            metrics = read_json(run.metrics_path, what="metrics")
        except ValueError as exc:
            unreadable.append(Finding(kind="claim_vs_metrics", severity="warning", message=str(exc)))
        if not isinstance(metrics, dict):
            metrics = None
    found = check_claim(manifest, config=config, config_sha256=run.config_sha256, metrics=metrics)
    return tuple(sorted((*unreadable, *found), key=lambda f: f.severity != "error"))


def epsilon_is_complete(run_dir: str | Path | VerifiedRun, config: EpsilonConfig | None = None) -> bool:
    """Whether ``<run_dir>/epsilon.json`` is current (:func:`training.run.is_current`): readable (current format or
    migrated), same verified weights and membership, pool fingerprint, ``scores.npz``, config and claim record.

    >>> epsilon_is_complete("/nonexistent/run")
    False
    """
    config = config if config is not None else EpsilonConfig()
    path = (run_dir.run_dir if isinstance(run_dir, VerifiedRun) else Path(run_dir))
    if not (path / EPSILON_FILE).is_file():
        return False
    try:
        run = as_run(run_dir, verify=False)
        data = read_epsilon_file(path, identity=evidence_identity(run))
    except UserError:
        return False
    scores_path = path / SCORES_FILE
    scores_sha = sha256_file(scores_path) if scores_path.is_file() else None
    return is_current(data.inputs, run, scores_sha256=scores_sha, config_sha256=config_sha256(config),
                      claim_sha256=claim_sha256(run))
