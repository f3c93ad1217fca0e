"""The representation-law rows of ``seed_findings.md``: a 12-block ViT's per-block fuzziness D and prediction
residual fitted geometrically over the blocks, by ε, tuned vs untuned (the arm is :mod:`experiments.arms.vit`)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from experiments.stats import fmt_mean_sd, fmt_p, holm, verdict, welch
from experiments.findings.rows import arm_result, arms_cmd, greater, pct, row

VIT_EPS = (("eps1", "1"), ("eps3", "3"), ("eps8", "8"), ("epsinf", "∞"))
R2_BAR = 0.9


def _bound(values: list[float]) -> tuple[float, float, float]:
    """(mean, lower, upper) 95 % t-interval of the mean over seeds (nan bounds below 2 values)."""
    from scipy import stats

    v = [x for x in values if x is not None and math.isfinite(x)]
    if len(v) < 2:
        return (v[0] if v else math.nan), math.nan, math.nan
    m, sd = statistics.mean(v), statistics.stdev(v)
    h = stats.t.ppf(0.975, len(v) - 1) * sd / math.sqrt(len(v))
    return m, m - h, m + h


def _law_verdict(values: list[float]) -> str:
    _, lo, hi = _bound(values)
    return "reproduced" if lo > R2_BAR else "not reproduced" if hi < R2_BAR else "inconclusive"


def _holm_rows(pairs: list[tuple[str, Any]]) -> tuple[str, str]:
    """(test text, verdict) of per-ε Welch tests under Holm's correction: reproduced if any corrected test rejects in
    the paper's direction, not reproduced if all reject against it."""
    ok = [(t, r) for t, r in pairs if r is not None]
    if not ok:
        return "too few seeds for a test", "inconclusive"
    adj = holm([r.p for _, r in ok])
    vs = [verdict(diff=r.diff, p=p) for (_, r), p in zip(ok, adj)]
    v = ("reproduced" if "reproduced" in vs else "not reproduced" if all(x == "not reproduced" for x in vs)
         else "inconclusive")
    return f"Welch per ε, Holm over {len(ok)}: " + ", ".join(f"ε={t} {fmt_p(p)}" for (t, _), p in zip(ok, adj)), v


def vit_rows(scale: str) -> list[str]:
    """The representation law on a 12-block ViT (per-block fuzziness D and prediction residual, 12-point fits)."""
    a = arm_result(scale, "vit")
    if not a:
        return []
    ps, cmd = a["per_seed"], arms_cmd("vit", scale)
    paper, rows = "representation law (DP fine-tuned ViTs)", []
    eps = [(e, t) for e, t in VIT_EPS if e in a["epsilons"]]  # merged (seed, ε) parts keep the ε every seed has
    what = (f"{a['blocks']}-block ViT (width {a['vit_kwargs'].get('embed_dim')}), {a['steps']} fine-tuning steps, "
            f"{len(a['seeds'])} seeds, {a['probe_images']} held-out images; "
            + (f"one pre-trained model for every seed, {100 * ps['pretrain_acc'][0]:.1f} %" if a.get("shared_pretrain")
               else f"pre-trained model {pct(ps['pretrain_acc'])}"))
    for key, label in (("D", "fuzziness D"), ("res", "prediction residual")):
        r2 = {e: ps[f"{e}_tuned_r2_{key}"] for e, _ in eps}
        rho = {e: ps[f"{e}_tuned_rho_{key}"] for e, _ in eps}
        vs = [_law_verdict(r2[e]) for e, _ in eps]
        rows.append(row(scale, paper, f"per-block {label} decays geometrically over the blocks (tuned models, every "
                         "ε)", f"{what}. By ε: " + "; ".join(f"ε={t}: R² {fmt_mean_sd(r2[e], '.2f')}, ρ "
                                                             f"{fmt_mean_sd(rho[e], '.3f')}" for e, t in eps),
                         f"95 % t-interval of the mean R² against {R2_BAR}, per ε: {', '.join(vs)}",
                         vs[0] if len(set(vs)) == 1 else "inconclusive", cmd))
    test, v = _holm_rows([(t, welch(ps[f"{e}_tuned_r2_D"], ps[f"{e}_untuned_r2_D"])) for e, t in eps])
    rows.append(row(scale, paper, "tuned hyper-parameters make the law hold better (R² of the D fit, tuned > "
                     "untuned)", "; ".join(f"ε={t}: {fmt_mean_sd(ps[f'{e}_tuned_r2_D'], '.2f')} vs "
                                         f"{fmt_mean_sd(ps[f'{e}_untuned_r2_D'], '.2f')}" for e, t in eps),
                     test, v, cmd))
    if {"eps1", "epsinf"} <= set(a["epsilons"]):
        t, v, _ = greater(ps["eps1_tuned_rho_D"], ps["epsinf_tuned_rho_D"], scale=1, fmt="+.3f")
        measured = (f"ρ: ε=1 {fmt_mean_sd(ps['eps1_tuned_rho_D'], '.3f')}, ε=∞ "
                    f"{fmt_mean_sd(ps['epsinf_tuned_rho_D'], '.3f')}")
    else:  # a merge of (seed, ε) parts keeps only the ε every seed has
        t, v, measured = "ε = 1 or ∞ not measured", "inconclusive", "ε = 1 or ∞ not measured on every seed"
    rows.append(row(scale, paper, "stronger privacy slows the separation across blocks (ρ of D at ε = 1 > non-DP)",
                     measured, f"ε=1 > ε=∞: {t}", v, cmd))
    test, v = _holm_rows([(t, welch(ps[f"{e}_tuned_acc"], ps[f"{e}_untuned_acc"])) for e, t in eps])
    rows.append(row(scale, paper, "tuning (learning rate searched on public data, no privacy cost) improves "
                     "fine-tuning accuracy", "; ".join(f"ε={t}: {pct(ps[f'{e}_tuned_acc'])} vs "
                                                       f"{pct(ps[f'{e}_untuned_acc'])}" for e, t in eps),
                     test, v, cmd))
    return rows
