"""`audit attack` (being written)."""

import click


@click.command(name="attack")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit attack is not available yet")
