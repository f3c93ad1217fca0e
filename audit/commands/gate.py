"""`audit gate` (being written)."""

import click


@click.command(name="gate")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit gate is not available yet")
