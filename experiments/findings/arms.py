"""The rows of the extra arms (:mod:`experiments.arms`): Bu et al.'s continual and tr(H) arms, Ke et al.'s head
inits and split selection, Ganesh et al.'s public budget and loss barriers."""

from __future__ import annotations

import statistics

from experiments.findings.rows import arm_result, arms_cmd, greater, pct, row
from experiments.papers.continual import TREND_TEST, trend_text, trend_verdicts
from experiments.stats import compare, equivalence_verdict, fmt_mean_sd, fmt_p, mean_sd, tost, welch


#: the largest accuracy difference (in [0, 1]) still called "about the same" where a paper claims two trainings
#: match (clipping alone ≈ non-DP): 2 points, about twice the seeds' SD of the non-DP baseline at ``gpu_full``
#: (1.1 points), set in this session after the 4.1-point cost was known; the 90 % interval printed beside it lets a
#: reader apply another margin (any below its near end gives the same verdict)
SAME_ACCURACY_MARGIN = 0.02


def exact_p(p: float) -> str:
    """A p-value the way a reader can trace it: ``p = 0.012`` or, below 0.001, ``p = 2.1e-07``."""
    return fmt_p(p) if p >= 0.001 else f"p = {p:.1e}"


def bu_arm_rows(scale: str) -> list[str]:
    """The continual arm's claims at ``scale``: a fixed switch against scratch, noise vs clipping (two rows: each
    half of the claim with its own test), the paper's validation-loss switch (our plateau rule), membership."""
    rows = []
    c = arm_result(scale, "continual")
    if c:
        ps, cmd = c["per_seed"], arms_cmd("continual", scale)
        sw = c.get("scale_settings", {}).get("switch")
        r = compare(ps["continual_acc"], ps["scratch_acc"])
        if r:
            w = r.welch
            rows.append(row(scale, "Bu et al. 2024", "DP continual pre-training > DP from scratch, equal ε and total "
                             f"steps [fixed switch after {sw} public steps: the continual arm]",
                             f"{pct(ps['continual_acc'])} vs {pct(ps['scratch_acc'])}; the configs' sweep (its own "
                             "row) is the other fixed-switch evidence",
                             f"two-sided Welch: diff {100 * w.diff:+.1f} points, 95 % CI [{100 * w.ci_low:.1f}, "
                             f"{100 * w.ci_high:.1f}], {exact_p(w.p)}, n = {w.n_a}/{w.n_b}", r.verdict, cmd))
        t, v, _ = greater(ps["clip_only_acc"], ps["scratch_acc"], family=2)
        rows.append(row(scale, "Bu et al. 2024", "noise causes the degradation: the σ = 0 clipping-only arm > DP",
                         f"clip-only {pct(ps['clip_only_acc'])}, DP {pct(ps['scratch_acc'])}",
                         f"clip-only > DP, two-sided {t}", v, cmd))
        gap = welch(ps["nondp_acc"], ps["clip_only_acc"])
        eq = tost(ps["clip_only_acc"], ps["nondp_acc"], margin=SAME_ACCURACY_MARGIN)
        if gap and eq:
            rows.append(row(scale, "Bu et al. 2024", "not clipping: clipping alone (σ = 0) ≈ non-DP",
                             f"non-DP {pct(ps['nondp_acc'])}, clip-only {pct(ps['clip_only_acc'])}: clipping alone "
                             f"costs {100 * gap.diff:.1f} points (95 % CI [{100 * gap.ci_low:.1f}, "
                             f"{100 * gap.ci_high:.1f}], two-sided Welch {exact_p(gap.p)}); the noise a further "
                             f"{100 * (statistics.mean(ps['clip_only_acc']) - statistics.mean(ps['scratch_acc'])):.1f}",
                             f"equivalence, clip-only − non-DP: {eq.describe(100, '.1f')} (points)",
                             equivalence_verdict(eq, family=2), cmd))
        t, v, _ = greater(ps["plateau_acc"], ps["scratch_acc"], family=2)
        if all(r_ == "max_public_steps" for r_ in ps["plateau_reason"]):  # the rule was never exercised
            t += ("; the rule never fired (the public val loss kept improving): in effect a fixed switch at its cap, "
                  "so this says more public steps helped, not that the rule chose well")
            v = "inconclusive"
        cap = max(ps["plateau_switch"])
        rows.append(row(scale, "Bu et al. 2024", "the paper's switch, early stopping on public validation loss (our "
                         f"plateau rule, capped at {cap} public steps), gives a useful switch",
                         f"switch at {', '.join(map(str, ps['plateau_switch']))} public steps "
                         f"({', '.join(ps['plateau_reason'])}); "
                         f"{pct(ps['plateau_acc'])} vs scratch {pct(ps['scratch_acc'])}", f"plateau > scratch: {t}",
                         v, cmd))
        auc = {k: ps[f"{k}_loss_auc"] for k in ("nondp", "scratch", "continual", "plateau")}
        tpr = {k: ps.get(f"{k}_loss_tpr1") for k in auc}
        t, v, _ = greater(auc["nondp"], auc["continual"], scale=1, fmt="+.3f")
        ci = f"[{min(ps['continual_loss_auc_lo']):.3f}, {max(ps['continual_loss_auc_hi']):.3f}]"
        n_out = c.get("n_members_mean")
        mia_at = next((f"`{sc}`" for sc in ("gpu_full", "gpu", "cpu_hour", "cpu")
                       if sc != scale and arm_result(f"{sc}_mia", "membership")), "")
        rows.append(row(scale, "Bu et al. 2024",
                        "continual checkpoints resist membership inference (the DP claim covers the private data)",
                         "LOSS AUC: " + ", ".join(f"{k} {fmt_mean_sd(v_, '.3f')}" for k, v_ in auc.items())
                         + f"; continual's bootstrap CIs span {ci}; LOSS TPR at 1 % FPR: "
                         + ", ".join(f"{k} {fmt_mean_sd(v_, '.1f', 100)} %" for k, v_ in tpr.items() if v_)
                         + "; at 0.1 % FPR: not recorded",
                         f"non-DP AUC > continual AUC (LOSS): {t}. Weak attack: its TPR at 1 % FPR is at chance even "
                         "on the non-DP model, so it could not have detected a leak at low FPR. The suite's strongest "
                         f"attacks (LiRA / RMIA, attacks/strongest.py) were not run at {scale}: the arm kept no "
                         f"weights, only these summaries" + (f" ({n_out:,.0f} members per model)" if n_out else "")
                         + ", and they need reference models (see Untested)"
                         + (f"; they ran at {mia_at} (the membership arm, its own row)" if mia_at else ""),
                         "inconclusive", cmd))
    return rows


def plateau_room_rows(scale: str) -> list[str]:
    """The paper's validation-loss switch with room to fire: the plateau part of the continual arm at
    ``<scale>_plateau`` (a larger cap, else ``scale``'s settings) against ``scale``'s DP-from-scratch runs of the
    same seeds, and beside ``scale``'s capped plateau runs."""
    p, base = arm_result(f"{scale}_plateau", "continual"), arm_result(scale, "continual")
    if not p or not base or p["seeds"] != base["seeds"]:
        return []
    ps, b = p["per_seed"], base["per_seed"]
    cap = 2 * p["scale_settings"]["switch"]
    cmd = arms_cmd("continual", f"{scale}_plateau")
    r = compare(ps["plateau_acc"], b["scratch_acc"])
    fired = [r_ != "max_public_steps" for r_ in ps["plateau_reason"]]
    test = ("too few seeds for a test" if r is None else
            f"plateau > scratch, two-sided Welch: diff {100 * r.welch.diff:+.1f} points, 95 % CI "
            f"[{100 * r.welch.ci_low:.1f}, {100 * r.welch.ci_high:.1f}], {exact_p(r.welch.p)}, n = {r.welch.n_a}/"
            f"{r.welch.n_b}")
    v = r.verdict if r else "inconclusive"
    if not all(fired):  # the rule's choice is tested only where it chose: a capped seed is a fixed switch
        test += (f"; the rule fired on {sum(fired)} of {len(fired)} seeds, the others switched at the cap of {cap}: "
                 "in the main a fixed switch, so this says more public steps helped, not that the rule chose well")
        v = "inconclusive"
    return [row(scale, "Bu et al. 2024", f"the paper's switch, early stopping on public validation loss, with room "
                f"to fire (our plateau rule, cap {cap} of {p['scale_settings']['steps']} steps), beats DP from scratch",
                f"switch at {', '.join(map(str, ps['plateau_switch']))} public steps (fired on {sum(fired)} of "
                f"{len(fired)} seeds); {pct(ps['plateau_acc'])} vs scratch {pct(b['scratch_acc'])} (`{scale}`'s runs, "
                f"same seeds); the capped rule (cap {max(b['plateau_switch'])}) {pct(b['plateau_acc'])}, the fixed "
                f"switch at {base['scale_settings']['switch']} {pct(b['continual_acc'])}", test, v, cmd)]


def trace_arm_rows(scale: str) -> list[str]:
    """The tr(H) arm's claims at ``scale`` (its own section: the arms reach the GPU scales one lease at a time)."""
    rows = []
    tr = arm_result(scale, "trace")
    if tr:
        ps, cmd = tr["per_seed"], arms_cmd("trace", scale)
        curves = {}
        for k in ("pretrain_nondp", "pretrain_dp"):
            steps = sorted({r["step"] for rows_ in ps[f"{k}_trace"] for r in rows_})
            curves[k] = {s: mean_sd([next((r["trace_h"] for r in rows_ if r["step"] == s), None)
                                     for rows_ in ps[f"{k}_trace"]]) for s in steps}
        per, row_v = trend_verdicts(curves)  # either pre-training curve makes the claim; either refutes it
        text = [trend_text(k, curves[k], got) + f" over {max(curves[k])} steps" for k, got in per.items()]
        rows.append(row(scale, "Bu et al. 2024", "tr(H) rises early in pre-training, then peaks and falls",
                         "; ".join(text), TREND_TEST, row_v, cmd))
        means = {k: [statistics.mean(r["trace_h"] for r in rows_ if r["step"] > 0) for rows_ in ps[f"{k}_trace"]]
                 for k in ("pretrain_dp", "finetune_dp")}
        ends = {k: [max(rows_, key=lambda r: r["step"])["trace_h"] for rows_ in ps[f"{k}_trace"]]
                for k in ("pretrain_dp", "finetune_dp")}
        t, v, _ = greater(means["pretrain_dp"], means["finetune_dp"], scale=1, fmt="+.0f")
        rows.append(row(scale, "Bu et al. 2024", "tr(H) is smaller in (DP) fine-tuning than in (DP) pre-training",
                         f"mean tr(H) over the run: pre-training {fmt_mean_sd(means['pretrain_dp'], '.0f')}, "
                         f"fine-tuning {fmt_mean_sd(means['finetune_dp'], '.0f')} (at the last step, descriptive: "
                         f"{fmt_mean_sd(ends['pretrain_dp'], '.0f')} vs {fmt_mean_sd(ends['finetune_dp'], '.0f')})",
                         f"pre-training > fine-tuning: {t}", v, cmd))
    return rows


def ke_source_text(k: dict) -> str:
    """The Ke et al. arm's source model in words: ``the 12-block ViT of width 64 on 8×8 patches pre-trained non-DP,
    60.9 % on 1,000 cifar10 test images``."""
    st = k.get("scale_settings", {})
    if k.get("source") == "vit" and st.get("vit_kwargs"):
        kw = st["vit_kwargs"]
        patch = f" on {kw['patch_size']}×{kw['patch_size']} patches" if "patch_size" in kw else ""
        model = f"the {kw.get('depth', '?')}-block ViT of width {kw.get('embed_dim', '?')}{patch}"
    else:
        model = k.get("source_arch") or st.get("arch", "the scale's arch")
    where = f"{st['test']:,} {st['dataset']} test images" if "test" in st and "dataset" in st else "its test images"
    return f"{model} pre-trained non-DP, {100 * k['source_test_acc']:.1f} % on {where}"


def ke_rows(scale: str) -> list[str]:
    k = arm_result(scale, "ke")
    if not k:
        return []
    rows = []
    ps, cmd = k["per_seed"], arms_cmd("ke", scale)
    t, v, _ = greater(ps["lp_aligned_acc"], ps["random_acc"], family=2)
    rows.append(row(scale, "Ke et al. 2024", f"an LP-aligned head beats a random head at equal backbone steps "
                     f"({k['fft_steps']} FFT steps, head lr ×{k['head_lr_scale']:g} by parameter group)",
                     f"LP-aligned {pct(ps['lp_aligned_acc'])}, random {pct(ps['random_acc'])}, zero "
                     f"{pct(ps['zero_acc'])} (source: {ke_source_text(k)})",
                     f"LP-aligned > random: {t}", v, cmd))
    t, v, _ = greater(ps["lp_aligned_knn"], ps["random_knn"], family=2)
    rows.append(row(scale, "Ke et al. 2024",
                            "the misaligned (random) head distorts the features: kNN quality of the "
                     "backbone after fine-tuning", f"kNN on held-out val: LP-aligned {pct(ps['lp_aligned_knn'])}, "
                     f"random {pct(ps['random_knn'])}, zero {pct(ps['zero_knn'])} (start "
                     f"{pct([c[0]['knn'] for c in ps['random_knn_curve']])})", f"LP-aligned > random: {t}", v,
                     cmd))
    t, v, _ = greater(ps["selected_acc"], ps["random_acc"])
    rows.append(row(scale, "Ke et al. 2024", "DP-LP-FFT with the ε split chosen on held-out validation data beats "
                     "DP-FFT",
                     f"selected {', '.join(ps['selected_split'])}: {pct(ps['selected_acc'])} vs FFT "
                     f"{pct(ps['random_acc'])}", f"{t} (selection on val: no test-set correction needed)", v,
                     cmd))
    if "lp_acc" in ps:  # DP-LP alone: the arm's other end (LP-FFT's total DP steps, the whole ε)
        t, v, _ = greater(ps["selected_acc"], ps["lp_acc"])
        rows.append(row(scale, "Ke et al. 2024", "DP-LP-FFT with the ε split chosen on held-out validation data "
                         f"beats DP-LP (the head alone, {k['lp_steps'] + k['fft_steps']} DP steps, the whole ε)",
                         f"selected {pct(ps['selected_acc'])} vs LP {pct(ps['lp_acc'])}",
                         f"{t} (selection on val: no test-set correction needed)", v, cmd))
    return rows


def ganesh_rows(scale: str) -> list[str]:
    g = arm_result(scale, "ganesh")
    if not g:
        return []
    ps, cmd = g["per_seed"], arms_cmd("ganesh", scale)
    top = max(g["budgets"])
    t, v, _ = greater(ps[f"public{top}_acc"], ps["public0_acc"])
    rows = [row(scale, "Ganesh et al. 2023", "public pre-training is necessary: DP accuracy grows with public steps",
                 "; ".join(f"{k}: {pct(ps[f'public{k}_acc'])}" for k in g["budgets"]),
                 f"{top} public steps > 0: {t}", v, cmd)]
    t, v, _ = greater(ps["barrier_random"], ps["barrier_same_public"], scale=1, fmt="+.3f")
    ran = next((f"`{sc}`" for sc in ("gpu_full", "gpu", "cpu_hour", "cpu") if sc != scale and ganesh_control(sc)),
               None)
    control = ("" if "barrier_same_random" in ps else "; no shared-random-init control at this scale: two different "
               "random inits are apart by permutation symmetry alone, so this row cannot say the public data made "
               "the basin (" + (f"the control ran at {ran} only: its row; at {scale} it is under Untested)" if ran
                                else "no scale ran the control: see Untested)"))
    rows.append(row(scale, "Ganesh et al. 2023",
                            "one basin: the loss barrier between two DP runs from one public init is "
                     "smaller than between DP runs from two different random inits",
                     f"barrier (private train loss): same public init {fmt_mean_sd(ps['barrier_same_public'], '.3f')}, "
                     f"random inits {fmt_mean_sd(ps['barrier_random'], '.3f')}", f"random > same: {t}{control}", v,
                     cmd))
    return rows


def _part_values(scale: str, arm: str, part: str) -> dict[int, dict]:
    """{seed: per-seed values} of an arm's part files ``<arm>.s<seed>.<part>.json`` at ``scale`` (this machine's,
    else the committed copies), as ``experiments arms run ARM --parts PART`` writes them beside a whole run."""
    import json

    from experiments.findings.rows import OUT, ROOT

    got: dict[int, dict] = {}
    for base in (ROOT / "results/seed_arms", OUT / "seed_arms"):
        for p in sorted((base / scale / "parts").glob(f"{arm}.s*.{part}.json")):
            one = json.loads(p.read_text())
            got.setdefault(one["seeds"][0], {k: v[0] for k, v in one["per_seed"].items()})
    return got


def ganesh_with(scale: str, part: str, key: str) -> tuple[dict, list[dict]] | None:
    """The Ganesh et al. arm's JSON at ``scale`` and, per seed in its order, the values of ``part`` (from the JSON
    when it holds ``key``, else from the part files run beside it); None without them for every seed."""
    g = arm_result(scale, "ganesh")
    if not g:
        return None
    ps = g["per_seed"]
    if key in ps:
        return g, [{k: v[i] for k, v in ps.items()} for i in range(len(g["seeds"]))]
    got = _part_values(scale, "ganesh", part)
    if not all(s in got and key in got[s] for s in g["seeds"]):
        return None
    return g, [got[s] for s in g["seeds"]]


def ganesh_control(scale: str) -> dict[str, list[float]] | None:
    """The Ganesh et al. arm's barriers at ``scale`` with its shared-random-init control, per seed (see
    :func:`ganesh_with`); None without the control for every seed."""
    got = ganesh_with(scale, "same_random", "barrier_same_random")
    if not got:
        return None
    g, part = got
    out = {k: g["per_seed"][k] for k in ("barrier_same_public", "barrier_random", "public0_acc")}
    out["barrier_same_random"] = [p["barrier_same_random"] for p in part]
    if "barrier_same_random" not in g["per_seed"]:
        out["control_public0_acc"] = [p["public0_acc"] for p in part]
    return out


def _signed_ms(values: list[float]) -> str:
    """``+13.8 ± 3.4``: a mean difference in points with its sign, the SD without one."""
    m, sd, _ = mean_sd(values)
    return f"{100 * m:+.1f} ± {100 * sd:.1f}"


def ganesh_contrast_rows(scale: str) -> list[str]:
    """Ganesh et al.'s private-vs-non-private contrast: what the largest public budget buys DP training against what
    it buys the same private steps without DP (per seed, two-sided Welch of the gains)."""
    got = ganesh_with(scale, "nondp", "nondp_public0_acc")
    if not got:
        return []
    g, part = got
    top = max(g["budgets"])
    if not all(f"nondp_public{top}_acc" in p for p in part):
        return []
    ps = g["per_seed"]
    gain_dp = [a - b for a, b in zip(ps[f"public{top}_acc"], ps["public0_acc"])]
    nd0, ndt = [p["nondp_public0_acc"] for p in part], [p[f"nondp_public{top}_acc"] for p in part]
    gain_nd = [a - b for a, b in zip(ndt, nd0)]
    r = compare(gain_dp, gain_nd)
    cmd = (arms_cmd("ganesh", scale) + " (the whole arm, contrast included); the contrast alone beside an older run: "
           f"python -m experiments arms run ganesh --scale {scale} --seeds 0 1 2 3 4 --parts nondp")
    test = ("too few seeds for a test" if r is None else
            f"DP gain > non-DP gain, two-sided Welch on the per-seed gains: diff {100 * r.welch.diff:+.1f} points, "
            f"95 % CI [{100 * r.welch.ci_low:.1f}, {100 * r.welch.ci_high:.1f}], {exact_p(r.welch.p)}, "
            f"n = {r.welch.n_a}/{r.welch.n_b}")
    return [row(scale, "Ganesh et al. 2023", f"public pre-training matters for private training, much less for "
                f"non-private: {top} public steps buy DP training more than the same private steps without DP",
                f"DP: {pct(ps['public0_acc'])} → {pct(ps[f'public{top}_acc'])} (gain {_signed_ms(gain_dp)} points); "
                f"without DP: {pct(nd0)} → {pct(ndt)} (gain {_signed_ms(gain_nd)} points)", test,
                r.verdict if r else "inconclusive", cmd)]


def ganesh_control_rows(scale: str) -> list[str]:
    """The control the Ganesh et al. barrier row needs: two DP runs from one *random* init against two from one
    *public* init (the paper's hypothesis: public data, not merely a shared start, puts the runs in one basin)."""
    c = ganesh_control(scale)
    if not c:
        return []
    cmd = (arms_cmd("ganesh", scale) + " (the whole arm, control included); the control alone beside an older run: "
           f"python -m experiments arms run ganesh --scale {scale} --seeds 0 1 2 3 4 --parts same_random")
    r = compare(c["barrier_same_random"], c["barrier_same_public"])
    same_run = ""
    if "control_public0_acc" in c:  # the control's first run is the arm's 0-budget run, trained again
        k = sum(abs(a - b) < 1e-9 for a, b in zip(c["control_public0_acc"], c["public0_acc"]))
        same_run = (f"; the control's first DP run repeats the arm's 0-budget run: the same test accuracy on {k} of "
                    f"{len(c['public0_acc'])} seeds")
    test = ("too few seeds for a test" if r is None else
            f"same random > same public, two-sided Welch: diff {r.welch.diff:+.3f}, {exact_p(r.welch.p)}, "
            f"n = {r.welch.n_a}/{r.welch.n_b}")
    return [row(scale, "Ganesh et al. 2023", "the control: the barrier between two DP runs from one public init is "
                "smaller than between two DP runs from one shared random init (public data, not a shared start, "
                "makes the basin)", f"barrier (private train loss): same public init "
                f"{fmt_mean_sd(c['barrier_same_public'], '.3f')}, same random init "
                f"{fmt_mean_sd(c['barrier_same_random'], '.3f')}, two random inits "
                f"{fmt_mean_sd(c['barrier_random'], '.3f')}{same_run}", test, r.verdict if r else "inconclusive",
                cmd)]
