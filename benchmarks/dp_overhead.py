"""DP overhead: wall time of one DP-SGD step over one non-DP step, same model, batch and device, one run.

Models: the small CNN, the CIFAR ResNet-20 (BatchNorm replaced by GroupNorm, 0.27M parameters) and a ViT-S
(timm ``vit_small_patch16_224`` shape: embed 384, 6 heads, MLP 1536) at 32x32 with patch 4 (65 tokens), with
``--vit-depth`` blocks (12 in ViT-S; fewer on a CPU to keep the run to minutes). Every per-sample-gradient mode
runs: Opacus's ``hooks``, ``functorch`` and ``ghost`` (two backward passes) and our book-keeping ``bk`` (one
backward pass, :mod:`training.dp.bk`). Steps are interleaved (DP, non-DP, DP, ...) and the median of each is
reported, so machine noise hits both sides alike; only the ratios are meant to be compared across machines.
On a CPU shared with other jobs run it with one torch thread (the default): with more threads than free cores
every small operation waits for a descheduled worker thread, which inflates the modes made of many small
operations (per-layer norms and sums) far beyond their arithmetic.

    .venv/bin/python benchmarks/dp_overhead.py --out results/reference/dp_overhead.md
    .venv/bin/python benchmarks/dp_overhead.py --quick    # fewer repeats, print only
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import remake_section, run_script  # noqa: E402
from training.config import ModelConfig, OptimConfig, PrivacyConfig  # noqa: E402
from training.device import is_cuda, resolve_device, synchronize  # noqa: E402
from training.dp.engine import make_stepper  # noqa: E402
from training.dp.recipe import TrainRecipe  # noqa: E402
from training.models import build_model, count_parameters  # noqa: E402

MODES = ("hooks", "functorch", "ghost", "bk")


def models(vit_depth: int) -> dict[str, ModelConfig]:
    return {
        "small_cnn": ModelConfig(arch="small_cnn"),
        "resnet20_cifar (GroupNorm)": ModelConfig(arch="resnet20_cifar"),
        f"vit_small p4 ({vit_depth} blocks)": ModelConfig(arch="vit_small_patch16_224",
                                                          kwargs={"depth": vit_depth, "drop_path_rate": 0.0}),
    }


def make(cfg: ModelConfig, *, dp: bool, mode: str, batch: int, device: torch.device):
    built = build_model(cfg, num_classes=10, input_shape=(3, 32, 32), seed=0)
    privacy = PrivacyConfig(enabled=dp, noise_multiplier=1.0 if dp else None, grad_sample_mode=mode)
    recipe = TrainRecipe.from_privacy(privacy=privacy, optim=OptimConfig(name="sgd", lr=0.01), steps=10_000,
                                      batch_size=batch, noise_multiplier=1.0 if dp else None,
                                      physical_batch_size=batch)
    return make_stepper(model=built.module, recipe=recipe, sample_rate=0.01,
                        generator=torch.Generator(device=device) if dp else None, device=device), built


def timed(stepper, x, y, device: torch.device) -> float:
    synchronize(device)
    t0 = time.perf_counter()
    stepper.step(x, y)
    synchronize(device)
    return time.perf_counter() - t0


def make_table(args: argparse.Namespace) -> str:
    repeats = 3 if args.quick else args.repeats
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device, field="--device")
    g = torch.Generator().manual_seed(args.seed)
    x = torch.rand(args.batch, 3, 32, 32, generator=g).to(device)
    y = torch.randint(0, 10, (args.batch,), generator=g).to(device)
    rows = []
    load_before = os.getloadavg()[0]
    t_start = time.perf_counter()
    for name, cfg in models(args.vit_depth).items():
        for mode in args.modes:
            plain, built = make(cfg, dp=False, mode=mode, batch=args.batch, device=device)
            dp, _ = make(cfg, dp=True, mode=mode, batch=args.batch, device=device)
            for s in (plain, dp):  # warm-up
                s.step(x, y)
            t_dp, t_plain = [], []
            for _ in range(repeats):
                t_dp.append(timed(dp, x, y, device))
                t_plain.append(timed(plain, x, y, device))
            md, mp = statistics.median(t_dp), statistics.median(t_plain)
            rows.append((name, count_parameters(built.module)[1], mode, mp * 1e3, md * 1e3, md / mp,
                         ", ".join(dp.fallback_layers or []) if mode == "bk" else ""))
            print(f"{name:28s} {mode:9s} non-DP {mp * 1e3:8.1f} ms  DP {md * 1e3:8.1f} ms  x{md / mp:.2f}", flush=True)
            del plain, dp
    wall = time.perf_counter() - t_start
    gpu = is_cuda(device)
    lines = [
        "# DP overhead: one DP-SGD step vs one non-DP step",
        "",
        f"Batch {args.batch} (one physical chunk), {repeats} interleaved repeats, median; ratios only are comparable "
        "across machines. The DP step includes per-sample gradients (or norms), clipping, noise and the optimizer "
        "update; the non-DP step is the same Stepper with privacy disabled (plain autograd + the same optimizer). "
        "One torch thread unless `--threads` says otherwise (see the script's docstring).",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, device `{device}`"
        f", torch {torch.__version__}, threads {torch.get_num_threads()}, date {time.strftime('%Y-%m-%d')}, "
        f"whole run {wall / 60:.1f} min, 1-minute load average {load_before:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end (other jobs shared the machine: compare ratios within one row).",
        "",
        "| model | trainable params | grad_sample_mode | non-DP step (ms) | DP step (ms) | DP / non-DP | bk fallback layers |",
        "| --- | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    lines += [f"| {n} | {p:,} | {m} | {a:.1f} | {b:.1f} | {r:.2f}x | {fb} |" for n, p, m, a, b, r, fb in rows]
    lines += ["", "GPU figures: " + ("this table." if gpu else "missing (no GPU was available for this run); the "
              "issue's goal, a ViT-S DP step <= 1.3x a non-DP step on one GPU (fastDP reports 80-100 % of non-DP "
              "throughput), is still to be measured."),
              "", "Reference points (issue 2): Opacus costs about 1.2-1.4x on a small CNN and 2.7-3.7x on a ViT on CPU.",
              ""]
    return "\n".join(lines + remake_section("dp_overhead.py"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--vit-depth", type=int, default=4, help="transformer blocks of the ViT-S (12 in ViT-S)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    ap.add_argument("--quick", action="store_true", help="3 repeats")
    run_script(ap, make_table, argv, threads=1)


if __name__ == "__main__":
    main()
