"""When to switch from public (non-DP) pre-training to private DP training: pure rules over a history.

DP continual pre-training (Bu, Zhang, Hong, Zha, Karypis, "Pre-training Differentially Private Models with
Limited Public Data", NeurIPS 2024) trains without noise on a little public data first and switches to DP-SGD
on the private data once the public phase has done what noise would spoil. Three rules decide the switch:

* ``steps``: after a fixed number of public steps;
* ``plateau``: when the public validation loss has not improved by more than ``min_delta`` for ``patience``
  consecutive evaluations (early stopping's criterion);
* ``decelerator``: when σ²·tr(H)/(B·c²) (:func:`training.hessian.decelerator`, with the private phase's σ, B,
  c and tr(H) estimated on public data) falls below a threshold, i.e. when DP noise would no longer slow the
  loss down much (Bu et al.'s argument: tr(H) falls early in training). A negative value (tr(H) < 0: the
  weights sit where the loss curves down along most directions, as at a random initialisation) never switches:
  there the second-order argument says noise *lowers* the loss, which is the quadratic model failing, not the
  noise being harmless. A value of exactly 0 (σ = 0, nothing to decelerate) switches.

Every rule also switches at ``max_public_steps``. The decision is a pure function of the step and the list of
evaluations made so far, so a resumed run that restores that list decides exactly as the uninterrupted one.

>>> rule = SwitchRule(kind="plateau", max_public_steps=100, patience=2, min_delta=0.0)
>>> evals = [Evaluation(step=10, value=1.0), Evaluation(step=20, value=0.9), Evaluation(step=30, value=0.95)]
>>> rule.decide(step=30, evaluations=evals) is None
True
>>> rule.decide(step=40, evaluations=evals + [Evaluation(step=40, value=0.91)])
'plateau'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Evaluation", "SwitchRule", "plateau_reached", "rule_from_config"]

KINDS = ("steps", "plateau", "decelerator")


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One check made during the public phase.

    Attributes:
        step: the number of public steps taken when it was made.
        value: the monitored quantity (public validation loss for ``plateau``, decelerator for ``decelerator``).
        extra: other numbers measured at the same time (tr(H), its standard error, σ used...), for the log.
    """

    step: int
    value: float
    extra: tuple[tuple[str, float], ...] = ()

    def as_dict(self) -> dict[str, float]:
        return {"step": self.step, "value": self.value, **dict(self.extra)}

    @classmethod
    def from_dict(cls, d: dict) -> "Evaluation":
        extra = tuple((str(k), float(v)) for k, v in d.items() if k not in ("step", "value"))
        return cls(step=int(d["step"]), value=float(d["value"]), extra=extra)


def plateau_reached(values: Sequence[float], *, patience: int, min_delta: float) -> bool:
    """True when the last ``patience`` values each failed to beat the best earlier value by more than ``min_delta``.

    "Beat" means value < best − min_delta (lower is better: a loss). Non-finite values never improve.

    Args:
        values: the monitored sequence, oldest first.
        patience: ≥ 1.
        min_delta: ≥ 0.

    Returns:
        Whether the sequence has plateaued.

    Raises:
        ValueError: if ``patience`` < 1 or ``min_delta`` < 0.

    >>> plateau_reached([3.0, 2.0, 1.999, 2.5], patience=2, min_delta=0.01)
    True
    >>> plateau_reached([3.0, 2.0, 1.5], patience=2, min_delta=0.01)
    False
    """
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
    if not (isinstance(min_delta, (int, float)) and min_delta >= 0):
        raise ValueError(f"min_delta must be >= 0, got {min_delta!r}")
    best = math.inf
    since = 0
    for v in values:
        if math.isfinite(v) and v < best - min_delta:
            best, since = v, 0
        else:
            since += 1
    return best < math.inf and since >= patience


@dataclass(frozen=True, kw_only=True)
class SwitchRule:
    """The public→private switch rule (see the module docstring).

    Args:
        kind: ``"steps"``, ``"plateau"`` or ``"decelerator"``.
        max_public_steps: switch at this step whatever the rule says; ≥ 0.
        switch_steps: ``steps``: the number of public steps.
        patience, min_delta: ``plateau``: see :func:`plateau_reached`.
        threshold: ``decelerator``: switch once the latest decelerator value is in [0, threshold); > 0.
        eval_every: how often (in public steps) the caller evaluates; ``plateau``/``decelerator`` only.

    Raises:
        ValueError: unknown kind or an out-of-range number.
    """

    kind: str
    max_public_steps: int
    switch_steps: int = 0
    patience: int = 1
    min_delta: float = 0.0
    threshold: float = 1.0
    eval_every: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("max_public_steps", "switch_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 1:
            raise ValueError(f"eval_every must be an integer >= 1, got {self.eval_every!r}")
        if not self.threshold > 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold!r}")
        plateau_reached([], patience=self.patience, min_delta=self.min_delta)  # validates both

    @property
    def needs_evaluations(self) -> bool:
        return self.kind != "steps"

    def evaluates_at(self, step: int) -> bool:
        """Whether the caller must add an :class:`Evaluation` after ``step`` public steps (before deciding)."""
        return self.needs_evaluations and step > 0 and step % self.eval_every == 0 and step < self.max_public_steps

    def decide(self, *, step: int, evaluations: Sequence[Evaluation]) -> str | None:
        """The reason to switch after ``step`` public steps, or None to keep training on public data.

        Args:
            step: public steps taken so far (≥ 0).
            evaluations: every evaluation made so far (oldest first), those at ``step`` included.

        Returns:
            ``"max_public_steps"``, ``"steps"``, ``"plateau"``, ``"decelerator"`` or None.
        """
        if step >= self.max_public_steps:
            return "max_public_steps"
        if self.kind == "steps":
            return "steps" if step >= self.switch_steps else None
        if not evaluations or evaluations[-1].step != step:
            return None  # decide only right after an evaluation
        if self.kind == "plateau":
            values = [e.value for e in evaluations]
            return "plateau" if plateau_reached(values, patience=self.patience, min_delta=self.min_delta) else None
        latest = evaluations[-1].value
        return "decelerator" if math.isfinite(latest) and 0.0 <= latest < self.threshold else None


def rule_from_config(cc) -> SwitchRule:
    """The :class:`SwitchRule` a :class:`training.config.ContinualConfig` describes."""
    return SwitchRule(kind=cc.switch, max_public_steps=cc.max_public_steps, switch_steps=cc.switch_steps,
                      patience=cc.plateau_patience, min_delta=cc.plateau_min_delta,
                      threshold=cc.decelerator_threshold, eval_every=cc.eval_every)
