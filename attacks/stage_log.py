"""The attack's terminal log: one line per message, and one progress line per counted stage.

A counted stage (reference models trained, signals per model) is one rich bar with its total, elapsed time and
ETA: redrawn in place on a terminal, printed once (its final state) when the output is piped, so a log holds
one line per stage instead of one per model. Library code receives a plain ``say(msg)`` callable; a stage
count is asked for with :func:`stage_ticker`, which falls back to one line per item for plain callables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["StageLog", "stage_ticker"]


class StageLog:
    """``say(msg)`` plus :meth:`stage`; silent when ``show`` is False."""

    def __init__(self, *, show: bool, prefix: str = "attack", console: Any | None = None) -> None:
        self.show = show
        self.prefix = prefix
        self._console = console

    def _get_console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, soft_wrap=True)  # a piped log line is not cut at 80 columns
        return self._console

    def __call__(self, msg: str) -> None:
        if self.show:
            self._get_console().print(f"{self.prefix}: {msg}", markup=False, highlight=False)

    def stage(self, label: str, total: int) -> Callable[[int], None]:
        """A ``tick(done)`` for a stage of ``total`` items; the bar closes when ``done == total``."""
        if not self.show or total <= 0:
            return lambda _done: None
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        bar = Progress(TextColumn(f"{self.prefix}: {label}", markup=False), BarColumn(bar_width=16),
                       MofNCompleteColumn(), TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA"),
                       TimeRemainingColumn(),
                       console=self._get_console(), transient=False)
        task = bar.add_task(label, total=total)
        bar.start()
        state = {"open": True}

        def tick(done: int) -> None:
            if not state["open"]:
                return
            bar.update(task, completed=done)
            if done >= total:
                bar.stop()
                state["open"] = False

        return tick


def stage_ticker(say: Callable[[str], None], label: str, total: int) -> Callable[[int], None]:
    """``say.stage(label, total)`` for a :class:`StageLog`; for a plain callable, one ``label: i/total`` line each.

    >>> lines = []
    >>> tick = stage_ticker(lines.append, "signals", 2); tick(1); tick(2)
    >>> lines
    ['signals: 1/2', 'signals: 2/2']
    """
    stage = getattr(say, "stage", None)
    if callable(stage):
        return stage(label, total)
    return lambda done: say(f"{label}: {done}/{total}")
