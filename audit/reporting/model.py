"""The report's data model: what each section shows, as plain typed records.

:func:`audit.reporting.build.build_report` fills a :class:`Report` from a run directory; the HTML and Markdown
renderers only format it, and ``report.json`` is :meth:`Report.to_dict`. Numbers are kept exactly as read
from the run's JSON files (no rounding here); :mod:`audit.reporting.fmt` rounds them for display. Figures and
thumbnails are kept apart (:class:`Figures`), so ``report.json`` stays small and text-only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Glance",
    "PhaseRow",
    "Claim",
    "ThreatModel",
    "AttackRow",
    "ClassRow",
    "Vulnerable",
    "AttacksSection",
    "EstimateRow",
    "PowerRow",
    "MechanismRow",
    "EpsilonSection",
    "TransferRow",
    "UtilitySection",
    "ProvenanceSection",
    "Report",
    "Figures",
    "GLANCE_FPR",
]

#: The FPR level shown at a glance (TPR at 0.1% FPR, the usual headline number for membership inference).
GLANCE_FPR = 0.001

_frozen = dataclass(frozen=True, kw_only=True)


@_frozen
class Glance:
    """Verdict at a glance.

    ``status`` is ``VIOLATION``, ``CONSISTENT`` or ``NO_CLAIM`` (from ``epsilon.json``), or ``NOT_AUDITED``
    when no epsilon estimate exists yet; a mechanism audit of the run's own claim that found a violation makes it
    ``VIOLATION`` whatever ``epsilon.json`` says (:mod:`audit.reporting.mechanism`).
    """

    status: str
    headline: str
    summary: str
    claimed_epsilon: float | None
    best_epsilon_lb: float | None
    best_method: str | None
    confidence: float | None
    strongest_attack: str | None
    strongest_tpr: float | str | None
    strongest_tpr_ci: tuple[float, float] | None
    glance_fpr: float
    test_accuracy: float | None
    mechanism: str | None = None  # the mechanism audit's line in the verdict box (audit.reporting.mechanism)


@_frozen
class PhaseRow:
    name: str
    dp: bool
    noise_multiplier: float | None
    sample_rate: float | None
    steps: int
    batch_size: int | None
    sampling: str
    poisson: bool
    clipping: str | None
    max_grad_norm: float | None
    epsilon: float | None
    dataset: str | None


@_frozen
class Claim:
    """What the checkpoint claims (``manifest.privacy``)."""

    dp: bool
    claimed_epsilon: float | None
    accountant: str | None
    cross_check_accountant: str | None
    cross_check_epsilon: float | None
    delta: float | None
    unit: str
    neighbouring: str
    phases: list[PhaseRow]
    non_poisson_phases: list[str]
    membership: str
    notes: list[str]


@_frozen
class ThreatModel:
    paragraphs: list[str]


@_frozen
class AttackRow:
    name: str
    title: str
    description: str
    auc: float
    auc_ci: tuple[float, float] | None
    tpr: dict[str, float | str | None]  # str: "not resolvable with N non-members" (attacks.resolution)
    tpr_ci: dict[str, tuple[float, float] | None]
    balanced_accuracy: float | None
    n_members: int | None
    n_nonmembers: int | None


@_frozen
class ClassRow:
    label: str
    auc: float | None
    n: int


@_frozen
class Vulnerable:
    index: int
    label: str | None
    thumbnail: str | None = field(default=None, metadata={"json": False})


@_frozen
class AttacksSection:
    """Membership-inference results (``attack.json``); ``ran`` is False when the file is absent."""

    ran: bool
    command: str
    setup: dict[str, Any]
    levels: list[str]
    rows: list[AttackRow]
    strongest: str | None
    per_class: list[ClassRow]
    vulnerable: list[Vulnerable]
    vulnerable_note: str


@_frozen
class EstimateRow:
    method: str
    source: str
    counts: dict[str, Any]
    alpha: float | None
    delta: float | None
    epsilon_lb: float
    ceiling: float | None
    tightness: float | None
    assumptions: str | None


@_frozen
class PowerRow:
    """What one deciding one-run bound could detect, stated before its scores were read (``epsilon.json`` power)."""

    source: str
    m: int
    alpha: float
    computed: bool
    epsilon_detectable: float | None
    accuracy_needed: float | None
    ceiling: float | None
    statement: str


@_frozen
class MechanismRow:
    """The tight audit of the DP-SGD mechanism (``mechanism.json``, ``audit mechanism``)."""

    status: str
    target: str
    claimed_epsilon: float
    epsilon_lb: float
    tightness: float
    trials: int
    alpha: float
    delta: float | None = None
    #: why the result is not an audit of the run's own claim (it then takes no part in the verdict), else None
    not_this_claim: str | None = None


@_frozen
class EpsilonSection:
    """Empirical epsilon lower bounds (``epsilon.json``); ``ran`` is False when the file is absent."""

    ran: bool
    command: str
    claimed_epsilon: float | None
    delta: float | None
    alpha: float | None
    rows: list[EstimateRow]
    status: str | None
    best_epsilon_lb: float | None
    best_method: str | None
    tightness: float | None
    inconclusive_above: float | None
    notes: list[str]
    mechanism: MechanismRow | None = None
    power: list[PowerRow] = field(default_factory=list)


@_frozen
class TransferRow:
    dataset: str
    status: str
    reason: str | None
    protocols: dict[str, dict[str, Any]]
    rho: float | None
    layers: list[dict[str, Any]]


@_frozen
class UtilitySection:
    metrics_ran: bool
    metrics_command: str
    test_accuracy: float | None
    train_accuracy: float | None
    generalisation_gap: float | None
    steps: int | None
    final_loss: float | None
    epsilon_spent: float | None
    transfer_ran: bool
    transfer_command: str
    protocols: list[str]
    transfer: list[TransferRow]


@_frozen
class ProvenanceSection:
    items: list[tuple[str, str]]
    commands: list[str]


@_frozen
class Report:
    """Everything the report shows, in section order."""

    run_name: str
    run_dir: str
    generated: str
    glance: Glance
    claim: Claim
    threat: ThreatModel
    attacks: AttacksSection
    epsilon: EpsilonSection
    utility: UtilitySection
    provenance: ProvenanceSection
    limitations: list[str]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (thumbnails left out; figures are not part of the model).

        >>> g = Glance(status="NO_CLAIM", headline="h", summary="s", claimed_epsilon=None,
        ...            best_epsilon_lb=None, best_method=None, confidence=None, strongest_attack=None,
        ...            strongest_tpr=None, strongest_tpr_ci=None, glance_fpr=0.001, test_accuracy=0.9)
        >>> _to_jsonable(g)["test_accuracy"]
        0.9
        """
        out = _to_jsonable(self)
        out["format"] = "dp-audit-report/1"
        return out


def _to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if f.metadata.get("json", True)}
    if isinstance(obj, dict):
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_jsonable(v) for v in obj]
    return obj


@_frozen
class Figures:
    """Inline SVG figures (``None`` when the data for a figure is absent)."""

    roc: str | None = None
    epsilon: str | None = None
    transfer: str | None = None
