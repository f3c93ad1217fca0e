"""`audit run` (being written)."""

import click


@click.command(name="run")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit run is not available yet")
