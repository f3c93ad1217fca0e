"""Attack power on real CIFAR-10 images: every attack against small models, with 16 reference models.

For each model preset (``small_cnn``: three 3x3 convolutions with GroupNorm and tanh, global average pooling,
a linear head; ``mlp``: one wide hidden layer, which memorises more in the same CPU budget), a non-DP target
is trained with ``audit train``'s trainer on a Bernoulli(1/2) half of a random pool drawn from the CIFAR-10
arrays in ``../shared/data/cifar10`` (JPEG-decoded training images, resized to 16x16 by default to fit a CPU
budget); then ``audit attack``'s runner trains 16 reference models with the same recipe on balanced halves of
the pool (every example IN for exactly 8), queries every model on each image and its horizontal flip, and
evaluates every attack twice: against the real target (its membership mask, with bootstrap intervals) and by
leave-one-out over the reference models (each in turn the target, the other 15 its references; mean +- std),
the LiRA paper's protocol.

The LiRA paper's 16-model demo figures (WRN-28-2 on CIFAR-10, online LiRA with fixed variance: AUC 0.686,
TPR 5.9% at 0.1% FPR) are shown beside the numbers for scale; the settings here are much smaller, so the
numbers are not comparable one to one.

With ``--privacy-meter PATH`` (Privacy Meter's ``modules/mia/attacks/rmia.py`` at a pinned commit, see
``_privacy_meter.py``) a peer section compares our offline RMIA with Privacy Meter's on the ``mlp`` models.
``--reuse-runs`` re-uses the run directories (target and reference models) of an earlier invocation.

Example (the command that made results/reference/attack_power.md)::

    .venv/bin/python benchmarks/attack_power.py --privacy-meter pm/modules/mia/attacks/rmia.py \
        --out results/reference/attack_power.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from foundation.shared_root import shared_root

import numpy as np
import torch

from attacks.runner import run_attack
from attacks.config import AttackConfig
from attacks.registry import attack_names
from attacks.resolution import format_tpr
from training.config import TrainConfig
from training.run import open_run
from _common import remake_section, run_script

SHARED = shared_root()  # $DP_AUDIT_SHARED, default ../shared
LIRA_DEMO = {"lira_online_fixed_var": (0.686, 0.059)}
#: model presets: (arch, kwargs, description, default steps, default Adam lr)
PRESETS = {
    "small_cnn": ("small_cnn", {}, "3x3 convolutions 16-32-64 with GroupNorm and tanh, global average pooling, "
                  "linear head", 120, 0.003),
    "mlp": ("mlp", {"hidden": [1024]}, "one hidden layer of 1,024 units, flattened pixels in", 300, 0.003),
}


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_one(args: argparse.Namespace, preset: str) -> str:
    """Train the target of ``preset``, run every attack with 16 reference models, render its section."""
    from training.trainer import train

    arch, kwargs, _, steps, lr = PRESETS[preset]
    steps, lr = args.steps or steps, args.lr or lr
    root = args.shared / "data" / "cifar10"
    run_dir = args.run_prefix.parent / f"{args.run_prefix.name}-{preset}"
    cfg = TrainConfig.model_validate({
        "name": run_dir.name, "output_dir": str(run_dir.parent),
        "data": {"dataset": "cifar10", "root": str(root), "pool_size": args.pool_size, "pool_seed": args.seed,
                 "test_size": args.test_size, "image_size": args.image_size, "membership_seed": args.seed},
        "model": {"arch": arch, "kwargs": kwargs}, "privacy": {"enabled": False},
        "optim": {"name": "adam", "lr": lr, "schedule": "cosine"},
        "training": {"steps": steps, "batch_size": args.batch_size, "physical_batch_size": 512,
                     "seed": args.seed, "progress": False, "log_every": 50, "checkpoint_every": 10_000}})
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    reuse = args.reuse_runs and (run_dir / "manifest.json").is_file()
    target = _Reused(open_run(run_dir)) if reuse else train(cfg, progress=False, overwrite=True)
    t_train, cpu_train = time.perf_counter() - t0, _cpu_seconds() - cpu0
    config = AttackConfig(n_reference=args.n_reference, attacks=attack_names(), flip=True, shifts=0,
                          population=args.population if args.population == "all" else int(args.population), evaluation="both", n_bootstrap=args.n_bootstrap,
                          seed=args.seed, executor=args.executor, device="cpu")
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    result = run_attack(run_dir=target.run_dir, config=config, retrain_shadows=not reuse, progress=True)
    t_attack, cpu_attack = time.perf_counter() - t0, _cpu_seconds() - cpu0
    with np.load(target.run_dir / "signals.npz", allow_pickle=False) as z:
        n_loo_non = int((~z["keep"]).sum(axis=1).min())   # the fewest non-members of a leave-one-out round
    text = render(args, preset, cfg, target, result.report.model_dump(), (t_train, cpu_train), (t_attack, cpu_attack),
                  n_loo_non)
    if args.privacy_meter is not None and preset == "mlp":
        from _privacy_meter import compare, load_privacy_meter, render as render_peer

        text += "\n" + render_peer(compare(target.run_dir, load_privacy_meter(args.privacy_meter)), args.privacy_meter)
    return text


class _Reused:
    """A run re-used with ``--reuse-runs``: what :func:`render` reads of a freshly trained one."""

    def __init__(self, run) -> None:
        self.run_dir, self.manifest = run.run_dir, run.manifest
        self.metrics = json.loads(run.metrics_path.read_text())


def run(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    args.image_size = args.image_size or None
    if not (args.shared / "data" / "cifar10" / "train.npz").is_file():
        sys.exit(f"missing {args.shared}/data/cifar10/train.npz: this benchmark needs ../shared (its MANIFEST.md)")
    sections = [run_one(args, preset) for preset in args.models]
    head = [
        "# Attack power: every attack against small models on CIFAR-10, 16 reference models",
        "",
        "Each section: a non-DP target trained by `audit train`'s trainer on a Bernoulli(1/2) half of a random "
        "pool of CIFAR-10 training images (`../shared/data/cifar10`, JPEG-decoded), then `audit attack`'s "
        "runner: 16 reference models with the target's recipe on balanced halves of the pool, every model "
        "queried on each image and its horizontal flip, every attack evaluated against the real target (its "
        "membership mask, with bootstrap intervals) and by leave-one-out over the reference models (each in "
        "turn the target, the other 15 its references: the LiRA paper's protocol).",
        "",
        "The LiRA demo figures in the last column are quoted from this project's issue (the LiRA reference "
        "code's 16-model demo: online LiRA with fixed variance against a WRN-28-2, about 1.5M parameters, "
        "trained with augmentation on half of CIFAR-10's 50,000 training images): a far larger, "
        "longer-trained model on far more data than the CPU-budget models here, so they are a scale "
        "reference, not a number to match.",
        "",
    ]
    tail = remake_section("attack_power.py")
    return "\n".join(head + sections + tail)


def _population(setup: dict) -> str:
    """``"57,600 (10,000 test split, 47,600 training images outside the pool)"``: the population's sources."""
    record = setup.get("population")
    if not record:
        return f"{setup['n_population']:,}"
    parts = [f"{s['used']:,} from {s['source']}" for s in record["sources"] if s["used"]]
    return f"{setup['n_population']:,} ({', '.join(parts)})"


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def render(args, preset, cfg, target, report, train_time, attack_time, n_loo_non) -> str:
    setup = report["setup"]
    side = args.image_size or 32
    n_non = setup["pool_size"] - setup["n_members"]
    acc = target.metrics
    _, _, description, _, _ = PRESETS[preset]
    lines = [
        f"## {preset}",
        "",
        f"Model: `{cfg.model.arch}` ({target.manifest.model.param_count:,} parameters: {description}), no DP, "
        f"Adam (lr {cfg.optim.lr}, cosine), {cfg.training.steps} steps of expected batch "
        f"{cfg.training.batch_size}, no data augmentation. Data: a pool of {setup['pool_size']:,} images "
        f"({side}x{side} pixels); the target's members: {setup['n_members']:,}, non-members: {n_non:,}; each "
        f"reference model trains on a balanced half (every image IN for exactly {setup['n_reference'] // 2} of "
        f"{setup['n_reference']}). Population samples z: {_population(setup)}. Queries: "
        f"{', '.join(setup['augmentations'])}. Target accuracy: train {_pct(acc['train_accuracy'])}, test "
        f"{_pct(acc['test_accuracy'])}.",
        "",
        "| attack | AUC (target) [95% CI] | TPR@0.1% FPR (target) [95% CI] | TPR@1% FPR (target) | "
        "AUC leave-one-out (mean +- std) | TPR@0.1% leave-one-out | LiRA paper demo, WRN-28-2, 16 models "
        "(AUC / TPR@0.1%) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in report["attacks"].items():
        m, loo = entry["metrics"], entry["leave_one_out"]
        ci, tci = m["auc_ci"], m["tpr_at_fpr_ci"]["0.001"]
        demo = LIRA_DEMO.get(name)
        loo_tpr = format_tpr(loo["tpr_at_fpr_mean"]["0.001"], 0.001, n_loo_non)
        if loo_tpr.endswith("%"):
            loo_tpr += f" +- {_pct(loo['tpr_at_fpr_std']['0.001'])}"
        lines.append(
            f"| {name} | {m['auc']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | "
            f"{format_tpr(m['tpr_at_fpr']['0.001'], 0.001, m['n_nonmembers'], interval=tci)} | "
            f"{format_tpr(m['tpr_at_fpr']['0.01'], 0.01, m['n_nonmembers'])} | "
            f"{loo['auc_mean']:.3f} +- {loo['auc_std']:.3f} | {loo_tpr} | "
            f"{f'{demo[0]:.3f} / {_pct(demo[1])}' if demo else ''} |")
    lines += [
        "",
        f"Target columns: 95% stratified-bootstrap percentile intervals ({args.n_bootstrap} resamples); with "
        f"{n_non:,} non-members, TPR at 0.1% FPR allows {int(0.001 * n_non + 1e-9)} false positive(s) (a TPR at an "
        f"FPR below 1/{n_non:,} is written as not resolvable). Leave-one-out columns: mean +- std over the "
        f"{setup['n_reference']} rounds (at least {n_loo_non:,} non-members each). RMIA: gamma 1, ties broken by the "
        f"likelihood ratio, offline a chosen on the reference models: "
        f"{report['attacks'].get('rmia_offline', {}).get('info', {}).get('a', 'n/a')} for the target. LiRA centre: "
        f"the median (the LiRA paper's code). Population: {setup.get('population_rule')}. Every score is "
        f"\"higher = member\".",
        "",
        f"Cost: target training {train_time[0]:.0f} s wall / {train_time[1]:.0f} s CPU; attack (16 reference "
        f"models, executor `{setup['executor']}`, {setup['shadow_train_seconds']:.0f} s; then signals and all "
        f"attacks) {attack_time[0]:.0f} s wall / {attack_time[1]:.0f} s CPU. Machine: {os.cpu_count()} cores "
        f"visible, {args.threads} torch threads, shared with other jobs (wall times are noisy; CPU time is the "
        f"steadier measure). torch {torch.__version__}, Python {platform.python_version()}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=SHARED, help="the shared data folder's parent")
    p.add_argument("--models", nargs="+", default=["small_cnn", "mlp"], choices=list(PRESETS))
    p.add_argument("--run-prefix", type=Path, default=Path("results/attack-power"),
                   help="run directories are <prefix>-<model>")
    p.add_argument("--pool-size", type=int, default=2400,
                   help="pool images (2,400: every leave-one-out round has > 1,000 non-members, so 0.1%% FPR resolves)")
    p.add_argument("--test-size", type=int, default=None, help="cap on test images (default: all 10,000)")
    p.add_argument("--image-size", type=int, default=16, help="resize images (None/0: native 32x32)")
    p.add_argument("--population", default="all", help="population samples z: 'all' (default) or a number")
    p.add_argument("--privacy-meter", type=Path, default=None,
                   help="Privacy Meter's modules/mia/attacks/rmia.py at the pinned commit: adds the peer section")
    p.add_argument("--reuse-runs", action="store_true", help="re-use the run directories of an earlier invocation")
    p.add_argument("--steps", type=int, default=None, help="override the preset's steps")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=None, help="override the preset's Adam learning rate")
    p.add_argument("--n-reference", type=int, default=16)
    p.add_argument("--n-bootstrap", type=int, default=200)
    p.add_argument("--executor", default="auto", choices=["auto", "batched", "sequential", "ray"])
    run_script(p, run, argv, threads=2)


if __name__ == "__main__":
    main()
