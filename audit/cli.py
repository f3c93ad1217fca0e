"""The `audit` command line: thin click adapters over library functions.

Each sub-command lives in ``audit/commands/<name>.py`` and exposes a click command named ``command``.
Errors caused by the user's input (:class:`training.errors.UserError`) print one line and exit with code 2.
"""

from __future__ import annotations

import importlib
import sys

import click

from training.errors import UserError

COMMANDS = ("train", "accountant", "attack", "import_", "epsilon", "transfer", "report", "gate", "run")


class AuditGroup(click.Group):
    """A click group that turns :class:`UserError` into a one-line message and exit code 2."""

    def invoke(self, ctx: click.Context):  # noqa: D401
        try:
            return super().invoke(ctx)
        except UserError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted: outputs written so far are complete; re-run with --resume to continue",
                       err=True)
            sys.exit(130)


@click.group(cls=AuditGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dp-audit")
def main() -> None:
    """Privacy auditing and evaluation for differentially private vision models."""


for _name in COMMANDS:
    main.add_command(importlib.import_module(f"audit.commands.{_name}").command)


if __name__ == "__main__":  # pragma: no cover
    main()
