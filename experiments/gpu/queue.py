"""The deadline-bound job queue of a lent GPU machine: the pending arm parts and config variants, seed-major, run
over worker processes that share the GPU until a soft deadline (start nothing more) and a hard one (stop all)."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from experiments.paths import ROOT

SIGMA_CACHE = ROOT / "results/sigma-cache"
LOG = ROOT / "results/seed_gpu_jobs.jsonl"
ARM_ORDER = ("vit", "ke", "ganesh", "trace", "continual")
ARM_SCALE = {"gpu": {"vit": "gpu_vit"}, "gpu_full": {"vit": "gpu_full_vit"}}  # per --scale, an arm that runs at
# another scale (default: --scale)


def arm_scale(arm: str, base: str = "gpu", overrides: dict[str, str] | None = None) -> str:
    """The :mod:`experiments.arms` scale an arm runs at under ``--scale base`` (``overrides``: ``--arm-scale``)."""
    return (overrides or {}).get(arm) or ARM_SCALE.get(base, {}).get(arm, base)


def _job(kind: str, name: str, key, base: str = "gpu", part=None) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    if kind == "arm":
        runner.run_arm(name, base, key, part)  # an arm job's base is its arm scale (jobs())
    else:
        from experiments.papers.runs import _run_one

        _run_one(name, base, key)
    return {"kind": kind, "name": name, "key": key, "part": part, "seconds": time.time() - t0,
            "end": time.time()}


def jobs(arms: list[str], runs: bool, bases: list[str] | None = None, scale: str = "gpu",
         overrides: dict[str, str] | None = None, skip: frozenset[str] = frozenset(),
         configs: tuple[str, ...] = ("continual",)) -> list[tuple]:
    """Pending jobs, seed-major: for each seed, its arms (longest first) then its variants of the :mod:`experiments.papers.runs`
    ``configs`` (``continual``, ``finetune``; ``bases`` keeps only those variant bases, e.g. ``sw0`` or
    ``lpfft25-e1``). An arm job names the arm's own scale (:func:`arm_scale`), a variant job the base scale.
    ``finetune`` puts its source (``finetune_source``) first when it has not run; its variants wait for it
    (:func:`ready`). ``skip`` names arm parts by their file's stem (``ganesh.s4.same``) that run elsewhere
    meanwhile (on the CPU the lease was sent from)."""
    import re

    from experiments.arms import runner
    from experiments.papers.runs import SCALES, read_run, scale_config
    from audit.config import select_variant, variant_names

    out, variants = [], {}
    for name in configs if runs else ():
        cfg = scale_config(name, SCALES[scale])
        variants[name] = [v for v in variant_names(cfg) if (bases is None or v.rsplit("-s", 1)[0] in bases)
                          and read_run(ROOT / select_variant(cfg, v).run_dir()) is None]
        if name == "finetune" and variants[name] and not _source_done(scale):
            out.append(("run", "finetune_source", None, scale))
    parts = _arm_parts(arms, scale, overrides)
    for seed in runner.SCALES[scale].seeds:
        out += [("arm", a, s, sc, e) for s, a, sc, e, path in parts
                if s == seed and not path.exists() and path.stem not in skip]
        for name, vs in variants.items():
            out += [("run", name, v, scale) for v in vs if re.fullmatch(rf".+-s{seed}", v)]
    return out


def _source_done(scale: str) -> bool:
    """Whether the fine-tuning configs' source model has been trained at ``scale`` (its run directory finished)."""
    from experiments.papers.runs import SCALES, read_run, scale_config

    return read_run(ROOT / scale_config("finetune_source", SCALES[scale]).run_dir()) is not None


def ready(j: tuple) -> bool:
    """Whether a pending job may start: a fine-tuning variant once its source has run, every other job at once."""
    return not (j[0] == "run" and j[1] == "finetune") or _source_done(j[3])


def _arm_parts(arms: list[str], scale: str, overrides: dict[str, str] | None = None) -> list[tuple]:
    """Every part of ``arms`` under ``--scale scale``, done or not, seed-major: ``(seed, arm, arm scale, part, part
    file)``. The ViT arm has one part per (seed, ε), the other arms one per (seed, training or run): each short
    enough to finish inside one command, and as many at once as the GPU holds."""
    from experiments.arms import runner

    out = []
    for seed in runner.SCALES[scale].seeds:
        for a in (a for a in ARM_ORDER if a in arms):
            sc = arm_scale(a, scale, overrides)
            if seed in runner.SCALES[sc].seeds:
                out += [(seed, a, sc, e, runner.part_path(sc, a, seed, e))
                        for e in runner.SPLITS[a].parts(runner.SCALES[sc])]
    return out


def run(arms: list[str], runs: bool, workers: int, soft: float, hard: float, bases: list[str] | None = None,
        first: list[str] = (), scale: str = "gpu", *, overrides: dict[str, str] | None = None,
        skip: frozenset[str] = frozenset(), configs: tuple[str, ...] = ("continual",), job=None,
        log_path: Path | None = None, is_ready=None) -> None:
    """Run the pending jobs (:func:`jobs`) until the deadlines, a job only once it is :func:`ready`; ``job`` (a
    module-level function, default :func:`_job`), ``log_path`` (default ``results/seed_gpu_jobs.jsonl``) and
    ``is_ready`` (default :func:`ready`) are for tests."""
    import multiprocessing as mp

    t0 = time.time()
    job, log_path, is_ready = job or _job, log_path or LOG, is_ready or ready
    os.chdir(ROOT)
    os.environ["DP_AUDIT_SIGMA_CACHE"] = str(SIGMA_CACHE)
    todo = jobs(arms, runs, bases, scale, overrides, skip, configs)
    todo.sort(key=lambda j: j[1] not in first and (j[0] == "arm" or str(j[2]).rsplit("-s", 1)[0] not in first))
    # the soft deadline counts from here, once the queue is known: the imports and the scan of finished jobs take
    # seconds, and a short --soft measured from the start let no job start at all (the gpu_full lease's resume call)
    ready_at = time.time()
    print(f"{len(todo)} job(s) on {workers} worker(s); soft {soft:.0f} s after {ready_at - t0:.0f} s of setup, hard "
          f"{hard:.0f} s", flush=True)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    pending = {}
    queue = list(todo)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        while queue or pending:
            while len(pending) < workers and time.time() - ready_at < soft:
                j = next((j for j in queue if is_ready(j)), None)  # e.g. a fine-tuning waits for its source
                if j is None:
                    break
                queue.remove(j)
                pending[pool.submit(job, *j)] = (j, time.time())
            if not pending:
                if queue:
                    print(f"{len(queue)} job(s) wait for what did not run (e.g. the fine-tuning source)", flush=True)
                break
            done, _ = wait(pending, timeout=max(1.0, min(15.0, hard - (time.time() - t0))),
                           return_when=FIRST_COMPLETED)
            for fut in done:
                j, started = pending.pop(fut)
                try:
                    rec = fut.result()
                    rec["status"] = "done"
                except Exception as exc:  # a job's failure is logged, the others go on
                    rec = {"kind": j[0], "name": j[1], "key": j[2], "part": j[4] if len(j) > 4 else None,
                           "status": f"failed: {exc!r}"[:400],
                           "seconds": time.time() - started}
                log.write(json.dumps(rec) + "\n")
                log.flush()
                print(f"[{time.time() - t0:5.0f} s] {rec['status'][:60]:<8} {_label(j)} in {rec['seconds']:.0f} s",
                      flush=True)
            if time.time() - t0 >= hard:
                print(f"hard deadline: {len(pending)} job(s) stopped, {len(queue)} not started", flush=True)
                for j, started in pending.values():  # what the next call must size for
                    print(f"[{time.time() - t0:5.0f} s] stopped  {_label(j)} after {time.time() - started:.0f} s",
                          flush=True)
                for proc in list(getattr(pool, "_processes", {}).values()):
                    proc.terminate()
                break
            if time.time() - ready_at >= soft and queue:
                print(f"soft deadline: {len(queue)} job(s) left for a later call", flush=True)
                queue.clear()
    pool.shutdown(wait=False, cancel_futures=True)


def _label(j: tuple) -> str:
    """A job in the log: ``continual s1 nondp`` (an arm's part), ``continual continual-dec-s0`` (a config run)."""
    return f"{j[1]} s{j[2]} {j[4]}" if j[0] == "arm" else f"{j[1]} {j[2] or ''}".rstrip()
