"""`audit mechanism`: a tight audit of the DP-SGD mechanism implementation (:mod:`audit.mechanism`).

Audits the project's DP engine with Dirac gradient canaries at a finished run's DP settings (RUN: its manifest's
σ, q, T, C, clipping, engine and sampler, judged against its claimed ε; writes RUN/mechanism.json), at the settings
a training config describes, without training it (CONFIG: the claim ``audit train CONFIG`` would make; writes
``--out``, default ``<output_dir>/<name>-mechanism/mechanism.json``), or at settings given as options. Prints the ε
lower bound and the verdict.

Examples::

    audit mechanism results/my-run
    audit mechanism eval_configs/quickstart_train.yaml --trials 8000
    audit mechanism --sigma 1.1 --sample-rate 0.01 --steps 500 --delta 1e-5 --clipping per_layer --engine bk
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from audit.mechanism.api import audit_mechanism, audit_run_mechanism
from audit.mechanism.engine_target import ENGINES
from audit.mechanism.result import write_mechanism
from foundation.errors import UserError
from foundation.files import MECHANISM_FILE


@click.command(name="mechanism")
@click.argument("run", required=False, metavar="[RUN|CONFIG]", type=click.Path(exists=True, path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="with CONFIG: override a config value")
@click.option("--variant", default=None, help="with CONFIG: the variant of a config that defines several")
@click.option("--sigma", type=float, default=None, help="noise multiplier σ (without RUN)")
@click.option("--sample-rate", type=float, default=None, help="Poisson sampling rate q in (0, 1] (without RUN)")
@click.option("--steps", type=int, default=None, help="number of steps T (without RUN)")
@click.option("--delta", type=float, default=None, help="δ of the claim (without RUN)")
@click.option("--max-grad-norm", type=float, default=1.0, show_default=True, help="clipping norm C (without RUN)")
@click.option("--clipping", type=click.Choice(("flat", "per_layer", "automatic")), default="flat", show_default=True)
@click.option("--engine", "grad_sample_mode", type=click.Choice(ENGINES), default="hooks", show_default=True)
@click.option("--trials", type=int, default=20_000, show_default=True, help="canary trials in all (half members)")
@click.option("--canaries-per-run", type=int, default=None,
              help="canaries per engine run (default 2000; with CONFIG: fixed by its batch size and members)")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="1 − confidence of the ε lower bound")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="without RUN: directory to write mechanism.json into (CONFIG: default <output_dir>/<name>-mechanism)")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def command(run: Path | None, overrides: tuple[str, ...], variant: str | None, sigma: float | None,
            sample_rate: float | None, steps: int | None, delta: float | None, max_grad_norm: float, clipping: str, grad_sample_mode: str, trials: int,
            canaries_per_run: int | None, alpha: float, seed: int, out: Path | None, as_json: bool) -> None:
    """Audit the DP-SGD mechanism (engine, clipping, noise, sampler, accountant call) against its claimed ε."""
    given = [v is not None for v in (sigma, sample_rate, steps, delta)]
    if not 0.0 < alpha < 1.0:
        raise UserError(f"--alpha must be in (0, 1), got {alpha}")
    if (overrides or variant is not None) and (run is None or run.is_dir()):
        raise UserError("--set and --variant apply to a CONFIG file only")
    if run is not None and any(given):
        raise UserError("give either RUN/CONFIG or --sigma/--sample-rate/--steps/--delta, not both")
    if run is not None and not run.is_dir():
        if canaries_per_run is not None:
            raise UserError("--canaries-per-run does not apply to a CONFIG: each run holds a whole number of the "
                            "config's batches (q × members), chosen for it")
        from audit.mechanism.config_target import audit_config_mechanism, default_out, load_train_config

        cfg = load_train_config(run, overrides=overrides, variant=variant)
        out = out if out is not None else default_out(cfg)
        claim, result = audit_config_mechanism(cfg, trials=trials, alpha=alpha, seed=seed, out=out)
        if not as_json:
            click.echo(f"config {run}: n = {claim.n} private examples, batch {claim.batch_size} "
                       f"(q = {claim.sample_rate:.4g}), {claim.steps} steps, σ = {claim.noise_multiplier:.4g}, "
                       f"δ = {claim.delta:.3g}; {claim.grad_sample_mode}/{claim.clipping}, {claim.sampling} sampling")
        _print(result, as_json)
        if not as_json:
            click.echo(f"wrote {Path(out) / MECHANISM_FILE}")
        return
    canaries_per_run = 2000 if canaries_per_run is None else canaries_per_run
    if run is not None:
        result = audit_run_mechanism(run, trials=trials, canaries_per_run=canaries_per_run, alpha=alpha, seed=seed)
    else:
        if not all(given):
            raise UserError("without RUN, --sigma, --sample-rate, --steps and --delta are all required")
        result = audit_mechanism(noise_multiplier=sigma, sample_rate=sample_rate, steps=steps, delta=delta,
                                 max_grad_norm=max_grad_norm, clipping=clipping, grad_sample_mode=grad_sample_mode,
                                 trials=trials, canaries_per_run=canaries_per_run, alpha=alpha, seed=seed)
        if out is not None:  # only once the audit succeeded: nothing half-written
            out.mkdir(parents=True, exist_ok=True)
            write_mechanism(out, result)
    _print(result, as_json)


def _print(r, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(r.model_dump(mode="json"), indent=2))
        return
    click.echo(f"{r.target}: σ = {r.noise_multiplier:.4g}, q = {r.sample_rate:.4g}, T = {r.steps}, "
               f"C = {r.max_grad_norm:.4g}, δ = {r.delta:.3g}; claimed ε = {r.claimed_epsilon:.4f} ({r.accountant})")
    click.echo(f"{r.trials_in + r.trials_out} Dirac-canary trials in {r.runs} run(s): ε_lb = {r.epsilon_lb:.4f} at "
               f"{1 - r.alpha:.0%} confidence (ε_lb/ε = {r.tightness:.3f}; σ ≤ {r.sigma_ub:.4g})")
    click.echo(f"verdict: {r.verdict.status}" + (f" — {r.verdict.notes[0]}" if r.verdict.notes else ""))
