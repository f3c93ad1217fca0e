"""``results/reference/seed_findings.md``: every seed-paper claim, our measurement, the test, the verdict, the command.

Reads the continual-pretraining run directories (``benchmarks/seed_papers.py``), the arms' JSON
(``benchmarks/seed_arms.py``) and, for Ke et al.'s budget-split claims, the statistics of the committed
``finetune_strategies[.scale].md`` table of the largest scale that has one. Every test is from
:mod:`audit.stats`; a claim is "reproduced" only when its (corrected) test rejects at 0.05 in the paper's direction,
"not reproduced" when it rejects in the other direction, "inconclusive" otherwise.

    python benchmarks/seed_findings.py [--scales gpu_full gpu_full_vit_long cpu_vit_long cpu_vit_ke ... cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from audit.stats import chance_test, fmt_mean_sd, fmt_p, holm, mean_sd, verdict, welch, welch_from_summary  # noqa: E402
from _seed_continual import PEAK_TEST, shapes_of, sweep_points  # noqa: E402
from _seed_runs import OUT, ROOT, groups, hist  # noqa: E402
from _seed_text import IN_WORDS, LEFT_OUT, SCALE_NOTE  # noqa: E402
from _seed_law import R2_BAR, vit_rows  # noqa: E402,F401 - R2_BAR: the law's bar, read by the tests
from _seed_rows import GPU_RUNS_CMD, RUNS_CMD, arm_result, arms_cmd, greater, pct, row  # noqa: E402


def continual_rows(scale: str) -> list[str]:
    from _seed_runs import SCALES as RUN_SCALES

    g = groups("continual", scale) if scale in RUN_SCALES else {}
    if not g:
        return []
    acc = {k: [x["test_accuracy"] for _, _, x in runs] for k, runs in g.items()}
    cmd = (GPU_RUNS_CMD.format(scale=scale) if scale.startswith("gpu") else RUNS_CMD.format(scale=scale)
           + f" && python benchmarks/seed_papers.py tables --scale {scale}")
    rows = []
    sweep = sweep_points(g)
    # DP from scratch: the configs' scratch arm, else the sweep's 0-public-step point (the same training: equal
    # total steps, all of them DP), which the GPU scales run instead
    scratch = "scratch" if "scratch" in acc else next((k for s, k in sweep if s == 0), None)
    tests = [(k, welch(acc[k], acc[scratch])) for k in ("continual", "continual-dec") if k in acc and scratch]
    adj = holm([r.p for _, r in tests if r is not None])
    for (k, r), p in zip([t for t in tests if t[1] is not None], adj):
        what = "continual (fixed switch)" if k == "continual" else "continual (decelerator rule)"
        test, v = f"Welch {fmt_p(r.p)}, Holm ×{len(adj)}: {fmt_p(p)}", verdict(diff=r.diff, p=p)
        if k == "continual-dec" and all(x["continual"]["switch_reason"] == "max_public_steps" for _, _, x in g[k]):
            test += ("; the rule never fired (σ²·tr(H)/(B·c²) stayed above its threshold): a fixed switch at its "
                     "cap, so this says more public steps helped, not that the rule chose well")
            v = "inconclusive"
        rows.append(row(scale, "Bu et al. 2024", "DP continual pre-training > DP from scratch, equal ε and total "
                         f"steps [{what}]", f"{pct(acc[k])} vs {pct(acc[scratch])}"
                         + (" (0 public steps)" if scratch != "scratch" else ""), test, v, cmd))
    curves = {k: [hist(x, "trace_h") for _, _, x in g[k]] for k in ("nondp", "scratch", "continual") if k in g}
    curves = {k: c for k, c in curves.items() if all(c)}
    if curves:
        steps = {k: sorted(set.intersection(*(set(c) for c in cs))) for k, cs in curves.items()}
        shapes, any_fall = shapes_of({k: {s: mean_sd([c[s] for c in cs]) for s in steps[k]}
                                      for k, cs in curves.items()})
        text = [f"{k}: {shape}" + (f" (peak at {peak})" if peak else "") + f" over {max(steps[k])} steps, "
                f"{len(curves[k])} seed(s), last {statistics.mean(c[max(steps[k])] for c in curves[k]):.0f}"
                for k, (shape, peak) in shapes.items()]
        rows.append(row(scale, "Bu et al. 2024", "tr(H) rises early in training, then peaks and falls (the configs' "
                         "runs; 256 held-out test images, 32 probes)", "; ".join(text), PEAK_TEST,
                         "reproduced" if any_fall else "inconclusive", cmd))
    if sweep:
        zero = next((k for s, k in sweep if s == 0), None)
        others = [(s, k) for s, k in sweep if s > 0]
        res = [(s, welch(acc[k], acc[zero])) for s, k in others] if zero else []
        adj = holm([r.p for _, r in res]) if res else []
        best = max(sweep, key=lambda sk: statistics.mean(acc[sk[1]]))
        measured = "; ".join(f"{s}: {pct(acc[k])}" for s, k in sweep)
        if res:
            i = max(range(len(res)), key=lambda j: res[j][1].diff)
            paired = _paired_holm({s: dict(zip(_seeds(g, k), acc[k])) for s, k in sweep}, 0)
            rows.append(row(scale, "Bu et al. 2024", "some public steps before DP beat none (switch-point sweep, "
                             "equal total steps, σ by PLD)", measured, f"each k > 0 vs 0 by Welch, Holm over "
                             f"{len(res)}: best k = {res[i][0]}, {fmt_p(adj[i])}{paired}",
                             verdict(diff=res[i][1].diff, p=adj[i]), cmd))
        if "continual-dec" in g:
            rows.append(row(scale, "Bu et al. 2024", "the decelerator rule switches near the sweep's best point",
                             *decelerator_rule_verdict(g, acc, sweep, best), cmd))
        elif "nondp" in curves:
            rows += _offline_decelerator_row(scale, g, curves["nondp"], best[0], cmd)
    return rows


def decelerator_rule_verdict(g: dict, acc: dict[str, list[float]], sweep: list[tuple[int, str]],
                             best: tuple[int, str]) -> tuple[str, str, str]:
    """(measurement, test, verdict) of "the decelerator rule switches near the sweep's best point". Pre-set test:
    the sweep's best point (picked on test accuracy, so Bonferroni × the sweep's points for that choice) beats the
    rule's runs by Welch → not reproduced (the rule's runs beating the best → reproduced); a rule that never fired
    (every run switched at its cap) was not exercised, and a difference within the noise is not a proof of
    equivalence: both inconclusive. ``best``: the sweep's (switch step, variant) of the best mean accuracy."""
    runs = g["continual-dec"]
    sw = [x["continual"]["switch_step"] for _, _, x in runs]
    best_s, best_k = best
    same = next((k for s, k in sweep if s == round(statistics.mean(sw))), None)
    measured = (f"rule: switch at {', '.join(map(str, sw))} public steps, {pct(acc['continual-dec'])}; sweep best: "
                f"{best_s} public steps, {pct(acc[best_k])}"
                + (f"; the sweep at the rule's {round(statistics.mean(sw))}: {pct(acc[same])}" if same else ""))
    test, v, _ = greater(acc[best_k], acc["continual-dec"], family=len(sweep))
    test = f"sweep best > rule: {test} (the best picked among {len(sweep)} points)"
    if all(x["continual"]["switch_reason"] == "max_public_steps" for _, _, x in runs):
        test += "; the rule never fired (σ²·tr(H)/(B·c²) stayed above its threshold): not exercised"
        v = "inconclusive"
    else:  # the best point beats the rule: it did not land near it; the rule beats every point: it did
        v = {"reproduced": "not reproduced", "not reproduced": "reproduced"}.get(v, "inconclusive")
    return measured, test, v


def _offline_decelerator_row(scale: str, g: dict, nondp: list[dict[int, float]], best: int, cmd: str) -> list[str]:
    """Where the decelerator rule would have switched, read off the non-DP run's held-out tr(H) (mean over seeds)
    with the σ each switch step would leave (PLD, the sweep's ε, δ and q): a stand-in when no run used the rule.
    Descriptive: the rule itself measures tr(H) on public images every ``eval_every`` steps, not on this grid."""
    from _seed_runs import SCALES as RUN_SCALES, scale_config
    from training.accounting import noise_multiplier_for
    import dataclasses

    from training.recipes.switch import Evaluation, rule_from_config

    cfg = scale_config("continual", RUN_SCALES[scale])
    tc, cc = cfg.training, cfg.training.continual
    man = g[next(k for k in g if k.startswith("sw"))][0][1]
    q, delta = tc.batch_size / cfg.data.pool_size, man["privacy"]["delta"]
    steps = sorted(set.intersection(*(set(c) for c in nondp)))
    grid = [st for st in steps if 0 < st <= cc.max_public_steps] or [st for st in steps if 0 < st < tc.steps][:1]
    if not grid:
        return []
    vals = []
    for st in grid:
        sigma = noise_multiplier_for(target_epsilon=cfg.privacy.target_epsilon, sample_rate=q, steps=tc.steps - st,
                                     delta=delta, accountant=cfg.privacy.accountant)
        trace = statistics.mean(c[st] for c in nondp)
        vals.append((st, sigma, trace, sigma ** 2 * trace / (tc.batch_size * cfg.privacy.max_grad_norm ** 2)))
    # the decelerator rule as the runs build it (the base config's switch may be another kind), fed this grid
    rule = dataclasses.replace(rule_from_config(cc), kind="decelerator")
    evals = [Evaluation(step=st, value=d) for st, _, _, d in vals]
    fired = next((st for i, (st, *_) in enumerate(vals) if rule.decide(step=st, evaluations=evals[:i + 1])
                  == "decelerator"), None)
    where = (f"below the threshold {cc.decelerator_threshold:g} by step {fired} at the latest" if fired is not None
             else f"above the threshold {cc.decelerator_threshold:g} at every measured step up to the cap "
                  f"({cc.max_public_steps})")
    return [row(scale, "Bu et al. 2024", "the decelerator rule switches near the sweep's best point (read off the "
                 "non-DP run's tr(H); no run used the rule at this scale)",
                 "σ²·tr(H)/(B·c²) at " + ", ".join(f"step {st}: {d:.2f} (σ {sg:.3f}, tr(H) {tr:.0f})"
                                                    for st, sg, tr, d in vals)
                 + f": {where}; sweep best mean: {best} public steps", "none (descriptive; tr(H) on "
                 f"{len(grid)} grid point(s), means over {len(nondp)} seeds)", "inconclusive", cmd)]


def _seeds(g: dict, key: str) -> list[int]:
    return [seed for seed, _, _ in g[key]]


def _paired_holm(by_point: dict[int, dict[int, float]], base: int) -> str:
    """A secondary, descriptive analysis: paired t-tests over the seeds two points share (a seed fixes the
    initialisation in every arm), Holm over the points; the verdict stays with the pre-set Welch test."""
    from scipy import stats

    res = []
    for k, accs in by_point.items():
        common = sorted(set(accs) & set(by_point[base]))
        if k != base and len(common) >= 3:
            d = [accs[s] - by_point[base][s] for s in common]
            res.append((k, statistics.mean(d), float(stats.ttest_rel([accs[s] for s in common],
                                                                     [by_point[base][s] for s in common]).pvalue)))
    if not res:
        return ""
    adj = holm([p for _, _, p in res])
    return ("; secondary (paired by seed, descriptive): " + ", ".join(
        f"{k}: {100 * d:+.1f} points, Holm {fmt_p(p)}" for (k, d, _), p in zip(res, adj)))


def bu_arm_rows(scale: str) -> list[str]:
    """The continual arm's claims at ``scale``: σ = 0, the plateau rule, membership inference."""
    rows = []
    c = arm_result(scale, "continual")
    if c:
        ps, cmd = c["per_seed"], arms_cmd("continual", scale)
        t, v, _ = greater(ps["clip_only_acc"], ps["scratch_acc"], family=2)
        gap = welch(ps["nondp_acc"], ps["clip_only_acc"])
        gap_s = (f"; non-DP − clip-only {100 * gap.diff:+.1f} points, 95 % CI [{100 * gap.ci_low:.1f}, "
                 f"{100 * gap.ci_high:.1f}]" if gap else "")
        rows.append(row(scale, "Bu et al. 2024",
                                "noise, not clipping, causes the degradation (σ = 0 clipping-only arm ≈ "
                         "non-DP, > DP)", f"non-DP {pct(ps['nondp_acc'])}, clip-only {pct(ps['clip_only_acc'])}, "
                         f"DP {pct(ps['scratch_acc'])}{gap_s}", f"clip-only > DP: {t}", v, cmd))
        t, v, _ = greater(ps["plateau_acc"], ps["scratch_acc"], family=2)
        if all(r == "max_public_steps" for r in ps["plateau_reason"]):  # the rule was never exercised
            t += ("; the rule never fired (the public val loss kept improving): in effect a fixed switch at its cap, "
                  "so this says more public steps helped, not that the rule chose well")
            v = "inconclusive"
        rows.append(row(scale, "Bu et al. 2024", "the plateau switch rule (public val loss) gives a useful switch",
                         f"switch at {', '.join(map(str, ps['plateau_switch']))} public steps "
                         f"({', '.join(ps['plateau_reason'])}); "
                         f"{pct(ps['plateau_acc'])} vs scratch {pct(ps['scratch_acc'])}", f"plateau > scratch: {t}",
                         v, cmd))
        auc = {k: ps[f"{k}_loss_auc"] for k in ("nondp", "scratch", "continual", "plateau")}
        t, v, _ = greater(auc["nondp"], auc["continual"], scale=1, fmt="+.3f")
        ci = f"[{min(ps['continual_loss_auc_lo']):.3f}, {max(ps['continual_loss_auc_hi']):.3f}]"
        rows.append(row(scale, "Bu et al. 2024",
                                "continual checkpoints resist membership inference (the DP claim covers "
                         "the private data)", "LOSS AUC: " + ", ".join(f"{k} {fmt_mean_sd(v_, '.3f')}"
                                                                     for k, v_ in auc.items())
                         + f"; continual's bootstrap CIs span {ci}", f"non-DP AUC > continual AUC: {t}", v, cmd))
    return rows


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
        shapes, any_fall = shapes_of(curves)  # either pre-training curve makes the claim
        text = [f"{k}: {shape}" + (f" (peak at {peak})" if peak else "") + f" over {max(curves[k])} steps"
                for k, (shape, peak) in shapes.items()]
        rows.append(row(scale, "Bu et al. 2024", "tr(H) rises early in pre-training, then peaks and falls",
                         "; ".join(text), PEAK_TEST, "reproduced" if any_fall else "inconclusive", cmd))
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


def _finetune_summary(scale: str = "cpu") -> dict[tuple[str, int], tuple[float, float, int]]:
    """(mean, SD, seeds) of test accuracy per (strategy, ε) from the committed ``finetune_strategies[.scale].md``."""
    path = OUT / ("finetune_strategies.md" if scale == "cpu" else f"finetune_strategies.{scale}.md")
    text = path.read_text() if path.is_file() else ""
    out = {}
    for m in re.finditer(r"^\| (DP-[^|]+?) \| (\d) \| (\d+) \| [^|]+ \| [^|]+ \| ([\d.]+) ± ([\d.]+) \|", text, re.M):
        label = m.group(1)
        key = {"DP-LP (head only)": "lp", "DP-FFT (all parameters)": "fft"}.get(label)
        key = key or "lpfft" + re.search(r"(\d\d) %", label).group(1)
        out[(key, int(m.group(2)))] = (float(m.group(4)), float(m.group(5)), int(m.group(3)))
    return out


def _finetune_runs(scale: str) -> dict[tuple[str, int], list[float]]:
    """Per-seed test accuracy (%) per (strategy, ε) of the fine-tuning runs of ``scale`` that are on this machine
    (run directories, or unpacked from the scale's runs archive); empty when they are not here."""
    from _seed_runs import SCALES as RUN_SCALES

    if scale not in RUN_SCALES:
        return {}
    out = {}
    for name, runs in groups("finetune", scale).items():
        m = re.fullmatch(r"(\w+)-e(\d+)", name)
        if m:
            out[(m.group(1), int(m.group(2)))] = [100 * x["test_accuracy"] for _, _, x in runs]
    return out


def finetune_table_rows(scale: str) -> list[str]:
    """Ke et al.'s budget-split claims at ``scale``, tested as ``finetune_strategies[.scale].md`` tests them: Welch
    per split against the other strategy, Holm over the 3 splits. The per-seed accuracies of the runs when they are
    on this machine (then the verdicts equal the table's), else the table's rounded mean ± SD."""
    from _seed_finetune import SPLITS
    from _seed_runs import SCALES as RUN_SCALES, remake, scale_config

    rows: list[str] = []
    s = _finetune_summary(scale)
    if not s or scale not in RUN_SCALES:
        return rows
    raw = _finetune_runs(scale)
    exact = all(k in raw and len(raw[k]) == s[k][2] >= 2 for k in s)
    source = "the per-seed runs" if exact else "the table's rounded mean ± SD"
    ft_cfg = scale_config("finetune", RUN_SCALES[scale])
    steps, n_test = ft_cfg.training.steps, ft_cfg.data.test_size or 1000  # Food-101 test images each seed is scored on
    cmd = remake("finetune_source finetune", scale).removeprefix("Re-make: ").strip("`")
    for eps in (1, 8):
        if ("fft", eps) not in s:
            continue
        for other, claim in (("fft", "DP-LP-FFT > DP-FFT ('LP first mitigates distortion')"),
                             ("lp", "DP-LP-FFT > DP-LP")):
            res = [welch(raw[(k, eps)], raw[(other, eps)]) if exact else
                   welch_from_summary(*s[(k, eps)], *s[(other, eps)]) for k in SPLITS]
            adj = holm([r.p for r in res])
            i = max(range(3), key=lambda j: res[j].diff)
            vs = [verdict(diff=r.diff, p=p) for r, p in zip(res, adj)]
            v = "reproduced" if "reproduced" in vs else "not reproduced" if vs.count("not reproduced") == 3 else \
                "inconclusive"
            seeds = s[(other, eps)][2]
            near = (f" {'DP-FFT' if other == 'fft' else 'DP-LP'} is near chance (10 %)."
                    if chance_test(s[(other, eps)][0] / 100, n=n_test * seeds, chance=0.1).near else "")
            rows.append(row(scale, "Ke et al. 2024", f"{claim}, ε = {eps} (finetune_strategies table, {steps} steps)",
                             f"LP-FFT splits {', '.join(f'{s[(k, eps)][0]:.1f}' for k in SPLITS)} % vs "
                             f"{s[(other, eps)][0]:.1f} ± {s[(other, eps)][1]:.1f} %, {seeds} seeds.{near}",
                             f"Welch per split on {source}, Holm over 3 splits: {fmt_p(adj[i])} for the largest "
                             f"difference ({SPLITS[i][5:]} % to LP)", v, cmd))
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
    rows = []
    k = arm_result(scale, "ke")
    if k:
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
    rows.append(row(scale, "Ganesh et al. 2023",
                            "one basin: the loss barrier between two DP runs from one public init is "
                     "smaller than between DP runs from random inits",
                     f"barrier (private train loss): same public init {fmt_mean_sd(ps['barrier_same_public'], '.3f')}, "
                     f"random inits {fmt_mean_sd(ps['barrier_random'], '.3f')}", f"random > same: {t}", v, cmd))
    return rows


SECTIONS = (continual_rows, bu_arm_rows, trace_arm_rows, finetune_table_rows, ke_rows, ganesh_rows, vit_rows)
SCALES = ("gpu_full", "gpu_full_vit_long", "cpu_vit_long", "cpu_vit_ke", "gpu_full_vit", "gpu", "gpu_vit", "cpu_hour",
          "cpu_hour_vit", "cpu")


def main(argv: list[str] | None = None) -> int:
    from foundation.io import write_text

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", nargs="+", default=list(SCALES),
                        help="for each group of claims, the first of these scales that has results is used")
    args = parser.parse_args(argv)
    # the decelerator read-off calibrates σ for switch steps no run used: keep them in the runs' σ cache (as
    # seed_gpu.py does) instead of recalibrating on every re-make
    from training.accounting.sigma_cache import SIGMA_CACHE_ENV

    os.environ.setdefault(SIGMA_CACHE_ENV, str(ROOT / "results/sigma-cache"))
    rows: list[str] = []
    settings: dict[str, dict] = {}
    for fn in SECTIONS:
        for sc in args.scales:
            got = fn(sc)
            if got:
                rows += got
                arm = next((a for a in (arm_result(sc, n) for n in ("continual", "trace", "ke", "ganesh", "vit"))
                            if a), None)
                if arm:
                    settings[sc] = {**arm.get("scale_settings", {}),
                                    **({"mixed_settings": arm["mixed_settings"]} if "mixed_settings" in arm else {})}
                if fn is not continual_rows:  # the configs' runs: every scale that has them (the GPU sweep and the
                    break                     # CPU runs measure different claims); the arms: the largest scale
    text = "\n".join([
        "# The seed papers' findings, claim by claim", "",
        "Re-make: each row's command (the `--scale` it names), then `python benchmarks/seed_findings.py`; the GPU "
        "rows' runs are kept in `results/reference/seed_gpu/runs.tgz` (`gpu`) and `gpu_full_runs.tgz` beside it, "
        "the `cpu_hour` configs' runs in "
        "`cpu_hour_runs.tgz` beside it (`python benchmarks/seed_gpu.py unpack FILE` puts them back), the arms' in "
        "`results/reference/seed_arms/<scale>/`.", "",
        *SCALE_NOTE, "",
        "| paper | claim | scale | our measurement (mean ± SD over seeds) | test (correction) | verdict | command |",
        "|---|---|---|---|---|---|---|", *rows, "", *IN_WORDS, *LEFT_OUT, "", "## Scale settings", "",
        *[f"* `{sc}`: `{json.dumps(v)}`" for sc, v in settings.items()], ""])
    write_text(OUT / "seed_findings.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
