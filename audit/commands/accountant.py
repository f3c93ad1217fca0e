"""`audit accountant`: ε of a DP-SGD schedule under every accountant, or σ for a target ε.

Parses options and prints :func:`audit.accountant.account`. The schedule is given either as ``--sample-rate`` and
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

from audit.commands.tables import print_table

from audit.accountant import account
from training.accounting import ACCOUNTANTS


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
    result = account(sigma=sigma, target_epsilon=target_epsilon, sample_rate=sample_rate, steps=steps,
                     batch_size=batch_size, dataset_size=dataset_size, epochs=epochs, delta=delta,
                     accountant=accountant)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    sigma, q, T, delta = result.noise_multiplier, result.sample_rate, result.steps, result.delta
    console = Console(highlight=False, soft_wrap=True)
    head = f"σ = {sigma:.6g}, q = {q:.6g}, T = {T}, δ = {delta:.3g}"
    if target_epsilon is not None:
        console.print(f"noise multiplier for ε = {target_epsilon:g} ({accountant}): σ = {sigma:.6g}")
    console.print(head)
    tab = Table("accountant", "epsilon", "")
    for name, eps in result.epsilons.items():
        tab.add_row(name, f"{eps:.4f}", "claim" if name == accountant else "")
    print_table(tab, console=console)
