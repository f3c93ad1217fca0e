"""`audit accountant`: ε of a DP-SGD schedule under every accountant, or σ for a target ε.

A thin adapter over :mod:`training.accounting`. The schedule is given either as ``--sample-rate`` and
``--steps`` or as ``--batch-size``, ``--dataset-size`` and ``--epochs`` (q = B/N, T = ⌈epochs/q⌉).

Examples::

    audit accountant --sigma 1.0 --sample-rate 0.01 --steps 1000 --delta 1e-5
    audit accountant --target-epsilon 8 --batch-size 256 --dataset-size 50000 --epochs 10
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from training.accounting import (
    ACCOUNTANTS,
    DPPhase,
    check_delta,
    default_delta,
    epsilons_for,
    noise_multiplier_for,
    steps_for_epochs,
)
from training.errors import UserError


def _schedule(*, sample_rate: float | None, steps: int | None, batch_size: int | None, dataset_size: int | None,
              epochs: float | None) -> tuple[float, int]:
    """(q, T) from either --sample-rate/--steps or --batch-size/--dataset-size and --epochs or --steps."""
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
    return q, int(steps)


@click.command(name="accountant")
@click.option("--sigma", "sigma", type=float, default=None, help="noise multiplier σ: print ε under every accountant")
@click.option("--target-epsilon", type=float, default=None, help="instead of --sigma: print the σ reaching this ε")
@click.option("--sample-rate", type=float, default=None, help="Poisson sampling rate q in (0, 1]")
@click.option("--steps", type=int, default=None, help="number of steps T")
@click.option("--batch-size", type=int, default=None, help="expected batch size B (with --dataset-size)")
@click.option("--dataset-size", type=int, default=None, help="number of private examples N")
@click.option("--epochs", type=float, default=None, help="instead of --steps: T = ceil(epochs * N / B)")
@click.option("--delta", type=float, default=None,
              help="δ in (0, 1); default with --dataset-size: the largest 10^-k <= 1/(10 N)")
@click.option("--accountant", type=click.Choice(ACCOUNTANTS), default="prv", show_default=True,
              help="accountant of the claim (and of the σ search)")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of a table")
def command(sigma: float | None, target_epsilon: float | None, sample_rate: float | None, steps: int | None,
            batch_size: int | None, dataset_size: int | None, epochs: float | None, delta: float | None,
            accountant: str, as_json: bool) -> None:
    """ε of DP-SGD (Poisson-subsampled Gaussian, add/remove neighbours) from σ, q, T, δ; or σ for a target ε."""
    if (sigma is None) == (target_epsilon is None):
        raise UserError("give exactly one of --sigma S (to get epsilon) or --target-epsilon E (to get sigma)")
    q, T = _schedule(sample_rate=sample_rate, steps=steps, batch_size=batch_size, dataset_size=dataset_size,
                     epochs=epochs)
    if delta is None:
        if dataset_size is None:
            raise UserError("give --delta D (or --dataset-size N to use the default delta)")
        delta = default_delta(dataset_size)
    warnings = check_delta(delta, dataset_size) if dataset_size is not None else []
    if target_epsilon is not None:
        sigma = noise_multiplier_for(target_epsilon=target_epsilon, sample_rate=q, steps=T, delta=delta,
                                     accountant=accountant)
    table = epsilons_for(phases=[DPPhase(sigma, q, T)], delta=delta)

    result = {"noise_multiplier": sigma, "sample_rate": q, "steps": T, "delta": delta, "accountant": accountant,
              "target_epsilon": target_epsilon, "epsilon": table[accountant], "epsilons": table,
              "warnings": warnings}
    for w in warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    console = Console(highlight=False, soft_wrap=True)
    head = f"σ = {sigma:.6g}, q = {q:.6g}, T = {T}, δ = {delta:.3g}"
    if target_epsilon is not None:
        console.print(f"noise multiplier for ε = {target_epsilon:g} ({accountant}): σ = {sigma:.6g}")
    console.print(head)
    tab = Table("accountant", "epsilon", "")
    for name, eps in table.items():
        tab.add_row(name, f"{eps:.4f}", "claim" if name == accountant else "")
    console.print(tab)
