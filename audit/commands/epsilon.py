"""`audit epsilon` (being written)."""

import click


@click.command(name="epsilon")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit epsilon is not available yet")
