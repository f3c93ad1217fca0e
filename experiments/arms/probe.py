"""The ViT arm's public pre-training recipe on this CPU: learning-rate schedule and length against test accuracy.

The GPU ViT arm (``gpu_full_vit``) pre-trained each seed for 2,000 constant-rate steps and reached 44.8 %, under
issue 16's 60 %. Its next scale (``gpu_full_vit_long``) spends the lease's pre-training on one longer run with a
cosine schedule. This measures, at the CPU arm's size (``cpu_hour_vit``: the 64-wide 12-block ViT on 8×8 patches,
18,000 public CIFAR-10 images, batch 128, AdamW at 1e-3), what the schedule, the length and the crops and flips
(``--augment``, as the GPU arms pre-train) do: one process per run, one torch thread each, the arm's own
phase/train/test functions. Accuracy is on the arm's 1,000 test images; the seeds pair the runs (one
initialisation and batch order per seed).

    .venv/bin/python -m experiments vit-probe --runs constant:0:2000 cosine:100:2000 cosine:400:8000 \\
        --seeds 0 1 --workers 2 [--augment] --out results/reference/vit_pretrain_probe[.augment].md

Each ``--runs`` entry is ``schedule:warmup:steps``."""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SCALE = "cpu_hour_vit"


def one(schedule: str, warmup: int, steps: int, seed: int, augment: bool) -> tuple[float, float]:
    """(test accuracy, seconds) of one pre-training run."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from experiments.arms.common import CROP_FLIP, build, load_arm_data, phase, test_acc, train
    from experiments.arms.scales import SCALES
    from experiments.arms.vit import public_parts

    sc = SCALES[SCALE]
    data = load_arm_data(sc.with_(public=sc.vit_public))
    parts = public_parts(data.public, sc.vit_tune_fraction)
    t0 = time.perf_counter()
    model = build(sc, data, seed=seed, arch=sc.vit_arch, kwargs=sc.vit_kwargs)
    model = train(model, [phase("public", parts.pretrain, scale=sc, steps=steps, sigma=None, seed=seed, index=0,
                                lr=sc.vit_lr, schedule=schedule, warmup_steps=warmup,
                                augment=CROP_FLIP if augment else None)], seed=seed)
    return test_acc(model, data.test, "cpu"), time.perf_counter() - t0


def parse_run(text: str) -> tuple[str, int, int]:
    try:
        schedule, warmup, steps = text.split(":")
        return schedule, int(warmup), int(steps)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a run is schedule:warmup:steps, e.g. cosine:100:2000; got {text!r}")


def make_table(args: argparse.Namespace, argv: list[str]) -> str:
    """The table of every (run, seed), with the command (``argv``: its options) that re-makes it."""
    import multiprocessing as mp

    jobs = sorted(((r, s) for r in args.runs for s in args.seeds), key=lambda j: -j[0][2])  # longest first
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn")) as pool:
        futs = {job: pool.submit(one, *job[0], job[1], args.augment) for job in jobs}
        res = {job: f.result() for job, f in futs.items()}
    aug = "with crops and flips" if args.augment else "without augmentation"
    lines = [f"# ViT pre-training recipe (CPU probe, {aug})", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             "| schedule | warm-up | steps | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean | seconds "
             "per run |", "|---|---|---|" + "---|" * len(args.seeds) + "---|---|"]
    for r in args.runs:
        accs = [res[(r, s)][0] for s in args.seeds]
        secs = statistics.mean(res[(r, s)][1] for s in args.seeds)
        lines.append(f"| {r[0]} | {r[1]} | {r[2]:,} | " + " | ".join(f"{100 * a:.1f} %" for a in accs)
                     + f" | {100 * statistics.mean(accs):.1f} % | {secs:.0f} |")
    return "\n".join(lines + ["", f"Machine: {os.cpu_count()} CPU cores, one torch thread per run.", "",
                              "## Re-make", "", "```",
                              shlex.join([".venv/bin/python", "-m", "experiments", "vit-probe", *argv]), "```", ""])


def main(argv: list[str] | None = None, prog: str = "python -m experiments vit-probe") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", type=parse_run, default=[parse_run("constant:0:2000"),
                                                                      parse_run("cosine:100:2000")])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--augment", action="store_true", help="crops and flips in the pre-training")
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown table here")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    text = make_table(args, argv)
    print(text)
    if args.out:
        from foundation.io import write_text

        write_text(args.out, text)
    return 0
