"""The membership arm (LiRA / RMIA on the continual arm's trainings) and its findings row: leave-one-out scoring
against a naive loop, the strongest attack by the suite's definition, the two-sided verdict with its power check,
the resolution statement, and the arm's models being the continual arm's runs again."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.arms import ArmScale

TINY = ArmScale(name="tiny", dataset="digits", root=None, private=120, public=60, val=40, test=60, batch_size=20,
                steps=6, switch=2, seeds=(0,), accountant="rdp", membership_models=4,
                continual_arms=("nondp", "continual"))


def _family(rng, m: int, n: int, pop: int, signal: float):
    keep = rng.random((m, n)) < 0.5
    phi = rng.normal(size=(m, n, 2)) + signal * keep[..., None]
    return phi, keep, rng.normal(size=(m, pop, 2))


def test_score_family_pools_the_leave_one_out_rounds_and_picks_the_strongest_by_the_suites_definition():
    """Per-target metrics are the naive loop's (each model the target, the others its references with their keep
    masks); the pooled ROC is every round's scores together; the strongest attack is attacks.strongest's choice on
    the pooled metrics. A leaky family (members' signals shifted) is found at 1 % FPR, a null family is not."""
    from attacks.metrics import compute_metrics
    from attacks.registry import AttackInputs, configured_attack
    from attacks.strongest import strongest
    from experiments.arms.membership import score_family

    rng = np.random.default_rng(0)
    m, n, pop = 6, 400, 100
    phi, keep, pop_phi = _family(rng, m, n, pop, signal=3.0)
    per, summ = score_family(phi, keep, pop_phi, attacks=("loss", "lira_online", "rmia_online"))
    assert len(per["lira_online_auc"]) == m
    scores = []
    for t in range(m):  # the slow obviously-correct reference
        others = [i for i in range(m) if i != t]
        s = configured_attack("lira_online").score(AttackInputs(target=phi[t], reference=phi[others],
                                                                reference_in=keep[others]))
        ref = compute_metrics(s, keep[t], rng=t, n_boot=200, fpr_targets=(0.01, 0.001))
        assert per["lira_online_tpr_0.01"][t] == ref.tpr_at[0.01]
        assert per["lira_online_tpr_0.01_ci"][t] == list(ref.tpr_at_ci[0.01])
        assert per["lira_online_n_nonmembers"][t] == int((~keep[t]).sum())
        scores.append(s)
    pooled = compute_metrics(np.concatenate(scores), keep.reshape(-1), rng=m, n_boot=200, fpr_targets=(0.01, 0.001))
    assert summ["pooled"]["lira_online"]["auc"] == pooled.auc
    assert summ["n_nonmembers_pooled"] == int((~keep).sum())
    cands = {a: (p["auc"], {"0.01": p["tpr_0.01"], "0.001": p["tpr_0.001"]}, p["n_nonmembers"])
             for a, p in summ["pooled"].items()}
    assert summ["strongest"] == strongest(cands)
    assert summ["pooled"][summ["strongest"]]["tpr_0.01"] > 0.3
    null_per, null = score_family(*_family(rng, m, n, pop, signal=0.0), attacks=("loss", "lira_online"))
    assert null["pooled"][null["strongest"]]["tpr_0.01_ci"][0] < 0.03


@pytest.mark.parametrize("nondp, dp, lows, want", [
    ([0.30, 0.28, 0.33, 0.31, 0.29], [0.011, 0.009, 0.012, 0.010, 0.010], (0.25, 0.005), "reproduced"),
    ([0.011, 0.009, 0.012, 0.010, 0.010], [0.30, 0.28, 0.33, 0.31, 0.29], (0.005, 0.25), "not reproduced"),
    ([0.013, 0.012, 0.014, 0.013, 0.012], [0.009, 0.010, 0.008, 0.009, 0.010], (0.009, 0.004), "inconclusive"),
    ([0.30, 0.20, 0.40, 0.25, 0.35], [0.31, 0.22, 0.38, 0.27, 0.30], (0.2, 0.2), "inconclusive"),
])
def test_the_membership_verdict_is_two_sided_and_needs_an_attack_with_power(nondp, dp, lows, want):
    """'reproduced' only when DP's TPR at 1 % FPR is significantly below non-DP's, 'not reproduced' when above, and
    never a verdict when neither training's pooled TPR is above chance (a significant difference of two chance
    levels, the third case, is no evidence of resistance)."""
    from experiments.findings.membership import membership_verdict

    text, v = membership_verdict(nondp, dp, *lows)
    assert v == want
    assert ("no power" in text) == (max(lows) <= 0.01)


def test_the_dp_bound_at_eps_8_says_nothing_at_one_percent_fpr():
    from experiments.findings.membership import dp_tpr_bound

    assert dp_tpr_bound(8.0, 1e-5, 0.01) == 1.0 and dp_tpr_bound(1.0, 0.0, 0.01) == pytest.approx(np.e / 100)


def test_the_arm_retrains_the_continual_arms_runs_keeps_its_signals_and_its_row_says_what_is_not_resolvable(
        tmp_path, monkeypatch):
    """Model i of a training is the continual arm's seed i (same member half, same test accuracy); the kept
    signals re-score to the same per-target metrics; the findings row prints TPR at 0.1 % FPR as not resolvable
    with 60 non-members per target (and 240 pooled), and gives a verdict."""
    from experiments.arms.bu import continual_arm
    from experiments.arms.membership import load_signals, membership_arm, rescore_parts, score_family
    from experiments.findings import membership as fm

    res = membership_arm(TINY, signals_dir=tmp_path)
    assert res["targets"] == 4 and len(res["per_seed"]["nondp_acc"]) == 4
    base = continual_arm(TINY.with_(seeds=(0, 1), continual_arms=("nondp", "continual")))
    for fam in ("nondp", "continual"):
        assert res["per_seed"][f"{fam}_acc"][:2] == base["per_seed"][f"{fam}_acc"]
    phi, keep, pop_phi = load_signals(tmp_path / "nondp.safetensors")
    assert phi.shape == (4, 120, 2) and pop_phi.shape == (4, 60, 2) and keep.sum(axis=1).tolist() == [60] * 4
    again, _ = score_family(phi, keep, pop_phi)
    assert again["lira_online_auc"] == res["per_seed"]["nondp_lira_online_auc"]
    part = tmp_path / "membership.s0.json"  # re-scored from the kept signals with other attacks: no training
    part.write_text(json.dumps(res))
    [done] = rescore_parts([part], tmp_path, attacks=("loss", "lira_online_fixed_var"))
    back = json.loads(done.read_text())
    assert back["per_seed"]["nondp_acc"] == res["per_seed"]["nondp_acc"]
    assert "nondp_rmia_online_auc" not in back["per_seed"] and len(back["per_seed"]["nondp_loss_auc"]) == 4
    assert back["per_seed"]["continual_lira_online_fixed_var_tpr_0.01"] == score_family(
        *load_signals(tmp_path / "continual.safetensors"), attacks=("lira_online_fixed_var",))[0][
        "lira_online_fixed_var_tpr_0.01"]
    assert set(back["summary"]["nondp"]["pooled"]) == {"loss", "lira_online_fixed_var"}
    with pytest.raises(ValueError, match="no signals"):
        rescore_parts([part], tmp_path / "elsewhere")
    res = json.loads(json.dumps({**res, "scale_settings": {"epsilon": 8.0, "delta": 1e-5}}))
    monkeypatch.setattr(fm, "arm_result", lambda scale, arm: res if (scale, arm) == ("tiny_mia", "membership")
                        else None)
    [line] = fm.membership_rows("tiny")
    assert "not resolvable with 60 non-members per target" in line
    assert "not resolvable with 240 non-members" in line
    assert any(f"**{v}**" in line for v in ("reproduced", "not reproduced", "inconclusive"))
    assert fm.membership_rows("other") == []


def test_the_per_seed_archive_keeps_what_is_not_on_this_machine():
    """Re-making the findings where only some runs are present updates those and keeps every other committed
    value (a table's runs that left this machine must not vanish from the archive)."""
    from experiments.findings.cli import merged_per_seed

    kept = {"continual/gpu_full": {"nondp": {"0": 0.6}}, "finetune/gpu_full": {"lp-e1": {"0": 0.1}}}
    here = {"finetune/gpu_full": {"lp-nondp": {"0": 0.4}, "lp-e1": {"0": 0.2}}}
    out = merged_per_seed(here, kept)
    assert out["continual/gpu_full"] == {"nondp": {"0": 0.6}}
    assert out["finetune/gpu_full"] == {"lp-e1": {"0": 0.2}, "lp-nondp": {"0": 0.4}}


def test_the_ke_rows_quote_the_non_dp_reference_only_where_it_is_archived(tmp_path, monkeypatch):
    """Without the non-DP runs (here or in the committed per-seed file) the rows say DP's cost is not measured;
    with them, they quote the reference's mean ± SD and where its per-seed values are."""
    from experiments.findings import finetune as ff

    monkeypatch.setattr(ff, "groups", lambda config, scale: {})
    monkeypatch.setattr(ff, "OUT", tmp_path)
    assert "not measured" in ff.nondp_text("gpu_full")
    (tmp_path / "seed_findings.per_seed.json").write_text(json.dumps(
        {"finetune/gpu_full": {"lp-nondp": {"0": 0.40, "1": 0.42}, "fft-nondp": {"1": 0.52, "0": 0.50}}}))
    assert ff.nondp_reference("gpu_full") == {"lp-nondp": [0.40, 0.42], "fft-nondp": [0.50, 0.52]}
    text = ff.nondp_text("gpu_full")
    assert "LP 41.0 ± 1.4 % (2 seeds)" in text and "FFT 51.0 ± 1.4 % (2 seeds)" in text
    (tmp_path / "seed_findings.per_seed.json").write_text(json.dumps({"finetune/gpu_full": {"lp-nondp": {"0": 0.25}}}))
    text = ff.nondp_text("gpu_full")
    assert "LP 25.0 % (1 seed)" in text and "FFT without DP not run" in text


def test_the_budget_split_prose_states_what_dp_costs_once_the_reference_is_archived(monkeypatch):
    """The committed gpu_full table read back with a non-DP reference: DP's cost is the reference's mean minus the
    table's DP mean, and the paragraph quotes it instead of saying there is no reference."""
    from experiments.findings import facts_tables, finetune as ff
    from experiments.findings.prose_law import _budget_split

    monkeypatch.setattr(ff, "nondp_reference", lambda scale: {})
    f = facts_tables.budget_split()
    assert "bs_ref_lp" not in f and "has no reference" in _budget_split({**f, "bss_source": "x", "bss_p_fft1": "y"})
    monkeypatch.setattr(ff, "nondp_reference", lambda scale: {"lp-nondp": [0.40, 0.42], "fft-nondp": [0.50, 0.52]})
    f = facts_tables.budget_split()
    table = facts_tables.budget_table("gpu_full")["rows"]
    assert f["bs_cost_lp8"] == f"{41.0 - table[('lp', 8)][0]:.1f}" and f["bs_ref_lp"] == "41.0 ± 1.4 % (2 seeds)"
    text = _budget_split({**f, "bss_source": "x", "bss_p_fft1": "y"})
    assert "no reference" not in text and f"FFT {f['bs_cost_fft8']} ({f['bs_fft8']} %)" in text


def test_the_archive_section_names_only_archives_that_exist(tmp_path, monkeypatch):
    """Where the per-seed values are: the membership JSON and the non-DP reference are named only when their files
    hold them; the 50 DP runs of Ke et al.'s gpu_full table are always said to be archived nowhere."""
    from experiments.findings import cli

    monkeypatch.setattr(cli, "OUT", tmp_path)
    text = "\n".join(cli.archive_section())
    assert "membership" not in text and "No non-DP reference runs at this scale are archived" in text
    assert "not archived anywhere" in text
    (tmp_path / "seed_arms/cpu_hour_mia").mkdir(parents=True)
    (tmp_path / "seed_arms/cpu_hour_mia/membership.json").write_text("{}")
    (tmp_path / cli.PER_SEED_JSON).write_text(json.dumps({"finetune/gpu_full": {"fft-nondp": {"0": 0.4}}}))
    text = "\n".join(cli.archive_section())
    assert "seed_arms/cpu_hour_mia/membership.json" in text and "(`fft-nondp`) are in" in text
    assert "not archived anywhere" in text
