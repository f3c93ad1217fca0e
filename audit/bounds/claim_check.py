"""Does the claim follow from what the run says it did? The auditor recomputes it and cross-examines the files.

A manifest's ``privacy.epsilon`` is a number anyone can edit. What the auditor can recompute it recomputes:

* **mechanism** — every DP phase's (σ, q, T) and δ composed through the PLD accountant
  (:func:`training.accounting.epsilon_for`, ``accountant="pld"``). A claim below that (beyond a small numerical
  tolerance, :data:`REL_TOL` and :data:`ABS_TOL`) does not follow from the stated mechanism. A DP claim without a
  complete DP phase (σ > 0, q, T), or without δ, states no mechanism that could support it.
* **config** — the run's own ``config.yaml``: privacy enabled, σ or target ε, δ, clipping norm, sampling and
  batch size must agree with the manifest's phases; its sha256 must be the one the manifest recorded.
* **metrics** — ``metrics.json``: ``epsilon_spent`` and ``steps`` must agree with the claim and the phases.
* **provenance** — ``provenance.command``: an override that turned DP off (``privacy.enabled=false``,
  ``privacy.noise_multiplier=0``) contradicts a DP claim.
* **δ** — a claimed δ above ``1/n`` (n: training examples) permits a mechanism that publishes a whole training
  example with probability δ: no meaningful guarantee, whatever ε says (``claim_delta_above_1_over_n``, error).

Each contradiction is a :class:`~audit.bounds.verdict.Finding` (kinds ``claim_not_from_mechanism``,
``claim_unverifiable``, ``claim_delta_above_1_over_n``, ``claim_phase_on_private_data``, ``claim_vs_config``,
``claim_vs_metrics``, ``claim_vs_provenance``) with severity
``"error"`` (the verdict becomes ``VIOLATION``: the claim is not supported by the run's own record) or
``"warning"`` (reported, verdict unchanged). Everything here
is a pure function of already-parsed values; reading the files is the caller's job.

>>> from training.run.manifest import PrivacyInfo, PhaseInfo
>>> phase = PhaseInfo(name="private", dp=True, noise_multiplier=1.0, sample_rate=0.01, steps=1000)
>>> honest = PrivacyInfo(dp=True, delta=1e-5, accountant="prv", epsilon=1.84, phases=[phase])
>>> check_mechanism(honest)
()
>>> forged = honest.model_copy(update={"epsilon": 0.5})
>>> check_mechanism(forged)[0].message[:60]
'claim does not follow from the stated mechanism: ε(PLD) = 1.'
"""

from __future__ import annotations

import math
import shlex
import warnings
from collections.abc import Mapping
from typing import Any

from audit.bounds.verdict import Finding
from foundation.errors import UserError
from foundation.files import CONFIG_FILE, METRICS_FILE
from training.run.manifest import Manifest, PrivacyInfo

__all__ = ["check_delta", "REL_TOL", "ABS_TOL", "recompute_epsilon", "check_mechanism", "check_config",
           "check_metrics", "check_provenance", "check_claim"]

#: Relative tolerance between a claim and the PLD ε of its mechanism (PRV/PLD agree to ~1%; RDP claims are larger).
REL_TOL = 0.02
#: Absolute tolerance (ε units) on top of :data:`REL_TOL`, for tiny claims.
ABS_TOL = 0.01
_SAME = 1e-6  # relative tolerance for numbers copied from the config (σ, δ, C, ε spent)


def _close(a: float, b: float, rel: float = _SAME) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=1e-12)


def _dp_phases(privacy: PrivacyInfo) -> list[Any]:
    return [p for p in privacy.phases if p.dp]


def recompute_epsilon(privacy: PrivacyInfo) -> float:
    """ε of the manifest's DP phases at its δ through the PLD accountant (the auditor's own number).

    Returns:
        ε ≥ 0 (RDP's bound above :data:`training.accounting.WEAK_PRIVACY_EPSILON`, where PLD is impractical).

    Raises:
        UserError: no δ, or a DP phase without σ > 0, q in (0, 1] and T ≥ 0.

    >>> from training.run.manifest import PrivacyInfo, PhaseInfo
    >>> p = PhaseInfo(name="dp", dp=True, noise_multiplier=1.0, sample_rate=0.01, steps=1000)
    >>> round(recompute_epsilon(PrivacyInfo(dp=True, delta=1e-5, epsilon=2.0, phases=[p])), 2)
    1.83
    """
    from training.accounting import DPPhase, epsilon_for

    if privacy.delta is None:
        raise UserError("the DP claim records no delta")
    phases = []
    for p in _dp_phases(privacy):
        if p.noise_multiplier is None or p.sample_rate is None:
            raise UserError(f"DP phase '{p.name}' records no noise multiplier or sample rate")
        phases.append(DPPhase(noise_multiplier=p.noise_multiplier, sample_rate=p.sample_rate, steps=p.steps))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the weak-privacy fallback to RDP: still an upper bound
        return epsilon_for(phases=phases, delta=float(privacy.delta), accountant="pld")


def check_delta(manifest: Any) -> tuple[Finding, ...]:
    """A DP claim whose δ exceeds ``1/n`` (n = the run's training examples) is an error.

    >>> from types import SimpleNamespace as NS
    >>> m = NS(privacy=NS(dp=True, delta=0.5), data=NS(membership=NS(n_members=1000)))
    >>> check_delta(m)[0].kind
    'claim_delta_above_1_over_n'
    """
    privacy, n = manifest.privacy, int(manifest.data.membership.n_members)
    if not privacy.dp or privacy.delta is None or n <= 0 or not float(privacy.delta) > 1.0 / n:
        return ()
    return (Finding(kind="claim_delta_above_1_over_n", severity="error", message=(
        f"claimed δ = {float(privacy.delta):.3g} exceeds 1/n = {1.0 / n:.3g} (n = {n} training examples): a "
        f"mechanism that publishes whole training examples with probability δ meets such a claim; use δ < 1/n")),)


def check_mechanism(privacy: PrivacyInfo, *, rel_tol: float = REL_TOL,
                    abs_tol: float = ABS_TOL) -> tuple[Finding, ...]:
    """Recompute the claim from its stated mechanism; a claim below ε(PLD) beyond the tolerance is an error.

    Args:
        privacy: the manifest's privacy block.
        rel_tol, abs_tol: the claim may be below ε(PLD) by at most ``abs_tol + rel_tol * ε(PLD)``.

    Returns:
        Findings (empty when the claim follows, or when there is no DP claim).
    """
    if not privacy.dp or privacy.epsilon is None:
        return ()
    claim = float(privacy.epsilon)
    out: list[Finding] = []
    dp = _dp_phases(privacy)
    if not dp:
        return (Finding(kind="claim_not_from_mechanism", severity="error", message=(
            f"claim does not follow from the stated mechanism: ε = {claim:.4g} is claimed but no phase is DP "
            "(every listed phase trained without noise); a DP claim needs its DP phases (σ, q, T) in the "
            "manifest")),)
    for p in dp:
        if p.noise_multiplier is None or not p.noise_multiplier > 0 or p.sample_rate is None:
            return (Finding(kind="claim_not_from_mechanism", severity="error", message=(
                f"claim does not follow from the stated mechanism: DP phase '{p.name}' has noise multiplier "
                f"{p.noise_multiplier} and sample rate {p.sample_rate}; without noise (σ > 0) and a sample rate "
                "no finite ε holds")),)
    if privacy.delta is None:
        return (Finding(kind="claim_not_from_mechanism", severity="error", message=(
            f"claim does not follow from the stated mechanism: ε = {claim:.4g} is claimed without a delta")),)
    try:
        eps = recompute_epsilon(privacy)
    except UserError as exc:
        return (Finding(kind="claim_not_from_mechanism", severity="error",
                             message=f"claim does not follow from the stated mechanism: {exc}"),)
    if claim < eps - (abs_tol + rel_tol * eps):
        shape = ", ".join(f"{p.name}: σ={p.noise_multiplier:.4g}, q={p.sample_rate:.4g}, T={p.steps}" for p in dp)
        out.append(Finding(kind="claim_not_from_mechanism", severity="error", message=(
            f"claim does not follow from the stated mechanism: ε(PLD) = {eps:.4g} > claimed ε = {claim:.4g} "
            f"at δ = {privacy.delta:.3g} ({shape})")))
    return tuple(out)


def _phases_on_private_data(manifest: Manifest) -> tuple[Finding, ...]:
    """Non-DP phases that name the private dataset: the claim holds only if they used disjoint public data."""
    if not manifest.privacy.dp:
        return ()
    return tuple(Finding(kind="claim_phase_on_private_data", severity="warning", message=(
        f"non-DP phase '{p.name}' ({p.steps} steps) trained on dataset '{p.dataset}', the private data's dataset: "
        "the claim holds only if that phase used public examples disjoint from the pool"))
        for p in manifest.privacy.phases
        if not p.dp and p.steps > 0 and p.dataset is not None and p.dataset == manifest.data.dataset)


def check_config(manifest: Manifest, config: Mapping[str, Any] | None, *,
                 config_sha256: str | None = None) -> tuple[Finding, ...]:
    """Compare a DP claim with the run's own ``config.yaml`` (parsed mapping; None: the run has none).

    Args:
        manifest: the verified manifest.
        config: ``yaml.safe_load`` of ``config.yaml``, or None.
        config_sha256: sha256 of the ``config.yaml`` bytes (compared with ``provenance.config_sha256``).

    Returns:
        Findings; empty without a DP claim or without a config.
    """
    from training.config import TrainConfig, format_validation_error

    privacy = manifest.privacy
    if not privacy.dp or privacy.epsilon is None or config is None:
        return ()
    claim = float(privacy.epsilon)

    def err(msg: str) -> Finding:
        return Finding(kind="claim_vs_config", severity="error", message=f"config.yaml contradicts the claim: {msg}")

    out: list[Finding] = []
    recorded = manifest.provenance.config_sha256
    if config_sha256 is not None and recorded is not None and config_sha256 != recorded:
        out.append(err(f"its sha256 {config_sha256[:12]}... is not the {recorded[:12]}... the manifest recorded "
                       "(edited after training)"))
    try:
        cfg = TrainConfig.model_validate(dict(config))
    except Exception as exc:  # pydantic ValidationError or a bad value type: the recipe is unusable as evidence
        msg = format_validation_error(exc, TrainConfig, CONFIG_FILE) if hasattr(exc, "errors") else str(exc)
        return (*out, err(f"it does not validate ({msg})"))
    pc, tc = cfg.privacy, cfg.training
    if not pc.enabled:
        return (*out, err(f"privacy.enabled is false (trained without DP), but the manifest claims ε = {claim:.4g}"))
    dp = _dp_phases(privacy)
    if pc.delta is not None and privacy.delta is not None and not _close(pc.delta, privacy.delta):
        out.append(err(f"privacy.delta = {pc.delta:g}, the manifest's δ = {privacy.delta:g}"))
    if pc.target_epsilon is not None and not math.isclose(pc.target_epsilon, claim, rel_tol=REL_TOL,
                                                          abs_tol=5 * ABS_TOL):
        out.append(err(f"privacy.target_epsilon = {pc.target_epsilon:.4g}, the manifest claims ε = {claim:.4g}"))
    if pc.noise_multiplier is not None and tc.recipe in ("standard", "continual_pretrain"):
        bad = [p for p in dp if p.noise_multiplier is None or not _close(p.noise_multiplier, pc.noise_multiplier)]
        if bad:
            out.append(err(f"privacy.noise_multiplier = {pc.noise_multiplier:.4g}, DP phase '{bad[0].name}' "
                           f"records σ = {bad[0].noise_multiplier}"))
    n = manifest.data.membership.n_members
    for p in dp:
        if p.max_grad_norm is not None and not _close(p.max_grad_norm, pc.max_grad_norm):
            out.append(err(f"privacy.max_grad_norm = {pc.max_grad_norm:g}, DP phase '{p.name}' records "
                           f"C = {p.max_grad_norm:g}"))
        if p.sampling != pc.sampling:
            out.append(err(f"privacy.sampling = {pc.sampling}, DP phase '{p.name}' records {p.sampling}"))
        if p.batch_size is not None and p.batch_size != tc.batch_size:
            out.append(err(f"training.batch_size = {tc.batch_size}, DP phase '{p.name}' records {p.batch_size}"))
        if p.sample_rate is not None and n > 0 and not _close(p.sample_rate, tc.batch_size / n):
            out.append(err(f"DP phase '{p.name}' records q = {p.sample_rate:.4g}, but batch {tc.batch_size} over "
                           f"the {n} members gives q = {tc.batch_size / n:.4g}"))
    if tc.recipe == "standard" and tc.steps is not None:
        bad = [p for p in dp if p.steps != tc.steps]
        if bad:
            out.append(err(f"training.steps = {tc.steps}, DP phase '{bad[0].name}' records T = {bad[0].steps}"))
    return tuple(out)


def check_metrics(manifest: Manifest, metrics: Mapping[str, Any] | None) -> tuple[Finding, ...]:
    """Compare a DP claim with ``metrics.json`` (parsed mapping; None: the run has none): ``epsilon_spent`` must
    be the claim, ``steps`` the phases' total."""
    privacy = manifest.privacy
    if not privacy.dp or privacy.epsilon is None or metrics is None:
        return ()
    claim = float(privacy.epsilon)
    out: list[Finding] = []
    if "epsilon_spent" in metrics:
        spent = metrics.get("epsilon_spent")
        if not isinstance(spent, (int, float)) or isinstance(spent, bool) or not _close(spent, claim):
            out.append(Finding(kind="claim_vs_metrics", severity="error", message=(
                f"{METRICS_FILE} contradicts the claim: epsilon_spent = {spent!r}, the manifest claims "
                f"ε = {claim:.4g}")))
    steps = metrics.get("steps")
    total = sum(p.steps for p in privacy.phases)
    if isinstance(steps, int) and not isinstance(steps, bool) and privacy.phases and steps != total:
        out.append(Finding(kind="claim_vs_metrics", severity="error", message=(
            f"{METRICS_FILE} contradicts the claim: steps = {steps}, the manifest's phases total {total}")))
    return tuple(out)


#: ``--set`` overrides that turn DP off.
_NO_DP = {("privacy.enabled", "false"), ("privacy.enabled", "no"), ("privacy.enabled", "off"),
          ("privacy.enabled", "0")}


def check_provenance(manifest: Manifest) -> tuple[Finding, ...]:
    """A DP claim whose recorded command line turned DP off (``--set privacy.enabled=false``, or a noise
    multiplier of 0) contradicts itself.

    >>> from training.run.manifest import Provenance
    >>> _overrides("audit train q.yaml --set privacy.enabled=false --set=a.b=1")
    [('privacy.enabled', 'false'), ('a.b', '1')]
    """
    privacy = manifest.privacy
    command = manifest.provenance.command
    if not privacy.dp or privacy.epsilon is None or not command:
        return ()
    out = []
    for key, value in _overrides(command):
        v = value.strip().lower()
        off = (key, v) in _NO_DP
        if key == "privacy.noise_multiplier":
            try:
                off = float(v) <= 0.0
            except ValueError:
                off = False
        if off:
            out.append(Finding(kind="claim_vs_provenance", severity="error", message=(
                f"the recorded command contradicts the claim: it sets {key}={value} (no DP), but the manifest "
                f"claims ε = {float(privacy.epsilon):.4g}")))
    return tuple(out)


def _overrides(command: str) -> list[tuple[str, str]]:
    """``(key, value)`` of every ``--set KEY=VALUE`` (or ``--set=KEY=VALUE``) in a command line."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    out = []
    for i, w in enumerate(words):
        text = w[len("--set="):] if w.startswith("--set=") else (
            words[i + 1] if w == "--set" and i + 1 < len(words) else None)
        if text and "=" in text:
            key, value = text.split("=", 1)
            out.append((key.strip(), value))
    return out


def check_claim(manifest: Manifest, *, config: Mapping[str, Any] | None = None, config_sha256: str | None = None,
                metrics: Mapping[str, Any] | None = None) -> tuple[Finding, ...]:
    """Every check above, errors first: what the verdict and the report say about the claim itself.

    Args:
        manifest: the verified manifest.
        config: parsed ``config.yaml`` (None when the run has none, e.g. an imported checkpoint).
        config_sha256: sha256 of the ``config.yaml`` bytes.
        metrics: parsed ``metrics.json`` (None when absent).

    Returns:
        Findings, errors before warnings. An imported checkpoint that claims ε without listing DP phases gets a
        warning (its claim cannot be recomputed), not an error.
    """
    privacy = manifest.privacy
    findings: list[Finding] = []
    if privacy.dp and privacy.epsilon is not None and not privacy.phases:
        findings.append(Finding(kind="claim_unverifiable", severity="warning", message=(
            f"the claim ε = {float(privacy.epsilon):.4g} lists no training phase (σ, q, T), so the auditor cannot "
            "recompute it; it is taken on trust")))
    else:
        findings += check_mechanism(privacy)
    findings += check_delta(manifest)
    findings += _phases_on_private_data(manifest)
    findings += check_config(manifest, config, config_sha256=config_sha256)
    findings += check_metrics(manifest, metrics)
    findings += check_provenance(manifest)
    return tuple(sorted(findings, key=lambda f: f.severity != "error"))
