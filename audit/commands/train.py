"""`audit train` (being written)."""

import click


@click.command(name="train")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit train is not available yet")
