"""Tables of the continual pre-training experiment (Bu et al. 2024): ``continual_pretrain.md`` and ``decelerator.md``.

Every statistic comes from :mod:`experiments.stats` (within-group pooled SD, Welch's t with Holm's correction over the
comparisons made against DP from scratch, "reproduced" only when the corrected test rejects in the paper's
direction). tr(H) is read from the runs' metrics history: one fixed batch of test images in every arm
(:func:`training.recipes.common.make_monitor`), with the standard error of each estimate over its probes.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from experiments.stats import fmt_mean_sd, fmt_p, holm, mean_sd, pooled_sd, verdict, welch
from experiments.papers.runs import CONFIGS, SCALES, closing, groups, hist, remake, scale_config

ARMS = (("nondp", "non-DP (same steps)"), ("scratch", "DP from scratch"), ("continual", "DP continual pre-training"),
        ("continual-dec", "DP continual pre-training, decelerator rule"))


def _left(size: int, dropped) -> str:
    """", leaving N" when ``dropped`` is a count."""
    return f", leaving {size - dropped}" if isinstance(dropped, int) else ""


def _augment_words(aug) -> str:
    """The training augmentation in words, or nothing when there is none."""
    parts = ([f"random {aug.crop_padding}-pixel crops"] if aug.crop_padding else []) + (
        ["horizontal flips"] if aug.flip else [])
    if not parts:
        return ""
    return (f" Every phase trains on {' and '.join(parts)} (one clipped gradient per example under DP, so the "
            f"accounting is unchanged).")


def _phase_steps(m: dict, dp: bool) -> int:
    return sum(p["steps"] for p in m["privacy"]["phases"] if p["dp"] == dp and (dp or p["name"] == "public"))


def sweep_points(g: dict) -> list[tuple[int, str]]:
    """(switch step, variant base) of the switch-point sweep arms (``sw<i>``, switch step read from the runs), in
    switch order."""
    return sorted((g[k][0][2]["continual"]["switch_step"], k) for k in g if k.startswith("sw") and k[2:].isdigit())


def table_continual(scale: str = "cpu") -> str | None:
    g = groups("continual", scale)
    if not g:
        return None
    cc = scale_config("continual", SCALES[scale]).training.continual
    order = [*ARMS, *[(k, f"DP continual, switch after {s} public steps (sweep)") for s, k in sweep_points(g)]]
    rows = ["| method | seeds | claimed ε (δ, accountant) | public steps | DP steps | σ | test accuracy (%) | "
            "train accuracy (%) |", "|---|---|---|---|---|---|---|---|"]
    accs: dict[str, list[float]] = {}
    for key, label in order:
        runs = g.get(key, [])
        if not runs:
            continue
        m0 = runs[0][1]["privacy"]
        eps = [m["privacy"]["epsilon"] for _, m, _ in runs]
        sig = [p["noise_multiplier"] for _, m, _ in runs for p in m["privacy"]["phases"] if p["dp"]]
        accs[key] = [x["test_accuracy"] for _, _, x in runs]
        eps_s = ("∞ (no claim)" if eps[0] is None else
                 f"{statistics.mean(eps):.2f} ({m0['delta']:g}, {m0['accountant']})")
        pub = sorted({_phase_steps(m, False) for _, m, _ in runs})
        dp = sorted({_phase_steps(m, True) for _, m, _ in runs})
        rows.append(f"| {label} | {len(runs)} | {eps_s} | {'/'.join(map(str, pub))} | {'/'.join(map(str, dp))} | "
                    f"{fmt_mean_sd(sig, '.3f') if sig else '–'} | {fmt_mean_sd(accs[key], '.1f', 100)} | "
                    f"{fmt_mean_sd([x['train_accuracy'] for _, _, x in runs], '.1f', 100)} |")
    seeds = sorted({s for runs in g.values() for s, _, _ in runs})
    per_seed = ["| method | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for key, label in order:
        by_seed = {s: x["test_accuracy"] for s, _, x in g.get(key, [])}
        if by_seed:
            per_seed.append(f"| {label} | " + " | ".join(f"{100 * by_seed[s]:.1f}" if s in by_seed else "–"
                                                      for s in seeds) + " |")
    findings = ["- Tests: Welch's two-sample t-test (two-sided) on per-seed test accuracy; Holm's correction over the "
                "comparisons with DP from scratch made here; pooled SD = within-group pooled SD. A claim is "
                "'reproduced' only when its corrected p < 0.05 in the paper's direction."]
    tests = [(k, welch(accs[k], accs["scratch"])) for k in ("continual", "continual-dec")
             if k in accs and "scratch" in accs]
    tests = [(k, r) for k, r in tests if r is not None]
    adj = holm([r.p for _, r in tests])
    claims = {"continual": "continual > scratch at equal ε and total steps",
              "continual-dec": "the decelerator-rule switch > scratch"}
    for (k, r), p_h in zip(tests, adj):
        findings.append(f"- {dict(ARMS)[k]} minus DP from scratch: {100 * r.diff:+.1f} points (pooled SD "
                        f"{100 * pooled_sd(accs[k], accs['scratch']):.1f}; {r.describe(100)}; Holm-corrected "
                        f"{fmt_p(p_h)}): '{claims[k]}' — **{verdict(diff=r.diff, p=p_h)}**.")
    if "nondp" in accs and "scratch" in accs:
        gaps = ", ".join(f"{100 * (statistics.mean(accs['nondp']) - statistics.mean(accs[k])):.1f} points "
                         f"({dict(ARMS)[k]})" for k in ("scratch", "continual") if k in accs)
        findings.append(f"- gap to non-DP: {gaps}.")
    sweep = [(s, k) for s, k in sweep_points(g) if k in accs]
    if sweep:
        best_s, best_k = max(sweep, key=lambda sk: statistics.mean(accs[sk[1]]))
        findings.append("- switch-point sweep (equal total steps, σ calibrated for the DP steps left): "
                        + ", ".join(f"{s}: {fmt_mean_sd(accs[k], '.1f', 100)} %" for s, k in sweep)
                        + f"; best mean at {best_s} public steps (chosen on these test accuracies: descriptive).")
    if "continual-dec" in g:
        sw = [(s, x["continual"]["switch_step"], x["continual"]["switch_reason"]) for s, _, x in g["continual-dec"]]
        findings.append("- decelerator rule switch (seed, step, reason): " + ", ".join(f"({s}, {t}, {r})"
                                                                                      for s, t, r in sw))
        if sweep:
            steps = [t for _, t, _ in sw]
            findings.append(f"  The rule switched at {statistics.mean(steps):.0f} public steps on average; the "
                            f"sweep's best mean is at {best_s}.")
        if all(r == "max_public_steps" for _, _, r in sw):
            findings.append("  The decelerator never fell below the threshold, so this arm is in effect 'switch at "
                            "max_public_steps': it says whether more public steps helped, not whether the rule "
                            "picks the step.")
    all_runs = [x for runs in g.values() for _, _, x in runs]
    manifests = [m for runs in g.values() for _, m, _ in runs]
    dropped = next((x["continual"]["public_dropped"] for runs in g.values() for _, _, x in runs
                    if "continual" in x), "–")
    cfg = scale_config("continual", SCALES[scale])
    return "\n".join([
        f"# DP continual pre-training vs DP from scratch vs non-DP (Bu et al. 2024, {scale} scale)", "",
        remake("continual", scale) + " (= `audit run eval_configs/experiments/continual_pretrain.yaml --steps train` "
        "per variant, then this table).", "",
        f"Setup (`{CONFIGS['continual'].name}`, scale `{scale}`): private = {cfg.data.pool_size} CIFAR-10 training "
        f"images (all members), `{cfg.model.arch}`, {cfg.optim.name} lr {cfg.optim.lr:g}, batch "
        f"{cfg.training.batch_size}, {cfg.training.steps} logical steps in total for every method (public steps "
        f"count), flat clipping C = {cfg.privacy.max_grad_norm:g}, Poisson sampling, target ε = "
        f"{cfg.privacy.target_epsilon:g} ({cfg.privacy.accountant} accountant: σ is calibrated for the DP steps "
        f"alone). Public = {cc.public.pool_size} CIFAR-10 training images drawn apart from the private pool (images "
        f"equal to a private one are dropped: {dropped} were{_left(cc.public.pool_size, dropped)}); the public phase "
        f"is not accounted. Test accuracy on {cfg.data.test_size} CIFAR-10 "
        f"test images.{_augment_words(cfg.training.augment)} Mean ± sample SD over seeds "
        f"{', '.join(map(str, seeds))} (model init, batches, noise).", "",
        *rows, "", "Test accuracy (%) per seed:", "", *per_seed, "", *closing(findings, all_runs, manifests, scale)])


def _curve(runs: list, key: str) -> dict[int, tuple[float, float, int]]:
    steps = sorted({s for _, _, x in runs for s in hist(x, key)})
    return {s: mean_sd([hist(x, key).get(s) for _, _, x in runs]) for s in steps}


#: the family-wise level of :func:`peak_and_fall`'s test
PEAK_ALPHA = 0.05
#: its test in words, for the tables' "test" column
PEAK_TEST = ("highest interior point > last: one-sided Welch t on the seeds, Bonferroni × the interior points "
             "(any of them could have been the peak) × the curves tested, p < 0.05")


def peak_and_fall(curve: dict[int, tuple[float, float, int]], *, family: int = 1) -> tuple[str, int | None]:
    """Whether a mean tr(H) curve over seeds (step → (mean, SD, seeds)) rises to an interior peak and then falls.

    The peak is the highest interior point (neither the first nor the last step), so it is *chosen* among the m
    interior points: the fall from it to the last point must pass a one-sided Welch test (from the means and SDs)
    at :data:`PEAK_ALPHA` / (m · ``family``), ``family`` being the number of curves of which any one passing makes
    the claim (a row that reads "reproduced" when any of its curves falls). Without that correction the highest
    of ~15 points on a flat, noisy curve beats the last by two standard errors about one time in five. Returns
    ("peak-and-fall", peak step), ("interior peak, fall within the noise", peak step), ("interior peak, too few
    seeds to test the fall", peak step) below 2 seeds, ("rising", None) when the last point is the highest,
    ("highest at the start", None) when the first is, or ("too few points", None)."""
    from experiments.stats import welch_from_summary

    pts = {s: v for s, v in curve.items() if math.isfinite(v[0])}
    if len(pts) < 3:
        return "too few points", None
    peak = max(pts, key=lambda s: pts[s][0])
    last = max(pts)
    if peak == last:
        return "rising", None
    if peak == min(pts):
        return "highest at the start", None
    (mp, sp, n_p), (ml, sl, n_l) = pts[peak], pts[last]
    if n_p < 2 or n_l < 2 or not (math.isfinite(sp) and math.isfinite(sl)):
        return "interior peak, too few seeds to test the fall", peak
    r = welch_from_summary(mp, sp, n_p, ml, sl, n_l)
    p_one = r.p / 2 if r.diff > 0 else 1 - r.p / 2
    m = len(pts) - 2
    fell = p_one * m * family < PEAK_ALPHA
    return ("peak-and-fall", peak) if fell else ("interior peak, fall within the noise", peak)


TREND_TEST = ("two-sided, per curve: 'reproduced' when the fall from the highest interior point to the last passes a "
              "one-sided Welch t on the seeds, Bonferroni × the interior points (any could have been the peak) × "
              "the curves tested; 'not reproduced' when there is no such fall and the last point is above the first "
              "one after initialisation (two-sided Welch, Bonferroni × the curves): still rising when the run "
              "ended; else 'inconclusive'")


def still_rising(curve: dict[int, tuple[float, float, int]], *, family: int = 1) -> tuple[bool, float, int | None]:
    """Whether the last point of a mean tr(H) curve (step → (mean, SD, seeds)) is above its first point after
    initialisation (the first step > 0), by a two-sided Welch test at :data:`PEAK_ALPHA` with Bonferroni ×
    ``family``: (rising, Bonferroni-corrected p, that first step). (False, nan, None) without two such points or
    two seeds in each.

    >>> still_rising({0: (-9.0, 1.0, 5), 100: (400.0, 60.0, 5), 200: (700.0, 90.0, 5), 300: (1000.0, 300.0, 5)})[0]
    True
    """
    from experiments.stats import welch_from_summary

    pts = {s: v for s, v in curve.items() if math.isfinite(v[0])}
    after = sorted(s for s in pts if s > 0)
    if len(after) < 2:
        return False, math.nan, None
    (mf, sf, nf), (ml, sl, nl) = pts[after[0]], pts[after[-1]]
    if nf < 2 or nl < 2 or not (math.isfinite(sf) and math.isfinite(sl)):
        return False, math.nan, after[0]
    r = welch_from_summary(ml, sl, nl, mf, sf, nf)
    p = min(1.0, r.p * family)
    return (r.diff > 0 and p < PEAK_ALPHA), p, after[0]


def trend_verdicts(curves: dict[str, dict[int, tuple[float, float, int]]]
                   ) -> tuple[dict[str, tuple[str, str, int | None, float, int | None]], str]:
    """The two-sided rule of :data:`TREND_TEST` for each named curve, tested as one family: per curve (verdict,
    shape, peak step, corrected p of the rise from the first point after initialisation to the last, that first
    step), and the row's verdict ("reproduced" when some curve peaks and falls, else "not reproduced" when some
    curve is still rising, else "inconclusive")."""
    shapes, _ = shapes_of(curves)
    out = {}
    for k, (shape, peak) in shapes.items():
        rising, p, first = still_rising(curves[k], family=len(curves))
        v = "reproduced" if shape == "peak-and-fall" else "not reproduced" if rising else "inconclusive"
        out[k] = (v, shape, peak, p, first)
    vs = [v for v, *_ in out.values()]
    row_v = "reproduced" if "reproduced" in vs else "not reproduced" if "not reproduced" in vs else "inconclusive"
    return out, row_v


def trend_text(name: str, curve: dict[int, tuple[float, float, int]], got: tuple) -> str:
    """One curve's part of a tr(H) row: ``pretrain_dp: not reproduced (still rising: 393 at step 100 → 1045 at
    step 1500, p = 0.015; highest interior point 1212 at 1300, fall within the noise)``."""
    v, shape, peak, p, first = got
    last = max(curve)
    bits = [f"{shape}" + (f" (peak at {peak})" if peak else "")]
    if first is not None and math.isfinite(p):
        bits.append(f"step {first} → {last}: {curve[first][0]:.0f} → {curve[last][0]:.0f}, two-sided "
                    f"{fmt_p(p)} corrected")
    return f"{name}: {v} ({'; '.join(bits)})"


def shapes_of(curves: dict[str, dict[int, tuple[float, float, int]]]) -> tuple[dict[str, tuple[str, int | None]], bool]:
    """:func:`peak_and_fall` of each named curve, tested as one family (a row reads "reproduced" when any of them
    falls), and whether any did."""
    shapes = {k: peak_and_fall(c, family=len(curves)) for k, c in curves.items()}
    return shapes, any(shape == "peak-and-fall" for shape, _ in shapes.values())


def table_decelerator(scale: str = "cpu") -> str | None:
    g = groups("continual", scale)
    if not g:
        return None
    labels = dict(ARMS)
    steps = sorted({s for runs in g.values() for _, _, x in runs for s in hist(x, "trace_h")})
    head = "| method | " + " | ".join(f"step {s}" for s in steps) + " |"
    sep = "|---|" + "---|" * len(steps)
    tr_rows, se_rows, dec_rows = [head, sep], [head, sep], [head, sep]
    for key, label in labels.items():
        runs = g.get(key, [])
        if not runs:
            continue
        tr_rows.append(f"| {label} | " + " | ".join(fmt_mean_sd([hist(x, "trace_h").get(s) for _, _, x in runs], ".0f")
                                                    for s in steps) + " |")
        se_rows.append(f"| {label} | " + " | ".join(
            f"{statistics.median(v):.0f}" if (v := [hist(x, "trace_h_stderr")[s] for _, _, x in runs
                                                   if s in hist(x, "trace_h_stderr")]) else "–" for s in steps) + " |")
        if key != "nondp":
            dec_rows.append(f"| {label} | " + " | ".join(
                fmt_mean_sd([hist(x, "decelerator").get(s) for _, _, x in runs], ".2f") for s in steps) + " |")
    evals = defaultdict(list)
    for _, _, x in g.get("continual-dec", []):
        for e in x["continual"]["evaluations"]:
            evals[e["step"]].append(e)
    ev_rows = ["| public step | tr(H) (rule's public batch) | its SE | decelerator σ²·tr(H)/(B·c²) | σ used |",
               "|---|---|---|---|---|"]
    for s in sorted(evals):
        ev_rows.append(f"| {s} | {fmt_mean_sd([e['trace_h'] for e in evals[s]], '.0f')} | "
                       f"{statistics.median(e['trace_h_stderr'] for e in evals[s]):.0f} | "
                       f"{fmt_mean_sd([e['value'] for e in evals[s]], '.2f')} | "
                       f"{fmt_mean_sd([e['sigma'] for e in evals[s]], '.3f')} |")
    findings = []
    for key in ("nondp", "scratch", "continual"):
        curve = _curve(g.get(key, []), "trace_h")
        if len(curve) < 2:
            continue
        shape, peak = peak_and_fall(curve)
        first, last = min(curve), max(curve)
        text = (f"rises to a peak at step {peak} and then falls (one-sided Welch, Bonferroni over the "
                f"{len(curve) - 2} interior points, p < {PEAK_ALPHA}), as Bu et al. report"
                if shape == "peak-and-fall" else
                f"shows no peak followed by a significant fall within {last} steps: the run is too short (or too "
                "noisy) to tell, so no claim about tr(H) falling (or not falling) is made from it")
        findings.append(f"- {labels[key]}: mean tr(H) {curve[first][0]:.0f} at step {first}, "
                        f"{curve[last][0]:.0f} at step {last}: it {text}.")
    cfg = scale_config("continual", SCALES[scale])
    hc = cfg.training.hessian
    ratios = [abs(h["trace_h_stderr"] / h["trace_h"]) for runs in g.values() for _, _, x in runs
              for h in x["history"] if h.get("trace_h") and math.isfinite(h.get("trace_h_stderr", math.nan))]
    rel = 100 * statistics.median(ratios) if ratios else float("nan")
    n_seeds = len({s for runs in g.values() for s, _, _ in runs})
    return "\n".join([
        f"# tr(H) and the decelerator over training (Bu et al. 2024, {scale} scale)", "",
        remake("continual", scale) + " (the same runs as `continual_pretrain.md`).", "",
        f"tr(H): Hutchinson's estimator (`training/hessian.py`), {hc.probes} Rademacher probes, mean cross-entropy "
        f"of the same {hc.batch_size} CIFAR-10 test images in every arm and seed (one fixed draw, "
        "`training.recipes.common.HELD_OUT_SEED`; never trained on), logged at initialisation and every "
        f"{hc.every} global steps. Decelerator = σ²·tr(H)/(B·c²) with the run's DP σ, B = "
        f"{cfg.training.batch_size}, c = {cfg.privacy.max_grad_norm:g}. Mean ± SD over {n_seeds} seeds; the "
        f"second table is the median standard error of one estimate over its probes (overall median: {rel:.0f} % "
        "of the estimate). The decelerator rule's own checks (last table) use public images only (the public "
        "validation split when configured), since a switch decided on test images would leak them.", "",
        *_section("tr(H) at global step (mean ± SD over seeds)", tr_rows),
        *_section("Standard error of one tr(H) estimate (median over seeds)", se_rows),
        *_section("Decelerator at global step (DP runs)", dec_rows),
        *_section("The decelerator rule's own checks during the public phase (continual-dec runs)", ev_rows),
        "## Findings", "", *findings, ""])


def _section(title: str, table: list[str]) -> list[str]:
    """A titled table, or one line saying there was nothing to show (a table of its header and separator only)."""
    if len(table) <= 2:
        return [f"## {title}", "", "No runs of this kind at this scale.", ""]
    return [f"## {title}", "", *table, ""]
