"""Issue 16's seed-paper runs on one GPU machine: the data that fits its upload, a deadline-bound job queue, the pack.

The GPU machine this project is lent sometimes takes a 64 MiB working tree, runs one command of at most 10 minutes
and keeps nothing. So:

* ``prepare`` (in :mod:`_seed_gpu_data`, as is ``decode``) writes ``.device_data/`` (git-ignored) from
  ``../shared/data``: 11,000 CIFAR-10 training images (the arms' 8,000 private + 2,000 public + 1,000 validation
  images; the continual configs' 8,000-image private pool is drawn from them), 2,000 CIFAR-10 test images, 2,000
  *other* CIFAR-10 training images as the continual configs' public set (disjoint by construction, so no public
  image is dropped as a duplicate of a private one) and 3,600 Food-101 images (the Ke et al. arm's downstream
  task), each draw seeded: the ``gpu`` scale.
  ``prepare --jpeg`` instead packs all of CIFAR-10 (55,000 images) and the same Food-101 slice as JPEG in 52 MiB;
  ``decode`` on the device turns it into ``.device_data/cifar10_full`` and ``.device_data/food101`` for the
  ``gpu_full`` scale (issue 16's full sizes).
* ``run [--scale gpu|gpu_full]`` trains that scale of :mod:`seed_arms` (one job per arm and seed; the ViT arm one
  job per (seed, ε), at ``gpu_vit`` under ``--scale gpu`` and ``gpu_full_vit`` under ``--scale gpu_full``; the
  continual arm one per (seed, training): non-DP, σ = 0, scratch, continual, plateau; the tr(H) arm one per (seed,
  training); the Ganesh et al. arm one per (seed, public budget or barrier pair); the Ke et al. arm one per (seed,
  head init or LP-FFT split), its source model trained once and shared) and of
  :mod:`seed_papers`' configs (``--configs continual finetune``, one job per variant; the fine-tuning variants
  start once their source, one job, has run, and ``pack`` brings its weights back: carry
  ``results/experiments-gpu-full/ft-source`` to a later lease and it is not trained again) over ``--workers``
  processes sharing the GPU, in seed-major order (``--first`` moves arms, configs or variants ahead), skipping jobs
  whose results exist (carry them back in and the queue resumes), starting nothing once ``--soft`` seconds have
  passed since the queue was ready and stopping everything at ``--hard`` seconds. σ calibrations are shared
  between the processes through the on-disk cache of :mod:`training.accounting.sigma_cache`. One process alone
  leaves an H100 mostly idle (the DP step is host-bound); 8-12 processes keep it busy
  (``results/reference/seed_gpu/``).
* ``profile`` times one process alone (non-DP, DP hooks, DP bk) and lists the top device kernels of 12 DP steps.
* ``pack DEST`` writes the results (arm parts, run manifests and metrics, the fine-tuning source's weights, the σ
  cache, the job log) to one tarball; ``unpack`` puts a pack's JSON and safetensors back under ``results/``.

Here, afterwards: ``python benchmarks/seed_arms.py merge ARM... --scale SCALE``, ``python benchmarks/seed_papers.py
tables --scale gpu`` and ``python benchmarks/seed_findings.py``.

A lease: here ``prepare --jpeg`` and the wheels of opacus, dp-accounting, dm-tree and pydantic (+ pydantic-core,
annotated-types, typing-inspection, typing-extensions) in ``.whl/``, both git-ignored (timm is on the device
already), σ calibrated here into ``results/sigma-cache``; the device tool's ``run`` with ``carry`` = ``.whl``,
``.device_data/cifar10.jpeg.npz``, ``results/sigma-cache`` and, where some of an arm's parts already ran here,
``results/seed_arms/gpu_full/parts`` (the queue skips them), and the command::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
    python3 benchmarks/seed_gpu.py decode
    python3 benchmarks/seed_gpu.py run --scale gpu_full --arms ganesh --no-runs --workers 13 --soft 290 --hard 560
    python3 benchmarks/seed_gpu.py pack $OUT/x.tgz

then the same ``run`` line with ``--soft 20`` and what is left of the lease as ``--hard`` on the still-warm machine
(finished jobs are skipped; a machine that is given back keeps nothing: carry the pack's results back in or start
again). A shared pre-trained model (the ViT arm's, ``results/seed_arms/<scale>/pretrained/*.safetensors``, 21 MiB
for ViT-Tiny) comes back too when the command splits it under ``$OUT`` (``split -b 15m``; files over 16 MiB stay
behind) with its ``sha256sum``: joined here, ``python benchmarks/seed_arms.py adopt FILE --scale SCALE --sha256
HEX`` makes it this machine's cached model, and the jobs the lease left fine-tune the lease's weights on this
CPU. Size a call before making it: jobs that share the GPU slow each other about in proportion, and a job
stopped at ``--hard`` returns nothing. A 1,000-step DP ResNet-20 run costs about 20 s of the whole GPU (110-130 s
with 6 at a time, 230-270 s with 12), non-DP steps ~5 times less, tr(H) estimates more; a Ganesh et al. run, with
its evaluations, ~35 s (9 at a time: 315 s): keep each job's runs × the jobs at once × that cost under ``--hard``.
``--skip ARM.sSEED.PART ...`` leaves out parts started on this CPU meanwhile, and a loop that packs to ``$OUT``
every 25 s in the background returns what finished even if the device's limit cuts the call. Every lease as it
ran, what it measured, and the plan for the next ones: ``results/reference/seed_gpu/LEASES.md``."""

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

from _seed_gpu_data import DATA, pack_jpeg, prepare, unpack_jpeg  # noqa: E402  (the data that travels)

SIGMA_CACHE = ROOT / "results/sigma-cache"
LOG = ROOT / "results/seed_gpu_jobs.jsonl"
ARM_ORDER = ("vit", "ke", "ganesh", "trace", "continual")
ARM_SCALE = {"gpu": {"vit": "gpu_vit"}, "gpu_full": {"vit": "gpu_full_vit"}}  # per --scale, an arm that runs at
# another scale (default: --scale)


def arm_scale(arm: str, base: str = "gpu", overrides: dict[str, str] | None = None) -> str:
    """The :mod:`seed_arms` scale an arm runs at under ``--scale base`` (``overrides``: ``--arm-scale``)."""
    return (overrides or {}).get(arm) or ARM_SCALE.get(base, {}).get(arm, base)


def _job(kind: str, name: str, key, base: str = "gpu", part=None) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    if kind == "arm":
        import seed_arms

        seed_arms.run_arm(name, base, key, part)  # an arm job's base is its arm scale (jobs())
    else:
        from _seed_runs import _run_one

        _run_one(name, base, key)
    return {"kind": kind, "name": name, "key": key, "part": part, "seconds": time.time() - t0,
            "end": time.time()}


def jobs(arms: list[str], runs: bool, bases: list[str] | None = None, scale: str = "gpu",
         overrides: dict[str, str] | None = None, skip: frozenset[str] = frozenset(),
         configs: tuple[str, ...] = ("continual",)) -> list[tuple]:
    """Pending jobs, seed-major: for each seed, its arms (longest first) then its variants of the :mod:`_seed_runs`
    ``configs`` (``continual``, ``finetune``; ``bases`` keeps only those variant bases, e.g. ``sw0`` or
    ``lpfft25-e1``). An arm job names the arm's own scale (:func:`arm_scale`), a variant job the base scale.
    ``finetune`` puts its source (``finetune_source``) first when it has not run; its variants wait for it
    (:func:`ready`). ``skip`` names arm parts by their file's stem (``ganesh.s4.same``) that run elsewhere
    meanwhile (on the CPU the lease was sent from)."""
    import re

    import seed_arms
    from _seed_runs import SCALES, read_run, scale_config
    from audit.config import select_variant, variant_names

    out, variants = [], {}
    for name in configs if runs else ():
        cfg = scale_config(name, SCALES[scale])
        variants[name] = [v for v in variant_names(cfg) if (bases is None or v.rsplit("-s", 1)[0] in bases)
                          and read_run(ROOT / select_variant(cfg, v).run_dir()) is None]
        if name == "finetune" and variants[name] and not _source_done(scale):
            out.append(("run", "finetune_source", None, scale))
    parts = _arm_parts(arms, scale, overrides)
    for seed in seed_arms.SCALES[scale].seeds:
        out += [("arm", a, s, sc, e) for s, a, sc, e, path in parts
                if s == seed and not path.exists() and path.stem not in skip]
        for name, vs in variants.items():
            out += [("run", name, v, scale) for v in vs if re.fullmatch(rf".+-s{seed}", v)]
    return out


def _source_done(scale: str) -> bool:
    """Whether the fine-tuning configs' source model has been trained at ``scale`` (its run directory finished)."""
    from _seed_runs import SCALES, read_run, scale_config

    return read_run(ROOT / scale_config("finetune_source", SCALES[scale]).run_dir()) is not None


def ready(j: tuple) -> bool:
    """Whether a pending job may start: a fine-tuning variant once its source has run, every other job at once."""
    return not (j[0] == "run" and j[1] == "finetune") or _source_done(j[3])


def _arm_parts(arms: list[str], scale: str, overrides: dict[str, str] | None = None) -> list[tuple]:
    """Every part of ``arms`` under ``--scale scale``, done or not, seed-major: ``(seed, arm, arm scale, part, part
    file)``. The ViT arm has one part per (seed, ε), the other arms one per (seed, training or run): each short
    enough to finish inside one command, and as many at once as the GPU holds."""
    import seed_arms

    out = []
    for seed in seed_arms.SCALES[scale].seeds:
        for a in (a for a in ARM_ORDER if a in arms):
            sc = arm_scale(a, scale, overrides)
            if seed in seed_arms.SCALES[sc].seeds:
                out += [(seed, a, sc, e, seed_arms.part_path(sc, a, seed, e))
                        for e in seed_arms.SPLITS[a].parts(seed_arms.SCALES[sc])]
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


def profile(steps: int, out: Path | None) -> None:
    """One process alone on the device: seconds per step of the arms' loop (ResNet-20, batch 256, the gpu scale's
    data) non-DP, DP with Opacus hooks and DP with ``bk``, then the top device kernels of 12 DP (hooks) steps."""
    import dataclasses
    import statistics

    import torch

    import seed_arms
    from audit.seed_arms.common import build, load_arm_data, phase, train
    from training.device import resolve_device, synchronize

    dev = resolve_device("auto")
    scale = seed_arms.SCALES["gpu"]
    data = load_arm_data(scale, device=dev)
    lines = [f"device {dev}, torch {torch.__version__}, {steps} steps per mode (median of the last {steps - 10})"]

    def timed(sigma, mode, n, on=None):
        spec = phase("private", data.private, scale=scale, steps=n, sigma=sigma, seed=0, index=0)
        if mode:
            spec = dataclasses.replace(spec, privacy=spec.privacy.model_copy(update={"grad_sample_mode": mode}))
        stamps = []

        def hook(g, *_):
            synchronize(dev)
            stamps.append(time.perf_counter())
            if on:
                on(g)

        train(build(scale, data, seed=0, device=dev), [spec], seed=0, device=dev, on_step=hook)
        return statistics.median(b - a for a, b in zip(stamps[10:], stamps[11:]))

    for label, sigma, mode in (("non-DP", None, None), ("DP, hooks", 1.0, "hooks"), ("DP, bk", 1.0, "bk")):
        try:
            lines.append(f"{label}: {1000 * timed(sigma, mode, steps):.1f} ms/step")
        except Exception as exc:  # a mode that fails here is reported, the others still run
            lines.append(f"{label}: failed ({exc!r})"[:300])
        print(lines[-1], flush=True)
    from torch.profiler import ProfilerActivity, profile as tprofile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type != "cpu" else [])
    with tprofile(activities=acts) as prof:
        timed(1.0, "hooks", 12)
    key = "self_device_time_total" if dev.type != "cpu" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)
    print("\n".join(lines[1:]) + "\n" + table, flush=True)
    if out:
        out.write_text("\n".join(lines) + "\n\n" + table + "\n")


def unpack(tarball: Path) -> None:
    """Extract a pack into ``results/`` (JSON, and the fine-tuning source's safetensors weights, never a pickle;
    paths checked), e.g. the committed GPU results."""
    with tarfile.open(tarball, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith("results/")
                   and ".." not in Path(m.name).parts and m.name.endswith((".json", ".jsonl", ".safetensors"))]
        tar.extractall(ROOT, members=members, filter="data")
    print(f"unpacked {len(members)} file(s) from {tarball}")


def pack(dest: Path) -> None:
    """One tarball of everything a later table needs (no checkpoints)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        import seed_arms

        names = {n for n in seed_arms.SCALES if n.startswith("gpu")}
        arms = sorted(p for d in names for p in (ROOT / "results/seed_arms" / d).rglob("*.json"))
        for p in arms:
            tar.add(p, arcname=str(p.relative_to(ROOT)))
        for p in sorted(p for d in ("experiments-gpu", "experiments-gpu-full")
                        for p in (ROOT / "results" / d).glob("*/*.json")):
            tar.add(p, arcname=str(p.relative_to(ROOT)))
        for p in sorted(ROOT.glob("results/experiments-gpu*/ft-source/model.safetensors")):  # a later lease's start
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
    p.add_argument("--jpeg", action="store_true", help="instead: all of CIFAR-10 as JPEG "
                   "(.device_data/cifar10.jpeg.npz, ~48 MiB); decode it on the device with `decode`")
    dj = sub.add_parser("decode", help="on the device: .device_data/cifar10.jpeg.npz -> .device_data/cifar10_full/")
    dj.add_argument("--src", type=Path, default=DATA / "cifar10.jpeg.npz")
    dj.add_argument("--folder", type=Path, default=DATA / "cifar10_full")
    r = sub.add_parser("run", help="run the pending gpu-scale jobs until the deadlines")
    r.add_argument("--arms", nargs="*", default=list(ARM_ORDER), choices=ARM_ORDER)
    r.add_argument("--no-runs", action="store_true", help="skip the configs' variants")
    r.add_argument("--configs", nargs="*", default=["continual"], choices=("continual", "finetune"),
                   help="whose variants to run: the continual config's, the fine-tuning configs' (after their "
                        "source); default continual")
    r.add_argument("--variants", nargs="*", default=None,
                   help="only these variant bases of the configs (e.g. sw0 sw1, lpfft25-e1); default all")
    r.add_argument("--first", nargs="*", default=[],
                   help="arms, configs or variant bases whose pending jobs start first")
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--scale", choices=("gpu", "gpu_full"), default="gpu",
                   help="gpu: the 11,000-image slice; gpu_full: all of CIFAR-10 after `prepare --jpeg` and `decode`")
    r.add_argument("--arm-scale", nargs="*", default=[], metavar="ARM=SCALE",
                   help="run an arm at another seed_arms scale, e.g. vit=gpu_full_vit_long")
    r.add_argument("--skip", nargs="*", default=[], metavar="ARM.sSEED.PART",
                   help="arm parts running elsewhere meanwhile, by their file's stem, e.g. ganesh.s4.same")
    r.add_argument("--soft", type=float, default=420.0,
                   help="seconds after the queue is ready (imports and the scan done) after which no job starts")
    r.add_argument("--hard", type=float, default=540.0, help="seconds after which running jobs are stopped")
    k = sub.add_parser("pack", help="write the results to one tarball")
    k.add_argument("dest", type=Path)
    u = sub.add_parser("unpack", help="extract a pack's JSON into results/")
    u.add_argument("tarball", type=Path)
    f = sub.add_parser("profile", help="one process alone: ms/step non-DP / DP hooks / DP bk, top kernels")
    f.add_argument("--steps", type=int, default=60)
    f.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.cmd == "prepare" and args.jpeg:
        pack_jpeg(args.shared, DATA / "cifar10.jpeg.npz")
    elif args.cmd == "prepare":
        prepare(args.shared)
    elif args.cmd == "decode":
        unpack_jpeg(args.src, args.folder)
    elif args.cmd == "run":
        import seed_arms

        overrides = dict(a.split("=", 1) for a in args.arm_scale if "=" in a)
        bad = [a for a in args.arm_scale if "=" not in a] + [f"{k}={v}" for k, v in overrides.items()
                                                              if k not in ARM_ORDER or v not in seed_arms.SCALES]
        if bad:
            parser.error(f"--arm-scale takes ARM=SCALE with an arm of {', '.join(ARM_ORDER)} and a scale of "
                         f"benchmarks/seed_arms.py, got {' '.join(bad)}")
        unknown = sorted(set(args.skip) - {path.stem for *_, path in _arm_parts(args.arms, args.scale, overrides)})
        if unknown:
            parser.error(f"--skip names no part of the arms {' '.join(args.arms)} at --scale {args.scale}: "
                         f"{' '.join(unknown)} (a part is ARM.sSEED.PART, e.g. ganesh.s4.same)")
        run(args.arms, not args.no_runs, args.workers, args.soft, args.hard, args.variants, args.first, args.scale,
            overrides=overrides, skip=frozenset(args.skip), configs=tuple(args.configs))
    elif args.cmd == "unpack":
        unpack(args.tarball)
    elif args.cmd == "profile":
        profile(args.steps, args.out)
    else:
        pack(args.dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
