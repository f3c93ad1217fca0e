"""Issue 16's seed-paper runs on one GPU machine: the data that fits its upload, a deadline-bound job queue, the pack.

The GPU machine this project is lent sometimes takes a 64 MiB working tree, runs one command of at most 10 minutes
and keeps nothing. So:

* ``prepare`` writes ``.device_data/`` (git-ignored) from ``../shared/data``: 11,000 CIFAR-10 training images (the
  arms' 8,000 private + 2,000 public + 1,000 validation images; the continual configs' 8,000-image private pool is
  drawn from them), 2,000 CIFAR-10 test images, 2,000 *other* CIFAR-10 training images as the continual configs'
  public set (disjoint by construction, so no public image is dropped as a duplicate of a private one) and 3,600
  Food-101 images (the Ke et al. arm's downstream task), each draw seeded.
* ``run`` trains the ``gpu`` scale of :mod:`seed_arms` (one job per arm and seed) and of :mod:`seed_papers`' continual
  config (one job per variant) over ``--workers`` processes sharing the GPU, in seed-major order (every claim gets
  its seeds at the same pace), skipping jobs whose results exist (carry them back in and the queue resumes), and
  starts nothing after ``--soft`` seconds and stops everything at ``--hard`` seconds. σ calibrations are shared
  between the processes through the on-disk cache of :mod:`training.accounting.sigma_cache`.
* ``pack DEST`` writes the results (arm parts, run manifests and metrics, the σ cache, the job log) to one tarball.

Here, afterwards: ``python benchmarks/seed_arms.py merge continual trace ke ganesh --scale gpu``, ``python
benchmarks/seed_papers.py tables --scale gpu`` and ``python benchmarks/seed_findings.py --scale gpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

DATA = ROOT / ".device_data"
SIGMA_CACHE = ROOT / "results/sigma-cache"
LOG = ROOT / "results/seed_gpu_jobs.jsonl"
ARM_ORDER = ("ke", "ganesh", "trace", "continual")


def prepare(shared: Path) -> None:
    """Write ``.device_data/`` from the shared arrays (see the module docstring)."""
    import shutil

    import numpy as np

    def save(folder: Path, split: str, x, y) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / f"{split}.npz", x=x, y=y)

    shutil.rmtree(DATA, ignore_errors=True)
    with np.load(shared / "cifar10/train.npz") as tr, np.load(shared / "cifar10/test.npz") as te:
        xtr, ytr, xte, yte = tr["x"], tr["y"], te["x"], te["y"]
    perm = np.random.default_rng(20261125).permutation(len(ytr))
    test = np.sort(np.random.default_rng(20261126).permutation(len(yte))[:2000])
    for name, idx in (("cifar10", np.sort(perm[:11000])), ("cifar10_public", np.sort(perm[11000:13000]))):
        save(DATA / name, "train", xtr[idx], ytr[idx])
        t = test if name == "cifar10" else test[:10]  # the public set's test split is never read
        save(DATA / name, "test", xte[t], yte[t])
        shutil.copy(shared / "cifar10/classes.txt", DATA / name / "classes.txt")
    with np.load(shared / "food101/train.npz") as tr, np.load(shared / "food101/test.npz") as te:
        i = np.sort(np.random.default_rng(1).permutation(len(tr["y"]))[:3000])
        j = np.sort(np.random.default_rng(2).permutation(len(te["y"]))[:600])
        save(DATA / "food101", "train", tr["x"][i], tr["y"][i])
        save(DATA / "food101", "test", te["x"][j], te["y"][j])
    shutil.copy(shared / "food101/classes.txt", DATA / "food101/classes.txt")
    print(f"wrote {DATA}: {sum(p.stat().st_size for p in DATA.rglob('*') if p.is_file()) / 2**20:.1f} MiB")


def _job(kind: str, name: str, key) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    if kind == "arm":
        import seed_arms

        seed_arms.run_arm(name, "gpu", key)
    else:
        from _seed_runs import _run_one

        _run_one(name, "gpu", key)
    return {"kind": kind, "name": name, "key": key, "seconds": time.time() - t0, "end": time.time()}


def jobs(arms: list[str], runs: bool) -> list[tuple[str, str, object]]:
    """Pending jobs, seed-major: for each seed, its arms (longest first) then its continual-config variants."""
    import re

    import seed_arms
    from _seed_runs import SCALES, read_run, scale_config
    from audit.config import select_variant, variant_names

    cfg = scale_config("continual", SCALES["gpu"])
    variants = variant_names(cfg) if runs else []
    out = []
    for seed in seed_arms.SCALES["gpu"].seeds:
        out += [("arm", a, seed) for a in ARM_ORDER if a in arms and not seed_arms.part_path("gpu", a, seed).exists()]
        out += [("run", "continual", v) for v in variants if re.fullmatch(rf".+-s{seed}", v)
                and read_run(ROOT / select_variant(cfg, v).run_dir()) is None]
    return out


def run(arms: list[str], runs: bool, workers: int, soft: float, hard: float) -> None:
    import multiprocessing as mp

    t0 = time.time()
    os.chdir(ROOT)
    os.environ["DP_AUDIT_SIGMA_CACHE"] = str(SIGMA_CACHE)
    todo = jobs(arms, runs)
    print(f"{len(todo)} job(s) on {workers} worker(s); soft {soft:.0f} s, hard {hard:.0f} s", flush=True)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    pending = {}
    queue = list(todo)
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with open(LOG, "a") as log:
        while queue or pending:
            while queue and len(pending) < workers and time.time() - t0 < soft:
                j = queue.pop(0)
                pending[pool.submit(_job, *j)] = (j, time.time())
            if not pending:
                break
            done, _ = wait(pending, timeout=max(1.0, min(15.0, hard - (time.time() - t0))),
                           return_when=FIRST_COMPLETED)
            for fut in done:
                j, started = pending.pop(fut)
                try:
                    rec = fut.result()
                    rec["status"] = "done"
                except Exception as exc:  # a job's failure is logged, the others go on
                    rec = {"kind": j[0], "name": j[1], "key": j[2], "status": f"failed: {exc!r}"[:400],
                           "seconds": time.time() - started}
                log.write(json.dumps(rec) + "\n")
                log.flush()
                print(f"[{time.time() - t0:5.0f} s] {rec['status'][:60]:<8} {j[1]} {j[2]} in "
                      f"{rec['seconds']:.0f} s", flush=True)
            if time.time() - t0 >= hard:
                print(f"hard deadline: {len(pending)} job(s) stopped, {len(queue)} not started", flush=True)
                for proc in list(getattr(pool, "_processes", {}).values()):
                    proc.terminate()
                break
            if time.time() - t0 >= soft and queue:
                print(f"soft deadline: {len(queue)} job(s) left for a later call", flush=True)
                queue.clear()
    pool.shutdown(wait=False, cancel_futures=True)


def pack(dest: Path) -> None:
    """One tarball of everything a later table needs (no checkpoints)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        for p in sorted((ROOT / "results/seed_arms/gpu").rglob("*.json")):
            tar.add(p, arcname=str(p.relative_to(ROOT)))
        for p in sorted((ROOT / "results/experiments-gpu").glob("*/*.json")):
            tar.add(p, arcname=str(p.relative_to(ROOT)))
        for p in [*sorted(SIGMA_CACHE.glob("*.json")), LOG]:
            if p.exists():
                tar.add(p, arcname=str(p.relative_to(ROOT)))
    print(f"packed {dest} ({dest.stat().st_size / 2**10:.0f} KiB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write .device_data/ from ../shared/data")
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared/data")
    r = sub.add_parser("run", help="run the pending gpu-scale jobs until the deadlines")
    r.add_argument("--arms", nargs="*", default=list(ARM_ORDER), choices=ARM_ORDER)
    r.add_argument("--no-runs", action="store_true", help="skip the continual config's variants")
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--soft", type=float, default=420.0, help="seconds after which no job starts")
    r.add_argument("--hard", type=float, default=540.0, help="seconds after which running jobs are stopped")
    k = sub.add_parser("pack", help="write the results to one tarball")
    k.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.shared)
    elif args.cmd == "run":
        run(args.arms, not args.no_runs, args.workers, args.soft, args.hard)
    else:
        pack(args.dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
