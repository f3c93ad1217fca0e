"""`audit report` (being written)."""

import click


@click.command(name="report")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit report is not available yet")
