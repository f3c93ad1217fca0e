"""What every benchmark script does the same way: its output options and writing its Markdown table.

Benchmarks run as scripts (``.venv/bin/python benchmarks/<name>.py``), so this module is imported as ``_common``
from the scripts' own folder.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from foundation.io import write_text

__all__ = ["add_output_args", "emit", "command_line", "remake_section", "run_script"]


def add_output_args(parser: argparse.ArgumentParser, *, seed: bool = True, threads: int | None = None) -> None:
    """Add ``--out`` (Markdown file to write) and, when asked, ``--seed`` and ``--threads``."""
    if seed:
        parser.add_argument("--seed", type=int, default=0)
    if threads is not None:
        parser.add_argument("--threads", type=int, default=threads, help="torch threads of the main process")
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown table here")


def emit(text: str, out: str | Path | None) -> None:
    """Print the table, and write it atomically to ``out`` when given."""
    print(text)
    if out:
        write_text(out, text)


def command_line(script: str) -> str:
    """The command that re-makes a table: this script with the arguments it was given."""
    return shlex.join([".venv/bin/python", f"benchmarks/{script}", *sys.argv[1:]])


def remake_section(script: str) -> list[str]:
    """Markdown lines of a "Re-make" section: the command (:func:`command_line`) that re-makes the table."""
    return ["## Re-make", "", "```", command_line(script), "```", ""]


def run_script(parser: argparse.ArgumentParser, make_table: Callable[[argparse.Namespace], str],
               argv: list[str] | None = None, *, seed: bool = True, threads: int | None = None) -> None:
    """A benchmark's ``main``: add the output options, parse ``argv``, make the table, :func:`emit` it."""
    add_output_args(parser, seed=seed, threads=threads)
    args = parser.parse_args(argv)
    emit(make_table(args), args.out)
