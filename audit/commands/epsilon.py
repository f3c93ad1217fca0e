"""`audit epsilon RUN`: empirical ε lower bounds and a verdict for a checkpoint (writes RUN/epsilon.json)."""

from __future__ import annotations

import math

import click

def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else f"{x:.3f}"


def _counts(counts: dict) -> str:
    if "r" in counts:
        return f"m={counts['m']} r={counts['r']} v={counts['v']}"
    return f"fp={counts.get('fp')}/{counts.get('n_neg')} fn={counts.get('fn')}/{counts.get('n_pos')}"


@click.command(name="epsilon")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--alpha", type=float, default=None, help="1 - confidence of the verdict (default 0.05)")
@click.option("--sources", default=None, metavar="LIST",
              help="comma-separated: pool,input_canaries,gradient_canaries,multi_run,auditor_canaries (default: all "
                   "but multi_run, which trains models, and auditor_canaries, which needs --canaries)")
@click.option("--attack", default=None,
              help="attack in scores.npz that scores the pool (default strongest: the first of rmia_online, "
                   "lira_online, rmia_offline, lira_offline, attack_p, loss that scores.npz holds)")
@click.option("--guesses", type=click.Choice(["in", "in_out"]), default=None,
              help="one-run guesses: top-k IN only, or also bottom-k OUT")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="experiment YAML whose 'epsilon' section supplies the defaults")
@click.option("--canaries", type=click.Path(dir_okay=False), default=None, metavar="SECRET",
              help="the auditor's canary_secret.npz (audit canaries make): check its commitment against the run and "
                   "score every canary against reference models trained here (source auditor_canaries; the only "
                   "source unless --sources is given)")
@click.option("--references", "reference_dir", type=click.Path(file_okay=False), default=None,
              help="with --canaries: where the auditor's reference sets are kept (default RUN/canary_references)")
@click.option("--trust-code", is_flag=True,
              help="allow the run directory to name code to import (model.arch 'package.module:factory'); "
                   "only if you trust who made it (recorded in the results)")
def command(run_dir: str, alpha: float | None, sources: str | None, attack: str | None, guesses: str | None,
            config_file: str | None, canaries: str | None, reference_dir: str | None, trust_code: bool) -> None:
    """Lower-bound ε from attacks and canaries and judge the claim of RUN_DIR; writes RUN_DIR/epsilon.json."""
    from rich.table import Table

    from audit.api import epsilon

    report = epsilon(run_dir, alpha=alpha, sources=sources, attack=attack, guesses=guesses, config=config_file,
                     canaries=canaries, references=reference_dir, trust_code=trust_code,
                     log=lambda msg: click.echo(f"epsilon: {msg}", err=True))
    table = Table(title=f"empirical ε for {report.run} (claimed ε = {_fmt(report.claimed_epsilon)}, "
                        f"δ = {report.delta:.1e})")
    for col in ("source", "method", "ε_lb", "ceiling", "α", "counts", "verdict"):
        table.add_column(col, justify="right" if col in ("ε_lb", "ceiling", "α") else "left")
    for e in report.estimates:
        est = e.estimate
        table.add_row(e.source, est.method, _fmt(est.epsilon_lb), _fmt(est.ceiling), f"{est.alpha:.3g}",
                      _counts(dict(est.counts)), "decides" if e.in_verdict else "info only")
    from audit.commands.tables import print_table, table_console

    console = table_console()
    print_table(table, console=console)
    for s in report.skipped:
        console.print(f"skipped {s.source}: {s.reason}")
    for entry in report.power:  # stated from m, α and the grid before the scores were read; in epsilon.json
        click.echo(entry.statement)
    v = report.verdict
    for f in v.findings:  # why a claim fails whatever the bounds say (the claim check, the evidence files)
        click.echo(f"finding ({f.severity}, {f.kind}): {f.message}")
    best = (f"best ε_lb = {v.best_epsilon_lb:.3f} ({v.best_source}/{v.best_method})" if v.best_method
            else "no bound")
    line = f"{v.status}: {best}, claimed ε = {_fmt(report.claimed_epsilon)}"
    if v.tightness is not None:
        line += f", tightness {v.tightness:.3f}"
    if v.inconclusive_above is not None:
        line += f"; inconclusive for violations above {v.inconclusive_above:.3f}"
    click.echo(line)
    click.echo(f"wrote {report.path}")
