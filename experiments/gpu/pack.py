"""A lease's results as one tarball and back: ``pack`` gathers the arm parts, run manifests and metrics, the
fine-tuning source's weights, the σ cache and the job log; ``unpack`` puts a pack's JSON and safetensors back under
``results/`` (never a pickle; paths checked)."""

from __future__ import annotations

import tarfile
from pathlib import Path

from experiments.arms.scales import SCALES
from experiments.paths import ROOT

SIGMA_CACHE = ROOT / "results/sigma-cache"
LOG = ROOT / "results/seed_gpu_jobs.jsonl"


def unpack(tarball: Path) -> None:
    """Extract a pack into ``results/`` (JSON, and the fine-tuning source's safetensors weights, never a pickle;
    paths checked), e.g. the committed GPU results."""
    with tarfile.open(tarball, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith("results/")
                   and ".." not in Path(m.name).parts and m.name.endswith((".json", ".jsonl", ".safetensors"))]
        tar.extractall(ROOT, members=members, filter="data")
    print(f"unpacked {len(members)} file(s) from {tarball}")


def pack(dest: Path) -> None:
    """One tarball of everything a later table needs (no checkpoints)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        names = {n for n in SCALES if n.startswith("gpu")}
        arms = sorted(p for d in names for p in (ROOT / "results/seed_arms" / d).rglob("*.json"))
        for p in arms:
            tar.add(p, arcname=str(p.relative_to(ROOT)))
        for p in sorted(p for d in ("experiments-gpu", "experiments-gpu-full")
                        for p in (ROOT / "results" / d).glob("*/*.json")):
            tar.add(p, arcname=str(p.relative_to(ROOT)))
        for p in sorted(ROOT.glob("results/experiments-gpu*/ft-source/model.safetensors")):  # a later lease's start
            tar.add(p, arcname=str(p.relative_to(ROOT)))
        for p in [*sorted(SIGMA_CACHE.glob("*.json")), LOG]:
            if p.exists():
                tar.add(p, arcname=str(p.relative_to(ROOT)))
    print(f"packed {dest} ({dest.stat().st_size / 2**10:.0f} KiB)")
