"""`audit accountant` (being written)."""

import click


@click.command(name="accountant")
def command() -> None:
    """Not available yet."""
    raise click.ClickException("audit accountant is not available yet")
