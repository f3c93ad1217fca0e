"""The figures the findings' prose quotes from the extra arms' result files (``results/reference/seed_arms/<scale>/
<arm>.json`` and their parts): the continual arm, Ganesh et al., tr(H), Ke et al. and the ViT representation law,
each computed with the tests the table rows use."""

from __future__ import annotations

import json
import statistics

from experiments.findings.arms import SAME_ACCURACY_MARGIN, exact_p, ganesh_control as arm_control, ganesh_with
from experiments.findings.law import R2_BAR, RHO_MARGIN_SHARE, _bound
from experiments.findings.numbers import mean_pct, ms, ms_pct, p2, plain_p, points, signed, spread, spread_pct, thousands
from experiments.findings.rows import OUT, ROOT, arm_result
from experiments.papers.continual import trend_verdicts
from experiments.stats import all_equivalent, compare, equivalence_verdict, holm, mean_sd, tost, welch

EPS = (("eps1", "1"), ("eps3", "3"), ("eps8", "8"), ("epsinf", "∞"))


def _mean(v) -> float:
    return statistics.mean(v)


def continual_arm(scale: str = "gpu_full", small: str = "cpu_hour") -> dict[str, str]:
    """σ = 0 vs non-DP vs DP, the continual and plateau runs, membership inference (the continual arm)."""
    c, s = arm_result(scale, "continual"), arm_result(small, "continual")
    if not c:
        return {}
    ps, st = c["per_seed"], c["scale_settings"]
    gap = welch(ps["nondp_acc"], ps["clip_only_acc"])
    noise = welch(ps["clip_only_acc"], ps["scratch_acc"])
    dp = ("scratch", "continual", "plateau")
    auc_means = [_mean(ps[f"{k}_loss_auc"]) for k in dp]
    auc = welch(ps["nondp_loss_auc"], ps["continual_loss_auc"])
    f = {
        "ca_clip_cost": points(gap.diff), "ca_clip": ms_pct(ps["clip_only_acc"]), "ca_nondp": ms_pct(ps["nondp_acc"]),
        "ca_ci": f"[{100 * gap.ci_low:.1f}, {100 * gap.ci_high:.1f}]", "ca_noise_cost": points(noise.diff),
        "ca_scratch": ms_pct(ps["scratch_acc"]), "ca_p_noise": plain_p(min(1.0, noise.p * 2)),
        "ca_switch": str(st["switch"]), "ca_dp_steps": str(st["steps"] - st["switch"]),
        "ca_cont": ms_pct(ps["continual_acc"]), "ca_plateau": ms_pct(ps["plateau_acc"]),
        "ca_plateau_cap": str(max(ps["plateau_switch"])),
        "ca_plateau_capped": all(r == "max_public_steps" for r in ps["plateau_reason"]),
        "ca_auc_dp": f"{min(auc_means):.3f}-{max(auc_means):.3f}", "ca_auc_nondp": ms(ps["nondp_loss_auc"]),
        "ca_p_auc": plain_p(auc.p), "ca_tpr_dp": f"{100 * _mean([x for k in dp for x in ps[f'{k}_loss_tpr1']]):.1f}",
        "ca_auc_clip": f"{_mean(ps['clip_only_loss_auc']):.3f}",
        "ca_tpr_clip": f"{100 * _mean(ps['clip_only_loss_tpr1']):.1f}",
        "ca_nondp_mean": mean_pct(ps["nondp_acc"]), "ca_sigma": f"{_mean(ps['sigma_scratch']):.3f}",
        "ca_members": thousands(c["n_members_mean"]) if "n_members_mean" in c else "?",
        "ca_p_clip": exact_p(gap.p), "ca_margin": f"{100 * SAME_ACCURACY_MARGIN:.0f}",
        "ca_clip_eq": equivalence_verdict(tost(ps["clip_only_acc"], ps["nondp_acc"], margin=SAME_ACCURACY_MARGIN),
                                          family=2),
        "ca_p_cont": exact_p(welch(ps["continual_acc"], ps["scratch_acc"]).p),
        "ca_cont_gap": points(_mean(ps["continual_acc"]) - _mean(ps["scratch_acc"])),
        "ca_tpr_nondp": f"{100 * _mean(ps['nondp_loss_tpr1']):.1f}",
    }
    if s:
        q = s["per_seed"]
        f.update({"cas_clip": mean_pct(q["clip_only_acc"]), "cas_scratch": mean_pct(q["scratch_acc"]),
                  "cas_auc_dp": f"{_mean(q['continual_loss_auc']):.3f}",
                  "cas_auc_nondp": f"{_mean(q['nondp_loss_auc']):.3f}",
                  "cas_nondp_mean": _mean(q["nondp_acc"])})
    return f


def _endpoints(curves: list[list[float]]) -> list[float]:
    return [v for c in curves for v in (c[0], c[-1])]


def ganesh(scale: str = "gpu_full", small: str = "cpu_hour") -> dict[str, str]:
    """The public budget sweep and the loss barriers (Ganesh et al.), with where the parts ran."""
    g, s = arm_result(scale, "ganesh"), arm_result(small, "ganesh")
    if not g:
        return {}
    ps, st = g["per_seed"], g["scale_settings"]
    budgets = g["budgets"]
    top, mid = budgets[-1], budgets[-2]
    r = welch(ps[f"public{top}_acc"], ps["public0_acc"])
    same, rand = ps["barrier_same_public"], ps["barrier_random"]
    ends_same, ends_rand = _endpoints(ps["barrier_same_public_curve"]), _endpoints(ps["barrier_random_curve"])
    rb = welch(rand, same)
    flat = [b for b in budgets if 0 < b < mid]
    parts = sorted((OUT / "seed_arms" / scale / "parts").glob("ganesh.s*.json")) or sorted(
        (ROOT / "results/seed_arms" / scale / "parts").glob("ganesh.s*.json"))
    walls = {p.stem: json.loads(p.read_text()) for p in parts}
    cpu = [w["wall_seconds"] for w in walls.values() if w.get("device") == "cpu"]
    gpu = [w for w in walls.values() if w.get("device") != "cpu"]
    f = {
        "ga_public": thousands(st["public"]), "ga_steps": thousands(st["steps"]), "ga_batch": str(st["batch_size"]),
        "ga_private": thousands(st["private"]), "ga_sigma": f"{g['sigma']:.3f}", "ga_test": thousands(st["test"]),
        "ga_budgets": ", ".join(str(b) for b in budgets[:-1]) + f" and {top}",
        "ga_accs": ", ".join(ms_pct(ps[f"public{b}_acc"]) for b in budgets[:-1]) + f" and "
                   f"{ms_pct(ps[f'public{top}_acc'])}",
        "ga_flat_to": str(flat[-1]) if flat else "0", "ga_flat": f"{flat[0]}-{flat[-1]}" if flat else "",
        "ga_mid": str(mid), "ga_d_mid": signed(_mean(ps[f"public{mid}_acc"]) - _mean(ps["public0_acc"])),
        "ga_top": str(top), "ga_d_top": signed(r.diff).lstrip("+"), "ga_p_top": plain_p(r.p),
        "ga_same": ms(same), "ga_same_pct": f"{100 * _mean(same) / _mean(ends_same):.0f}",
        "ga_ends_same": spread(ends_same), "ga_rand": ms(rand, ".2f"), "ga_rand_span": spread(rand),
        "ga_rand_pct": f"{100 * _mean(rand) / _mean(ends_rand):.0f}", "ga_ends_rand": spread(ends_rand),
        "ga_p_barrier": plain_p(rb.p), "ga_parts": str(len(walls)), "ga_parts_cpu": str(len(cpu)),
        "ga_parts_gpu": str(len(gpu)), "ga_cpu_secs": f"{thousands(min(cpu))}-{thousands(max(cpu))}" if cpu else "",
        "ga_hours": f"{g['wall_seconds'] / 3600:.1f}",
    }
    if s:
        f.update({"gas_same": f"{_mean(s['per_seed']['barrier_same_public']):.2f}",
                  "gas_rand": f"{_mean(s['per_seed']['barrier_random']):.2f}"})
    return f


def ganesh_control(small: str = "cpu_hour") -> dict[str, str]:
    """The shared-random-init control of the barrier test (the largest scale that ran it)."""
    c = arm_control(small)
    if not c:
        return {}
    r = welch(c["barrier_same_random"], c["barrier_same_public"])
    v = compare(c["barrier_same_random"], c["barrier_same_public"]).verdict if r else "inconclusive"
    reading = {"reproduced": "Public data does more than a shared start here: the paper's account holds at this "
                             "scale.",
               "not reproduced": "A shared random start gives the *smaller* barrier: at this scale the public data "
                                 "is not what makes the basin."}.get(
        v, "The control does not separate a shared public start from a shared random one: at this scale a shared "
           "start alone may be what puts the DP runs in one basin.")
    return {"gc_reading": reading, "gc_scale": small, "gc_same": ms(c["barrier_same_public"]),
            "gc_same_random": ms(c["barrier_same_random"]),
            "gc_rand": ms(c["barrier_random"]), "gc_p": exact_p(r.p) if r else "too few seeds",
            "gc_verdict": v,
            "gc_seeds": str(len(c["barrier_same_random"]))}


def ganesh_contrast(small: str = "cpu_hour") -> dict[str, str]:
    """Ganesh et al.'s private-vs-non-private contrast (the ``nondp`` part) at the largest scale that ran it."""
    got = ganesh_with(small, "nondp", "nondp_public0_acc")
    if not got:
        return {}
    g, part = got
    top, ps = max(g["budgets"]), g["per_seed"]
    nd0, ndt = [p["nondp_public0_acc"] for p in part], [p.get(f"nondp_public{top}_acc") for p in part]
    if None in ndt:
        return {}
    gdp = [a - b for a, b in zip(ps[f"public{top}_acc"], ps["public0_acc"])]
    gnd = [a - b for a, b in zip(ndt, nd0)]
    r = compare(gdp, gnd)
    return {"gx_scale": small, "gx_top": str(top), "gx_seeds": str(len(nd0)), "gx_dp0": ms_pct(ps["public0_acc"]),
            "gx_dpt": ms_pct(ps[f"public{top}_acc"]), "gx_gain_dp": f"{100 * _mean(gdp):+.1f}",
            "gx_nd0": ms_pct(nd0), "gx_ndt": ms_pct(ndt), "gx_gain_nd": f"{100 * _mean(gnd):+.1f}",
            "gx_p": exact_p(r.welch.p) if r else "too few seeds", "gx_verdict": r.verdict if r else "inconclusive"}


def plateau_room(small: str = "cpu_hour") -> dict[str, str]:
    """The validation-loss switch given room to fire (``<small>_plateau``) against ``small``'s scratch runs."""
    p, b = arm_result(f"{small}_plateau", "continual"), arm_result(small, "continual")
    if not p or not b or p["seeds"] != b["seeds"]:
        return {}
    ps, q = p["per_seed"], b["per_seed"]
    r = compare(ps["plateau_acc"], q["scratch_acc"])
    fired = sum(x != "max_public_steps" for x in ps["plateau_reason"])
    return {"cp_cap": str(2 * p["scale_settings"]["switch"]), "cp_steps": str(p["scale_settings"]["steps"]),
            "cp_fired": f"{fired} of {len(ps['plateau_reason'])}", "cp_fired_n": fired,
            "cp_switch": ", ".join(map(str, ps["plateau_switch"])), "cp_acc": ms_pct(ps["plateau_acc"]),
            "cp_scratch": ms_pct(q["scratch_acc"]), "cp_capped": ms_pct(q["plateau_acc"]),
            "cp_capped_cap": str(max(q["plateau_switch"])), "cp_p": exact_p(r.welch.p) if r else "too few seeds",
            "cp_verdict": (r.verdict if r and fired == len(ps["plateau_reason"]) else
                           "inconclusive: the capped seeds are a fixed switch, so it says more public steps helped, "
                           "not that the rule chose well")}


def _trace_curve(rows_by_seed: list[list[dict]]) -> dict[int, tuple[float, float, int]]:
    steps = sorted({r["step"] for rows in rows_by_seed for r in rows})
    return {s: mean_sd([next((r["trace_h"] for r in rows if r["step"] == s), None) for rows in rows_by_seed])
            for s in steps}


def trace(scale: str = "gpu_full", small: str = "cpu_hour") -> dict[str, str]:
    """tr(H) in non-DP and DP pre-training and in DP fine-tuning (the tr(H) arm)."""
    t, s = arm_result(scale, "trace"), arm_result(small, "trace")
    if not t:
        return {}
    ps, st = t["per_seed"], t["scale_settings"]
    nd, dp, ft = (_trace_curve(ps[f"{k}_trace"]) for k in ("pretrain_nondp", "pretrain_dp", "finetune_dp"))
    first = sorted(nd)[1]
    peak = max((x for x in nd if x > 0), key=lambda x: nd[x][0])
    means = {k: [_mean([r["trace_h"] for r in rows if r["step"] > 0]) for rows in ps[f"{k}_trace"]]
             for k in ("pretrain_dp", "finetune_dp")}
    r = welch(means["pretrain_dp"], means["finetune_dp"])
    modes = (t.get("mixed_settings") or {}).get("grad_sample_mode", {})
    hooks = sorted(k for k, v in modes.items() if v == "hooks" and "pretrain_dp" in k)
    f = {
        "tr_batch": str(st["hessian_batch"]), "tr_probes": str(st["hessian_probes"]), "tr_every": str(st["hessian_every"]),
        "tr_steps": thousands(st["trace_steps"]), "tr_sigma": f"{t['sigma']:.3f}",
        "tr_nd_acc": spread_pct(ps["pretrain_nondp_acc"]), "tr_first": str(first), "tr_nd_first": f"{nd[first][0]:.0f}",
        "tr_nd_init": f"{round(nd[0][0], -2):,.0f}".replace("-", "−"),
        "tr_nd_level": f"{round(_mean([v[0] for k, v in nd.items() if k >= first]), -2):.0f}",
        "tr_nd_peak": f"{nd[peak][0]:.0f}", "tr_nd_peak_step": str(peak), "tr_nd_last": f"{nd[max(nd)][0]:.0f}",
        "tr_last_step": thousands(max(nd)), "tr_dp_acc": spread_pct(ps["pretrain_dp_acc"]),
        "tr_dp_first": f"{dp[first][0]:.0f}", "tr_dp_last": f"{dp[max(dp)][0]:,.0f} ± {dp[max(dp)][1]:,.0f}",
        "tr_source_steps": thousands(st["source_steps"]), "tr_ft_acc": spread_pct(ps["finetune_dp_acc"]),
        "tr_ft_start": f"{ft[0][0]:,.0f}", "tr_ft_last": f"{ft[max(ft)][0]:,.0f} ± {ft[max(ft)][1]:,.0f}",
        "tr_mean_ft": ms(means["finetune_dp"], ",.0f"), "tr_mean_dp": ms(means["pretrain_dp"], ",.0f"),
        "tr_p": p2(r.p), "tr_end_ft": f"{ft[max(ft)][0]:,.0f}", "tr_end_dp": f"{dp[max(dp)][0]:,.0f}",
        "tr_hooks": ", ".join(h.split(".")[0].replace("s", "seed ", 1) for h in hooks),
    }
    per, _ = trend_verdicts({"pretrain_nondp": nd, "pretrain_dp": dp})
    f.update({"tr_v_dp": per["pretrain_dp"][0], "tr_v_nd": per["pretrain_nondp"][0],
              "tr_p_rise_dp": plain_p(per["pretrain_dp"][3]), "tr_p_rise_nd": plain_p(per["pretrain_nondp"][3]),
              "tr_p_rise_dp_raw": plain_p(welch([r_["trace_h"] for rows in ps["pretrain_dp_trace"] for r_ in rows
                                                 if r_["step"] == max(dp)],
                                                [r_["trace_h"] for rows in ps["pretrain_dp_trace"] for r_ in rows
                                                 if r_["step"] == first]).p)})
    if s:
        q = s["per_seed"]
        m = {k: [_mean([r["trace_h"] for r in rows if r["step"] > 0]) for rows in q[f"{k}_trace"]]
             for k in ("pretrain_dp", "finetune_dp")}
        f.update({"trs_ft": f"{_mean(m['finetune_dp']):,.0f}", "trs_dp": f"{_mean(m['pretrain_dp']):,.0f}",
                  "trs_p": plain_p(welch(m["finetune_dp"], m["pretrain_dp"]).p),
                  "trs_source_steps": str(s["scale_settings"]["source_steps"])})
    return f


def _profile(curves: list[list[float]]) -> list[float]:
    return [statistics.mean(c[i] for c in curves) for i in range(len(curves[0]))]


def vit(scale: str = "gpu_full_vit_long", narrow: str = "cpu_vit_long", short: str = "gpu_full_vit") -> dict[str, str]:
    """The representation law on the 12-block ViT, with the narrower and the shorter-pre-trained ViTs beside it."""
    a = arm_result(scale, "vit")
    if not a:
        return {}
    ps = a["per_seed"]
    pre = _mean(ps["pretrain_acc"])
    unt = {e: ps[f"{e}_untuned_acc"] for e, _ in EPS}
    res1 = _profile(ps["eps1_tuned_residual"])
    prer = _profile(ps["pretrain_residual"])
    pred, d1 = _profile(ps["pretrain_D"]), _profile(ps["eps1_tuned_D"])
    r2res = [_mean(ps[f"{e}_tuned_r2_res"]) for e, _ in EPS]
    r2d = [_mean(ps[f"{e}_tuned_r2_D"]) for e, _ in EPS]
    below = [t for (e, t) in EPS if _bound(ps[f"{e}_tuned_r2_res"])[2] < R2_BAR]
    reach = [t for (e, t) in EPS if t not in below]
    rho = welch(ps["eps1_tuned_rho_D"], ps["epsinf_tuned_rho_D"])
    tune_law = holm([welch(ps[f"{e}_tuned_r2_D"], ps[f"{e}_untuned_r2_D"]).p for e, _ in EPS])
    tune_acc = holm([welch(ps[f"{e}_tuned_acc"], ps[f"{e}_untuned_acc"]).p for e, _ in EPS])
    lift = _mean([_mean(unt[e]) for e, _ in EPS]) - pre
    f = {
        "v_pre": f"{100 * pre:.1f}", "v_seeds": str(len(a["seeds"])), "v_private": thousands(a["private_images"]),
        "v_lift": f"{100 * lift:.0f}",
        "v_unt1": ms_pct(unt["eps1"]), "v_unt3": mean_pct(unt["eps3"]), "v_unt8": mean_pct(unt["eps8"]),
        "v_untinf": ms_pct(unt["epsinf"]),
        "v_res1_head": ", ".join(f"{x:.2f}" for x in res1[:3]), "v_res1_tail": f"{res1[3]:.2f} to {res1[-1]:.2f}",
        "v_blocks": str(len(res1)), "v_rho_res": f"{_mean([_mean(ps[f'{e}_tuned_rho_res']) for e, _ in EPS]):.3f}",
        "v_r2_res": f"{min(r2res):.2f}-{max(r2res):.2f}", "v_res_below": ", ".join(below[:-1]) + f" and {below[-1]}"
        if len(below) > 1 else "".join(below), "v_res_reach": " and ".join(reach),
        "v_pre_res": f"{prer[0]:.3f}, {prer[1]:.3f}, {prer[2]:.3f}, ..., {prer[-1]:.3f}",
        "v_rho_d": f"{_mean([_mean(ps[f'{e}_tuned_rho_D']) for e, _ in EPS]):.2f}",
        "v_r2_d": f"{min(r2d):.2f}-{max(r2d):.2f}", "v_pre_d_turn": f"{pred[-2]:.1f} to {pred[-1]:.1f}",
        "v_d1_turn": f"{d1[-2]:.1f} to {d1[-1]:.1f}", "v_rho1": f"{_mean(ps['eps1_tuned_rho_D']):.3f}",
        "v_rhoinf": f"{_mean(ps['epsinf_tuned_rho_D']):.3f}", "v_p_rho": p2(rho.p),
        "v_p_tune_law": f"p = {min(tune_law):.1f}" if min(tune_law) >= 0.95 else plain_p(min(tune_law)),
        "v_tuned1": ms_pct(ps["eps1_tuned_acc"]), "v_p_tune_acc": f"p ≥ {min(tune_acc):.2f}",
        "v_sigma1": f"{a['sigmas']['eps1']:.3f}",
    }
    for key in ("D", "res"):  # the paper's "near-identical across ε", by TOST (the table's rows)
        ref = ps[f"epsinf_tuned_rho_{key}"]
        margin = RHO_MARGIN_SHARE * (1 - _mean(ref))
        res = [tost(ps[f"{e}_tuned_rho_{key}"], ref, margin=margin) for e, _ in EPS[:-1]]
        f.update({f"v_margin_{key}": f"{margin:.4f}", f"v_eq_{key}": all_equivalent(res),
                  f"v_eq_{key}_ci1": f"[{res[0].ci_low:+.4f}, {res[0].ci_high:+.4f}]"})
    n = arm_result(narrow, "vit")
    if n:
        q = n["per_seed"]
        r2dn = [_mean(q[f"{e}_tuned_r2_D"]) for e, _ in EPS]
        r2rn = [_mean(q[f"{e}_tuned_r2_res"]) for e, _ in EPS]
        f.update({"vn_r2_d": f"{min(r2dn):.2f}-{max(r2dn):.2f}", "vn_r2_res": f"{min(r2rn):.2f}-{max(r2rn):.2f}",
                  "vn_rho_res": f"{_mean([_mean(q[f'{e}_tuned_rho_res']) for e, _ in EPS]):.3f}",
                  "vn_width": str(n["vit_kwargs"].get("embed_dim"))})
    o = arm_result(short, "vit")
    if o:
        q = o["per_seed"]
        f.update({"vs_pre": mean_pct(q["pretrain_acc"]),
                  "vs_rho_res": f"{_mean([_mean(q[f'{e}_tuned_rho_res']) for e, _ in EPS]):.3f}",
                  "vs_r2_res": f"{_mean([_mean(q[f'{e}_tuned_r2_res']) for e, _ in EPS]):.1f}"})
    return f


def ke(scale: str = "cpu_vit_ke", small: str = "cpu_hour") -> dict[str, str]:
    """Ke et al.'s arm on the ViT source: the selected split against DP-LP and FFT, head inits, kNN quality."""
    k, s = arm_result(scale, "ke"), arm_result(small, "ke")
    if not k:
        return {}
    ps = k["per_seed"]
    sel = ps["selected_split"]
    f = {
        "ke_sel": ms_pct(ps["selected_acc"]), "ke_lp": ms_pct(ps["lp_acc"]),
        "ke_p_lp": plain_p(welch(ps["selected_acc"], ps["lp_acc"]).p), "ke_random": ms_pct(ps["random_acc"]),
        "ke_aligned": ms_pct(ps["lp_aligned_acc"]), "ke_zero": ms_pct(ps["zero_acc"]),
        "ke_knn_start": f"{100 * _mean([c[0]['knn'] for c in ps['random_knn_curve']]):.1f}",
        "ke_knn_end": f"{100 * min(_mean(ps[f'{h}_knn']) for h in ('lp_aligned', 'random', 'zero')):.0f}-"
                      f"{100 * max(_mean(ps[f'{h}_knn']) for h in ('lp_aligned', 'random', 'zero')):.0f}",
        "ke_knn_aligned": ms_pct(ps["lp_aligned_knn"]), "ke_knn_random": ms_pct(ps["random_knn"]),
        "ke_sel_share": sel[0][len("lpfft"):] if len(set(sel)) == 1 else "/".join(sorted(set(sel))),
        "ke_sel_every": "on every seed" if len(set(sel)) == 1 else "on most seeds",
    }
    if s:
        q = s["per_seed"]
        f.update({"kes_aligned": mean_pct(q["lp_aligned_acc"]), "kes_random": mean_pct(q["random_acc"])})
    return f
