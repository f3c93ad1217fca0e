"""Downstream transfer of the continual pre-training checkpoints, and feature distortion during DP fine-tuning.

Part 1: every run directory ``results/experiments/continual-<method>-s<seed>`` (small CNN on CIFAR-10 arrays:
non-DP, DP from scratch, DP continual pre-training, DP continual with the decelerator switch) is evaluated with
:func:`audit.transfer.runner.evaluate_transfer` on the ``cifar_suite.yaml`` datasets plus Places365 and
iNaturalist 2021 (absent here: they appear as "missing" rows with the root that was looked up), with small
budgets (``--max-train`` / ``--max-test`` per dataset). Reported: linear-probe and k-NN accuracy (Wilson 95%
intervals) per dataset, and per feature block the separation fuzziness D (He & Su 2023), Fisher separability,
least-squares residual and the fitted geometric ratio rho of D across blocks.

Part 2: :func:`audit.transfer.distortion_run.distortion_trajectory` from the non-DP source ``ft-source`` on one
downstream set: DP-FFT vs DP-LP-FFT at the same sigma and seeds, k-NN accuracy of the backbone features and
relative feature change over steps (Kumar et al. 2022; Ke et al. 2024).

Transfer results and feature caches go to ``--work-dir`` (never into the run directories).

Example (the command that made results/reference/transfer.md)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/transfer_reference.py --out results/reference/transfer.md
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from audit.transfer.distortion_run import distortion_trajectory
from audit.transfer.runner import evaluate_transfer
from audit.transfer.suite import TransferSuite, load_suite, parse_suite
from training.data import limit_indices, load_dataset
from foundation.io import read_json, write_json, write_text

METHODS = {"nondp": "non-DP (reference)", "scratch": "DP from scratch", "continual": "DP continual pre-training",
           "continual-dec": "DP continual + decelerator"}
EXTRA = [{"name": "places365", "root": "../shared/data/places365", "train_split": "train", "test_split": "val"},
         {"name": "inat2021", "root": "../shared/data/inat2021", "train_split": "train_mini",
          "test_split": "valid"}]


def make_suite(base: str, *, max_train: int, max_test: int, diag: int) -> TransferSuite:
    """``base`` suite with Places365/iNat appended, small budgets, CPU."""
    data = load_suite(base).model_dump(mode="json")
    names = {d["name"] for d in data["datasets"]}
    data["datasets"] += [d for d in EXTRA if d["name"] not in names]
    data["budget"] = {"max_train_examples": max_train, "max_test_examples": max_test}
    data["protocols"]["diagnostics"]["max_examples"] = diag
    data["device"] = "cpu"
    return parse_suite(data)


def _pct(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "—"
    a = entry["accuracy"] if "accuracy" in entry and isinstance(entry["accuracy"], dict) else entry
    return f"{100 * a['accuracy']:.1f} [{100 * a['ci_low']:.1f}, {100 * a['ci_high']:.1f}]"


def transfer_tables(results: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown: accuracy table (one row per run x dataset) and separability table (per block)."""
    acc = ["| run | dataset | n train / test | linear probe % [95% CI] | k-NN % [95% CI] |", "|---|---|---|---|---|"]
    sep = ["| run | dataset | block | dim | fuzziness D | Fisher | residual |", "|---|---|---|---|---|---|---|"]
    decay = ["| run | dataset | fitted ρ of D per block | R² | points | residual dof |", "|---|---|---|---|---|---|"]
    reasons: dict[str, str] = {}
    for run, data in results.items():
        for row in data["datasets"]:
            if row["status"] != "ok":
                acc.append(f"| {run} | {row['dataset']} | **{row['status']}** (root `{row.get('root')}`) | — | — |")
                reasons.setdefault(row["dataset"], row.get("reason", ""))
                continue
            acc.append(f"| {run} | {row['dataset']} | {row['train']['n']} / {row['test']['n']} | "
                       f"{_pct(row.get('linear_probe'))} | {_pct(row.get('knn'))} |")
            diag = row.get("diagnostics") or {}
            for layer in diag.get("layers", []):
                sep.append(f"| {run} | {row['dataset']} | {layer['layer']} | {layer['dim']} | "
                           f"{layer['fuzziness']:.3g} | {layer['fisher']:.3g} | {layer['residual']:.3f} |")
            d = diag.get("decay")
            decay.append(f"| {run} | {row['dataset']} | {d['rho']:.3f} | {d['r_squared']:.3f} | {d['n_layers']} | "
                         f"{d['n_layers'] - 2} |" if d else
                         f"| {run} | {row['dataset']} | — ({diag.get('note')}) | — | — | — |")
    notes = [f"* {ds}: {why}" for ds, why in reasons.items()]
    missing = ["Missing datasets (reason as reported):", "", *notes, ""] if notes else []
    return ["### Accuracy", "", *acc, "", *missing,
            "### Layer-wise separability (per feature block)", "", *sep, "",
            "### Geometric decay of the fuzziness across blocks", "", *decay, ""]


def summary_table(results: dict[str, dict[str, Any]]) -> list[str]:
    """Mean over seeds of LP / k-NN accuracy per method and dataset."""
    by: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run, data in results.items():
        method = run.rsplit("-s", 1)[0]
        for row in data["datasets"]:
            if row["status"] == "ok":
                e = by.setdefault((method, row["dataset"]), {"lp": [], "knn": [], "rho": []})
                e["lp"].append(row["linear_probe"]["accuracy"]["accuracy"])
                e["knn"].append(row["knn"]["accuracy"]["accuracy"])
                if (row.get("diagnostics") or {}).get("decay"):
                    e["rho"].append(row["diagnostics"]["decay"]["rho"])
    out = ["| method | dataset | seeds | linear probe % (mean ± sd) | k-NN % (mean ± sd) | ρ (mean) |",
           "|---|---|---|---|---|---|"]

    def ms(v: list[float]) -> str:
        from experiments.stats import fmt_mean_sd

        return fmt_mean_sd(v, ".1f", 100)

    for (method, ds), e in by.items():
        rho = f"{np.mean(e['rho']):.3f}" if e["rho"] else "—"
        out.append(f"| {METHODS.get(method, method)} | {ds} | {len(e['lp'])} | {ms(e['lp'])} | {ms(e['knn'])} | "
                   f"{rho} |")
    return out


def distortion_section(trajs: dict[str, list[list[dict[str, Any]]]], setup: str) -> list[str]:
    out = ["## Feature distortion during DP fine-tuning (DP-FFT vs DP-LP-FFT)", "", setup, "",
           "| step | strategy | phase | k-NN % (mean over seeds) [95% CI, seed 0] | ‖F_t−F_0‖/‖F_0‖ train | "
           "‖F_t−F_0‖/‖F_0‖ test | ε |", "|---|---|---|---|---|---|---|"]
    n_rows = len(next(iter(trajs.values()))[0])
    for i in range(n_rows):
        for strat, seeds in trajs.items():
            r0 = seeds[0][i]
            knn = np.mean([s[i]["knn_accuracy"] for s in seeds])
            ch_tr = np.mean([s[i]["relative_change_train"] for s in seeds])
            ch_te = np.mean([s[i]["relative_change_test"] for s in seeds])
            out.append(f"| {r0['step']} | {strat} | {r0['phase']} | {100 * knn:.1f} [{100 * r0['knn_ci_low']:.1f}, "
                       f"{100 * r0['knn_ci_high']:.1f}] | {ch_tr:.4f} | {ch_te:.4f} | {r0['epsilon']:.2f} |")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="results/reference/transfer.md")
    p.add_argument("--work-dir", default="/tmp/transfer_reference")
    p.add_argument("--suite", default="eval_configs/transfer/cifar_suite.yaml")
    p.add_argument("--experiments", default="results/experiments")
    p.add_argument("--methods", default="nondp,scratch,continual,continual-dec")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--max-train", type=int, default=2000)
    p.add_argument("--max-test", type=int, default=1000)
    p.add_argument("--diag-examples", type=int, default=1000)
    p.add_argument("--source", default="results/experiments/ft-source")
    p.add_argument("--distortion-dataset", default="food101")
    p.add_argument("--distortion-root", default="../shared/data/food101")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lp-steps", type=int, default=50)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--distortion-seeds", default="0,1")
    p.add_argument("--head-init", default="random", choices=["zero", "random"])
    p.add_argument("--skip-transfer", action="store_true", help="reuse transfer JSONs already in --work-dir")
    p.add_argument("--distortion-from", default=None, help="reuse trajectories from this distortion.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    work = Path(args.work_dir)
    t0 = time.time()

    suite = make_suite(args.suite, max_train=args.max_train, max_test=args.max_test, diag=args.diag_examples)
    results: dict[str, dict[str, Any]] = {}
    for method in [m for m in args.methods.split(",") if m]:
        for seed in args.seeds.split(","):
            run = f"continual-{method}-s{seed}"
            out = work / f"{run}.transfer.json"
            if args.skip_transfer and out.exists():
                results[f"{method}-s{seed}"] = read_json(out)
                continue
            print(f"[{time.time() - t0:6.0f}s] transfer {run}", flush=True)
            res = evaluate_transfer(run_dir=Path(args.experiments) / run, suite=suite, out_path=out,
                                    cache_dir=work / "features" / run)
            results[f"{method}-s{seed}"] = res.data
    t_transfer = time.time() - t0

    train = load_dataset(args.distortion_dataset, root=args.distortion_root, split="train")
    test = load_dataset(args.distortion_dataset, root=args.distortion_root, split="test")
    train = train.subset(np.sort(limit_indices(train.y, args.max_train)))
    test = test.subset(np.sort(limit_indices(test.y, args.max_test)))
    trajs: dict[str, list[list[dict[str, Any]]]] = {"DP-FFT": [], "DP-LP-FFT": []}
    if args.distortion_from:
        trajs = read_json(args.distortion_from)
    for seed in () if args.distortion_from else (int(s) for s in args.distortion_seeds.split(",")):
        for name, strategy, lp in (("DP-FFT", "fft", 0), ("DP-LP-FFT", "lp_fft", args.lp_steps)):
            print(f"[{time.time() - t0:6.0f}s] distortion {name} seed {seed}", flush=True)
            trajs[name].append(distortion_trajectory(
                source_run_dir=args.source, data=(train, test), strategy=strategy, steps=args.steps, lp_steps=lp,
                noise_multiplier=args.sigma, batch_size=args.batch_size, lr=args.lr, eval_every=args.eval_every,
                seed=seed, head_init=args.head_init))
    if not args.distortion_from:
        write_json(work / "distortion.json", trajs)
    t_all = time.time() - t0

    argv_used = list(sys.argv[1:] if argv is None else argv)
    reused = args.skip_transfer or args.distortion_from is not None
    for flag in ("--skip-transfer", "--distortion-from"):  # the re-make command computes everything
        if flag in argv_used:
            i = argv_used.index(flag)
            del argv_used[i:i + (2 if flag == "--distortion-from" else 1)]
    cmd = "OMP_NUM_THREADS=1 .venv/bin/python " + shlex.join(["benchmarks/transfer_reference.py", *argv_used])
    machine = (f"{platform.machine()} CPU ({os.cpu_count()} cores visible, 1 torch thread), {platform.system()}, "
               f"torch {torch.__version__}, Python {platform.python_version()}; no GPU")
    setup = (f"Source: `{args.source}` (small CNN, non-DP on CIFAR-10). Downstream: {args.distortion_dataset} "
             f"(`{args.distortion_root}`), {len(train)} train / {len(test)} test (class-balanced). DP-SGD, "
             f"Poisson q = {args.batch_size}/{len(train)}, σ = {args.sigma}, C = 1, SGD lr {args.lr} (no momentum), "
             f"{args.steps} steps; DP-LP-FFT = {args.lp_steps} LP steps (backbone frozen) then "
             f"{args.steps - args.lp_steps} FFT steps; head init {args.head_init}. Seeds "
             f"{args.distortion_seeds}. k-NN (k = 20, τ = 0.07, cosine) on the backbone features "
             "(`forward_features`), train features of the same step as the bank. ε: RDP, δ = default_delta(n).")
    lines = [
        "# Downstream transfer of the continual pre-training checkpoints, and DP fine-tuning feature distortion",
        "", f"Re-make: `{cmd}`", "", f"Machine: {machine}. " + (
            "This file was assembled from the JSONs of that command's two parts (transfer, distortion) run "
            f"separately into `{args.work_dir}`; each transfer evaluation took ~1 min of 1 core, each "
            "trajectory a few minutes, on a machine shared with other jobs." if reused else
            f"Wall time: transfer {t_transfer:.0f} s, total {t_all:.0f} s."), "",
        f"Suite: `{args.suite}` + Places365 and iNaturalist 2021 (expected at the roots shown; absent here), budget "
        f"≤ {args.max_train} train / ≤ {args.max_test} test per dataset (class-balanced), linear probe (logistic "
        f"regression, C chosen on a 20% validation split), k-NN (k = 20, τ = 0.07); separability on "
        f"≤ {args.diag_examples} training examples per dataset. Intervals: Wilson 95%. Checkpoints: "
        f"`{args.experiments}/continual-<method>-s<seed>` (see results/reference/continual_pretrain.md).", "",
        "## Summary (mean ± sample sd over seeds)", "", *summary_table(results), "",
        "## Per run", "", *transfer_tables(results), *distortion_section(trajs, setup), ""]
    write_text(args.out, "\n".join(lines))
    print(f"wrote {args.out} in {t_all:.0f}s")


if __name__ == "__main__":
    main()
