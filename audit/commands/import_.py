"""`audit import` (being written)."""

import click


@click.command(name="import")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit import is not available yet")
