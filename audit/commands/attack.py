"""`audit attack RUN`: membership-inference attacks on a run directory (see :mod:`attacks.runner`)."""

from __future__ import annotations

from typing import Any

import click

from foundation.files import ATTACK_FILE, SCORES_FILE


def _fmt_ci(ci: Any) -> str:
    return "" if not ci else f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def _print_table(result: Any) -> None:
    from rich.table import Table

    from attacks.resolution import format_tpr

    report = result.report
    setup = report.setup
    table = Table(title=f"{report.run}: {setup.n_members} members / {setup.pool_size} pool, "
                        f"{setup.n_reference} reference models, evaluation {setup.evaluation}")
    table.add_column("attack", min_width=22, no_wrap=True)
    table.add_column("AUC [95% CI]", justify="right", no_wrap=True)
    for level in ("TPR@1%", "@0.1%", "@0.01%"):
        table.add_column(level, justify="right")   # wraps "not resolvable with N non-members" in a narrow terminal
    for name, entry in report.attacks.items():
        m = entry.metrics
        table.add_row(name, f"{m.auc:.3f}{_fmt_ci(m.auc_ci)}",
                      *(format_tpr(m.tpr_at_fpr.get(k), float(k), m.n_nonmembers, digits=2)
                        for k in ("0.01", "0.001", "0.0001")))
    from audit.commands.tables import print_table, table_console

    console = table_console()
    print_table(table, console=console)
    console.print(f"wrote {result.run_dir / ATTACK_FILE} and {result.run_dir / SCORES_FILE}")


@click.command(name="attack")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="experiment YAML whose attack: section to use (default: built-in attack settings)")
@click.option("--variant", default=None, help="variant of --config (default: the one named like RUN)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override an attack setting, e.g. --set attack.n_reference=16 (repeatable)")
@click.option("--retrain-shadows", is_flag=True, help="delete the reference models under RUN/shadows and retrain")
@click.option("--executor", type=click.Choice(["auto", "batched", "sequential", "processes", "ray"]), default=None,
              help="how reference models train (default: attack.executor)")
@click.option("--ray-address", default=None, metavar="auto|HOST:PORT|ray://HOST:PORT",
              help="train reference models as tasks on this Ray cluster (implies --executor ray); without it "
                   "--executor ray starts a private local Ray")
@click.option("--ray-bind-host", default=None, metavar="IP",
              help="where the local Ray of --executor ray listens (default 127.0.0.1: this machine only); an IP "
                   "address of this machine opens it to other nodes (ray start --address)")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="CPUs of the local Ray of --executor ray (default: all cores); worker processes of --executor "
                   "processes (default 4)")
@click.option("--no-progress", is_flag=True, help="no progress messages")
@click.option("--trust-code", is_flag=True,
              help="allow the run directory to name code to import (model.arch 'package.module:factory'); "
                   "only if you trust who made it (recorded in the results)")
def command(run: str, config_path: str | None, variant: str | None, overrides: tuple[str, ...],
            retrain_shadows: bool, executor: str | None, ray_address: str | None, workers: int | None,
            ray_bind_host: str | None, no_progress: bool,
            trust_code: bool) -> None:
    """Attack the run in RUN (LOSS, Attack-P, LiRA, RMIA, ...) and write RUN/attack.json and RUN/scores.npz."""
    from audit.api import attack

    result = attack(run, config=config_path, variant=variant, overrides=overrides, retrain_shadows=retrain_shadows,
                    executor=executor, ray_address=ray_address, workers=workers, ray_bind_host=ray_bind_host,
                    progress=not no_progress,
                    trust_code=trust_code,
                    note=lambda message: click.echo(f"note: {run} {message}", err=True))
    _print_table(result)
