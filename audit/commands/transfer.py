"""`audit transfer` (being written)."""

import click


@click.command(name="transfer")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit transfer is not available yet")
