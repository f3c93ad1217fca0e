"""The membership row under the suite's strongest attack (LiRA / RMIA): Bu et al.'s "continual checkpoints resist
membership inference", from the membership arm (:mod:`experiments.arms.membership`) at ``<scale>_mia``.

Each training (non-DP, DP from scratch, DP continual) is a family of models; every model is the target in turn with
the others of its family as references. Per family the strongest attack is the suite's one definition
(:mod:`attacks.strongest`) applied to the pooled ROC (every target's scores; ``targets`` × the non-members). The
pre-set test, two-sided: the strongest attack's per-target TPR at 1 % FPR on the non-DP models against the DP
continual models' (Welch). It counts only when the attack has power: its pooled TPR at 1 % FPR on the non-DP models
must lie above chance (the bootstrap interval's low end above 1 %); a test that could not have found a leak is
inconclusive whatever its p. TPR at 0.1 % FPR is reported with its interval, or as not resolvable where the
non-members are too few (:mod:`attacks.resolution`).
"""

from __future__ import annotations

import math

from experiments.findings.rows import arm_result, arms_cmd, row
from experiments.stats import compare, fmt_mean_sd

__all__ = ["MIA_SUFFIX", "PRIMARY_FPR", "strongest_view", "membership_verdict", "membership_rows", "dp_tpr_bound",
           "facts", "paragraph"]

#: the membership arm's scale beside a base scale (``cpu_hour`` -> ``cpu_hour_mia``)
MIA_SUFFIX = "_mia"
#: the FPR of the pre-set test (the 0.1 % level is reported, not tested: a handful of false positives decide it)
PRIMARY_FPR = 0.01
_LABELS = {"nondp": "non-DP", "clip_only": "clipping only (σ = 0)", "scratch": "DP from scratch",
           "continual": "DP continual"}


def _key(fpr: float) -> str:
    return f"{fpr:g}"


def strongest_view(result: dict, family: str) -> dict | None:
    """One family of a membership arm's JSON through its strongest attack: ``attack``, ``per_target`` TPR at each
    FPR (lists, one per model), ``pooled`` metrics, the ``n_nonmembers`` of one target and of the pooled ROC, the
    ``reference_fpr`` the choice was made at; None when the family is absent."""
    summ = result.get("summary", {}).get(family)
    if not summ:
        return None
    name, ps = summ["strongest"], result["per_seed"]
    fprs = result.get("fprs", [0.01, 0.001])
    return {"attack": name, "pooled": summ["pooled"][name], "reference_fpr": summ.get("reference_fpr"),
            "per_target": {_key(f): ps[f"{family}_{name}_tpr_{_key(f)}"] for f in fprs},
            "auc": ps[f"{family}_{name}_auc"], "n_nonmembers": ps[f"{family}_{name}_n_nonmembers"][0],
            "n_pooled": summ["n_nonmembers_pooled"], "acc": ps[f"{family}_acc"],
            "all_pooled": summ["pooled"]}


def membership_verdict(nondp: list[float], dp: list[float], nondp_pooled_low: float, dp_pooled_low: float = 0.0,
                       *, fpr: float = PRIMARY_FPR) -> tuple[str, str]:
    """(test text, verdict) of "DP models resist membership inference": the strongest attack's per-target TPR at
    ``fpr`` on the non-DP models (``nondp``) against the DP models (``dp``), two-sided Welch; 'reproduced' when the
    DP models' is significantly lower, 'not reproduced' when it is significantly higher; 'inconclusive' otherwise,
    and always when the attacks show no power: neither the non-DP nor the DP models' pooled TPR is above chance
    (``*_pooled_low``, the low ends of the pooled TPRs' intervals, at most ``fpr``), so no leak could have been
    found to differ."""
    r = compare(nondp, dp)
    if r is None:
        return "too few targets for a test", "inconclusive"
    w = r.welch
    text = (f"non-DP > DP continual, TPR at {100 * fpr:g} % FPR per target, two-sided Welch: diff "
            f"{100 * w.diff:+.1f} points, 95 % CI [{100 * w.ci_low:.1f}, {100 * w.ci_high:.1f}], "
            + (f"p = {w.p:.1e}" if w.p < 0.001 else f"p = {w.p:.3f}") + f", n = {w.n_a}/{w.n_b}")
    if not max(nondp_pooled_low, dp_pooled_low) > fpr:
        return (text + f"; the attacks have no power here: their pooled TPR is not above chance ({100 * fpr:g} %) "
                "on the non-DP models nor on the DP ones, so they could not have found a leak"), "inconclusive"
    return text, r.verdict


def dp_tpr_bound(epsilon: float, delta: float, fpr: float) -> float:
    """The highest TPR at ``fpr`` any attack can reach on an (ε, δ)-DP training: min(1, e^ε · FPR + δ)."""
    return min(1.0, math.exp(epsilon) * fpr + delta)


def _tpr(v: float, ci: list[float] | None, fpr: float, n: int) -> str:
    from attacks.resolution import format_tpr

    return format_tpr(v, fpr, n, interval=tuple(ci) if ci else None)


def _family_text(fam: str, s: dict) -> str:
    from attacks.resolution import not_resolvable, resolvable

    p, n = s["pooled"], s["n_pooled"]
    per = s["per_target"]
    return (f"{_LABELS.get(fam, fam)} ({fmt_mean_sd(s['acc'], '.1f', 100)} % test accuracy): strongest "
            f"{s['attack']}, TPR at 1 % FPR {_tpr(p['tpr_0.01'], p.get('tpr_0.01_ci'), 0.01, n)} pooled, "
            f"{fmt_mean_sd(per['0.01'], '.1f', 100)} % per target; at 0.1 % FPR "
            f"{_tpr(p['tpr_0.001'], p.get('tpr_0.001_ci'), 0.001, n)} pooled, "
            + (f"{fmt_mean_sd(per['0.001'], '.1f', 100)} % per target" if resolvable(0.001, s["n_nonmembers"])
               else not_resolvable(s["n_nonmembers"]) + " per target")
            + f"; AUC {p['auc']:.3f}")


def membership_rows(scale: str) -> list[str]:
    """The membership row at ``scale`` from the membership arm at ``<scale>_mia`` (none without it)."""
    mia = f"{scale}{MIA_SUFFIX}"
    m = arm_result(mia, "membership")
    if not m:
        return []
    views = {f: strongest_view(m, f) for f in ("nondp", "clip_only", "scratch", "continual")}
    views = {f: v for f, v in views.items() if v}
    if "nondp" not in views or "continual" not in views:
        return []
    nd, ct = views["nondp"], views["continual"]
    test, v = membership_verdict(nd["per_target"]["0.01"], ct["per_target"]["0.01"],
                                 nd["pooled"]["tpr_0.01_ci"][0], ct["pooled"]["tpr_0.01_ci"][0])
    st = m.get("scale_settings", {})
    bound = dp_tpr_bound(st.get("epsilon", 8.0), st.get("delta", 1e-5), PRIMARY_FPR)
    cmd = (arms_cmd("membership", mia) + f" --seeds 0 --parts {' '.join(views)}, then python -m experiments arms "
           f"merge membership --scale {mia}")
    measured = ("; ".join(_family_text(f, s) for f, s in views.items())
                + f". {m['targets']} models per training, each the target once with the other {m['targets'] - 1} as "
                f"references; {nd['n_nonmembers']:,} non-members per target, {nd['n_pooled']:,} pooled; strongest = "
                f"the suite's definition on the pooled ROC (at {100 * float(nd['reference_fpr']):g} % FPR), among "
                f"{', '.join(m['attacks'])}")
    alt = {f: max(views[f]["all_pooled"], key=lambda a: views[f]["all_pooled"][a]["tpr_0.01"])
           for f in ("nondp", "continual")}
    if alt != {"nondp": nd["attack"], "continual": ct["attack"]}:  # the choice at 1 % FPR instead: does it matter?
        r = compare(*(m["per_seed"][f"{f}_{alt[f]}_tpr_0.01"] for f in ("nondp", "continual")))
        if r is not None:
            test += (f"; sensitivity, each training's attack with the highest pooled TPR at 1 % FPR instead "
                     f"({alt['nondp']}, {alt['continual']}): diff {100 * r.welch.diff:+.1f} points, "
                     + (f"p = {r.welch.p:.1e}" if r.welch.p < 0.001 else f"p = {r.welch.p:.3f}") + f", {r.verdict}")
    eps, delta = st.get("epsilon", 8.0), st.get("delta", 1e-5)
    test += (f". The DP guarantee alone (ε = {eps:g}, δ = {delta:g}) bounds TPR at 1 % FPR by {100 * bound:.0f} %: "
             "it does not decide this claim, the models do")
    return [row(scale, "Bu et al. 2024", "continual checkpoints resist membership inference under the suite's "
                "strongest attack (LiRA / RMIA, attacks/strongest.py; TPR at 1 % and 0.1 % FPR)", measured, test, v,
                cmd)]


def facts(scale: str = "cpu_hour") -> dict[str, str]:
    """The figures the prose quotes from the membership arm at ``<scale>_mia``."""
    m = arm_result(f"{scale}{MIA_SUFFIX}", "membership")
    if not m:
        return {}
    views = {f: v for f in ("nondp", "scratch", "continual") if (v := strongest_view(m, f))}
    if "nondp" not in views or "continual" not in views:
        return {}
    nd, ct = views["nondp"], views["continual"]
    test, v = membership_verdict(nd["per_target"]["0.01"], ct["per_target"]["0.01"], nd["pooled"]["tpr_0.01_ci"][0],
                                 ct["pooled"]["tpr_0.01_ci"][0])
    loss = {f: views[f]["all_pooled"]["loss"]["tpr_0.01"] for f in views if "loss" in views[f]["all_pooled"]}

    def pooled(s: dict, fpr: str) -> str:
        return _tpr(s["pooled"][f"tpr_{fpr}"], s["pooled"].get(f"tpr_{fpr}_ci"), float(fpr), s["n_pooled"])

    f = {"mi_models": str(m["targets"]), "mi_refs": str(m["targets"] - 1), "mi_non": f"{nd['n_nonmembers']:,}",
         "mi_pooled_n": f"{nd['n_pooled']:,}", "mi_verdict": v,
         "mi_nd_attack": nd["attack"], "mi_ct_attack": ct["attack"],
         "mi_nd_acc": fmt_mean_sd(nd["acc"], ".1f", 100), "mi_ct_acc": fmt_mean_sd(ct["acc"], ".1f", 100),
         "mi_nd_1": pooled(nd, "0.01"), "mi_nd_01": pooled(nd, "0.001"),
         "mi_ct_1": pooled(ct, "0.01"), "mi_ct_01": pooled(ct, "0.001"),
         "mi_scratch": (f", and on DP from scratch ({fmt_mean_sd(views['scratch']['acc'], '.1f', 100)} %) "
                        f"{views['scratch']['attack']} {pooled(views['scratch'], '0.01')} and "
                        f"{pooled(views['scratch'], '0.001')}" if "scratch" in views else
                        "; DP from scratch was not attacked at this scale (the arm's `--parts scratch` adds it)"),
         "mi_nd_auc": f"{nd['pooled']['auc']:.3f}", "mi_ct_auc": f"{ct['pooled']['auc']:.3f}",
         "mi_test": test.split(". The DP guarantee")[0],
         "mi_secs": f"{m['wall_seconds']:,.0f}" if "wall_seconds" in m else "?"}
    # below 5 % TPR at 1 % FPR the non-DP model itself leaks little: say so, the verdict is about a weak model
    f["mi_weak"] = (": the small CNN leaks little even without DP, so the verdict is about this model, not the "
                    "paper's" if nd["pooled"]["tpr_0.01"] < 0.05 else "")
    if "nondp" in loss:
        f["mi_nd_loss_1"] = f"{100 * loss['nondp']:.1f} %"
    return f


def paragraph(f: dict) -> str:
    """The membership arm in words (a missing figure leaves the paragraph out, as :func:`prose.paragraphs` does)."""
    weak = (f" (LOSS on the same models: {f['mi_nd_loss_1']})" if "mi_nd_loss_1" in f else "")
    return (
        f"* **Membership under the strongest attack (`cpu_hour`, the small CNN, {f['mi_models']} models per "
        "training).** The LOSS / Attack-P row could not have found a leak at low FPR; LiRA and RMIA need reference "
        "models, so the membership arm trains the continual arm's `cpu_hour` recipes "
        f"{f['mi_models']} times each on random halves of the private pool and attacks every model with the other "
        f"{f['mi_refs']} as references ({f['mi_non']} non-members a target, {f['mi_pooled_n']} pooled). On the non-DP "
        f"models ({f['mi_nd_acc']} % test accuracy) the strongest attack, {f['mi_nd_attack']}, reaches a TPR of "
        f"{f['mi_nd_1']} at 1 % FPR{weak} and {f['mi_nd_01']} at 0.1 %; on the DP continual models "
        f"({f['mi_ct_acc']} %) the strongest, {f['mi_ct_attack']}, {f['mi_ct_1']} and {f['mi_ct_01']} (pooled, "
        f"95 % bootstrap intervals){f['mi_scratch']}. {f['mi_test'][0].upper() + f['mi_test'][1:]}: "
        f"{f['mi_verdict']}. Leave-one-out "
        "targets share references and overlap in their members, so the per-target values are not independent and "
        "the Welch p is approximate; the pooled intervals are the other view. The strongest attack's pooled AUC is "
        f"{f['mi_nd_auc']} on the non-DP models and {f['mi_ct_auc']} on the DP continual ones{f['mi_weak']}. At "
        "`gpu_full` (ResNet-20) these attacks were not run (Untested).")
