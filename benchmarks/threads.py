"""Torch threads: the default policy (training/threads.py) against one thread, on a quiet and on a loaded machine.

Two jobs, each a fresh ``audit`` process timed from start to exit:

- **quickstart**: ``audit run eval_configs/quickstart.yaml`` (both variants: train, 16 reference models each,
  attacks, ε bounds, report) into a fresh output directory;
- **attack**: ``audit attack RUN --retrain-shadows`` of the quickstart's DP target (16 reference models trained
  in-process, batched, then the attacks) on a fresh copy of a target trained once before the timings.

Each job runs with the default policy (no ``DP_AUDIT_THREADS``/``OMP_NUM_THREADS`` in the environment: the policy
decides) and with ``DP_AUDIT_THREADS=1``, first on the machine as it is ("quiet": whatever else runs on a shared
machine runs; the load average is recorded) and then "loaded": the benchmark itself starts one busy-loop process
per core for the duration. CPU time is user + sys of the whole process tree (``RUSAGE_CHILDREN``); wall is the
elapsed time. ``--policies all`` adds ``DP_AUDIT_THREADS=all`` (every core, torch's own default).

Example (the command that made results/reference/threads.md)::

    .venv/bin/python benchmarks/threads.py --out results/reference/threads.md
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _common import remake_section, run_script

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "eval_configs/quickstart.yaml"
POLICIES = {"default": None, "one": "1", "all": "all"}
POLICY_LABEL = {"default": "default policy", "one": "one thread (DP_AUDIT_THREADS=1)",
                "all": "every core (DP_AUDIT_THREADS=all)"}


@dataclasses.dataclass(frozen=True)
class Timing:
    job: str
    machine: str
    policy: str
    wall: float
    cpu: float
    load_before: float
    load_after: float
    threads: str
    returncode: int


def _busy() -> None:
    while True:
        pass


@contextmanager
def loaded(on: bool) -> Iterator[int]:
    """One busy-loop process per core this process may use while the block runs (none when ``on`` is False)."""
    procs = []
    if on:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_busy, daemon=True) for _ in range(len(os.sched_getaffinity(0)))]
        for p in procs:
            p.start()
        time.sleep(5)  # let the load average start to see them
    try:
        yield len(procs)
    finally:
        for p in procs:
            p.terminate()
            p.join()


def _env(policy: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DP_AUDIT_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    if POLICIES[policy] is not None:
        env["DP_AUDIT_THREADS"] = POLICIES[policy]
    return env


def _threads_used(out: Path) -> str:
    """The ``provenance.threads`` counts recorded in the manifests under ``out`` (target runs, reference models)."""
    import json

    counts: dict[int, int] = {}
    for manifest in out.rglob("manifest.json"):
        t = (json.loads(manifest.read_text()).get("provenance") or {}).get("threads")
        if t:
            counts[t["threads"]] = counts.get(t["threads"], 0) + 1
    return ", ".join(f"{n}×{k}" for k, n in sorted(counts.items())) or "n/a"


def _timed(cmd: list[str], *, env: dict[str, str], out: Path, timeout: float) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}", file=sys.stderr)
    return wall, cpu, proc.returncode


def _target(work: Path, timeout: float) -> Path:
    """The quickstart's DP target, trained once (one thread), without reference models."""
    cmd = [sys.executable, "-m", "audit", "train", CONFIG, "--variant", "dp-eps8", "--set", f"output_dir={work}",
           "--no-progress"]
    subprocess.run(cmd, env=_env("one"), cwd=ROOT, check=True, capture_output=True, timeout=timeout)
    return next(p.parent for p in work.glob("*/manifest.json"))


def run_job(job: str, policy: str, *, work: Path, target: Path, timeout: float) -> tuple[float, float, int, Path]:
    out = Path(tempfile.mkdtemp(dir=work, prefix=f"{job}-{policy}-"))
    if job == "quickstart":
        cmd = [sys.executable, "-m", "audit", "run", CONFIG, "--set", f"output_dir={out}", "--no-progress"]
    else:
        run = out / target.name
        shutil.copytree(target, run, ignore=shutil.ignore_patterns("shadows", "attack*", "signals*"))
        cmd = [sys.executable, "-m", "audit", "attack", str(run), "--config", CONFIG, "--variant", "dp-eps8",
               "--retrain-shadows", "--no-progress"]
    wall, cpu, rc = _timed(cmd, env=_env(policy), out=out, timeout=timeout)
    return wall, cpu, rc, out


def measure(args: argparse.Namespace) -> list[Timing]:
    work = Path(tempfile.mkdtemp(prefix="threads-bench-"))
    rows = []
    try:
        target = _target(work / "target", args.timeout)
        for machine in args.machines:
            with loaded(machine == "loaded"):
                for job in args.jobs:
                    for policy in args.policies:
                        load0 = os.getloadavg()[0]
                        wall, cpu, rc, out = run_job(job, policy, work=work, target=target, timeout=args.timeout)
                        rows.append(Timing(job=job, machine=machine, policy=policy, wall=wall, cpu=cpu,
                                           load_before=load0, load_after=os.getloadavg()[0],
                                           threads=_threads_used(out), returncode=rc))
                        print(rows[-1], flush=True)
                        shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def make_table(args: argparse.Namespace) -> str:
    import torch

    rows = measure(args)
    lines = ["# Torch threads: default policy vs one thread", "",
             "Each row is one fresh `audit` process (its whole process tree timed). *quickstart*: `audit run "
             f"{CONFIG}` (two targets, 16 reference models each, attacks, ε bounds, report); *attack*: `audit attack "
             "RUN --retrain-shadows` of the quickstart's DP target (16 reference models, batched in-process, then the "
             "attacks). *loaded*: the benchmark runs one busy-loop process per core meanwhile. The machine is shared "
             "with other jobs, so *quiet* is never idle: the 1-minute load average before and after each row is "
             "stated. Threads: the `provenance.threads` counts recorded in the runs' manifests (count × threads).",
             "", "| job | machine | threads policy | wall (s) | CPU user+sys (s) | CPU / one thread's | load avg "
             "before → after | threads recorded |", "|---|---|---|---:|---:|---:|---|---|"]
    base = {(r.job, r.machine): r.cpu for r in rows if r.policy == "one"}
    for r in rows:
        ratio = r.cpu / base[(r.job, r.machine)] if base.get((r.job, r.machine)) else float("nan")
        failed = "" if r.returncode == 0 else f" (exit {r.returncode})"
        lines.append(f"| {r.job}{failed} | {r.machine} | {POLICY_LABEL[r.policy]} | {r.wall:.1f} | {r.cpu:.1f} | "
                     f"{ratio:.2f} | {r.load_before:.2f} → {r.load_after:.2f} | {r.threads} |")
    cores = len(os.sched_getaffinity(0))
    lines += ["", f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores ({cores} usable), shared with other "
              f"jobs; torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
              *remake_section("threads.py")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", nargs="+", choices=["quickstart", "attack"], default=["quickstart", "attack"])
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=["default", "one"])
    parser.add_argument("--machines", nargs="+", choices=["quiet", "loaded"], default=["quiet", "loaded"])
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed to one job")
    run_script(parser, make_table, argv, seed=False)


if __name__ == "__main__":
    main()
