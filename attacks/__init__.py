"""dp-audit attacks: membership signals, membership-inference attacks and their metrics.

Every attack score is "higher = member". Importing this package registers the built-in attacks:
``loss``, ``attack_p``, ``calibrated_loss``, ``lira_online``, ``lira_offline``, ``rmia_online``,
``rmia_offline`` (see :mod:`attacks.registry`).
"""

from attacks.baselines import AttackP, CalibratedLoss, LossAttack
from attacks.lira import LiraOffline, LiraOnline
from attacks.metrics import (
    AttackMetrics,
    AveragedMetrics,
    auc,
    average_metrics,
    best_balanced_accuracy,
    bootstrap_ci,
    compute_metrics,
    membership_advantage,
    most_vulnerable,
    per_class_metrics,
    roc_curve,
    tpr_at_fpr,
)
from attacks.registry import (
    Attack,
    AttackInputs,
    LeaveOneOutResult,
    available_attacks,
    build_attack,
    get_attack_class,
    leave_one_out,
    register_attack,
)
from attacks.rmia import RmiaOffline, RmiaOnline, tune_offline_a
from attacks.signals import (
    AugmentationSpec,
    augment_batch,
    compute_signals,
    loss_from_phi,
    prob_from_phi,
    scaled_logit,
)

__all__ = [
    "Attack",
    "AttackInputs",
    "AttackMetrics",
    "AttackP",
    "AugmentationSpec",
    "AveragedMetrics",
    "CalibratedLoss",
    "LeaveOneOutResult",
    "LiraOffline",
    "LiraOnline",
    "LossAttack",
    "RmiaOffline",
    "RmiaOnline",
    "augment_batch",
    "auc",
    "available_attacks",
    "average_metrics",
    "best_balanced_accuracy",
    "bootstrap_ci",
    "build_attack",
    "compute_metrics",
    "compute_signals",
    "get_attack_class",
    "leave_one_out",
    "loss_from_phi",
    "membership_advantage",
    "most_vulnerable",
    "per_class_metrics",
    "prob_from_phi",
    "register_attack",
    "roc_curve",
    "scaled_logit",
    "tpr_at_fpr",
    "tune_offline_a",
]
