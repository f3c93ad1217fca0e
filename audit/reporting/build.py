"""Fill the report's data model from a run directory's files.

Each ``*_section`` function is pure: it maps the parsed files (:class:`audit.reporting.inputs.RunFiles`) to one
section of :class:`audit.reporting.model.Report`, without rounding any number. Membership-inference scores follow
"higher score = member"; the empirical epsilon values are lower bounds (a VIOLATION is declared only when a
lower bound exceeds the claimed epsilon, see ``audit epsilon``).
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timezone
from typing import Any

from attacks.resolution import not_resolvable, resolvable
from audit.reporting import fmt
from audit.reporting.images import PoolImages, thumbnail_uri
from audit.reporting.inputs import RunFiles
from audit.reporting.commands import USER_MODEL_NOTE, commands_for, rebuildable  # noqa: F401 (re-exported)
from audit.reporting.limitations import limitations
from audit.reporting.mechanism import mechanism_line, mechanism_row, mechanism_verdict
from audit.reporting.model import (
    GLANCE_FPR,
    AttackRow,
    AttacksSection,
    Claim,
    ClassRow,
    EpsilonSection,
    EstimateRow,
    Glance,
    PhaseRow,
    PowerRow,
    Report,
    ThreatModel,
    TransferRow,
    UtilitySection,
    Vulnerable,
)
from audit.reporting.provenance import provenance_section
from attacks.strongest import reference_level, strongest

__all__ = ["ATTACK_INFO", "build_report", "commands_for", "strongest_attack"]

#: Display name and a one-sentence, plain-language description of each attack.
ATTACK_INFO: dict[str, tuple[str, str]] = {
    "loss": ("LOSS", "Yeom et al. 2018: a low loss on an image suggests the model trained on it. "
             "Needs no reference models."),
    "attack_p": ("Attack-P", "Ye et al. 2022: compares the image's loss with the model's losses on "
                 "population images it never saw."),
    "calibrated_loss": ("Calibrated loss", "Watson et al. 2022: the loss minus its average on reference "
                        "models, so naturally easy images are not mistaken for members."),
    "lira_online": ("LiRA (online)", "Carlini et al. 2022: a likelihood-ratio test between reference models "
                    "that did and did not train on the image."),
    "lira_offline": ("LiRA (offline)", "Carlini et al. 2022: a one-sided test against reference models that "
                     "did not train on the image (cheaper; no per-target training)."),
    "rmia_online": ("RMIA (online)", "Zarifzadeh et al. 2024: compares the image's likelihood ratio with "
                    "many population images, using reference models with and without it."),
    "rmia_offline": ("RMIA (offline)", "Zarifzadeh et al. 2024: the same pairwise test using only reference "
                     "models that did not train on the image."),
}

#: the attack setup shown in the report
_SETUP_KEYS = {"n_reference", "augmentations", "pool_size", "n_members", "n_population", "evaluation", "recipe_hash"}

_HEADLINES = {
    "VIOLATION": "Privacy claim violated",
    "CONSISTENT": "No violation found",
    "NO_CLAIM": "No privacy claim",
    "NOT_AUDITED": "Claim not audited yet",
}


def _candidates(rows: list[AttackRow]) -> dict:
    return {r.name: (r.auc, r.tpr, r.n_nonmembers) for r in rows}


def strongest_attack(rows: list[AttackRow], level: str | None) -> AttackRow | None:
    """The strongest attack by the one definition (:mod:`attacks.strongest`) at ``level``."""
    name = strongest(_candidates(rows), level)
    return next((r for r in rows if r.name == name), None)


def glance_level(levels: list[str], rows: list[AttackRow]) -> str | None:
    """The FPR level of the at-a-glance TPR: the reference FPR of :mod:`attacks.strongest` (0.1 % when every
    attack's non-members resolve it, else the smallest level above it that they do; a TPR below ``1 / N``
    non-members is not a TPR at that FPR)."""
    level = reference_level(_candidates(rows))
    return level if level in levels else None


def _levels(run: RunFiles) -> list[str]:
    keys: dict[float, str] = {}
    for entry in (run.attack.attacks.values() if run.attack else []):
        for k in entry.metrics.tpr_at_fpr:
            try:
                keys.setdefault(float(k), k)
            except ValueError:
                continue
    return [keys[v] for v in sorted(keys, reverse=True)]


def attacks_section(run: RunFiles, commands: dict[str, str], images: PoolImages | None,
                    images_note: str) -> AttacksSection:
    if run.attack is None:
        return AttacksSection(ran=False, command=commands["attack"], setup={}, levels=[], rows=[],
                              strongest=None, per_class=[], vulnerable=[], vulnerable_note="")
    levels = _levels(run)
    rows = []
    for name, entry in run.attack.attacks.items():
        m = entry.metrics
        title, desc = ATTACK_INFO.get(name, (name, "A membership-inference attack (higher score = member)."))
        rows.append(AttackRow(
            name=name, title=title, description=desc, auc=m.auc, auc_ci=m.auc_ci,
            tpr={lv: m.tpr_at_fpr.get(lv) if resolvable(float(lv), m.n_nonmembers) else not_resolvable(m.n_nonmembers)
                 for lv in levels},
            tpr_ci={lv: m.tpr_at_fpr_ci.get(lv) if resolvable(float(lv), m.n_nonmembers) else None for lv in levels},
            balanced_accuracy=m.balanced_accuracy, n_members=m.n_members, n_nonmembers=m.n_nonmembers))
    best = strongest_attack(rows, glance_level(levels, rows))
    per_class: list[ClassRow] = []
    vulnerable: list[Vulnerable] = []
    note = ""
    if best is not None:
        entry = run.attack.attacks[best.name]
        classes = images.classes if images is not None else ()
        for key, sl in entry.per_class.items():
            label = key
            if key.isdigit() and int(key) < len(classes):
                label = f"{classes[int(key)]} ({key})"
            per_class.append(ClassRow(label=label, auc=sl.auc, n=sl.n))
        per_class.sort(key=lambda r: -1.0 if r.auc is None or math.isnan(r.auc) else r.auc, reverse=True)
        for idx in entry.most_vulnerable[:12]:
            if images is not None and 0 <= idx < len(images.y):
                label = int(images.y[idx])
                name = images.classes[label] if label < len(images.classes) else str(label)
                vulnerable.append(Vulnerable(index=idx, label=name, thumbnail=thumbnail_uri(images.x[idx])))
            else:
                vulnerable.append(Vulnerable(index=idx, label=None))
        note = images_note
    return AttacksSection(ran=True, command=commands["attack"], setup=run.attack.setup.model_dump(include=_SETUP_KEYS),
                          levels=levels, rows=rows, strongest=best.name if best else None,
                          per_class=per_class, vulnerable=vulnerable, vulnerable_note=note)


def epsilon_section(run: RunFiles, commands: dict[str, str]) -> EpsilonSection:
    claimed = run.manifest.privacy.claimed_epsilon
    if run.epsilon is None:
        return EpsilonSection(ran=False, command=commands["epsilon"], claimed_epsilon=claimed,
                              delta=run.manifest.privacy.delta, alpha=None, rows=[], status=None,
                              best_epsilon_lb=None, best_method=None, tightness=None, inconclusive_above=None,
                              notes=[], mechanism=mechanism_row(run))
    e = run.epsilon
    claimed = e.claimed_epsilon
    rows = []
    for est in e.estimates:
        tight = est.epsilon_lb / claimed if math.isfinite(claimed) and claimed > 0 else None
        rows.append(EstimateRow(method=est.method, source=est.source, counts=dict(est.counts),
                                alpha=est.alpha, delta=est.delta, epsilon_lb=est.epsilon_lb, ceiling=est.ceiling,
                                tightness=tight, assumptions=est.assumptions))
    v = e.verdict
    return EpsilonSection(ran=True, command=commands["epsilon"], claimed_epsilon=claimed, delta=e.delta,
                          alpha=e.alpha, rows=rows, status=str(v.status), best_epsilon_lb=v.best_epsilon_lb,
                          best_method=v.best_method, tightness=v.tightness,
                          inconclusive_above=v.inconclusive_above, notes=list(v.notes), mechanism=mechanism_row(run),
                          power=[PowerRow(source=p.source, m=p.m, alpha=p.alpha, computed=p.computed, ceiling=p.ceiling,
                                          epsilon_detectable=p.epsilon_detectable, accuracy_needed=p.accuracy_needed,
                                          statement=p.statement) for p in e.power])


def membership_text(data: Any) -> str:
    """How the pool's members were drawn, as recorded (an auditor's canary package is all members).

    >>> from types import SimpleNamespace as N
    >>> d = N(membership=N(scheme="bernoulli", p=0.5, seed=0, n_members=1300, n_pool=1797), canaries=None)
    >>> membership_text(d)[-43:]
    'seed 0); 1,300 members (72.34% of the pool)'
    >>> d.canaries = {"kind": "auditor", "count": 1000}
    >>> membership_text(d)[:95]
    'each of the 797 images of its own data was included independently with probability 0.5 (seed 0)'
    """
    mem = data.membership
    share = f"{mem.n_members:,} members ({fmt.pct(mem.n_members / mem.n_pool) if mem.n_pool else '—'} of the pool)"
    if mem.scheme == "bernoulli":
        canaries = data.canaries or {}
        n_pkg = int(canaries.get("count", 0)) if canaries.get("kind") == "auditor" else 0
        if n_pkg:
            return (f"each of the {mem.n_pool - n_pkg:,} images of its own data was included independently with "
                    f"probability {fmt.num(mem.p)} (seed {mem.seed}), and all {n_pkg:,} canaries of the auditor's "
                    f"package were included; {share}")
        return (f"each of the {mem.n_pool:,} pool images was included independently with probability "
                f"{fmt.num(mem.p)} (seed {mem.seed}); {share}")
    if mem.scheme == "all":
        return f"the whole pool of {mem.n_pool:,} images was trained on"
    return f"an explicit membership mask: {share}"


def claim_section(run: RunFiles) -> Claim:
    p = run.manifest.privacy
    phases = [PhaseRow(name=ph.name, dp=ph.dp, noise_multiplier=ph.noise_multiplier, sample_rate=ph.sample_rate,
                       steps=ph.steps, batch_size=ph.batch_size, sampling=ph.sampling,
                       poisson=(ph.sampling == "poisson" or not ph.dp), clipping=ph.clipping,
                       max_grad_norm=ph.max_grad_norm, epsilon=ph.epsilon, dataset=ph.dataset)
              for ph in p.phases]
    cross = p.epsilon_cross_check or {}
    membership = membership_text(run.manifest.data)
    cross_eps = cross.get("epsilon")
    return Claim(dp=p.dp, claimed_epsilon=p.epsilon if p.dp else None, accountant=p.accountant,
                 cross_check_accountant=cross.get("accountant"),
                 cross_check_epsilon=float(cross_eps) if cross_eps is not None else None,
                 delta=p.delta, unit=p.unit, neighbouring=p.neighbouring, phases=phases,
                 non_poisson_phases=[ph.name for ph in phases if not ph.poisson], membership=membership,
                 notes=list(p.notes))


def queries_phrase(augmentations: list[str]) -> str:
    """How each image was queried, from the attack's recorded augmentations.

    >>> queries_phrase(["identity"]), queries_phrase(["identity", "flip"]), queries_phrase([])
    ('each queried once (as it is)', 'each queried 2 times (identity, flip)', 'each queried once')
    """
    if not augmentations:
        return "each queried once"
    if augmentations == ["identity"]:
        return "each queried once (as it is)"
    return f"each queried {len(augmentations)} times ({', '.join(augmentations)})"


def recipe_phrase(run: RunFiles) -> str:
    """What the reference models' recipe included, from the target's manifest: its DP phases or none."""
    phases = run.manifest.privacy.phases
    dp = [ph for ph in phases if ph.dp]
    if not dp:
        return "without DP, as the target was trained"
    if len(dp) == len(phases):
        return "DP-SGD included, with the target's noise, sampling rate and clipping"
    return (f"{len(dp)} DP phase(s) with the target's noise, sampling rate and clipping, and its "
            f"{len(phases) - len(dp)} non-DP phase(s)")


def threat_section(run: RunFiles) -> ThreatModel:
    paras = ["The attacker's question: given an image, was it part of this model's training data? "
             "Each attack outputs a score per image (higher score = more likely a member)."]
    if run.attack is not None:
        s = run.attack.setup
        paras.append(f"Black-box access: the attacker sees only the model's output scores on the images it "
                     f"queries, {queries_phrase(list(s.augmentations or []))}. It never sees the weights.")
        if s.n_reference and s.reference_training:
            paras.append(f"Knowledge of the training code: the attacker trains {s.n_reference} reference models with "
                         f"the code that trained the target ({s.reference_training}: your own training code, DP "
                         f"as it applies it) on random halves of a pool of {fmt.count(s.pool_size)} examples; RMIA and Attack-P "
                         f"compare each example with the rest of the pool.")
        elif s.n_reference:
            paras.append(f"Knowledge of the recipe: the attacker trains {s.n_reference} reference models with "
                         f"the target's own recipe ({recipe_phrase(run)}) on random halves of a pool of "
                         f"{fmt.count(s.pool_size)} images from the same distribution"
                         + (f", and uses {fmt.count(s.n_population)} further population images for comparison."
                            if s.n_population else "."))
        if s.evaluation == "leave_one_out":
            paras.append("Evaluation: each reference model takes a turn as the target (leave-one-out), so the "
                         "attack's error rates are measured over many models.")
        elif s.evaluation:
            paras.append(f"Evaluation: the attack is scored on the target model itself; members are the "
                         f"{fmt.count(s.n_members)} pool images it was trained on, the rest are non-members.")
    sources = {est.source for est in (run.epsilon.estimates if run.epsilon else [])}
    if "input_canaries" in sources:
        paras.append("Input canaries: the auditor planted specially crafted images, each included in training "
                     "with probability 1/2, and checks from the model's scores which ones were used.")
    if "auditor_canaries" in sources:
        paras.append("Auditor-chosen canaries: the auditor drew the canaries, included each with probability 1/2 and "
                     "published a commitment before training; the vendor trained on the included ones only. The "
                     "auditor scores every canary from the model's outputs against reference models it trained "
                     "itself (with the claimed noise and without it).")
    if "gradient_canaries" in sources:
        paras.append("White-box canaries: the auditor planted random gradient directions (canaries), each "
                     "included with probability 1/2, and reads the model parameters to see which ones were "
                     "used. This is a stronger attacker than the black-box attacks above.")
    paras.append("A differential-privacy guarantee protects against a much stronger attacker: one who knows "
                 "every other training image and sees every intermediate model. The attacks here are weaker, so "
                 "what they measure is a lower bound on the true leakage, not its full extent.")
    return ThreatModel(paragraphs=paras)


def utility_section(run: RunFiles, commands: dict[str, str]) -> UtilitySection:
    m = run.metrics
    test_acc = run.test_accuracy
    train_acc = m.train_accuracy if m else None
    gap = train_acc - test_acc if (train_acc is not None and test_acc is not None) else None
    rows: list[TransferRow] = []
    protocols: list[str] = []
    if run.transfer is not None:
        for ds in run.transfer.datasets:
            prot = {}
            for pname, acc in ds.accuracies().items():
                prot[pname] = {"accuracy": acc.accuracy, "ci": (acc.ci_low, acc.ci_high)}
                if pname not in protocols:
                    protocols.append(pname)
            diag = ds.diagnostics
            layers = [{"block": layer.layer, "separability": None, "fuzziness": layer.fuzziness,
                       "fisher": layer.fisher, "residual": layer.residual} for layer in (diag.layers if diag else [])]
            rho = diag.decay.rho if diag is not None and diag.decay is not None else None
            rows.append(TransferRow(dataset=ds.dataset, status=ds.status, reason=ds.reason, protocols=prot, rho=rho,
                                    layers=layers))
    return UtilitySection(metrics_ran=m is not None, metrics_command=commands["train"], test_accuracy=test_acc,
                          train_accuracy=train_acc, generalisation_gap=gap, steps=m.steps if m else None,
                          final_loss=m.final_loss if m else None, epsilon_spent=m.epsilon_spent if m else None,
                          transfer_ran=run.transfer is not None, transfer_command=commands["transfer"],
                          protocols=protocols, transfer=rows)


def attack_sentence(title: str, tpr: float, fpr: float) -> str:
    """The at-a-glance sentence on the strongest attack; a TPR no better than its FPR is said to be chance.

    >>> attack_sentence("LiRA", 0.05, 0.01)[:80]
    'The strongest attack (LiRA) recognises 5.00% of training images at a 1% false-po'
    >>> attack_sentence("LOSS", 0.0097, 0.01)[:80]
    'The strongest attack (LOSS) does no better than random guessing at a 1% false-po'
    """
    if tpr <= fpr:
        return (f"The strongest attack ({title}) does no better than random guessing at a {fmt.fpr_label(fpr)} "
                f"false-positive rate: it flags {fmt.pct(tpr)} of training images and {fmt.fpr_label(fpr)} of "
                f"other images.")
    return (f"The strongest attack ({title}) recognises {fmt.pct(tpr)} of training images at a "
            f"{fmt.fpr_label(fpr)} false-positive rate (random guessing would recognise {fmt.fpr_label(fpr)}).")


def glance_section(run: RunFiles, attacks: AttacksSection, eps: EpsilonSection) -> Glance:
    claimed = run.manifest.privacy.claimed_epsilon
    status = eps.status if eps.ran else ("NO_CLAIM" if not math.isfinite(claimed) else "NOT_AUDITED")
    best = next((r for r in attacks.rows if r.name == attacks.strongest), None)
    level = glance_level(attacks.levels, attacks.rows)
    glance_fpr = float(level) if level is not None else GLANCE_FPR
    tpr = best.tpr.get(level) if (best and level) else None
    tpr_ci = best.tpr_ci.get(level) if (best and level) else None
    alpha = eps.alpha
    conf = 1.0 - alpha if alpha is not None else None
    conf_s = f" with {fmt.num(100 * conf)}% confidence" if conf is not None else ""
    estimated = eps.ran and eps.best_method is not None  # a bound exists (0 is a bound only when estimated)
    lb = eps.best_epsilon_lb if estimated else None
    claim_errors = run.epsilon.verdict.errors if (eps.ran and run.epsilon is not None) else ()
    headline = _HEADLINES[status]
    if status == "VIOLATION" and claim_errors:  # the claim check (audit.bounds.claim_check), not a bound
        summary = f"The privacy claim is not supported by the run's own record: {claim_errors[0].message}."
    elif status == "VIOLATION":
        lead = f"{conf_s.strip()}, " if conf_s else ""
        summary = (f"The audit shows this model leaks more than its privacy claim allows: {lead}ε is at least "
                   f"{fmt.eps(lb)}, above the claimed ε = {fmt.eps(claimed)}.")
    elif status == "CONSISTENT" and eps.inconclusive_above is not None:
        headline = "Inconclusive: no violation found, and none could have been"
        found = (f" The strongest bound found is ε ≥ {fmt.eps(lb)}{conf_s}." if lb is not None
                 else " No ε lower bound was estimated.")
        summary = (f"This audit could not have detected a violation of this claim: the largest ε lower bound its "
                   f"estimators could reach with these counts (their ceiling, {fmt.eps(eps.inconclusive_above)}) "
                   f"is below the claimed ε = {fmt.eps(claimed)}.{found} It neither supports nor refutes the "
                   f"claim; more canaries or audited examples raise the ceiling.")
    elif status == "CONSISTENT" and lb is not None:
        summary = (f"The strongest audit proves ε ≥ {fmt.eps(lb)}{conf_s}, within the claimed "
                   f"ε = {fmt.eps(claimed)}: the claim survived these attacks, which is evidence for it, not a "
                   f"proof.")
    elif status == "CONSISTENT":
        summary = (f"No ε lower bound was estimated, so nothing contradicts the claimed ε = {fmt.eps(claimed)}; "
                   f"this is not evidence for it.")
    elif status == "NO_CLAIM":
        summary = "This model makes no differential-privacy claim, so there is no guarantee to check."
        if lb is not None:
            summary += f" The audit shows its leakage is at least ε = {fmt.eps(lb)}{conf_s}."
    else:
        summary = (f"The claim ε = {fmt.eps(claimed)} has not been audited yet: run "
                   f"'{eps.command}' to estimate an ε lower bound.")
    decided = mechanism_verdict(eps.mechanism, status=status, summary=summary, lb=lb, epsilon_command=eps.command)
    if decided is not None:  # the DP implementation itself refutes the claim (audit.reporting.mechanism)
        status, headline, summary = decided
    if tpr is not None and best is not None and not isinstance(tpr, str):
        summary += " " + attack_sentence(best.title, float(tpr), glance_fpr)
    return Glance(status=status, headline=headline, summary=summary, mechanism=mechanism_line(eps.mechanism),
                  claimed_epsilon=claimed if math.isfinite(claimed) else None, best_epsilon_lb=lb,
                  best_method=eps.best_method, confidence=conf, strongest_attack=best.name if best else None,
                  strongest_tpr=tpr, strongest_tpr_ci=tpr_ci, glance_fpr=glance_fpr,
                  test_accuracy=run.test_accuracy)


def build_report(run: RunFiles, *, images: PoolImages | None = None, images_note: str = "",
                 generated: str | None = None) -> Report:
    """Build the report's data model from a parsed run directory.

    Args:
        run: the parsed run directory (:func:`audit.reporting.inputs.load_run`).
        images: the training pool's images for thumbnails of the most vulnerable examples (None: indices only).
        images_note: why ``images`` is None, shown next to the indices.
        generated: the report's timestamp (ISO 8601; default: now, UTC).

    Returns:
        The filled :class:`Report`.
    """
    commands = commands_for(run)
    attacks = attacks_section(run, commands, images, images_note)
    eps = epsilon_section(run, commands)
    report = Report(
        run_name=run.manifest.run_name,
        run_dir=str(run.run_dir),
        generated=generated or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        glance=glance_section(run, attacks, eps),
        claim=claim_section(run),
        threat=threat_section(run),
        attacks=attacks,
        epsilon=eps,
        utility=utility_section(run, commands),
        provenance=provenance_section(run, commands),
        limitations=[],
    )
    return dataclasses.replace(report, limitations=limitations(run, report))
