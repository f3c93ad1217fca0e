"""Tight audit of the DP-SGD mechanism implementation: ε_lb/ε, planted bugs, false-violation rate.

Three parts, each stored in ``--data`` (JSON, so parts can be re-run one at a time) and rendered to ``--out``:

* ``tightness``: the project's engine (Opacus hooks, flat clipping, Poisson sampler) on the Dirac-canary probe
  (:func:`audit.mechanism.api.audit_mechanism`), σ from the PRV accountant for ε ∈ {1, 2, 4, 8} at δ = 1e-5,
  full batch (q = 1, T = 10) and Poisson (q = 0.01, T = 500); ε_lb at 95 % confidence, trials, CPU seconds.
* ``bugs``: each planted bug (:mod:`audit.mechanism.mutants`) and the honest engine over 20 seeds: full batch
  σ = 2, T = 4, C = 2 (hooks and bk), and Poisson q = 0.1, T = 20, σ = 1 for the doubled sample rate; 8,000
  trials per audit.
* ``false``: 500 seeds of the honest mechanism's math (:func:`audit.mechanism.scoring.simulate_observations`,
  no model or optimizer) at the two bug-table settings, 8,000 trials each: how often the claim is refuted.
  Full batch: the verdict itself. Poisson: refutation of the claimed trade-off curve at any grid threshold,
  which every VIOLATION needs, so its rate bounds the false-VIOLATION rate from above.

Example (the command that made results/reference/tight_audit.md)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tight_audit.py --parts tightness bugs false \
        --out results/reference/tight_audit.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

import numpy as np

from audit.mechanism.api import audit_mechanism
from audit.mechanism.estimate import MechanismClaim, mechanism_estimate, threshold_grid
from audit.mechanism.family import refutes
from audit.mechanism.scoring import simulate_observations, trial_scores
from audit.bounds.clopper_pearson import clopper_pearson_upper
from audit.bounds.thresholds import counts_at_thresholds
from audit.bounds.verdict import verdict
from training.accounting import noise_multiplier_for

warnings.filterwarnings("ignore")
DELTA = 1e-5
SETTINGS = {"full batch": dict(sample_rate=1.0, steps=10, trials=100_000, canaries_per_run=4000),
            "Poisson": dict(sample_rate=0.01, steps=500, trials=60_000, canaries_per_run=20_000)}
FULL = dict(noise_multiplier=2.0, sample_rate=1.0, steps=4, delta=DELTA, max_grad_norm=2.0, trials=8000)
POISSON = dict(noise_multiplier=1.0, sample_rate=0.1, steps=20, delta=DELTA, trials=8000)
BUGS = [("honest", None, "hooks", FULL), ("honest", None, "bk", FULL), ("noise_0.8", "noise_0.8", "hooks", FULL),
        ("noise_0.8", "noise_0.8", "bk", FULL), ("noise_without_C (C = 2)", "noise_without_C", "hooks", FULL),
        ("unclipped_group", "unclipped_group", "hooks", FULL), ("unclipped_group", "unclipped_group", "bk", FULL),
        ("reused_noise", "reused_noise", "hooks", FULL), ("honest (Poisson)", None, "hooks", POISSON),
        ("double_rate (2q)", "double_rate", "hooks", POISSON)]


def part_tightness(store: dict) -> None:
    rows = store.setdefault("tightness", [])
    for name, s in SETTINGS.items():
        for eps in (1.0, 2.0, 4.0, 8.0):
            if any(r["setting"] == name and r["target_epsilon"] == eps for r in rows):
                continue
            sigma = noise_multiplier_for(target_epsilon=eps, sample_rate=s["sample_rate"], steps=s["steps"],
                                         delta=DELTA)
            t0 = time.process_time()
            r = audit_mechanism(noise_multiplier=sigma, delta=DELTA, seed=int(eps), **s)
            rows.append(dict(setting=name, target_epsilon=eps, sigma=sigma, q=s["sample_rate"], T=s["steps"],
                             claimed=r.claimed_epsilon, eps_lb=r.epsilon_lb, tightness=r.tightness,
                             direct=r.epsilon_lb_direct, trials=r.trials_in + r.trials_out,
                             cpu=time.process_time() - t0, status=str(r.verdict.status)))
            print(rows[-1], flush=True)
            _save(store)


def part_bugs(store: dict, seeds: int) -> None:
    rows = store.setdefault("bugs", [])
    for label, mutant, mode, cfg in BUGS:
        if any(r["bug"] == label and r["engine"] == mode for r in rows):
            continue
        t0 = time.process_time()
        res = [audit_mechanism(**cfg, grad_sample_mode=mode, mutant=mutant, seed=1000 * k) for k in range(seeds)]
        rows.append(dict(bug=label, engine=mode, seeds=seeds, q=cfg["sample_rate"], T=cfg["steps"],
                         violations=sum(str(r.verdict.status) == "VIOLATION" for r in res),
                         eps_lb_median=float(np.median([r.epsilon_lb for r in res])),
                         claimed=res[0].claimed_epsilon, cpu=time.process_time() - t0))
        print(rows[-1], flush=True)
        _save(store)


def part_false(store: dict, seeds: int) -> None:
    rows = store.setdefault("false", [])
    for label, cfg in (("full batch", FULL), ("Poisson", POISSON)):
        if any(r["setting"] == label for r in rows):
            continue
        t0 = time.process_time()
        claim = MechanismClaim.from_accountant(noise_multiplier=cfg["noise_multiplier"],
                                               sample_rate=cfg["sample_rate"], steps=cfg["steps"], delta=DELTA)
        n = cfg["trials"] // 2
        members = np.arange(2 * n) < n
        grid = threshold_grid(claim, n_out=n)
        bad = 0
        for k in range(seeds):
            x = simulate_observations(members=members, steps=claim.steps, noise_multiplier=claim.noise_multiplier,
                                      sample_rate=claim.sample_rate, rng=10_000 + k)
            s = trial_scores(x, noise_multiplier=claim.noise_multiplier, sample_rate=claim.sample_rate)
            if claim.sample_rate >= 1.0:
                est = mechanism_estimate(scores_in=s[members], scores_out=s[~members], claim=claim, grid=grid)
                bad += str(verdict(claimed_epsilon=claim.epsilon, estimates=[est]).status) == "VIOLATION"
            else:
                a = 0.05 / grid.size
                fp, fn = counts_at_thresholds(scores_in=s[members], scores_out=s[~members], thresholds=grid)
                fpr = clopper_pearson_upper(k=fp, n=n, alpha=a / 2)
                fnr = clopper_pearson_upper(k=fn, n=n, alpha=a / 2)
                bad += any(refutes(sigma=claim.noise_multiplier, fpr=float(u), fnr=float(v),
                                   sample_rate=claim.sample_rate, steps=claim.steps) for u, v in zip(fpr, fnr))
        rows.append(dict(setting=label, seeds=seeds, trials=2 * n, false=int(bad), q=claim.sample_rate,
                         T=claim.steps, sigma=claim.noise_multiplier, cpu=time.process_time() - t0))
        print(rows[-1], flush=True)
        _save(store)


def render(store: dict, out: Path) -> None:
    L = ["# Tight audit of the DP-SGD mechanism implementation (Dirac gradient canaries, every update observed)", "",
         "Made by `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tight_audit.py --parts tightness bugs false "
         "--out results/reference/tight_audit.md` (see the script's docstring for the setup).", "",
         f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores shared with other jobs "
         "(CPU seconds are process time of one thread).", "",
         "Method (`audit.mechanism`): each trial is one canary whose per-sample gradient is ±100·C on coordinates "
         "no other example touches (so clipping makes it exactly ±C·v), signs alternating over steps; the noisy "
         "sum along v is read from the weights before and after every SGD step; each trial is scored with the "
         "exact Neyman–Pearson log-likelihood ratio summed over steps (mixture ratio under Poisson sampling); "
         "the ε lower bound at 95 % confidence comes from Clopper–Pearson bounds on FPR/FNR at the best of a "
         "Bonferroni grid of thresholds fixed in advance, converted through the trade-off curve of the claimed "
         "DP-SGD family (GDP for full batch, as Nasr et al. 2023; a PLD trade-off curve for Poisson). "
         "`direct` is the assumption-free Clopper–Pearson (ε, δ) bound of the same trials.", ""]
    if store.get("tightness"):
        L += ["## ε_lb / ε (engine: Opacus hooks, flat clipping, Poisson sampler; δ = 1e-5, 95 % confidence)", "",
              "| setting | q | T | σ | claimed ε | ε_lb | ε_lb / ε | direct ε_lb | trials | CPU s | verdict |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        order = list(SETTINGS)
        for r in sorted(store["tightness"], key=lambda r: (order.index(r["setting"]), r["target_epsilon"])):
            L.append(f"| {r['setting']} | {r['q']:g} | {r['T']} | {r['sigma']:.3f} | {r['claimed']:.3f} | "
                     f"{r['eps_lb']:.3f} | **{r['tightness']:.3f}** | {r['direct']:.3f} | {r['trials']} | "
                     f"{r['cpu']:.0f} | {r['status']} |")
        L.append("")
    if store.get("bugs"):
        L += ["## Planted bugs (the claim unchanged; 8,000 trials per audit)", "",
              "Full batch: σ = 2, T = 4, C = 2, flat clipping; Poisson: σ = 1, q = 0.1, T = 20.", "",
              "| bug | engine | q | T | claimed ε | median ε_lb | VIOLATION / seeds | CPU s (all seeds) |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in store["bugs"]:
            L.append(f"| {r['bug']} | {r['engine']} | {r['q']:g} | {r['T']} | {r['claimed']:.3f} | "
                     f"{r['eps_lb_median']:.3f} | {r['violations']} / {r['seeds']} | {r['cpu']:.0f} |")
        L.append("")
    if store.get("false"):
        L += ["## False violations of the honest mechanism (its math, vectorised; α = 0.05)", "",
              "| setting | σ | q | T | trials per audit | seeds | false refutations | rate |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in store["false"]:
            L.append(f"| {r['setting']} | {r['sigma']:g} | {r['q']:g} | {r['T']} | {r['trials']} | {r['seeds']} | "
                     f"{r['false']} | {r['false'] / r['seeds']:.3f} |")
        L.append("")
    L += _goals(store)
    out.write_text("\n".join(L))


def _goals(store: dict) -> list[str]:
    """The issue's goals against the numbers above, said plainly."""
    L = ["## Goals", ""]
    for r in sorted(store.get("tightness", []), key=lambda r: (r["setting"], r["target_epsilon"])):
        goal = 0.8 if r["setting"] == "full batch" else 0.6
        if r["target_epsilon"] >= 2 or r["setting"] != "full batch":
            L.append(f"- {r['setting']}, ε = {r['target_epsilon']:g}: ε_lb/ε = {r['tightness']:.3f} "
                     f"(goal ≥ {goal}: {'met' if r['tightness'] >= goal else 'NOT met'}), {r['cpu']:.0f} CPU s "
                     f"(goal ≤ 600: {'met' if r['cpu'] <= 600 else 'NOT met'})")
    for r in store.get("bugs", []):
        honest = r["bug"].startswith("honest")
        ok = r["violations"] == 0 if honest else r["violations"] >= 19
        want = "CONSISTENT in 20 of 20" if honest else "VIOLATION in >= 19 of 20"
        L.append(f"- {r['bug']} ({r['engine']}): {r['violations']} / {r['seeds']} VIOLATION (goal {want}: "
                 f"{'met' if ok else 'NOT met'})")
    if any(r["bug"].startswith("honest") and r["violations"] for r in store.get("bugs", [])):
        L.append("- A VIOLATION of an honest run is a false positive of the α = 0.05 bound (the hooks and bk rows use "
                 "the same seeds and noise draws, so they are one sample, not two); the 500-seed rows below measure "
                 "how often the bound is wrong for the honest mechanism.")
    for r in store.get("false", []):
        L.append(f"- honest mechanism math, {r['setting']}: {r['false']} / {r['seeds']} false refutations "
                 f"(goal rate ≤ 0.05: {'met' if r['false'] / r['seeds'] <= 0.05 else 'NOT met'})")
    return L + [""]


_PATH: list[Path] = []


def _save(store: dict) -> None:
    tmp = _PATH[0].with_suffix(".tmp")
    tmp.write_text(json.dumps(store, indent=1))
    tmp.replace(_PATH[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=("tightness", "bugs", "false"), default=["tightness"])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--false-seeds", type=int, default=500)
    ap.add_argument("--data", type=Path, default=Path("results/reference/tight_audit.json"))
    ap.add_argument("--out", type=Path, default=Path("results/reference/tight_audit.md"))
    args = ap.parse_args()
    _PATH.append(args.data)
    store = json.loads(args.data.read_text()) if args.data.is_file() else {}
    for part in args.parts:
        if part == "tightness":
            part_tightness(store)
        elif part == "bugs":
            part_bugs(store, args.seeds)
        else:
            part_false(store, args.false_seeds)
        render(store, args.out)
    render(store, args.out)


if __name__ == "__main__":
    main()
