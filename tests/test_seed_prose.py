"""experiments.findings' prose: every figure a sentence quotes comes from the result files (reference computations
beside each), a changed result changes the sentence, and a paragraph whose files are absent is left out."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from experiments.findings import facts_arms, facts_tables, prose, prose_law, rows

REFERENCE = Path(__file__).resolve().parents[1] / "results/reference"


def _arm(name: str, scale: str = "gpu_full") -> dict:
    return json.loads((REFERENCE / "seed_arms" / scale / f"{name}.json").read_text())


def _ms(values, digits: int, scale: float = 1.0) -> str:
    """Mean ± sample SD, computed with numpy (the reference for experiments.stats.fmt_mean_sd)."""
    v = np.asarray(values, float) * scale
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def test_the_ganesh_paragraph_quotes_the_committed_arm_file():
    ps = _arm("ganesh")["per_seed"]
    f = facts_arms.ganesh()
    text = prose._ganesh(f)
    assert f"{_ms(ps['barrier_same_public'], 3)} along the straight line" in text
    ends = [v for c in ps["barrier_random_curve"] for v in (c[0], c[-1])]
    assert f"~{100 * np.mean(ps['barrier_random']) / np.mean(ends):.0f} % of their {min(ends):.2f}-{max(ends):.2f}" in text
    for b in _arm("ganesh")["budgets"]:
        assert _ms(ps[f"public{b}_acc"], 1, 100) in text
    parts = list((REFERENCE / "seed_arms/gpu_full/parts").glob("ganesh.s*.json"))
    cpu = [p for p in parts if json.loads(p.read_text())["device"] == "cpu"]
    assert f"{len(parts)} parts, {len(cpu)} on this CPU" in text


def test_the_law_paragraph_quotes_the_committed_vit_file():
    a = _arm("vit", "gpu_full_vit_long")
    ps = a["per_seed"]
    text = prose_law._law({**facts_arms.vit(), "cvl_pre": "60.9"})
    assert f"pre-trained to {100 * np.mean(ps['pretrain_acc']):.1f} %" in text
    assert f"untuned: {_ms(ps['eps1_untuned_acc'], 1, 100)} % at ε = 1" in text
    profile = np.mean(np.asarray(ps["pretrain_residual"], float), axis=0)
    assert f"({profile[0]:.3f}, {profile[1]:.3f}, {profile[2]:.3f}, ..., {profile[-1]:.3f})" in text
    assert f"(ρ {np.mean(ps['eps1_tuned_rho_D']):.3f} at ε = 1 vs {np.mean(ps['epsinf_tuned_rho_D']):.3f}" in text
    # the paper's "near-identical across ε" is read by the equivalence test, with its margin
    margin = 0.2 * (1 - np.mean(ps["epsinf_tuned_rho_D"]))
    assert f"margin ±{margin:.4f}" in text and "63.9" not in text and "cosine 0.001" not in text


def test_the_budget_split_paragraph_reads_the_committed_table():
    f = facts_tables.budget_split()
    text = (REFERENCE / "finetune_strategies.gpu_full.md").read_text()
    lp8 = float(text.split("| DP-LP (head only) | 8 | 5 |")[1].split("|")[2].split("±")[0])
    assert f["bs_lp8"] == f"{lp8:.1f}" and "77.2 % CIFAR-10 test accuracy" in text and f["bs_source"] == "77.2"
    assert "(ε = 8: +0.9-1.7 points, Holm p = 0.78)" in prose_law._budget_split(f)


@pytest.fixture
def out(tmp_path, monkeypatch):
    for module in (rows, facts_arms):  # where the arms' results are read
        monkeypatch.setattr(module, "OUT", tmp_path)
        monkeypatch.setattr(module, "ROOT", tmp_path)
    return tmp_path


def _continual(out: Path, scale: str, clip: list[float]) -> None:
    rng = np.random.default_rng(0)
    ps = {f"{k}_acc": list(rng.uniform(lo, lo + 0.02, 5)) for k, lo in
          (("nondp", 0.64), ("scratch", 0.40), ("continual", 0.48), ("plateau", 0.54))}
    ps["clip_only_acc"] = clip
    for k in ("nondp", "scratch", "continual", "plateau", "clip_only"):
        ps[f"{k}_loss_auc"] = list(rng.uniform(0.5, 0.54, 5))
        ps[f"{k}_loss_tpr1"] = list(rng.uniform(0.009, 0.012, 5))
    ps.update(plateau_switch=[400] * 5, plateau_reason=["max_public_steps"] * 5, sigma_scratch=[0.8] * 5)
    folder = out / "seed_arms" / scale
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "continual.json").write_text(json.dumps({"per_seed": ps, "n_members_mean": 10000,
                                                       "scale_settings": {"switch": 200, "steps": 1000}}))


def test_a_changed_result_changes_the_sentence(out):
    clip = [0.58, 0.60, 0.59, 0.61, 0.60]
    _continual(out, "gpu_full", clip)
    f = facts_arms.continual_arm()
    assert f["ca_clip"] == f"{100 * statistics.mean(clip):.1f} ± {100 * statistics.stdev(clip):.1f}"
    before = prose._continual_arm({**f, "cas_clip": "1", "cas_scratch": "1", "cas_auc_dp": "1", "cas_auc_nondp": "1",
                                   "gf_at_arm_switch": "1", "gf_at_arm_cap": "1"})
    _continual(out, "gpu_full", [0.50, 0.52, 0.51, 0.53, 0.52])
    g = facts_arms.continual_arm()
    after = prose._continual_arm({**g, "cas_clip": "1", "cas_scratch": "1", "cas_auc_dp": "1", "cas_auc_nondp": "1",
                                  "gf_at_arm_switch": "1", "gf_at_arm_cap": "1"})
    assert before != after and "51.6 ± 1.1 % vs" in after
    assert "its cap of 400 steps" in after  # the plateau rule ran to its cap on every seed: said so


def test_a_paragraph_without_its_result_files_is_left_out(out):
    assert facts_arms.ganesh() == {} and facts_arms.vit() == {}
    assert prose.paragraphs({}, prose._PROSE + prose_law.PROSE) == []
    _continual(out, "gpu_full", [0.58, 0.60, 0.59, 0.61, 0.60])
    f = {**facts_arms.continual_arm(), "gf_at_arm_switch": "48.3", "gf_at_arm_cap": "53.7"}
    got = prose.paragraphs(f, (prose._continual_arm, prose._ganesh))
    assert len(got) == 0  # the continual paragraph also quotes cpu_hour's arm, which is absent
    _continual(out, "cpu_hour", [0.28] * 5)
    f = {**facts_arms.continual_arm(), "gf_at_arm_switch": "48.3", "gf_at_arm_cap": "53.7"}
    assert len(prose.paragraphs(f, (prose._continual_arm, prose._ganesh))) == 1
