"""The seed-paper experiments' runs: which configs, at which scale, trained how, and read back how.

A *scale* is the same experiment configs with other seeds, steps and sizes (:data:`SCALES`): ``cpu`` is what the
configs in ``eval_configs/experiments`` hold except that tr(H) is measured 3 times with 8 probes (on a shared
2-core CPU one 256-image, 32-probe estimate of the small CNN takes about a minute; the numbers in
``results/reference`` come from this scale), ``full`` is the issue-16 scale (≥ 1,000 steps, 5 seeds, larger
data; meant for a GPU) written to its own output directory, so ``python -m experiments papers run continual
finetune_source finetune --scale full && python -m experiments papers tables --scale full`` is the whole re-run.

Variants named ``<base>-s<seed>`` are re-drawn for the scale's seeds (the base variant's overrides with
``training.seed`` replaced), so a config lists each arm once per seed at CPU scale and the full scale adds seeds.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.paths import ROOT
from foundation.config_io import shipped_config

EXPERIMENTS = shipped_config("experiments")  # the shipped experiment configs (importlib.resources)
CONFIGS = {
    "continual": EXPERIMENTS / "continual_pretrain.yaml",
    "finetune_source": EXPERIMENTS / "finetune_source.yaml",
    "finetune": EXPERIMENTS / "finetune_strategies.yaml",
}
OUT = ROOT / "results/reference"


@dataclass(frozen=True)
class Scale:
    """Seeds, output directory and per-config ``--set`` overrides of one scale (None seeds: the config's own)."""

    name: str
    seeds: tuple[int, ...] | None = None
    output_dir: str | None = None
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    variant_overrides: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    description: str = ""
    #: the GPU the scale's runs shared, in words (their manifests say only "cuda"); empty for CPU scales
    gpu: str = ""


def _sweep(*points: int) -> dict[str, dict[str, dict[str, Any]]]:
    """The continual config's switch-point sweep variants ``sw0, sw1, ...`` at ``points`` public steps (the issue's
    0/50/100/200/400 of 1,000 steps, scaled to a scale's length)."""
    return {"continual": {f"sw{i}": {"training.continual.switch_steps": k} for i, k in enumerate(points)}}


#: the continual config's training at the two GPU scales (they differ in data only)
_GPU_CONTINUAL = {"model.arch": "resnet20_cifar", "training.steps": 1000, "training.batch_size": 256,
                  "training.hessian.every": 50, "training.continual.switch_steps": 200,
                  "training.continual.max_public_steps": 400, "training.continual.eval_every": 50}

SCALES = {
    "cpu": Scale(name="cpu", description="the configs as committed, but tr(H) at steps 0/50/100 with 8 probes",
                 overrides={"continual": {"training.hessian.every": 50, "training.hessian.probes": 8}}),
    "full": Scale(
        name="full", seeds=(0, 1, 2, 3, 4), output_dir="results/experiments-full",
        description="issue 16: >= 1,000 steps, 5 seeds, 20k private CIFAR-10 images, ResNet-20 (a GPU run)",
        overrides={
            "continual": {"data.pool_size": 20000, "model.arch": "resnet20_cifar", "training.steps": 1000,
                          "training.hessian.every": 50, "training.continual.public.pool_size": 2000,
                          "training.continual.switch_steps": 300, "training.continual.max_public_steps": 600,
                          "training.continual.eval_every": 50},
            "finetune_source": {"model.arch": "resnet20_cifar", "training.steps": 3000},
            "finetune": {"training.steps": 400},
        },
        variant_overrides=_sweep(0, 50, 100, 200, 400)),
    "cpu_hour": Scale(
        name="cpu_hour", seeds=(0, 1, 2, 3, 4), output_dir="results/experiments-cpu-hour",
        description="the largest CPU scale of about an hour (2 cores): 300 steps of batch 128, 5 seeds, the small "
                    "CNN, 4,000 private and 1,000 public CIFAR-10 images, tr(H) with 32 probes every 50 steps; the "
                    "fine-tuning configs: a source trained 3,000 steps, then 1,000 DP steps per strategy on Food-101",
        overrides={"continual": {"training.steps": 300, "training.hessian.every": 50,
                                 "training.continual.public.pool_size": 1000, "training.continual.switch_steps": 60,
                                 "training.continual.max_public_steps": 120, "training.continual.eval_every": 15},
                   "finetune_source": {"training.steps": 3000, "training.checkpoint_every": 500},
                   "finetune": {"training.steps": 1000, "training.checkpoint_every": 250}},
        variant_overrides=_sweep(0, 15, 30, 60, 120)),
    "gpu_full": Scale(
        name="gpu_full", seeds=(0, 1, 2, 3, 4), output_dir="results/experiments-gpu-full",
        description="issue 16's scale on all of CIFAR-10 carried as JPEG (experiments gpu prepare --jpeg / decode): "
                    "20,000 private images, 1,000 steps of batch 256, ResNet-20, random crops and flips in every "
                    "arm, 5 seeds",
        # crops and flips: non-DP ResNet-20 on these 20,000 images reaches 56.1 % without them (seed 0) and 63.2 ± 0.9 %
        # with them (3 seeds) on this 2-core CPU (results/reference/seed_gpu/cpu_resnet20_probe.md)
        overrides={"continual": {**_GPU_CONTINUAL, "data.root": ".device_data/cifar10_full", "data.pool_size": 20000,
                                 "training.continual.public.root": ".device_data/cifar10_full",
                                 "training.continual.public.pool_size": 5000, "training.augment.crop_padding": 4,
                                 "training.augment.flip": True, "data.test_size": 10000},
                   # Ke et al.'s budget-split table on a source past 60 %: ResNet-20 trained without DP on all 45,000
                   # CIFAR-10 training images of the pack (crops and flips), then DP on the pack's Food-101 slice
                   # (3,000 training, 600 test images) at batch 125, 1,000 steps per strategy. Per-example
                   # gradients by bk, not the config's Opacus hooks: no lease was drawn after the source was
                   # trained, and on this 2-core CPU a ResNet-20 DP step of batch 125 costs 0.80 s under bk
                   # against 1.54 s under hooks (one thread each, 2026-11-26). The same clipped gradients
                   # (tests/test_dp_bk.py), so only the time differs; on a shared H100, 1,000 bk steps of the
                   # Ganesh et al. arm cost ~35 s of the whole GPU against ~20 s for hooks in the continual arm
                   # (results/reference/seed_gpu/LEASES.md, leases 4 and 6)
                   "finetune_source": {"model.arch": "resnet20_cifar", "data.root": ".device_data/cifar10_full",
                                       "data.pool_size": None, "data.test_size": 10000, "training.steps": 3000,
                                       "training.batch_size": 256, "training.augment.crop_padding": 4,
                                       "training.augment.flip": True, "training.checkpoint_every": 500},
                   "finetune": {"data.root": ".device_data/food101", "data.test_size": 600, "training.steps": 1000,
                                "training.checkpoint_every": 250, "privacy.grad_sample_mode": "bk"}},
        # the non-DP baseline's tr(H) every 250 steps, not 50: on one shared GPU its 21 estimates of 32 probes cost
        # as much device time as two DP runs (the `gpu` lease), and the trace arm is where tr(H) is measured. The
        # decelerator runs likewise: the rule decides on its own estimates (every eval_every = 50 public steps, on
        # public images); at every 50 the logged curve added 21 more, and 5 such runs, 6 jobs at once, did not
        # finish in 320 s (2026-11-26)
        variant_overrides={"continual": {**_sweep(0, 50, 100, 200, 400)["continual"],
                                         "nondp": {"training.hessian.every": 250},
                                         "continual-dec": {"training.hessian.every": 250}}},
        gpu="one lent NVIDIA H200 (143,771 MiB, driver 580.159.04) shared by 6-12 runs at a time"),
    "gpu": Scale(
        name="gpu", seeds=(0, 1, 2, 3, 4), output_dir="results/experiments-gpu",
        description="issue 16 on one H100: 1,000 steps of batch 256, 5 seeds, ResNet-20, 8,000 private CIFAR-10 "
                    "images, 2,000 disjoint public ones (experiments/gpu/; .device_data/ is what fits the "
                    "GPU machine's 64 MiB upload)",
        overrides={"continual": {**_GPU_CONTINUAL, "data.root": ".device_data/cifar10", "data.pool_size": 8000,
                                 "data.test_size": 2000, "training.continual.public.root":
                                 ".device_data/cifar10_public", "training.continual.public.pool_size": 2000}},
        variant_overrides=_sweep(0, 50, 100, 200, 400), gpu="one lent NVIDIA H100 80GB shared by 6-12 runs at a time"),
}


def scale_config(name: str, scale: Scale):
    """The experiment config ``name`` at ``scale``: overrides applied, ``-s<seed>`` variants re-drawn."""
    from audit.config import load_run_config

    ov = scale.overrides.get(name, {})
    cfg = load_run_config(str(CONFIGS[name]), [f"{k}={json.dumps(v)}" for k, v in ov.items()])
    update: dict[str, Any] = {}
    if scale.output_dir:
        update["output_dir"] = scale.output_dir
    vo = scale.variant_overrides.get(name, {})
    if (scale.seeds is not None or vo) and cfg.variants:
        bases: dict[str, dict[str, Any]] = {}
        seeds: list[int] = []
        for v, o in cfg.variants.items():
            m = re.fullmatch(r"(.+)-s(\d+)", v)
            if m:
                bases.setdefault(m.group(1), {k: x for k, x in o.items() if k != "training.seed"})
                seeds += [int(m.group(2))] * (int(m.group(2)) not in seeds)
        update["variants"] = {f"{b}-s{s}": {**o, **vo.get(b, {}), "training.seed": s} for b, o in bases.items()
                              for s in (scale.seeds if scale.seeds is not None else seeds)}
    if scale.output_dir and name == "finetune":  # the fine-tuning starts from the source of the same scale
        ft = cfg.training.finetune.model_copy(update={"checkpoint": f"{scale.output_dir}/ft-source"})
        update["training"] = cfg.training.model_copy(update={"finetune": ft})
    return cfg.model_copy(update=update) if update else cfg


def _run_one(name: str, scale_name: str, variant: str | None) -> tuple[str | None, float, str]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from audit.pipeline import run_pipeline

    t0 = time.perf_counter()
    cfg = scale_config(name, SCALES[scale_name])
    res = run_pipeline(config=cfg, variants=[variant] if variant else None, steps=("train",), progress=False,
                       command=f"python -m experiments papers run {name} --scale {scale_name} ({variant})",
                       log=lambda _msg: None)
    return variant, time.perf_counter() - t0, res[0].steps[0].status


def run(names: list[str], *, workers: int, scale: str, only: list[str] | None = None) -> None:
    """Train every variant of each config (``audit run --steps train``) over ``workers`` one-thread processes;
    ``only``: just the variants matching one of these shell patterns (e.g. ``'*-nondp-*'``)."""
    from fnmatch import fnmatchcase

    from audit.config import variant_names

    os.chdir(ROOT)
    for name in names:
        variants = variant_names(scale_config(name, SCALES[scale]))
        if only is not None:
            variants = [v for v in variants if any(fnmatchcase(v, pat) for pat in only)]
        print(f"[{time.strftime('%H:%M:%S')}] {name} ({scale}): {len(variants)} run(s) on {workers} worker(s)",
              flush=True)
        if workers == 1 or len(variants) == 1:
            for v in variants:
                print(f"  {_run_one(name, scale, v)}", flush=True)
            continue
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_run_one, name, scale, v) for v in variants]
            for fut in as_completed(futures):
                v, secs, status = fut.result()
                print(f"  [{time.strftime('%H:%M:%S')}] {v}: {status} in {secs:.0f} s", flush=True)


def read_run(run_dir: Path) -> tuple[dict, dict] | None:
    """(manifest, metrics) of a finished run directory, or None."""
    from training.run import MANIFEST_FILE, METRICS_FILE

    if not (run_dir / MANIFEST_FILE).is_file() or not (run_dir / METRICS_FILE).is_file():
        return None
    return (json.loads((run_dir / MANIFEST_FILE).read_text()), json.loads((run_dir / METRICS_FILE).read_text()))


def groups(name: str, scale: str) -> dict[str, list[tuple[int, dict, dict]]]:
    """Finished runs of a config at a scale, grouped by variant name without its ``-s<seed>`` suffix."""
    from audit.config import select_variant

    cfg = scale_config(name, SCALES[scale])
    out: dict[str, list[tuple[int, dict, dict]]] = defaultdict(list)
    for v in cfg.variants:
        m = re.fullmatch(r"(.+)-s(\d+)", v)
        got = read_run(ROOT / select_variant(cfg, v).run_dir())
        if m and got:
            out[m.group(1)].append((int(m.group(2)), *got))
    return {k: sorted(v, key=lambda r: r[0]) for k, v in out.items()}


def machine(runs: list[dict], manifests: list[dict] | None = None, scale: str | None = None) -> str:
    """Where the runs trained: this machine for CPU runs, else the device, torch and Python their manifests name and
    the GPU the scale records (:attr:`Scale.gpu`). ``manifests``, when given, pair with ``runs``; runs on several
    devices (a GPU lease's and this CPU's) are counted per device."""
    prov = [m.get("provenance", {}) for m in manifests or []]
    devices = sorted({p.get("device", "cpu") for p in prov}, key=lambda d: (d == "cpu", d))  # this CPU last

    def total(rs: list[dict]) -> str:
        secs = [r["wall_seconds"] for r in rs if r.get("wall_seconds")]
        return f"{len(secs)} run{'s' * (len(secs) != 1)}, {sum(secs) / 60:.1f} min of training in total"

    def cpu(rs: list[dict]) -> str:
        return (f"{platform.machine()}, {os.cpu_count()} CPU cores (shared with other jobs while these ran), torch "
                f"{__import__('torch').__version__}, 1 thread per run, {total(rs)}")

    if not devices or devices == ["cpu"]:
        return cpu(runs)
    parts = []
    for dev in devices:
        idx = [i for i, p in enumerate(prov) if p.get("device", "cpu") == dev]
        rs, ps = [runs[i] for i in idx], [prov[i] for i in idx]
        if dev == "cpu":
            parts.append(f"the other runs on this CPU: {cpu(rs)}")
            continue
        soft = sorted({f"torch {p.get('torch')}, Python {p.get('python')}" for p in ps})
        names = sorted({p["device_name"] for p in ps if p.get("device_name")})  # manifests record it since 2026-11
        # the GPU the manifests name (they do since 2026-11), else the one the scale records for its older runs
        gpu = (f"one lent {' / '.join(names)} shared by several runs at a time" if names else
               (SCALES[scale].gpu if scale in SCALES else "") or "one lent GPU shared by several runs at a time")
        parts.append(f"device {dev} ({'; '.join(soft)}): {gpu} (`experiments/gpu/`), so a run's wall time is "
                     f"not its speed alone; {total(rs)}")
    return " — ".join(parts)


def closing(findings: list[str], runs: list[dict], manifests: list[dict] | None = None, scale: str | None = None
            ) -> list[str]:
    """The end of a table: its findings, then the machine the runs took."""
    return ["## Findings", "", *findings, "", f"Machine: {machine(runs, manifests, scale)}.", ""]


def hist(metrics: dict, key: str) -> dict[int, float]:
    """``{step: value}`` of one logged quantity in a run's metrics history."""
    return {h["step"]: h[key] for h in metrics["history"] if key in h and isinstance(h[key], (int, float))}


def remake(names: str, scale: str) -> str:
    """The Re-make line of a table."""
    flag = "" if scale == "cpu" else f" --scale {scale}"
    if SCALES[scale].gpu:  # trained on a lent GPU through experiments.gpu's job queue, tabled here
        configs = " --configs finetune" if "finetune" in names.split() else ""
        return (f"Re-make: `python -m experiments gpu run --scale {scale} --arms{configs}` on the GPU machine (its "
                f"docstring has the data and wheels to carry; then `python -m experiments gpu unpack PACK` here) "
                f"or on a CPU with `--workers 2` (the Machine line says where these ran), then `python -m "
                f"experiments papers tables{flag}`")
    return (f"Re-make: `python -m experiments papers run {names} --workers 2{flag} && python -m "
            f"experiments papers tables{flag}`")
