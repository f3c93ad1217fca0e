"""Run the seed papers' extra arms (:mod:`audit.seed_arms`) at a named scale and keep their results as JSON.

Usage (from the repository root; needs ``../shared/data``)::

    python benchmarks/seed_arms.py run continual trace ke ganesh vit --scale cpu [--workers 2]
    python benchmarks/seed_arms.py run continual trace ke ganesh vit --scale full  # issue 16's scale (a GPU)
    python benchmarks/seed_findings.py --scale cpu                                # results/reference/seed_findings.md
    python benchmarks/seed_arms.py pretrained --scale cpu_vit_long  # the ViT arm's pre-trained model, whole test split
    python benchmarks/seed_arms.py adopt FILE --scale gpu_full_vit_long --sha256 HEX  # a lease's pre-training, here

Each arm writes ``results/seed_arms/<scale>/<arm>.json`` (its per-seed numbers, the scale, wall time, machine);
:mod:`seed_findings` turns them and the experiment tables into one claim-by-claim table. ``--workers`` runs arms
in parallel processes of one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audit.seed_arms import ARMS, SPLITS, ArmScale  # noqa: E402

#: the named scales; ``cpu`` finishes in minutes on a shared 2-core CPU, ``full`` is issue 16's (≥ 1,000 steps,
#: 5 seeds, a non-DP CIFAR-10 model above 60 % needs the ResNet and a GPU)
SCALES = {
    "cpu": ArmScale(name="cpu", private=1000, public=500, val=300, test=500, batch_size=64, steps=60, switch=20,
                    source_steps=150, public_steps=(0, 10, 30, 100), seeds=(0, 1), hessian_batch=256,
                    hessian_probes=8, hessian_every=20, trace_steps=80, knn_every=20, barrier_points=7,
                    accountant="rdp", vit_trials=3, vit_trial_steps=10, vit_probe_images=500),
    "full": ArmScale(name="full", arch="resnet20_cifar", private=20000, public=5000, val=2000, test=10000,
                     batch_size=256, steps=1000, switch=200, source_steps=3000, public_steps=(0, 10, 30, 100, 300),
                     seeds=(0, 1, 2, 3, 4), hessian_batch=256, hessian_probes=32, hessian_every=50, trace_steps=1500,
                     knn_every=100, barrier_points=21, accountant="pld",
                     # the ViT arm: ViT-Tiny width, pre-trained on the other 25,000 CIFAR-10 training images
                     vit_kwargs={"embed_dim": 192, "num_heads": 3, "depth": 12}, vit_lr=1e-3, vit_public=25000,
                     vit_tune_fraction=0.2, vit_trials=6, vit_trial_steps=200, vit_probe_images=1000),
    # what ran on one H100 (benchmarks/seed_gpu.py): the full scale on the 11,000 + 2,000 CIFAR-10 images and 3,600
    # Food-101 images that fit the GPU machine's 64 MiB upload (.device_data/, made by seed_gpu.py prepare)
    "gpu": ArmScale(name="gpu", root=".device_data/cifar10", downstream_root=".device_data/food101",
                    arch="resnet20_cifar", private=8000, public=2000, val=1000, test=2000, batch_size=256,
                    steps=1000, switch=200, source_steps=2000, public_steps=(0, 10, 30, 100, 300),
                    seeds=(0, 1, 2, 3, 4), hessian_batch=256, hessian_probes=32, hessian_every=50, trace_steps=1500,
                    knn_every=100, barrier_points=21, accountant="pld", downstream_private=2500, downstream_val=500,
                    vit_kwargs={"embed_dim": 192, "num_heads": 3, "depth": 12}, vit_lr=1e-3, vit_tune_fraction=0.2,
                    vit_trials=4, vit_trial_steps=100, vit_probe_images=1000),
}
# the largest CPU scale that fits about an hour of a shared 2-core CPU (issue 16's fallback when no GPU time is
# left): 5 seeds, 300 DP steps of batch 64 on 2,000 private images, tr(H) with 32 probes on 256 held-out images,
# σ by PLD; the ViT arm 200 steps per (ε, tuned/untuned), pre-trained on 1,800 of 3,000 public images
SCALES["cpu_hour"] = ArmScale(name="cpu_hour", private=2000, public=1000, val=500, test=1000, batch_size=64,
                              steps=300, switch=60, source_steps=400, public_steps=(0, 10, 30, 100, 300),
                              seeds=(0, 1, 2, 3, 4), hessian_batch=256, hessian_probes=32, hessian_every=50,
                              trace_steps=300, knn_every=50, barrier_points=11, accountant="pld",
                              downstream_private=2000, downstream_val=500, vit_public=3000, vit_trials=3,
                              vit_trial_steps=25, vit_probe_images=1000)
# the ViT arm on a 2-core CPU, sized so that the pre-trained model is a real one (about 50 % on CIFAR-10, not chance as
# the 32-wide ViT on 64 tokens and 1,800 images was): 12 blocks of width 64 on 8×8 patches (16 tokens + the class
# token), pre-trained for 2,000 steps of batch 128 on 18,000 public images (2,000 more are the search's tuning
# parts), then 300 steps per (ε, tuned/untuned) on 5,000 private images; 5 seeds, each about 20 minutes on one core
# (run two seed lists side by side: `run vit --scale cpu_hour_vit --seeds 0 2 4` and `--seeds 1 3`, then
# `merge vit --scale cpu_hour_vit`). Probes before the run, seed 0, 2,000 steps on all 20,000 public images, 1,000
# test images: width 64 49.0 %, width 96 45.5 % at twice the time, width 64 with crops and flips 47.1 % (too short
# a run to need them); the arm itself, on 18,000 images, pre-trains to 46.4 ± 1.6 % over 5 seeds
SCALES["cpu_hour_vit"] = SCALES["cpu_hour"].with_(
    name="cpu_hour_vit", private=5000, batch_size=128, steps=300, source_steps=2000, vit_public=20000,
    vit_kwargs={"embed_dim": 64, "num_heads": 4, "depth": 12, "patch_size": 8}, vit_lr=1e-3, vit_tune_fraction=0.1,
    vit_trials=3, vit_trial_steps=50, vit_probe_images=1000)
# issue 16's full scale on a GPU machine with all of CIFAR-10 carried as JPEG (`seed_gpu.py prepare --jpeg`, then
# `decode` there) and the 3,600-image Food-101 slice of `prepare` for the Ke et al. arm's downstream task; crops and
# flips in every phase, as in the configs' `gpu_full` scale (without them non-DP ResNet-20 stays under 60 %); tr(H)
# (256 held-out images, 32 probes) every 100 of the tr(H) arm's 1,500 steps, 16 points a curve: at every 50 the
# estimates (~1,000 fwd/bwd-equivalents a run) would double that arm's cost and its jobs would not fit one command.
# DP steps by book-keeping since 2026-11-26 (Opacus hooks before): the same clipped sums and noise draws, and since bk
# takes a Conv2d's per-example gradients from the grouped weight-gradient kernel ResNet-20's DP step costs half the
# hooks one on a CPU thread (1.5x a non-DP step; 73 vs 103 ms on the H100 before that change). The arm parts that ran
# earlier keep `hooks` in their settings; a merged arm lists who ran how under `mixed_settings`
SCALES["gpu_full"] = SCALES["full"].with_(name="gpu_full", root=".device_data/cifar10_full",
                                          downstream_root=".device_data/food101", downstream_private=2500,
                                          downstream_val=500, vit_public=20000, augment=True, hessian_every=100,
                                          grad_sample_mode="bk")
# the ViT arm for one 15-minute lease at gpu_full's data: ViT-Tiny's width, heads and depth (192, 3, 12; 5.4M
# parameters) on 8×8 patches (17 tokens, as `cpu_hour_vit`), pre-trained 2,000 steps of batch 256 on 18,000 public
# CIFAR-10 images with crops and flips (2,000 more are the search's parts), then per (ε, tuned/untuned) 300 steps on
# the 20,000 private images; a 3-trial × 50-step search on public data; 5 seeds, 1,000 probe images; DP steps by
# book-keeping (`grad_sample_mode: bk`, the same clipped sums as per-example gradients). About 11,000 DP steps and
# 10,000 non-DP ones in all. Measured on this 2-core CPU (2 threads, batch 256): the ViT's DP step takes 8.0 s with
# Opacus hooks, 1.25 s with bk (ghost clipping 1.96 s), its non-DP step 0.84 s; ResNet-20's DP step (hooks) 1.19 s,
# non-DP 0.25 s. So with bk a ViT DP step costs about what a ResNet-20 one does, ~20 ms of GPU time on the H100/H200
# leases: ~4 minutes of DP steps plus the pre-training, if 8-12 processes keep the GPU busy as they did. Pre-training
# probe on this CPU (seed 0, 2,000 steps, 29 min): 42.6 % on 2,000 test images. `seed_gpu.py run --scale gpu_full
# --arms vit --no-runs --workers 20` runs it as 20 (seed, ε) jobs sharing each seed's pre-training
# (`model_cache.cached_fit`): on an H200 (2026-11-26) all 20 at once finished in 432 s (pre-training 44.8 ± 2.1 % on
# the 10,000 test images; each DP fine-tuning run ~120 s, ~0.4 s a step with 20 processes sharing the GPU, 91 % busy)
SCALES["gpu_full_vit"] = SCALES["gpu_full"].with_(
    name="gpu_full_vit", steps=300, source_steps=2000, vit_public=20000, vit_tune_fraction=0.1,
    vit_kwargs={"embed_dim": 192, "num_heads": 3, "depth": 12, "patch_size": 8}, vit_lr=1e-3,
    vit_pretrain_augment=True, vit_trials=3, vit_trial_steps=50, vit_probe_images=1000, grad_sample_mode="bk")
# the ViT arm for the next lease: `gpu_full_vit` pre-trained each seed for 2,000 steps to 44.8 %, under the issue's
# 60 %; here one public model for all seeds (as a study of one public checkpoint has it; the seeds vary the
# fine-tuning and the search), so the lease's pre-training budget goes to one longer run: 8,000 steps, cosine with
# 400 warm-up steps, crops and flips. On this CPU the same recipe takes the 64-wide ViT from 45.7 % (2,000
# constant-rate steps) to 59.7 % (results/reference/vit_pretrain_probe.augment.md, 2 seeds).
# `seed_gpu.py run --scale gpu_full --arms vit --no-runs --arm-scale vit=gpu_full_vit_long`
SCALES["gpu_full_vit_long"] = SCALES["gpu_full_vit"].with_(
    name="gpu_full_vit_long", source_steps=8000, vit_shared_pretrain=True, vit_pretrain_schedule="cosine",
    vit_pretrain_warmup=400)
# the ViT arm on this 2-core CPU with a pre-trained model past issue 16's 60 %: `cpu_hour_vit`'s 64-wide 12-block ViT,
# one public pre-training for all seeds (as `gpu_full_vit_long`) of 16,000 cosine-scheduled steps (400 warm-up) with
# crops and flips on 22,500 public images (vit_public 25,000, a tenth of it the search's parts), where 8,000 steps on
# 18,000 images gave 59.7 % (vit_pretrain_probe.augment.md); DP steps by book-keeping (0.17 s a step against 0.27 s
# with Opacus hooks here, the same clipped sums). On this CPU, one thread a process: the pre-training 0.13 s a step
# (38 min, once), then 20 (seed, ε) jobs of ~2.5 minutes:
# `seed_gpu.py run --scale gpu_full --arms vit --no-runs --arm-scale vit=cpu_vit_long --workers 2`. Ran 2026-11-26:
# 60.9 % on the arm's 1,000 test images, 63.9 % on all 10,000 (`seed_arms.py pretrained --scale cpu_vit_long`)
SCALES["cpu_vit_long"] = SCALES["cpu_hour_vit"].with_(
    name="cpu_vit_long", source_steps=16000, vit_public=25000, vit_pretrain_augment=True, vit_shared_pretrain=True,
    vit_pretrain_schedule="cosine", vit_pretrain_warmup=400, grad_sample_mode="bk")
# Ke et al.'s arm on a source past issue 16's 60 % on this CPU: `cpu_vit_long`'s pre-trained ViT (63.9 % on the 10,000
# CIFAR-10 test images; the same cache key, so `results/seed_arms/cpu_vit_long/pretrained/` copied to this scale's
# folder spares the 38-minute pre-training), DP fine-tuned on the 10-class Food-101 slice (2,500 private images, 500
# held-out validation ones for the split selection and the kNN queries, 1,000 test) for 1,000 FFT steps of batch
# 128 at ε = 8 (PLD), LP phases of 500 steps, the head's rate ×5 by parameter group, kNN quality every 100 steps;
# DP steps by book-keeping (0.17 s a step on one core). 30 (seed, run) jobs, ~2-4 minutes alone on one core (5-9
# beside three other jobs; ran 2026-11-26, 2 hours on the 2 cores shared with the tr(H) arm's parts):
# `seed_gpu.py run --scale gpu_full --arms ke --no-runs --arm-scale ke=cpu_vit_ke --workers 2`
SCALES["cpu_vit_ke"] = SCALES["cpu_vit_long"].with_(name="cpu_vit_ke", ke_source="vit", steps=1000, knn_every=100,
                                                    downstream_private=2500, downstream_val=500)
# the ViT arm as it fitted the last ~10 minutes of a 30-minute H100 lease: 3 seeds, 500 fine-tuning steps per
# (ε, tuned/untuned), a 96-wide 12-block ViT pre-trained for 1,000 steps on the 1,600 public pre-training images
SCALES["gpu_vit"] = SCALES["gpu"].with_(name="gpu_vit", steps=500, source_steps=1000, seeds=(0, 1, 2),
                                        vit_kwargs={"embed_dim": 96, "num_heads": 3, "depth": 12})
OUT = ROOT / "results/seed_arms"


def part_path(scale_name: str, name: str, seed: int, part=None) -> Path:
    """Where one seed of an arm is kept when seeds run as separate jobs (``run --seeds``); an arm of
    :data:`SPLITS` can split further, one part per (seed, ε) or (seed, training)."""
    tag = "" if part is None else "." + SPLITS[name].tag(part)
    return OUT / scale_name / "parts" / f"{name}.s{seed}{tag}.json"


def _join_seed(parts: list[dict]) -> dict:
    """The (seed, part) parts of one seed as one part: ``per_seed`` keys united, ``epsilons``/``sigmas`` united."""
    out = {**parts[0], "per_seed": {}, "epsilons": [], "sigmas": {},
           "wall_seconds": sum(p["wall_seconds"] for p in parts)}
    for p in parts:
        for k, v in p["per_seed"].items():
            out["per_seed"].setdefault(k, v)
        out["epsilons"] += [e for e in p.get("epsilons", []) if e not in out["epsilons"]]
        out["sigmas"].update(p.get("sigmas", {}))
    if not out["epsilons"]:
        del out["epsilons"], out["sigmas"]
    return out


def part_label(part: dict, split_field: str) -> str:
    """``s<seed>[.<part>]``: which part of a merged run ``part`` was."""
    values = part["scale_settings"].get(split_field)
    return f"s{part['seeds'][0]}" + (f".{'+'.join(str(v) for v in values)}" if values and len(values) == 1 else "")


def part_machine(part: dict) -> str:
    """Where a part ran (its device and machine) and, when its pre-trained model came from another machine
    (``seed_arms.py adopt``), where that was trained."""
    where = f"{part.get('device', '?')} ({part.get('machine', '?')})"
    moved = [f"{o['device']}, torch {o['torch']}" for o in (part.get("pretrained_on") or {}).values()
             if o and o.get("adopted")]
    return where + (f"; pre-trained model adopted from {', '.join(sorted(set(moved)))}" if moved else "")


def mixed_machines(parts: list[dict], split_field: str) -> dict[str, str]:
    """{part label: :func:`part_machine`} when the parts of one run did not all run alike; else empty."""
    where = {part_label(p, split_field): part_machine(p) for p in parts}
    return where if len(set(where.values())) > 1 else {}


def mixed_settings(parts: list[dict], split_field: str) -> dict[str, dict[str, Any]]:
    """The scale settings that differ between the parts of one run (other than the seeds and the split field
    itself), each as {part label ``s<seed>[.<part>]``: value}; empty when the parts agree. A part written before
    a field existed ran with that field's default, and is read so."""
    import dataclasses

    from audit.seed_arms.common import ArmScale

    defaults = {f.name: json.loads(json.dumps(f.default, default=str)) for f in dataclasses.fields(ArmScale)
                if f.default is not dataclasses.MISSING}

    def value(p: dict, k: str) -> Any:
        return p["scale_settings"].get(k, defaults.get(k))

    keys = {k for p in parts for k in p["scale_settings"]} - {"seeds", split_field}
    out = {}
    for k in sorted(keys):
        if len({json.dumps(value(p, k), sort_keys=True, default=str) for p in parts}) > 1:
            out[k] = {part_label(p, split_field): value(p, k) for p in parts}
    return out


def merge(name: str, scale_name: str) -> dict | None:
    """One arm's per-seed parts as the arm's JSON (seeds in order, ``per_seed`` lists joined, wall time summed);
    (seed, ε) parts of a seed are joined first, and only what every seed has is kept. None when no part exists."""
    from foundation.io import write_json

    by_seed: dict[int, list[dict]] = {}
    for p in sorted((OUT / scale_name / "parts").glob(f"{name}.s*.json")):
        part = json.loads(p.read_text())
        by_seed.setdefault(part["seeds"][0], []).append(part)
    if not by_seed:
        return None
    parts = [_join_seed(by_seed[s]) for s in sorted(by_seed)]
    if name == "ke":  # the validation-selected split needs every split of a seed: chosen once they are joined
        from audit.seed_arms.ke import select_split

        for p in parts:
            flat = {k: v[0] for k, v in p["per_seed"].items()}
            sel = select_split(flat, p["scale_settings"]["lp_fractions"])
            p["per_seed"].update({k: [v] for k, v in sel.items()})
    keys = [k for k in parts[0]["per_seed"] if all(k in p["per_seed"] for p in parts)]
    out = {**parts[0], "seeds": [s for p in parts for s in p["seeds"]],
           "wall_seconds": sum(p["wall_seconds"] for p in parts),
           "per_seed": {k: [v for p in parts for v in p["per_seed"][k]] for k in keys}}
    if "epsilons" in out:  # the ε every seed has
        out["epsilons"] = [e for e in out["epsilons"] if f"{e}_tuned_acc" in out["per_seed"]]
        out["sigmas"] = {e: out["sigmas"][e] for e in out["epsilons"]}
    out["scale_settings"] = {**parts[0]["scale_settings"], "seeds": out["seeds"]}
    split = SPLITS[name]  # each part ran at its one value: the merged run's settings name the values it kept
    mixed = mixed_settings([p for s in sorted(by_seed) for p in by_seed[s]], split.field)
    if mixed:  # e.g. a scale's grad_sample_mode changed between parts: say which part ran how
        out["mixed_settings"] = mixed
    machines = mixed_machines([p for s in sorted(by_seed) for p in by_seed[s]], split.field)
    if machines:  # e.g. a lease ran some parts and this CPU the rest: the merged device/machine are not all's
        out["mixed_machines"] = machines
        out["device"] = out["machine"] = "mixed: see mixed_machines"
    origins = {k: {"device": o["device"], "torch": o["torch"]} for ps in by_seed.values() for p in ps
               for k, o in (p.get("pretrained_on") or {}).items() if o}
    if origins:  # where each pre-trained model was trained, adopted or not
        out["pretrained_on"] = origins
    values = [split.load(v) for ps in by_seed.values() for p in ps for v in p["scale_settings"].get(split.field) or []]
    if values:  # (whole-seed parts of an unsplit run leave a None field as it was)
        kept = {v for v in values if split.marker(v) in out["per_seed"]}
        order = split.parts(SCALES[scale_name]) if scale_name in SCALES else []
        out["scale_settings"][split.field] = sorted(kept, key=lambda v: (order.index(v) if v in order
                                                                         else len(order), str(v)))
    write_json(OUT / scale_name / f"{name}.json", out)
    return out


def pretrained_accuracy(scale_name: str, *, test_images: int = 10**9) -> tuple[float, int]:
    """(accuracy, images) of the ViT arm's seed-0 pre-trained model at ``scale_name`` on up to ``test_images`` of
    the test split (all of it by default, where the arm scores only ``scale.test``): the model the part jobs
    cached in ``results/seed_arms/<scale>/pretrained`` (the same key), trained there if it is absent."""
    from audit.seed_arms.common import test_acc
    from audit.seed_arms.vit import pretrained_vit, vit_data

    os.chdir(ROOT)
    scale = SCALES[scale_name]
    # the test split's size changes neither the other images drawn nor the cache key (made of ``scale``)
    data = vit_data(scale.with_(test=test_images))
    model = pretrained_vit(scale, data, seed=0, cache=OUT / scale_name / "pretrained")
    return test_acc(model, data.test), len(data.test)


def adopt_pretrained(src: Path, scale_name: str, *, seed: int = 0, sha256: str | None = None) -> Path:
    """File ``src``, the ViT arm's pre-trained model from a GPU lease (``results/seed_arms/<scale>/pretrained/
    vit-pretrained-*.safetensors`` there), as this machine's cached pre-training of ``seed`` at ``scale_name``, so
    the arm's part jobs that the lease left undone fine-tune the lease's weights here (each part then records
    where its pre-training ran, ``pretrained_on``). ``sha256``: the lease's checksum of the file.

    Raises:
        ValueError: a checksum that differs, or a file trained with other settings (see
            :func:`audit.seed_arms.model_cache.adopt_cached`).
    """
    import hashlib

    from audit.seed_arms.model_cache import adopt_cached
    from audit.seed_arms.vit import PRETRAIN_PREFIX, pretrain_key, vit_data
    from training.device import resolve_device

    src = Path(src).resolve()
    os.chdir(ROOT)
    if not src.is_file():
        raise ValueError(f"{src} does not exist: give the pre-trained model's .safetensors file")
    if sha256 is not None:
        got = hashlib.sha256(src.read_bytes()).hexdigest()
        if got != sha256.lower():
            raise ValueError(f"{src} has sha256 {got}, not the lease's {sha256}: re-assemble the file from its parts")
    scale = SCALES[scale_name]
    key = pretrain_key(scale, vit_data(scale), seed=seed, device=resolve_device("auto"))
    return adopt_cached(src, OUT / scale_name / "pretrained", key, prefix=PRETRAIN_PREFIX)


def run_arm(name: str, scale_name: str, seed: int | None = None, part=None) -> tuple[str, float]:
    """Run one arm at a named scale (all seeds, or one ``seed``, or one ``part`` of a seed: see :data:`SPLITS`) and
    write its JSON; returns (arm, seconds)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from training.device import resolve_device
    from foundation.io import write_json

    torch.set_num_threads(1)
    os.chdir(ROOT)
    scale = SCALES[scale_name] if seed is None else SCALES[scale_name].with_(seeds=(seed,))
    if part is not None:  # one part of a seed (audit.seed_arms.SPLITS)
        if seed is None:
            raise ValueError("a part is one seed's: give the seed")
        scale = scale.with_(**{SPLITS[name].field: (part,)})
    device = resolve_device("auto")
    t0 = time.perf_counter()
    # runs and part jobs share what they would each pre-train alike (a seed's ViT, the Ke source) through a cache
    extra = {"pretrained_cache": OUT / scale_name / "pretrained"} if name in ("vit", "ke") else {}
    res = ARMS[name](scale, device=device, log=lambda m: print(f"[{name}] {m}", flush=True), **extra)
    secs = time.perf_counter() - t0
    res.update({"wall_seconds": secs, "device": str(device), "machine": f"{platform.machine()}, {os.cpu_count()} "
                f"CPU cores, torch {torch.__version__}", "scale_settings": {k: v for k, v in vars(scale).items()}})
    write_json(OUT / scale_name / f"{name}.json" if seed is None else part_path(scale_name, name, seed, part),
               res)
    return name, secs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="run arms at a scale, write results/seed_arms/<scale>/<arm>.json")
    p.add_argument("arms", nargs="+", choices=sorted(ARMS))
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="run these seeds one at a time, each kept as a part (join them with `merge`)")
    m = sub.add_parser("merge", help="join the per-seed parts of arms (written by seed_gpu.py) into <arm>.json")
    m.add_argument("arms", nargs="+", choices=sorted(ARMS))
    m.add_argument("--scale", choices=sorted(SCALES), default="gpu")
    v = sub.add_parser("pretrained", help="the ViT arm's pre-trained model (seed 0; the one every seed shares with "
                       "vit_shared_pretrain) on the whole test split: loaded from the run's cache, trained if absent")
    v.add_argument("--scale", choices=sorted(SCALES), default="cpu_vit_long")
    d = sub.add_parser("adopt", help="file the ViT arm's pre-trained model from a GPU lease as this machine's "
                       "cached one, so the arm's remaining parts fine-tune it here")
    d.add_argument("file", type=Path)
    d.add_argument("--scale", choices=sorted(SCALES), default="gpu_full_vit_long")
    d.add_argument("--seed", type=int, default=0, help="the pre-training's seed (0 where every seed shares one)")
    d.add_argument("--sha256", default=None, help="the lease's checksum of the file (refused when it differs)")
    args = parser.parse_args(argv)
    if args.cmd == "adopt":
        try:
            path = adopt_pretrained(args.file, args.scale, seed=args.seed, sha256=args.sha256)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"adopted {args.file} as {path}", flush=True)
        return 0
    if args.cmd == "pretrained":
        acc, n = pretrained_accuracy(args.scale)
        print(f"{args.scale}: the pre-trained ViT (seed 0) {100 * acc:.1f} % on {n} test images", flush=True)
        return 0
    if args.cmd == "merge":
        for a in args.arms:
            got = merge(a, args.scale)
            print(f"{a}: " + (f"seeds {got['seeds']}" if got else "no parts"), flush=True)
        return 0
    if args.seeds is not None:
        for a in args.arms:
            for seed in args.seeds:
                print(f"{a} seed {seed}: {run_arm(a, args.scale, seed)[1]:.0f} s", flush=True)
            merge(a, args.scale)
        return 0
    if args.workers <= 1:
        for a in args.arms:
            print(f"{a}: {run_arm(a, args.scale)[1]:.0f} s", flush=True)
        return 0
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(run_arm, a, args.scale) for a in args.arms]):
            name, secs = fut.result()
            print(f"{name}: {secs:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
