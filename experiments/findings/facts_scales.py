"""The figures the scale notes of the findings quote: what each scale's pre-trained models reached, the σ its ε
took, where and how long its parts ran, read from the arms' result files and the configs' runs."""

from __future__ import annotations

import json
import statistics

from experiments.findings.numbers import mean_pct, ms_pct, thousands
from experiments.findings.rows import OUT, ROOT, arm_result
from experiments.papers.runs import groups


def _sigmas(a: dict) -> str:
    return " / ".join(f"{a['sigmas'][e]:.3f}" for e in ("eps1", "eps3", "eps8"))


def _parts(scale: str, arm: str) -> list[dict]:
    for base in (OUT / "seed_arms", ROOT / "results/seed_arms"):
        got = sorted((base / scale / "parts").glob(f"{arm}.s*.json"))
        if got:
            return [json.loads(p.read_text()) for p in got]
    return []


def vit_scales() -> dict[str, str]:
    """The ViT scales' pre-training accuracies, σ per ε and where their (seed, ε) parts ran."""
    f: dict[str, str] = {}
    long = arm_result("gpu_full_vit_long", "vit")
    if long:
        parts = _parts("gpu_full_vit_long", "vit")
        cpu = [p["wall_seconds"] for p in parts if p.get("device") == "cpu"]
        f.update({"gvl_pre": mean_pct(long["per_seed"]["pretrain_acc"]), "gvl_sigmas": _sigmas(long),
                  "gvl_jobs": str(len(parts)), "gvl_lease_jobs": str(len(parts) - len(cpu)),
                  "gvl_cpu_jobs": str(len(cpu)), "gvl_cpu_minutes": f"{statistics.mean(cpu) / 60:.0f}",
                  "gvl_cpu_secs": f"{thousands(min(cpu))}-{thousands(max(cpu))}"})
    for key, scale in (("cvl", "cpu_vit_long"), ("gv", "gpu_full_vit"), ("chv", "cpu_hour_vit")):
        a = arm_result(scale, "vit")
        if a:
            pre = a["per_seed"]["pretrain_acc"]
            f.update({f"{key}_pre": mean_pct(pre) if len(set(pre)) == 1 else ms_pct(pre), f"{key}_sigmas": _sigmas(a),
                      f"{key}_minutes_per_seed": f"{a['wall_seconds'] / 60 / len(a['seeds']):.0f}"})
    return f


def gpu_scale() -> dict[str, str]:
    """The ``gpu`` scale's non-DP baseline on its 8,000 images: test and train accuracy."""
    g = groups("continual", "gpu")
    if "nondp" not in g:
        return {}
    return {"gs_nondp": mean_pct([x["test_accuracy"] for _, _, x in g["nondp"]], 0),
            "gs_nondp_train": mean_pct([x["train_accuracy"] for _, _, x in g["nondp"]], 0)}
