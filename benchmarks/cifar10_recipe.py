"""CIFAR-10 recipes at the scale this machine allows: the non-DP ResNet target and the DP (ε = 8) WRN-16-4-like one.

Trains ``eval_configs/cifar10_resnet.yaml`` and ``eval_configs/cifar10_resnet_dp.yaml`` through ``audit train``
with the step count (and, for DP, the batch size and augmentation multiplicity) overridden to fit a CPU budget —
every other setting is the recipe's — and records test accuracy on the JPEG-decoded official test set
(``../shared/data/cifar10``) and on the exact original pixels (``../shared/data/cifar10_exact/test``, 1,017 images),
beside the published figures. On a GPU run it without overrides (``--full``) to get the recipes' own numbers.

    .venv/bin/python benchmarks/cifar10_recipe.py --out results/reference/cifar10_recipe.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import remake_section, run_script  # noqa: E402
from training.config import load_config  # noqa: E402
from training.data import load_dataset  # noqa: E402
from training.device import resolve_device  # noqa: E402
from training.evaluate import accuracy  # noqa: E402
from training.run import open_run  # noqa: E402
from training.trainer import train  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
PUBLISHED = {
    "nondp": "≥ 90 % is the aim (standard CIFAR-10 ResNet-18 training reaches 93–95 % on the 50,000 exact images)",
    "dp": "79.5 % (De et al. 2022, WRN-16-4, ε = 8, δ = 1e-5, batch 4,096, 16 augmentations per example)",
}


def run_one(which: str, overrides: list[str], out_dir: Path, device: str) -> dict:
    cfg_path = ROOT / "eval_configs" / ("cifar10_resnet.yaml" if which == "nondp" else "cifar10_resnet_dp.yaml")
    cfg = load_config(cfg_path, [*overrides, f"output_dir={out_dir}", f"data.root={SHARED / 'cifar10'}",
                                 "training.progress=false", f"training.device={device}"])
    t0 = time.perf_counter()
    res = train(cfg, overwrite=True)
    wall = time.perf_counter() - t0
    run = open_run(res.run_dir)
    exact = load_dataset("cifar10", root=str(SHARED / "cifar10_exact"), split="test")
    dev = resolve_device(device)
    exact_acc = accuracy(run.model(device=dev), exact, device=dev)
    members = res.manifest.data.membership.n_members
    return {"config": cfg_path.name, "overrides": overrides, "steps": res.metrics["steps"],
            "batch": cfg.training.batch_size, "members": members,
            "epochs": res.metrics["steps"] * cfg.training.batch_size / members,
            "multiplicity": cfg.training.augment.multiplicity, "wall": wall,
            "test": res.metrics["test_accuracy"],
            "exact": exact_acc, "epsilon": res.manifest.privacy.epsilon, "sigma": (
                res.manifest.privacy.phases[0].noise_multiplier if res.manifest.privacy.dp else None),
            "device": str(dev)}


def make_table(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        nondp_over = [] if args.full else ["training.epochs=null", f"training.steps={args.steps}",
                                           f"data.test_size={args.test_size}"]
        rows["nondp"] = run_one("nondp", nondp_over, Path(tmp), args.device)
        if not args.skip_dp:
            dp_over = [] if args.full else [f"training.steps={args.dp_steps}", f"training.batch_size={args.dp_batch}",
                                            f"training.augment.multiplicity={args.dp_multiplicity}",
                                            "training.eval_every=0", f"data.test_size={args.test_size}",
                                            "training.physical_batch_size=64"]
            rows["dp"] = run_one("dp", dp_over, Path(tmp), args.device)
    lines = ["# CIFAR-10 recipes: accuracy at the scale this machine allows", "",
             f"torch {torch.__version__}, {torch.get_num_threads()} threads, device "
             f"`{rows['nondp']['device']}`, {time.strftime('%Y-%m-%d')}.", "",
             "| recipe | overrides (else the config as written) | steps × batch (epochs over members) | wall | "
             "test acc. JPEG test | test acc. exact test (1,017) | ε | published / aim |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for which, r in rows.items():
        eps = "—" if r["epsilon"] is None else f"{r['epsilon']:.2f} (σ = {r['sigma']:.2f})"
        mult = f", ×{r['multiplicity']} copies" if r["multiplicity"] > 1 else ""
        lines.append(f"| `{r['config']}` | `{' '.join(r['overrides']) or '(none)'}` | {r['steps']} × {r['batch']}{mult} "
                     f"({r['epochs']:.2f}) | {r['wall'] / 60:.1f} min | {100 * r['test']:.1f} % | "
                     f"{100 * r['exact']:.1f} % | {eps} | {PUBLISHED[which]} |")
    lines += ["", *remake_section("cifar10_recipe.py")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120, help="non-DP steps at CPU scale")
    ap.add_argument("--dp-steps", type=int, default=20)
    ap.add_argument("--dp-batch", type=int, default=256)
    ap.add_argument("--dp-multiplicity", type=int, default=2)
    ap.add_argument("--test-size", type=int, default=2000, help="JPEG test images evaluated (CPU scale)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--full", action="store_true", help="the recipes as written (a GPU's job)")
    ap.add_argument("--skip-dp", action="store_true")
    run_script(ap, make_table, argv, seed=False, threads=2)


if __name__ == "__main__":
    main()
