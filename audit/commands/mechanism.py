"""`audit mechanism`: a tight audit of the DP-SGD mechanism implementation (:mod:`audit.mechanism`).

Audits the project's DP engine with Dirac gradient canaries at a finished run's DP settings (RUN: its manifest's
σ, q, T, C, clipping and engine, judged against its claimed ε; writes RUN/mechanism.json), or at settings given as
options. Prints the ε lower bound and the verdict.

Examples::

    audit mechanism results/my-run
    audit mechanism --sigma 1.1 --sample-rate 0.01 --steps 500 --delta 1e-5 --clipping per_layer --engine bk
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from audit.mechanism.api import audit_mechanism, audit_run_mechanism
from foundation.errors import UserError


@click.command(name="mechanism")
@click.argument("run", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--sigma", type=float, default=None, help="noise multiplier σ (without RUN)")
@click.option("--sample-rate", type=float, default=None, help="Poisson sampling rate q in (0, 1] (without RUN)")
@click.option("--steps", type=int, default=None, help="number of steps T (without RUN)")
@click.option("--delta", type=float, default=None, help="δ of the claim (without RUN)")
@click.option("--max-grad-norm", type=float, default=1.0, show_default=True, help="clipping norm C (without RUN)")
@click.option("--clipping", type=click.Choice(("flat", "per_layer", "automatic")), default="flat", show_default=True)
@click.option("--engine", "grad_sample_mode", type=click.Choice(("hooks", "bk")), default="hooks", show_default=True)
@click.option("--trials", type=int, default=20_000, show_default=True, help="canary trials in all (half members)")
@click.option("--canaries-per-run", type=int, default=2000, show_default=True, help="canaries per engine run")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="1 − confidence of the ε lower bound")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="without RUN: directory to write mechanism.json into")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def command(run: Path | None, sigma: float | None, sample_rate: float | None, steps: int | None,
            delta: float | None, max_grad_norm: float, clipping: str, grad_sample_mode: str, trials: int,
            canaries_per_run: int, alpha: float, seed: int, out: Path | None, as_json: bool) -> None:
    """Audit the DP-SGD mechanism (engine, clipping, noise, sampler, accountant call) against its claimed ε."""
    given = [v is not None for v in (sigma, sample_rate, steps, delta)]
    if not 0.0 < alpha < 1.0:
        raise UserError(f"--alpha must be in (0, 1), got {alpha}")
    if run is not None:
        if any(given):
            raise UserError("give either RUN or --sigma/--sample-rate/--steps/--delta, not both")
        result = audit_run_mechanism(run, trials=trials, canaries_per_run=canaries_per_run, alpha=alpha, seed=seed)
    else:
        if not all(given):
            raise UserError("without RUN, --sigma, --sample-rate, --steps and --delta are all required")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        result = audit_mechanism(noise_multiplier=sigma, sample_rate=sample_rate, steps=steps, delta=delta,
                                 max_grad_norm=max_grad_norm, clipping=clipping, grad_sample_mode=grad_sample_mode,
                                 trials=trials, canaries_per_run=canaries_per_run, alpha=alpha, seed=seed,
                                 run_dir=out)
    if as_json:
        click.echo(json.dumps(result.model_dump(mode="json"), indent=2))
        return
    r = result
    click.echo(f"{r.target}: σ = {r.noise_multiplier:.4g}, q = {r.sample_rate:.4g}, T = {r.steps}, "
               f"C = {r.max_grad_norm:.4g}, δ = {r.delta:.3g}; claimed ε = {r.claimed_epsilon:.4f} ({r.accountant})")
    click.echo(f"{r.trials_in + r.trials_out} Dirac-canary trials in {r.runs} run(s): ε_lb = {r.epsilon_lb:.4f} at "
               f"{1 - r.alpha:.0%} confidence (ε_lb/ε = {r.tightness:.3f}; σ ≤ {r.sigma_ub:.4g})")
    click.echo(f"verdict: {r.verdict.status}" + (f" — {r.verdict.notes[0]}" if r.verdict.notes else ""))
