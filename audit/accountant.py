"""ε of a DP-SGD schedule under every accountant, or σ for a target ε (the library behind `audit accountant`).

The schedule is given either as ``sample_rate`` and ``steps`` or as ``batch_size``, ``dataset_size`` and
``epochs`` or ``steps`` (q = B/N, T = ⌈epochs/q⌉). Mechanism: Poisson-subsampled Gaussian, add/remove neighbours
(:mod:`training.accounting`). Error messages name the command-line options (``--sample-rate`` for
``sample_rate``), since that is where most values come from.

>>> dp_sgd_schedule(batch_size=100, dataset_size=5000, epochs=5)
Schedule(sample_rate=0.02, steps=250)
>>> r = account(sigma=1.0, sample_rate=0.01, steps=1000, delta=1e-5, accountant="rdp")
>>> round(r.epsilon, 2) == round(r.epsilons["rdp"], 2)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.accounting import (
    DPPhase,
    check_delta,
    default_delta,
    epsilons_for,
    noise_multiplier_for,
    steps_for_epochs,
)
from foundation.errors import UserError

__all__ = ["Schedule", "AccountantResult", "dp_sgd_schedule", "account"]


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A DP-SGD schedule: Poisson sample rate q and number of steps T."""

    sample_rate: float
    steps: int


@dataclass(frozen=True, kw_only=True)
class AccountantResult:
    """ε of one schedule under every accountant (``epsilons``) and under the claim's (``epsilon``).

    Attributes:
        noise_multiplier: σ (given, or found for ``target_epsilon``).
        sample_rate, steps, delta: the schedule and δ accounted.
        accountant: the accountant of the claim (and of the σ search).
        target_epsilon: the ε σ was searched for, else None.
        epsilon: ε under ``accountant``.
        epsilons: accountant name -> ε.
        warnings: remarks on δ (e.g. not below 1/N).
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float
    accountant: str
    target_epsilon: float | None
    epsilon: float
    epsilons: dict[str, float]
    warnings: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``audit accountant --json`` prints."""
        return {"noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate, "steps": self.steps,
                "delta": self.delta, "accountant": self.accountant, "target_epsilon": self.target_epsilon,
                "epsilon": self.epsilon, "epsilons": dict(self.epsilons), "warnings": list(self.warnings)}


def dp_sgd_schedule(*, sample_rate: float | None = None, steps: int | None = None, batch_size: int | None = None,
                    dataset_size: int | None = None, epochs: float | None = None) -> Schedule:
    """(q, T) from ``sample_rate`` and ``steps``, or ``batch_size`` with ``dataset_size`` and ``epochs`` or ``steps``.

    Raises:
        UserError: both or neither ways of giving q or T, or values out of range (one line).
    """
    if sample_rate is not None:
        if batch_size is not None:
            raise UserError("give --sample-rate or --batch-size with --dataset-size, not both")
        q = sample_rate
    elif batch_size is not None and dataset_size is not None:
        if batch_size < 1 or dataset_size < 1:
            raise UserError(f"--batch-size and --dataset-size must be >= 1, got {batch_size} and {dataset_size}")
        if batch_size > dataset_size:
            raise UserError(f"--batch-size {batch_size} is larger than --dataset-size {dataset_size}")
        q = batch_size / dataset_size
    else:
        raise UserError("give the sample rate: --sample-rate Q, or --batch-size B with --dataset-size N")
    DPPhase(1.0, q, 0)  # validates q with a one-line message
    if (steps is None) == (epochs is None):
        raise UserError("give the length of training: --steps T or --epochs E (not both)")
    if steps is None:
        steps = steps_for_epochs(epochs=epochs, sample_rate=q)
    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    return Schedule(sample_rate=q, steps=int(steps))


def account(*, sigma: float | None = None, target_epsilon: float | None = None, sample_rate: float | None = None,
            steps: int | None = None, batch_size: int | None = None, dataset_size: int | None = None,
            epochs: float | None = None, delta: float | None = None, accountant: str = "prv") -> AccountantResult:
    """ε of DP-SGD with noise multiplier ``sigma`` under every accountant, or the σ reaching ``target_epsilon``.

    Args:
        sigma, target_epsilon: exactly one of them.
        sample_rate, steps, batch_size, dataset_size, epochs: the schedule (:func:`dp_sgd_schedule`).
        delta: δ in (0, 1); default with ``dataset_size``: the largest 10^-k <= 1/(10 N).
        accountant: the accountant of the claim and of the σ search.

    Raises:
        UserError: missing, conflicting or out-of-range values (one line).
    """
    if (sigma is None) == (target_epsilon is None):
        raise UserError("give exactly one of --sigma S (to get epsilon) or --target-epsilon E (to get sigma)")
    schedule = dp_sgd_schedule(sample_rate=sample_rate, steps=steps, batch_size=batch_size,
                               dataset_size=dataset_size, epochs=epochs)
    q, T = schedule.sample_rate, schedule.steps
    if delta is None:
        if dataset_size is None:
            raise UserError("give --delta D (or --dataset-size N to use the default delta)")
        delta = default_delta(dataset_size)
    warnings = check_delta(delta, dataset_size) if dataset_size is not None else []
    if target_epsilon is not None:
        sigma = noise_multiplier_for(target_epsilon=target_epsilon, sample_rate=q, steps=T, delta=delta,
                                     accountant=accountant)
    table = epsilons_for(phases=[DPPhase(sigma, q, T)], delta=delta)
    return AccountantResult(noise_multiplier=sigma, sample_rate=q, steps=T, delta=delta, accountant=accountant,
                            target_epsilon=target_epsilon, epsilon=table[accountant], epsilons=dict(table),
                            warnings=tuple(warnings))
