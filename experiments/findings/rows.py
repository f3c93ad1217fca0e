"""The pieces every row of ``results/reference/seed_findings.md`` is made of: the re-make commands, a row's
layout, the percentage format, the one-sided Welch test with its verdict, and an arm's result file."""

from __future__ import annotations

import json
import math

from experiments.stats import fmt_mean_sd, fmt_p, verdict, welch
from experiments.papers.runs import OUT, ROOT

ARMS_CMD = "python -m experiments arms run {arm} --scale {scale}"
RUNS_CMD = "python -m experiments papers run continual --scale {scale}"
GPU_CMD = ("python -m experiments gpu run --scale {base} --arms {arm} --no-runs{override} (on the GPU machine, "
           "see its docstring, or on a CPU with --workers 2), then here python -m experiments arms merge {arm} "
           "--scale {scale}")
GPU_RUNS_CMD = ("python -m experiments gpu run --scale {scale} --arms (on the GPU machine), then here python -m "
                "experiments papers tables --scale {scale}")


def arms_cmd(arm: str, scale: str) -> str:
    """The command that re-makes an arm's results at ``scale`` (GPU scales run through experiments/gpu/)."""
    if scale.startswith("gpu"):
        base = "gpu_full" if scale.startswith("gpu_full") else "gpu"
        override = f" --arm-scale {arm}={scale}" if scale != base else ""
        return GPU_CMD.format(base=base, arm=arm, scale=scale, override=override)
    return ARMS_CMD.format(arm=arm, scale=scale)


def pct(v: list[float]) -> str:
    """Mean ± SD over seeds of accuracies in [0, 1], in percent."""
    return f"{fmt_mean_sd(v, '.1f', 100)} %"


def row(scale: str, paper: str, claim: str, measured: str, test: str, verdict_: str, cmd: str) -> str:
    """One line of the findings table."""
    return f"| {paper} | {claim} | {scale} | {measured} | {test} | **{verdict_}** | `{cmd}` |"


def greater(a: list[float], b: list[float], *, family: int = 1, scale: float = 100, fmt: str = "+.1f"
            ) -> tuple[str, str, float]:
    """(test text, verdict, corrected p) of mean(a) > mean(b) by Welch, Bonferroni-corrected over ``family`` (the
    claims a table tests on the same runs; Holm's first step)."""
    r = welch(a, b)
    if r is None:
        return "too few seeds for a test", "inconclusive", math.nan
    p = min(1.0, r.p * family)
    corr = f", Bonferroni ×{family}: {fmt_p(p)}" if family > 1 else ""
    return (f"Welch: diff {r.diff * scale:{fmt}}, {fmt_p(r.p)}{corr}, n = {r.n_a}/{r.n_b}",
            verdict(diff=r.diff, p=p), p)


def arm_result(scale: str, name: str) -> dict | None:
    """An arm's JSON at ``scale``: this machine's run, else the copy kept in ``results/reference/seed_arms``."""
    for base in (ROOT / "results/seed_arms", OUT / "seed_arms"):
        if (base / scale / f"{name}.json").is_file():
            return json.loads((base / scale / f"{name}.json").read_text())
    return None
