"""Issue 16's seed-paper runs on one GPU machine: the data that fits its upload, a deadline-bound job queue, the pack.

The GPU machine this project is lent sometimes takes a 64 MiB working tree, runs one command of at most 10 minutes
and keeps nothing. So:

* ``prepare`` (in :mod:`experiments.gpu.data`, as is ``decode``) writes ``.device_data/`` (git-ignored) from
  ``../shared/data``: 11,000 CIFAR-10 training images (the arms' 8,000 private + 2,000 public + 1,000 validation
  images; the continual configs' 8,000-image private pool is drawn from them), 2,000 CIFAR-10 test images, 2,000
  *other* CIFAR-10 training images as the continual configs' public set (disjoint by construction, so no public
  image is dropped as a duplicate of a private one) and 3,600 Food-101 images (the Ke et al. arm's downstream
  task), each draw seeded: the ``gpu`` scale.
  ``prepare --jpeg`` instead packs all of CIFAR-10 (55,000 images) and the same Food-101 slice as JPEG in 52 MiB;
  ``decode`` on the device turns it into ``.device_data/cifar10_full`` and ``.device_data/food101`` for the
  ``gpu_full`` scale (issue 16's full sizes).
* ``run [--scale gpu|gpu_full]`` trains that scale of :mod:`experiments.arms` (one job per arm and seed; the ViT arm one
  job per (seed, ε), at ``gpu_vit`` under ``--scale gpu`` and ``gpu_full_vit`` under ``--scale gpu_full``; the
  continual arm one per (seed, training): non-DP, σ = 0, scratch, continual, plateau; the tr(H) arm one per (seed,
  training); the Ganesh et al. arm one per (seed, public budget or barrier pair); the Ke et al. arm one per (seed,
  head init or LP-FFT split), its source model trained once and shared) and of
  :mod:`experiments.papers`' configs (``--configs continual finetune``, one job per variant; the fine-tuning variants
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

Here, afterwards: ``python -m experiments arms merge ARM... --scale SCALE``, ``python -m experiments papers
tables --scale gpu`` and ``python -m experiments findings``.

A lease: here ``prepare --jpeg`` and the wheels of opacus, dp-accounting, dm-tree and pydantic (+ pydantic-core,
annotated-types, typing-inspection, typing-extensions) in ``.whl/``, both git-ignored (timm is on the device
already), σ calibrated here into ``results/sigma-cache``; the device tool's ``run`` with ``carry`` = ``.whl``,
``.device_data/cifar10.jpeg.npz``, ``results/sigma-cache`` and, where some of an arm's parts already ran here,
``results/seed_arms/gpu_full/parts`` (the queue skips them), and the command::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
    python3 -m experiments gpu decode
    python3 -m experiments gpu run --scale gpu_full --arms ganesh --no-runs --workers 13 --soft 290 --hard 560
    python3 -m experiments gpu pack $OUT/x.tgz

then the same ``run`` line with ``--soft 20`` and what is left of the lease as ``--hard`` on the still-warm machine
(finished jobs are skipped; a machine that is given back keeps nothing: carry the pack's results back in or start
again). A shared pre-trained model (the ViT arm's, ``results/seed_arms/<scale>/pretrained/*.safetensors``, 21 MiB
for ViT-Tiny) comes back too when the command splits it under ``$OUT`` (``split -b 15m``; files over 16 MiB stay
behind) with its ``sha256sum``: joined here, ``python -m experiments arms adopt FILE --scale SCALE --sha256
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
from pathlib import Path

from experiments.arms.scales import SCALES
from experiments.gpu.data import DATA, pack_jpeg, prepare, unpack_jpeg  # the data that travels
from experiments.gpu.pack import pack, unpack
from experiments.gpu.profile import profile
from experiments.gpu.queue import ARM_ORDER, _arm_parts, run
from experiments.paths import ROOT


def main(argv: list[str] | None = None, prog: str = "python -m experiments gpu") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
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
                   help="run an arm at another scale of experiments.arms.scales, e.g. vit=gpu_full_vit_long")
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
        overrides = dict(a.split("=", 1) for a in args.arm_scale if "=" in a)
        bad = [a for a in args.arm_scale if "=" not in a] + [f"{k}={v}" for k, v in overrides.items()
                                                              if k not in ARM_ORDER or v not in SCALES]
        if bad:
            parser.error(f"--arm-scale takes ARM=SCALE with an arm of {', '.join(ARM_ORDER)} and a scale of "
                         f"experiments.arms.scales, got {' '.join(bad)}")
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
