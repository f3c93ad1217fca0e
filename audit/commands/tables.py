"""How every command prints a rich table: fitted to the terminal, or wrapped (never truncated) when piped.

On a terminal rich fits the table to its width; piped (a CI log, ``| tee``) rich would assume 80 columns and cut
cells to ``gradient_c…``. Here a piped table gets a wide page and every column folds its long cells onto more
lines, so no value is lost.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["PIPED_WIDTH", "table_console", "print_table"]

#: the page width of a table printed to a pipe or file
PIPED_WIDTH = 160


def table_console(file: TextIO | None = None) -> Any:
    """A rich console on ``file`` (default stdout): the terminal's width, or :data:`PIPED_WIDTH` when piped."""
    from rich.console import Console

    out = file if file is not None else sys.stdout
    tty = bool(getattr(out, "isatty", lambda: False)())
    return Console(file=out, width=None if tty else PIPED_WIDTH, highlight=False, soft_wrap=not tty)


def print_table(table: Any, *, console: Any | None = None, file: TextIO | None = None) -> None:
    """Print ``table`` with every column folding long cells (wrapping inside the cell instead of truncating).

    >>> import io
    >>> from rich.table import Table
    >>> t = Table("source", "method")
    >>> t.add_row("gradient_canaries", "one_run_fdp")
    >>> buf = io.StringIO()
    >>> print_table(t, file=buf)
    >>> "gradient_canaries" in buf.getvalue() and "…" not in buf.getvalue()
    True
    """
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    (console or table_console(file)).print(table)
