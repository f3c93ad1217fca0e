"""Shadow-model throughput: K small DP-SGD models batched (torch.func vmap), one at a time, or as Ray tasks.

Every executor trains the same K models (same masks, seeds and recipe) on scikit-learn's digits (8x8
images, grey replicated to 3 channels), each on a random half of the pool, with DP-SGD (Poisson sampling).
The script reports wall time, models per second and the speed-up over the sequential executor, checks that
the executors produced the same weights, and writes a Markdown table. ``ray`` runs the tasks of the product's
``ray`` executor (:mod:`attacks.ray_farm`: one task per slot, each training its share of the models batched) on a
local Ray with ``--workers`` CPUs started once before the timings; its start-up and its overhead per task (the
round trip of an empty task) are measured separately and stated.

Example (the command that made results/reference/shadow_throughput.md)::

    .venv/bin/python benchmarks/shadow_throughput.py --models 16 64 --steps 100 \
        --out results/reference/shadow_throughput.md
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import functools
import os
import platform
import time

import numpy as np
import torch
from torch import nn

from training.config import OptimConfig
from training.dp.batched import train_many
from training.dp.recipe import TrainRecipe
from _common import remake_section, run_script


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions (GroupNorm, tanh; the second at stride 2) and a linear layer; no BatchNorm."""

    def __init__(self, c1: int = 16, c2: int = 32, num_classes: int = 10, side: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, c1, 3, padding=1), nn.GroupNorm(min(4, c1), c1), nn.Tanh(),
            nn.Conv2d(c1, c2, 3, stride=2, padding=1), nn.GroupNorm(min(8, c2), c2), nn.Tanh(), nn.Flatten())
        self.head = nn.Linear(c2 * ((side + 1) // 2) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def load_digits_pool() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 digits as float (N, 3, 8, 8) in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32)[:, None].repeat(1, 3, 1, 1)
    return x, torch.tensor(d.target, dtype=torch.int64)


def accuracy_on_non_members(factory, sds, x, y, masks) -> float:
    """Mean accuracy of each model on the pool examples it did not train on (a sanity check of learning)."""
    accs = []
    model = factory()
    with torch.no_grad():
        for sd, m in zip(sds, masks):
            model.load_state_dict(sd)
            out = model(x[~m]).argmax(1)
            accs.append(float((out == y[~m]).float().mean()))
    return float(np.mean(accs))


def _ray_task(task: dict, shared: dict) -> tuple[list[dict[str, np.ndarray]], float]:
    """One Ray task: train this task's models batched (the product's task for small models); its CPU seconds."""
    cpu0 = time.process_time()
    torch.set_num_threads(1)
    sds = train_many(model_factory=task["factory"], x=shared["x"], y=shared["y"], masks=task["masks"],
                     seeds=task["seeds"], recipe=task["recipe"], executor="batched")
    return [{n: v.numpy() for n, v in sd.items()} for sd in sds], time.process_time() - cpu0


def _empty_task(task: int, shared: None) -> int:
    return task


class RayFarm:
    """A local Ray with ``workers`` CPUs (started once) and the product's task farm over it."""

    def __init__(self, workers: int) -> None:
        import ray

        from attacks.ray_connect import start_local
        from attacks.ray_farm import RayOptions, ray_session

        here = os.path.dirname(os.path.abspath(__file__))
        t0 = time.perf_counter()
        # the executor's private local Ray (loopback, never a cluster found in Ray's address file)
        self._stop = start_local(ray, num_cpus=workers, log_to_driver=False, runtime_env={"env_vars": {
            "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here)]), "OMP_NUM_THREADS": "1"}})
        self._cm = ray_session(RayOptions(cpus_per_task=1))
        self.session = self._cm.__enter__()
        self.startup = time.perf_counter() - t0
        self.session.run(_empty_task, list(range(workers)))  # start the workers (untimed)
        t0 = time.perf_counter()
        n = 8 * workers
        self.session.run(_empty_task, list(range(n)))
        self.overhead = (time.perf_counter() - t0) * workers / n  # seconds of a slot per empty task

    def train(self, factory, x, y, masks, seeds, recipe) -> tuple[list[dict[str, torch.Tensor]], float]:
        """The K state dicts and the CPU seconds the tasks used."""
        slots = self.session.slots
        size = math.ceil(len(seeds) / slots)
        shared = self.session.put({"x": x, "y": y})
        tasks = [dict(factory=factory, masks=masks[i:i + size], seeds=seeds[i:i + size], recipe=recipe)
                 for i in range(0, len(seeds), size)]
        out = self.session.run(_ray_task, tasks, shared=shared)
        sds = [{n: torch.from_numpy(v) for n, v in sd.items()} for group, _ in out for sd in group]
        return sds, sum(cpu for _, cpu in out)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self._stop()


def max_weight_diff(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> float:
    return max(float((sa[n] - sb[n]).abs().max()) for sa, sb in zip(a, b) for n in sa)


def _widths(text: str) -> tuple[int, int]:
    try:
        c1, c2 = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"widths are C1xC2, e.g. 16x32, got {text!r}") from None
    if c1 < 1 or c2 < 1:
        raise argparse.ArgumentTypeError(f"widths must be positive, got {text!r}")
    return c1, c2


def run(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    x, y = load_digits_pool()
    load_start = os.getloadavg()
    rows, checks = [], []
    farm = RayFarm(args.workers) if "ray" in args.executors else None
    try:
        for c1, c2 in args.widths:
            run_width(args, x, y, c1, c2, rows, checks, farm)
    finally:
        if farm is not None:
            farm.close()
    return render(args, rows, checks, load_start, os.getloadavg(), farm)


def run_width(args, x, y, c1, c2, rows, checks, farm) -> None:
    factory = functools.partial(DigitsCNN, c1, c2)
    n_params = sum(p.numel() for p in factory().parameters())
    model = f"{c1}x{c2} ({n_params:,} params)"
    recipe = TrainRecipe(steps=args.steps, batch_size=args.batch_size,
                         optim=OptimConfig(name="sgd", lr=args.lr, momentum=args.momentum), dp=True,
                         noise_multiplier=args.sigma, max_grad_norm=args.clip, sampling="poisson",
                         physical_batch_size=args.physical_batch_size)
    warm = np.random.default_rng([args.seed, 0]).random((2, len(x))) < 0.5
    for executor in ("sequential", "batched"):  # untimed: first-call costs (lazy imports, kernel set-up)
        train_many(model_factory=factory, x=x, y=y, masks=warm, seeds=[0, 1], executor=executor,
                   recipe=dataclasses.replace(recipe, steps=3))
    if farm is not None:  # the same warm-up in every Ray worker
        farm.train(factory, x, y, np.concatenate([warm] * args.workers), list(range(2 * args.workers)),
                   dataclasses.replace(recipe, steps=3))
    for k in args.models:
        masks = np.random.default_rng([args.seed, k]).random((k, len(x))) < 0.5
        seeds = list(range(k))
        results = {}
        for executor in args.executors:
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            if executor == "ray":
                sds, task_cpu = farm.train(factory, x, y, masks, seeds, recipe)
                wall = time.perf_counter() - t0
                cpu = time.process_time() - cpu0 + task_cpu
            else:
                sds = train_many(model_factory=factory, x=x, y=y, masks=masks, seeds=seeds, executor=executor,
                                 recipe=recipe)
                wall = time.perf_counter() - t0
                cpu = time.process_time() - cpu0
            results[executor] = sds
            acc = accuracy_on_non_members(factory, sds, x, y, masks)
            rows.append(dict(model=model, k=k, executor=executor, wall=wall, cpu=cpu, acc=acc))
            print(f"{model} K={k:3d} {executor:10s} wall {wall:8.1f} s  cpu {cpu:8.1f} s  {k / wall:6.2f} models/s  "
                  f"non-member acc {acc:.3f}  load {os.getloadavg()[0]:.1f}", flush=True)
        mine = [r for r in rows if r["model"] == model and r["k"] == k]
        seq = next((r for r in mine if r["executor"] == "sequential"), None)
        for row in mine:
            row["speedup"] = seq["wall"] / row["wall"] if seq else float("nan")
            row["cpu_speedup"] = seq["cpu"] / row["cpu"] if seq else float("nan")
        names = list(results)
        for other in names[1:]:
            checks.append((model, k, names[0], other, max_weight_diff(results[names[0]], results[other])))


def render(args, rows, checks, load_start, load_end, farm) -> str:
    cpu_name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu_name = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        "# Shadow-model throughput: batched (torch.func vmap) vs one model at a time vs Ray tasks",
        "",
        "Recipe: DigitsCNN C1xC2 (conv 3->C1, GroupNorm, tanh; conv C1->C2 stride 2, GroupNorm, tanh; flatten; "
        "linear C2*16 -> 10; no BatchNorm) on scikit-learn digits "
        f"(1,797 images, 8x8, grey replicated to 3 channels); each model trains on a Bernoulli(1/2) half of "
        f"the pool; DP-SGD with Poisson sampling, expected batch {args.batch_size}, sigma {args.sigma}, "
        f"C {args.clip}, SGD lr {args.lr} momentum {args.momentum}, {args.steps} steps, "
        f"physical batch {args.physical_batch_size}.",
        "",
        "Executors: `sequential` = `train_one` per model (torch.func per-example gradients of one model); "
        "`batched` = `train_many(executor=\"batched\")`, all K models stacked in one vmap; "
        f"`ray` = the `ray` executor's task farm (`attacks.ray_farm`) on a local Ray with {args.workers} CPUs, "
        "one task per CPU, 1 torch thread each, each task training its share of the models batched (the pool "
        "is put in Ray's object store once per K). An untimed 3-step warm-up of every executor (in each "
        "Ray worker too) precedes the timings of each model. CPU s of `ray` = the driver's plus the tasks' CPU time.",
        *([] if farm is None else [
            "",
            f"Ray's fixed costs, measured apart from the table: starting the local Ray {farm.startup:.1f} s "
            f"(once per `audit attack`; none on a running cluster); overhead per task {1000 * farm.overhead:.0f} ms "
            "(the round trip of an empty task, per slot). The ray rows include neither the start-up nor "
            "the workers' first import of torch (an untimed warm-up runs first); they do include sending "
            "the pool, the tasks and the weights through the object store."]),
        "",
        "| model | K | executor | wall s | CPU s | models/s | speed-up vs sequential (wall) | speed-up (CPU time) "
        "| mean non-member accuracy |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['k']} | {r['executor']} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['k'] / r['wall']:.2f} | "
                     f"{r['speedup']:.2f}x | {r['cpu_speedup']:.2f}x | {r['acc']:.3f} |")
    lines += ["", "Same weights from every executor (max |difference| over all models and parameters):", ""]
    lines += [f"- {m}, K={k}: {a} vs {b}: {d:.2e}" for m, k, a, b, d in checks]
    lines += [
        "",
        "## Machine",
        "",
        f"- CPU: {cpu_name}; {os.cpu_count()} logical cores visible, {len(os.sched_getaffinity(0))} usable; "
        f"torch threads in the main process: {args.threads}",
        f"- torch {torch.__version__}, Python {platform.python_version()}, {platform.system()} {platform.release()}",
        f"- 1-minute load average at start {load_start[0]:.1f}, at end {load_end[0]:.1f} (a load above the core "
        "count means other jobs shared the cores: wall times are then noisy; CPU time is the steadier measure)",
        "",
        *remake_section("shadow_throughput.py"),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=int, nargs="+", default=[16, 64], help="values of K")
    p.add_argument("--executors", nargs="+", default=["sequential", "batched", "ray"],
                   choices=["sequential", "batched", "ray"], help="sequential first: the speed-up baseline")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--physical-batch-size", type=int, default=256)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--widths", type=_widths, nargs="+", default=[(8, 16), (16, 32)],
                   help="conv widths C1xC2 of the models to time, e.g. 8x16 16x32")
    p.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray (ray executor)")
    run_script(p, run, argv, threads=1)


if __name__ == "__main__":
    main()
