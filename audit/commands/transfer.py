"""`audit transfer RUN --suite SUITE`: downstream transfer and representation diagnostics of a checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from audit.transfer.runner import evaluate_transfer
from audit.transfer.suite import load_suite
from audit.transfer.summary import SUMMARY_COLUMNS, summary_rows
from foundation.config_io import shipped_config


def default_suite() -> Path:
    """The default suite: this installation's ``eval_configs/transfer/default.yaml`` (a checkout's or a wheel's,
    found through importlib.resources by :func:`foundation.config_io.shipped_config`), never the current
    directory's."""
    return shipped_config("transfer", "default.yaml")


@click.command(name="transfer")
@click.argument("run_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option("--suite", "suite_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None, show_default="eval_configs/transfer/default.yaml of this installation",
              help="transfer suite YAML (datasets, protocols, budget)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a suite value, e.g. --set budget.max_train_examples=2000 (repeatable)")
@click.option("--out", "out_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="where to write the result (default: RUN_DIR/transfer.json)")
@click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="feature cache folder (default: RUN_DIR/features)")
@click.option("--quiet", is_flag=True, help="no progress lines")
@click.option("--trust-code", is_flag=True,
              help="allow the run directory to name code to import (model.arch 'package.module:factory'); "
                   "only if you trust who made it (recorded in the results)")
def command(run_dir: Path, suite_path: Path | None, overrides: tuple[str, ...], out_path: Path | None,
            cache_dir: Path | None, quiet: bool, trust_code: bool) -> None:
    """Linear probe, k-NN, fine-tuning and per-layer separation of RUN_DIR's model on a transfer suite."""
    from rich.table import Table

    from audit.commands.tables import print_table

    suite = load_suite(suite_path or default_suite(), overrides)
    log = None if quiet else (lambda msg: click.echo(f"transfer: {msg}", err=True))
    result = evaluate_transfer(run_dir=run_dir, suite=suite, out_path=out_path, cache_dir=cache_dir, log=log,
                               trust_code=trust_code)
    table = Table(title=f"transfer: {result.data.run['name']} on suite {suite.name}")
    for col in SUMMARY_COLUMNS:
        table.add_column(col, overflow="fold")
    for row in summary_rows(result.data.datasets):
        table.add_row(*(row[c] for c in SUMMARY_COLUMNS))
    print_table(table)
    click.echo(f"wrote {result.path}")
