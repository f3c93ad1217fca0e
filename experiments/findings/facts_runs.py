"""The figures the findings' prose quotes from the experiment configs' runs (``python -m experiments papers``):
the continual pre-training sweeps and decelerator runs of ``gpu_full``, ``gpu`` and ``cpu_hour``, each computed
from the run directories (their metrics and manifests) with the tests the table rows use."""

from __future__ import annotations

import statistics

from experiments.findings.continual import offline_decelerator, paired_holm
from experiments.findings.numbers import (mean_pct, ms, ms_pct, plain_p, points, signed, spread_pct, thousands,
                                          words)
from experiments.papers.continual import sweep_points
from experiments.papers.runs import SCALES, groups, hist, scale_config
from experiments.stats import holm, mean_sd, welch


def _acc(g: dict) -> dict[str, list[float]]:
    return {k: [x["test_accuracy"] for _, _, x in runs] for k, runs in g.items()}


def _curve(g: dict, key: str, quantity: str = "trace_h") -> dict[int, tuple[float, float, int]]:
    """step -> (mean, SD, seeds) of a logged quantity over the seeds of a variant, at the steps every seed has."""
    curves = [hist(x, quantity) for _, _, x in g[key]]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return {s: mean_sd([c[s] for c in curves]) for s in steps}


def _ms0(v: tuple[float, float, int]) -> str:
    return f"{v[0]:,.0f} ± {v[1]:,.0f}"


def _sweep(g: dict, acc: dict) -> dict:
    """The switch-point sweep: points, the Welch tests against 0 public steps with Holm, the paired analysis."""
    sweep = sweep_points(g)
    zero = next(k for s, k in sweep if s == 0)
    res = [(s, k, welch(acc[k], acc[zero])) for s, k in sweep if s > 0]
    adj = holm([r.p for _, _, r in res])
    seeds = {k: [seed for seed, _, _ in g[k]] for _, k in sweep}
    paired = {k: (d, p, ds) for k, d, p, ds in paired_holm({s: dict(zip(seeds[k], acc[k])) for s, k in sweep}, 0)}
    best = max(sweep, key=lambda sk: statistics.mean(acc[sk[1]]))
    return {"sweep": sweep, "zero": zero, "res": res, "adj": adj, "paired": paired, "best": best}


def switch_gpu_full() -> dict[str, str]:
    """Switch point, non-DP tr(H) and the decelerator rule at ``gpu_full`` (configs' runs)."""
    g = groups("continual", "gpu_full")
    if not g:
        return {}
    acc, sw = _acc(g), _sweep(g, _acc(g))
    sweep, zero = sw["sweep"], sw["zero"]
    top_s, top_k = sweep[-1]
    i_top = [s for s, _, _ in sw["res"]].index(top_s)
    d_top, _, ds_top = sw["paired"][top_s]
    first_s = sweep[1][0]
    d_first, p_first, _ = sw["paired"][first_s]
    nondp = _curve(g, "nondp")
    interior = sorted(nondp)[1:-1]
    peak = max(interior, key=lambda s: nondp[s][0])
    last = max(nondp)
    steps = scale_config("continual", SCALES["gpu_full"]).training.steps
    f = {
        "gf_seeds": str(len(acc["nondp"])), "gf_nondp": mean_pct(acc["nondp"]), "gf_sw0": mean_pct(acc[zero]),
        "gf_sw_rest": " / ".join(mean_pct(acc[k]) for _, k in sweep[1:]),
        "gf_sw_rest_steps": " / ".join(str(s) for s, _ in sweep[1:]), "gf_top": str(top_s),
        "gf_n_k": str(len(sw["res"])), "gf_p_top": plain_p(sw["adj"][i_top]), "gf_d_top": signed(d_top),
        "gf_top_every": "on every seed" if all(x > 0 for x in ds_top) else "on average",
        "gf_first": str(first_s), "gf_d_first": points(d_first),
        "gf_first_dir": "below" if d_first < 0 else "above", "gf_p_first": plain_p(p_first),
        "gf_steps": thousands(steps), "gf_peak": str(peak), "gf_tr_peak": _ms0(nondp[peak]),
        "gf_tr_last": _ms0(nondp[last]), "gf_last": thousands(last), "gf_n_interior": words(len(interior)),
        "gf_n_interior_num": str(len(interior)),
        "gf_sweep_means": {s: mean_pct(acc[k]) for s, k in sweep},
    }
    if "continual-dec" in g:
        runs = g["continual-dec"]
        cc = scale_config("continual", SCALES["gpu_full"]).training.continual
        sw_steps = [x["continual"]["switch_step"] for _, _, x in runs]
        firsts = [x["continual"]["evaluations"][0] for _, _, x in runs]
        at = sw_steps[0] if len(set(sw_steps)) == 1 else round(statistics.mean(sw_steps))
        same = next(k for s, k in sweep if s == at)
        r0 = welch(acc["continual-dec"], acc[zero])
        best_s, best_k = sw["best"]
        rb = welch(acc[best_k], acc["continual-dec"])
        dec = _curve(g, "continual-dec")
        dcel = _curve(g, "continual-dec", "decelerator")
        f.update({
            "gf_dec_threshold": f"{cc.decelerator_threshold:g}", "gf_dec_every": str(cc.eval_every),
            "gf_dec_at": str(at), "gf_dec_value": ms([e["value"] for e in firsts], ".2f"),
            "gf_dec_trace": ms([e["trace_h"] for e in firsts], ".0f"), "gf_dec_acc": ms_pct(acc["continual-dec"]),
            "gf_sw_at_rule": ms_pct(acc[same]), "gf_sw0_ms": ms_pct(acc[zero]), "gf_dec_p0": plain_p(r0.p),
            "gf_dec_best_gap": points(rb.diff), "gf_best": str(best_s), "gf_best_acc": mean_pct(acc[best_k]),
            "gf_n_sweep": str(len(sweep)), "gf_dec_p_best": plain_p(min(1.0, rb.p * len(sweep))),
            "gf_dec_tr_last": _ms0(dec[max(dec)]), "gf_dcel_first": f"{dcel[min(s for s in dcel if s > 0)][0]:.2f}",
            "gf_dcel_last": f"{dcel[max(dcel)][0]:.2f}",
            "gf_dec_first_check": "at its first check on every seed" if all(
                s == e["step"] for s, e in zip(sw_steps, firsts)) else "at its checks",
        })
    return f


def switch_gpu() -> dict[str, str]:
    """The ``gpu`` sweep (8,000 images) and where the decelerator would have switched, read off non-DP tr(H)."""
    g = groups("continual", "gpu")
    if not g:
        return {}
    acc = _acc(g)
    sw = _sweep(g, acc)
    sweep, zero = sw["sweep"], sw["zero"]
    best_s, best_k = sw["best"]
    i_best = [s for s, _, _ in sw["res"]].index(best_s)
    after = [(s, k) for s, k in sweep if s > best_s]
    d_best, p_best, ds_best = sw["paired"][best_s]
    cfg = scale_config("continual", SCALES["gpu"])
    curves = [hist(x, "trace_h") for _, _, x in g["nondp"]]
    off = offline_decelerator("gpu", g, curves)
    fired = off[1] if off else None
    return {
        "g_images": thousands(cfg.data.pool_size), "g_seeds": str(len(acc[zero])), "g_best": str(best_s),
        "g_best_acc": mean_pct(acc[best_k]), "g_sw0": mean_pct(acc[zero]),
        "g_after": f"{after[0][0]}-{after[-1][0]}" if len(after) > 1 else str(after[0][0]),
        "g_after_acc": ", ".join(f"{mean_pct(acc[k])} %" for _, k in after),
        "g_n_k": words(len(sw["res"])), "g_p_best": plain_p(sw["adj"][i_best]), "g_d_best": signed(d_best),
        "g_best_every": (f"consistent on all {words(len(ds_best))} seeds" if all(x > 0 for x in ds_best)
                         else "not consistent over the seeds"),
        "g_p_paired": plain_p(p_best), "g_nondp_seeds": str(len(g["nondp"])),
        "g_dec_switch": (f"at its cap of {cfg.training.continual.max_public_steps}" if fired is None
                         else f"at {fired}"),
    }


def continual_cpu_hour() -> dict[str, str]:
    """The ``cpu_hour`` configs: continual (fixed switch) vs scratch, the sweep's largest point, the rules' caps."""
    g = groups("continual", "cpu_hour")
    if not g:
        return {}
    acc = _acc(g)
    cfg = scale_config("continual", SCALES["cpu_hour"])
    tests = [(k, welch(acc[k], acc["scratch"])) for k in ("continual", "continual-dec") if k in acc]
    adj = dict(zip([k for k, _ in tests], holm([r.p for _, r in tests])))
    sw = _sweep(g, acc)
    top_s, top_k = sw["sweep"][-1]
    i_top = [s for s, _, _ in sw["res"]].index(top_s)
    switch = g["continual"][0][2]["continual"]["switch_step"]
    steps = cfg.training.steps
    dec_capped = all(x["continual"]["switch_reason"] == "max_public_steps" for _, _, x in g.get("continual-dec", []))
    return {
        "ch_switch": str(switch), "ch_dp_steps": str(steps - switch), "ch_steps": str(steps),
        "ch_cont": mean_pct(acc["continual"]), "ch_scratch": mean_pct(acc["scratch"]),
        "ch_p_cont": plain_p(adj["continual"]), "ch_top": str(top_s), "ch_top_acc": mean_pct(acc[top_k]),
        "ch_p_top": plain_p(sw["adj"][i_top]), "ch_cap": str(cfg.training.continual.max_public_steps),
        "ch_nondp_mean": statistics.mean(acc["nondp"]), "ch_dec_fired": "never fired" if dec_capped else "fired",
    }


def gpu_full_scale() -> dict[str, str]:
    """The ``gpu_full`` configs' runs as the scale note states them: the non-DP baseline, public images kept, the
    decelerator runs' time, the runs and minutes of training."""
    g = groups("continual", "gpu_full")
    if not g:
        return {}
    acc = _acc(g)
    runs = [x for rs in g.values() for _, _, x in rs]
    pub = next(x["continual"] for k in g if k.startswith("sw") for _, _, x in g[k][:1] if x["continual"]["public_steps"])
    dec_min = [x["wall_seconds"] / 60 for _, _, x in g.get("continual-dec", [])]
    return {
        "gfs_nondp": ms_pct(acc["nondp"]), "gfs_nondp_span": spread_pct(acc["nondp"]),
        "gfs_all_above": "every seed above 60 %" if min(acc["nondp"]) > 0.6 else "not every seed above 60 %",
        "gfs_public_left": thousands(pub["public_size"]),
        "gfs_runs": str(len([x for k, rs in g.items() if k != "continual-dec" for _, _, x in rs])),
        "gfs_minutes": f"{sum(x['wall_seconds'] for k, rs in g.items() if k != 'continual-dec' for _, _, x in rs) / 60:.0f}",
        "gfs_dec_minutes": f"{min(dec_min):.0f}-{max(dec_min):.0f}" if dec_min else "?",
        "gfs_n_all": str(len(runs)),
    }
