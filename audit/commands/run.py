"""`audit run CONFIG`: the whole pipeline for every variant of a config, resumable."""

from __future__ import annotations

import shlex
import sys

import click

from audit.config import load_run_config
from audit.pipeline import STEPS, run_pipeline
from foundation.files import REPORT_HTML_FILE


def _fmt(value, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):  # a note in place of a number ("not resolvable with N non-members")
        return value
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    return format(value, spec)


@click.command(name="run")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a config value (repeatable)")
@click.option("--variant", "variants", multiple=True, help="run only these variants (repeatable)")
@click.option("--steps", default=",".join(STEPS), show_default=True,
              help="comma-separated subset of the steps to run")
@click.option("--retrain-shadows", is_flag=True, help="discard and retrain the reference models")
@click.option("--no-progress", is_flag=True, help="no progress bars")
def command(config: str, overrides: tuple[str, ...], variants: tuple[str, ...], steps: str, retrain_shadows: bool,
            no_progress: bool) -> None:
    """Train, attack, estimate epsilon, evaluate transfer and report, for every variant of CONFIG.

    Each step is skipped when its outputs are complete and match, so an interrupted run resumes.
    """
    from rich.console import Console
    from rich.table import Table

    from foundation.errors import ConfigError

    chosen = tuple(s.strip() for s in steps.split(",") if s.strip())
    unknown = [s for s in chosen if s not in STEPS]
    if unknown:
        raise ConfigError(f"--steps: unknown step(s) {unknown}; valid: {', '.join(STEPS)}")
    cfg = load_run_config(config, list(overrides))
    console = Console(stderr=True)
    results = run_pipeline(config=cfg, variants=list(variants) or None, steps=chosen,
                           retrain_shadows=retrain_shadows, progress=not no_progress,
                           command=shlex.join(["audit", *sys.argv[1:]]),
                           log=lambda m: console.print(m, markup=False, highlight=False),
                           warn=lambda m: click.echo(f"warning: {m}", err=True))
    from attacks.strongest import DEFINITION

    table = Table(title=f"audit run {config}")
    for col in ("run", "claimed ε", "test acc", "strongest attack", "AUC", "TPR at FPR", "ε lower bound",
                "verdict", "report"):
        table.add_column(col, overflow="fold")
    for r in results:
        s = r.summary
        report = r.run_dir / REPORT_HTML_FILE
        fpr = s.get("reference_fpr")
        tpr = (f"{_fmt(s.get('tpr_at_reference_fpr'), '.3f')} at {100 * fpr:g}%" if fpr is not None
               else "-" if s.get("strongest_attack") is None else "no resolvable FPR")
        table.add_row(s.get("run", str(r.run_dir)), _fmt(s.get("claimed_epsilon"), ".3g"),
                      _fmt(s.get("test_accuracy"), ".3f"), s.get("strongest_attack") or "-",
                      _fmt(s.get("auc"), ".3f"), tpr, _fmt(s.get("epsilon_lb"), ".3f"),
                      _verdict_cell(s), str(report) if report.exists() else "-")
    from audit.commands.tables import print_table, table_console

    out = table_console()  # piped: a wide page, cells wrap instead of truncating
    print_table(table, console=out)
    out.print(f"{DEFINITION}; ε lower bound: the deciding estimator's, '-' when none was estimated", markup=False,
              highlight=False)


def _verdict_cell(summary: dict) -> str:
    """The verdict word, with "inconclusive" when no estimator could have reached the claim."""
    verdict = summary.get("verdict") or "-"
    if verdict == "CONSISTENT" and summary.get("inconclusive_above") is not None:
        return "CONSISTENT (inconclusive: could not have detected a violation)"
    return verdict
