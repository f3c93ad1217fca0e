"""Training curves (TensorBoard) and the terminal progress bar."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

__all__ = ["TrainLogger", "EPSILON_LABEL", "epsilon_label"]

#: The bar's ε is the RDP bound of the steps so far (fast, at every log interval), not the claim's accountant: RDP
#: is looser than PRV/PLD (9.17 beside a PRV claim of 8.00 is no overshoot), so the bar says which bound it shows.
EPSILON_LABEL = "ε (RDP, upper bound)"


def epsilon_label(claim_accountant: str | None) -> str:
    """The bar's ε label, naming both bounds when the claim uses another accountant than the bar's RDP.

    >>> epsilon_label("prv")
    'ε (RDP bound; claim: PRV)'
    >>> print(epsilon_label("rdp"))
    ε (RDP, the claim's)
    >>> epsilon_label(None)
    'ε (RDP, upper bound)'
    """
    if claim_accountant is None:
        return EPSILON_LABEL
    if claim_accountant.lower() == "rdp":
        return "ε (RDP, the claim's)"
    return f"ε (RDP bound; claim: {claim_accountant.upper()})"  # short: a piped bar is 80 columns


class TrainLogger:
    """Writes scalars to TensorBoard and drives a rich progress bar; returns history rows every ``log`` call.

    Scalars: loss, lr, batch size, epsilon spent (RDP upper bound, for the curve and the bar, labelled so; the claim
    uses the configured accountant),
    fraction of clipped per-sample gradients, mean per-sample gradient norm, noise std.
    """

    def __init__(self, tb_dir: Path, *, total: int, start: int = 0, show: bool = True, dp: bool = True,
                 claim_accountant: str | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        _QuietWriterThreads.install()
        self._writer = SummaryWriter(log_dir=str(tb_dir))
        self._dp = dp
        self._label = epsilon_label(claim_accountant)
        self._progress = None
        if show:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("[bold]train"), BarColumn(bar_width=12), MofNCompleteColumn(),
                                      TimeRemainingColumn(), TextColumn("{task.fields[info]}"), transient=False)
            self._progress.start()
            self._task = self._progress.add_task("train", total=total, completed=start, info="")

    def scalar(self, tag: str, value: float, step: int) -> None:
        if value is not None and math.isfinite(value):
            self._writer.add_scalar(tag, value, step)

    def log(self, step: int, stats: Any, *, epsilon: float | None) -> dict[str, Any]:
        def num(v: Any) -> float:
            return float("nan") if v is None else float(v)

        row = {"step": step, "loss": num(stats.loss), "lr": num(stats.lr), "batch_size": int(stats.batch_size)}
        if self._dp and getattr(stats, "noise_std", None) is not None:  # a DP step (a non-DP phase has none)
            row.update(clipped_fraction=num(stats.clipped_fraction), grad_norm_mean=num(stats.grad_norm_mean),
                       noise_std=num(stats.noise_std))
        if epsilon is not None:
            row["epsilon_spent"] = float(epsilon)
        for k, v in row.items():
            if k != "step":
                self.scalar(f"train/{k}", v, step)
        if self._progress is not None:
            info = f"loss {row['loss']:.3f}" + (f"  {self._label} {epsilon:.2f}" if epsilon is not None else "")
            self._progress.update(self._task, completed=step, info=info)
        return row

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._writer.flush()
        self._writer.close()


class _QuietWriterThreads:
    """``threading.excepthook`` that does not print an ``OSError`` of TensorBoard's background writer thread (a
    full disk) as a thread traceback: TensorBoard raises the same error again in the training thread at its next
    write, flush or close (or while the writer is made), where the CLI reports it in one line (``error: no space left
    on device ...``). Other exceptions, and other threads, go to the hook installed before. Installed once per
    process, when the first :class:`TrainLogger` opens (the writer thread may fail after it is closed)."""

    def __init__(self, previous) -> None:
        self.previous = previous

    @classmethod
    def install(cls) -> None:
        import threading

        if not isinstance(threading.excepthook, cls):
            threading.excepthook = cls(threading.excepthook)

    def __call__(self, args) -> None:
        thread = args.thread
        writer = thread is not None and type(thread).__module__.startswith("tensorboard.")
        if not (writer and isinstance(args.exc_value, OSError)):
            self.previous(args)
