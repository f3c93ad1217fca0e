"""Learning-rate schedules as a pure function of the step: ``lr_at(step, ...)``.

Because the rate depends only on the step counter, resuming a run needs no scheduler state beyond the step.

Schedules (after ``warmup_steps`` of linear warm-up from lr/warmup to lr):

* ``constant``: lr.
* ``cosine``: lr_min + (lr − lr_min) · (1 + cos(π t)) / 2, t = progress through the post-warm-up steps.
* ``linear``: lr − (lr − lr_min) · t.
* ``step``: lr · gamma^⌊(step − warmup) / step_size⌋, never below lr_min.

with lr_min = lr · min_lr_ratio.

>>> from training.config import OptimConfig
>>> cfg = OptimConfig(lr=1.0, schedule="cosine", warmup_steps=2)
>>> [round(lr_at(s, optim=cfg, total_steps=6), 3) for s in range(6)]
[0.5, 1.0, 1.0, 0.75, 0.25, 0.0]
"""

from __future__ import annotations

import math
import numbers

from training.config import OptimConfig

__all__ = ["lr_at"]


def lr_at(step: int, *, optim: OptimConfig, total_steps: int) -> float:
    """The learning rate of (0-based) step ``step`` of a run of ``total_steps`` steps.

    Args:
        step: step index ≥ 0 (steps past ``total_steps`` keep the final rate).
        optim: the optimiser config (``lr``, ``schedule``, ``warmup_steps``, ``step_size``, ``gamma``,
            ``min_lr_ratio``).
        total_steps: number of steps the schedule spans; ≥ 1.

    Returns:
        The learning rate (≥ 0).

    Raises:
        ValueError: if ``step`` < 0 or ``total_steps`` < 1.
    """
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, numbers.Integral) or total_steps < 1:
        raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    step, total_steps = int(step), int(total_steps)
    lr = optim.lr
    warm = optim.warmup_steps
    if step < warm:
        return lr * (step + 1) / warm
    lr_min = lr * optim.min_lr_ratio
    span = max(1, total_steps - warm - 1)
    t = min(1.0, (step - warm) / span)
    if optim.schedule == "constant":
        return lr
    if optim.schedule == "cosine":
        return lr_min + (lr - lr_min) * 0.5 * (1.0 + math.cos(math.pi * t))
    if optim.schedule == "linear":
        return lr - (lr - lr_min) * t
    if optim.schedule == "step":
        return max(lr_min, lr * optim.gamma ** ((step - warm) // optim.step_size))
    raise ValueError(f"unknown schedule {optim.schedule!r} (constant, cosine, linear, step)")
