"""LOSS and Attack-P against a real, externally trained CIFAR-10 ResNet-20 (``../shared/weights``).

The checkpoint (``akamaster/pytorch_resnet_cifar10``, He et al. 2016 ResNet-20, no DP, trained on the full
CIFAR-10 train split) is imported with ``audit import``: members are ``cifar10_exact/train`` (original pixels of
5,438 training images), non-members ``cifar10_exact/test`` (1,017 test images), of which ``--population``
are held out as the population samples Attack-P ranks against. Then ``audit attack`` runs LOSS and Attack-P
(no reference models: there is no training recipe) and this script writes a Markdown table with AUC and
TPR at 1% FPR and their stratified-bootstrap 95% intervals. A second table shows the population / non-member
trade-off: LOSS on the same checkpoint with every non-member kept in the pool (``--population 0``), with and
without the flip query.

Example (the command that made results/reference/external_resnet20.md)::

    .venv/bin/python benchmarks/external_resnet20.py --out results/reference/external_resnet20.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from foundation.shared_root import shared_root

import torch

from attacks.runner import run_attack
from attacks.config import AttackConfig
from attacks.resolution import format_tpr
from audit.importer import import_checkpoint, parse_source
from _common import remake_section, run_script

SHARED = shared_root()  # $DP_AUDIT_SHARED, default ../shared
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def run(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    weights = args.shared / "weights" / "resnet20-cifar10-12fca82f.th"
    root = str(args.shared / "data" / "cifar10_exact")
    if not weights.is_file():
        sys.exit(f"missing {weights}: this benchmark needs ../shared (see its MANIFEST.md)")
    t0 = time.perf_counter()
    imported = import_checkpoint(
        weights=weights, arch="resnet20_cifar", normalize_mean=MEAN, normalize_std=STD, fix_batchnorm=False,
        members=parse_source("cifar10:train", root=root), nonmembers=parse_source("cifar10:test", root=root),
        population=args.population, seed=args.seed, out=args.run, overwrite=True, device="cpu",
        command="benchmarks/external_resnet20.py")
    t_import = time.perf_counter() - t0
    config = AttackConfig(attacks=("loss", "attack_p"), n_reference=0, flip=args.flip, shifts=0,
                          population=args.population, n_bootstrap=args.n_bootstrap, seed=args.seed, device="cpu")
    t0 = time.perf_counter()
    result = run_attack(run_dir=args.run, config=config, progress=False)
    t_attack = time.perf_counter() - t0
    main_text = render(args, imported, result.report.model_dump(), t_import, t_attack)
    head, remake = main_text.split("## Re-make", 1)
    return head + tradeoff(args, weights, root) + "\n## Re-make" + remake


def tradeoff(args: argparse.Namespace, weights: Path, root: str) -> str:
    """LOSS with ``--population {P, 0}`` and with/without the flip: what holding out a population costs."""
    rows = []
    for population, flip in ((args.population, True), (0, True), (0, False)):
        run = args.run.parent / f"{args.run.name}-population{population}"
        import_checkpoint(
            weights=weights, arch="resnet20_cifar", normalize_mean=MEAN, normalize_std=STD, fix_batchnorm=False,
            members=parse_source("cifar10:train", root=root), nonmembers=parse_source("cifar10:test", root=root),
            population=population, seed=args.seed, out=run, overwrite=True, device="cpu",
            command="benchmarks/external_resnet20.py")
        config = AttackConfig(attacks=("loss",), n_reference=0, flip=flip, shifts=0, population=population,
                              n_bootstrap=args.n_bootstrap, seed=args.seed, device="cpu")
        m = run_attack(run_dir=run, config=config, progress=False).report.attacks["loss"].metrics
        rows.append(f"| {population} | {m.n_nonmembers:,} | {'identity, hflip' if flip else 'identity'} | "
                    f"{m.auc:.3f} {_ci(list(m.auc_ci))} | "
                    f"{format_tpr(m.tpr_at_fpr['0.01'], 0.01, m.n_nonmembers, digits=2, interval=m.tpr_at_fpr_ci['0.01'])} | "
                    f"{format_tpr(m.tpr_at_fpr['0.001'], 0.001, m.n_nonmembers, digits=2)} |")
    return "\n".join([
        "## The population / non-member trade-off (LOSS)",
        "",
        "The 1,017 non-members are either negatives in the pool or population samples; LOSS needs no population.",
        "",
        "| --population | non-members in the pool | queries | AUC [95% CI] | TPR @ 1% FPR [95% CI] | TPR @ 0.1% FPR |",
        "|---:|---:|---|---:|---:|---:|",
        *rows,
        "",
        f"Holding out {args.population} non-members leaves {1017 - args.population} negatives: wider intervals and "
        f"no TPR below 1/{1017 - args.population} FPR. Averaging over the flip changes the score itself.",
        "",
    ])


def _ci(v: list[float] | None, scale: float = 1.0, digits: int = 3) -> str:
    return "n/a" if not v else f"[{v[0] * scale:.{digits}f}, {v[1] * scale:.{digits}f}]"


def render(args, imported, report, t_import: float, t_attack: float) -> str:
    setup, m = report["setup"], imported.metrics
    lines = [
        "# Membership inference against an external CIFAR-10 ResNet-20 (no DP)",
        "",
        "Checkpoint: `../shared/weights/resnet20-cifar10-12fca82f.th` (akamaster/pytorch_resnet_cifar10, "
        "He et al. 2016 CIFAR ResNet-20, 0.27M parameters, trained elsewhere on the full 50,000-image "
        "CIFAR-10 train split, no DP: claimed epsilon = inf). Imported with `audit import` (arch "
        "`resnet20_cifar`, BatchNorm kept, input normalised with ImageNet mean/std "
        f"{MEAN}/{STD}).",
        "",
        f"Data (`../shared/data/cifar10_exact`, original pixels): members = `train` ({setup['n_members']:,} "
        f"images), non-members = `test` (1,017 images), of which {setup['n_population']} (seed {args.seed}) are "
        f"held out as Attack-P's population; the attacked pool is {setup['pool_size']:,} images "
        f"({setup['n_members']:,} members, {setup['pool_size'] - setup['n_members']:,} non-members). "
        f"Queries: {', '.join(setup['augmentations'])}. Accuracy: {100 * m['train_accuracy']:.2f}% on members, "
        f"{100 * m['test_accuracy']:.2f}% on non-members.",
        "",
        "| attack | AUC | AUC 95% CI | TPR @ 1% FPR | TPR 95% CI | TPR @ 0.1% FPR | balanced accuracy |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in report["attacks"].items():
        mm = entry["metrics"]
        t = mm["tpr_at_fpr"]
        lines.append(f"| {name} | {mm['auc']:.3f} | {_ci(mm['auc_ci'])} | {100 * t['0.01']:.2f}% | "
                     f"{_ci(mm['tpr_at_fpr_ci'].get('0.01'), 100, 2)} % | "
                     f"{format_tpr(t['0.001'], 0.001, mm['n_nonmembers'], digits=2)} | "
                     f"{mm['balanced_accuracy']:.3f} |")
    n_non = setup["pool_size"] - setup["n_members"]
    lines += [
        "",
        f"Intervals: stratified percentile bootstrap, {args.n_bootstrap} resamples, 95%. With {n_non} "
        f"non-members the smallest non-zero FPR is 1/{n_non} = {1 / n_non:.4f}: TPR at 0.1% FPR is not resolvable "
        "(it would be the TPR at zero false positives). Every score is \"higher = member\"; LOSS ranks by the mean cross-entropy over "
        "the queries (Yeom et al. 2018), Attack-P by the fraction of population losses above the example's "
        "(Ye et al. 2022): a non-increasing step function of the same loss, so on one target the two differ "
        "only through the ties Attack-P creates between consecutive population losses.",
        "",
        f"Wall time on this machine: import {t_import:.0f} s, attack {t_attack:.0f} s (CPU, {args.threads} "
        f"torch threads; {os.cpu_count()} cores visible, shared with other jobs). "
        f"torch {torch.__version__}, Python {platform.python_version()}.",
        "",
        *remake_section("external_resnet20.py"),
        "or, with the CLI:",
        "",
        "```",
        ".venv/bin/audit import --weights ../shared/weights/resnet20-cifar10-12fca82f.th --arch resnet20_cifar \\",
        "    --normalize-mean 0.485 0.456 0.406 --normalize-std 0.229 0.224 0.225 \\",
        "    --members cifar10:train --nonmembers cifar10:test --root ../shared/data/cifar10_exact \\",
        f"    --population {args.population} --seed {args.seed} --out results/external-resnet20",
        f".venv/bin/audit attack results/external-resnet20 --set attack.flip={str(args.flip).lower()} "
        f"--set attack.population={args.population} --set attack.n_bootstrap={args.n_bootstrap}",
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shared", type=Path, default=SHARED, help="the shared data/weights folder")
    p.add_argument("--run", type=Path, default=Path("results/external-resnet20"), help="run directory to write")
    p.add_argument("--population", type=int, default=500, help="non-members held out as Attack-P's population")
    p.add_argument("--flip", action=argparse.BooleanOptionalAction, default=True, help="also query the flip")
    p.add_argument("--n-bootstrap", type=int, default=1000)
    run_script(p, run, argv, threads=2)


if __name__ == "__main__":
    main()
