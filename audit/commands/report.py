"""`audit report RUN`: the self-contained audit report of a run directory.

The library function is :func:`audit.api.report` (``audit.report(run)``).
"""

from __future__ import annotations

from pathlib import Path

import click

from audit.api import report


@click.command(name="report")
@click.argument("run", type=click.Path(file_okay=False, path_type=Path))
@click.option("--out", "out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="directory for report.html/.md/.json (default: the run directory)")
@click.option("--pdf", is_flag=True, help="also print report.pdf with headless Chromium")
@click.option("--no-images", is_flag=True, help="list vulnerable examples by index instead of re-loading the pool")
def command(run: Path, out: Path | None, pdf: bool, no_images: bool) -> None:
    """Write report.html (one self-contained file), report.md and report.json for RUN."""
    paths = report(run, out=out, pdf=pdf, images=not no_images)
    g = paths.report.glance
    click.echo(f"{g.status}: {g.headline}")
    for p in (paths.html, paths.markdown, paths.json, paths.pdf):
        if p is not None:
            click.echo(f"wrote {p}")
