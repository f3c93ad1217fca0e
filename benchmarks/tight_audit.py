"""Tight audit of the DP-SGD mechanism implementation: ε_lb/ε, planted bugs, false-violation rate.

Three parts, each stored in ``--data`` (JSON, so parts can be re-run one at a time) and rendered to ``--out``:

* ``tightness``: the project's engine (Opacus hooks, flat clipping, Poisson sampler) on the Dirac-canary probe
  (:func:`audit.mechanism.api.audit_mechanism`), σ from the PRV accountant for ε ∈ {1, 2, 4, 8} at δ = 1e-5,
  full batch (q = 1, T = 10) and Poisson (q = 0.01, T = 500); ε_lb at 95 % confidence, trials, CPU seconds.
* ``bugs``: each planted bug (:mod:`audit.mechanism.mutants`) and the honest engine over 20 seeds: full batch
  σ = 2, T = 4, C = 2 (hooks and bk), and Poisson q = 0.1, T = 20, σ = 1 for the doubled sample rate; 8,000
  trials per audit. The same for a user's Opacus set-up (``opacus`` rows: :mod:`audit.mechanism.opacus_mutants`,
  the optimizer or sampler broken as a training script would break it, through
  :func:`audit.mechanism.api.audit_opacus_mechanism`).
* ``honest``: the honest engine (hooks, the full-batch bug setting) over 500 seeds with the verdict itself, and the
  rule's exact false-violation probability there (:func:`audit.mechanism.false_rate.false_violation_probability`).
* ``false``: 500 seeds of the honest mechanism's math (:func:`audit.mechanism.scoring.simulate_observations`,
  no model or optimizer) at the two bug-table settings, 8,000 trials each: how often the claim is refuted.
  Full batch: the verdict itself. Poisson: refutation of the claimed trade-off curve at any grid threshold,
  which every VIOLATION needs, so its rate bounds the false-VIOLATION rate from above.

Example (the command that made results/reference/tight_audit.md)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tight_audit.py --parts tightness bugs false honest \
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

from audit.mechanism.api import audit_mechanism, audit_opacus_mechanism
from audit.mechanism.opacus_mutants import opacus_setup
from audit.mechanism.estimate import MechanismClaim
from audit.bounds.clopper_pearson import clopper_pearson_upper
from audit.mechanism.false_rate import claim_mu, false_violation_probability, simulated_false_violations
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
        ("double_rate (2q)", "double_rate", "hooks", POISSON), ("honest", None, "opacus", FULL),
        ("noise_0.8", "noise_0.8", "opacus", FULL), ("noise_without_C (C = 2)", "noise_without_C", "opacus", FULL),
        ("unclipped_group", "unclipped_group", "opacus", FULL), ("reused_noise", "reused_noise", "opacus", FULL),
        ("honest (Poisson)", None, "opacus", POISSON), ("double_rate (2q)", "double_rate", "opacus", POISSON)]


def _bug_audit(cfg: dict, mode: str, mutant: str | None, seed: int):
    """One audit of a bug-table row: the engine (``mode`` hooks/bk) or a user's Opacus set-up (``opacus``:
    :func:`audit.mechanism.opacus_mutants.opacus_setup`, the user's optimizer and sampler broken as a script would)."""
    if mode != "opacus":
        return audit_mechanism(**cfg, grad_sample_mode=mode, mutant=mutant, seed=seed)
    q = cfg["sample_rate"]
    s = opacus_setup(sigma=cfg["noise_multiplier"], max_grad_norm=cfg.get("max_grad_norm", 1.0),
                     expected_batch_size=q * 1000, sample_rate=q, bug=mutant)
    return audit_opacus_mechanism(optimizer_factory=s.optimizer_factory, sampler_factory=s.sampler_factory,
                                  noise_multiplier=s.noise_multiplier, sample_rate=q, steps=cfg["steps"],
                                  delta=cfg["delta"], trials=cfg["trials"], seed=seed)


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
        res = [_bug_audit(cfg, mode, mutant, 1000 * k) for k in range(seeds)]
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
        bad = simulated_false_violations(claim, trials=cfg["trials"], seeds=range(10_000, 10_000 + seeds))
        rows.append(dict(setting=label, seeds=seeds, trials=cfg["trials"], false=int(bad), q=claim.sample_rate,
                         T=claim.steps, sigma=claim.noise_multiplier, cpu=time.process_time() - t0))
        print(rows[-1], flush=True)
        _save(store)


def part_honest(store: dict, seeds: int) -> None:
    """The honest engine (hooks, full batch, the bug table's setting) over ``seeds`` seeds with the verdict itself:
    seeds ``1000 k`` (the bug table's first 20 included), and the rule's exact false-violation probability."""
    if store.get("honest", {}).get("seeds") == seeds:
        return
    t0 = time.process_time()
    claim = MechanismClaim.from_accountant(noise_multiplier=FULL["noise_multiplier"], sample_rate=1.0,
                                           steps=FULL["steps"], delta=DELTA)
    res = [audit_mechanism(**FULL, seed=1000 * k) for k in range(seeds)]
    mu = np.array([r.mu_lb for r in res])
    bad = [(1000 * k, r) for k, r in enumerate(res) if str(r.verdict.status) == "VIOLATION"]
    exact, mean, sd = false_violation_probability(claim, trials=FULL["trials"], details=True)
    store["honest"] = dict(seeds=seeds, violations=len(bad), violating_seeds=[k for k, _ in bad],
                           violating=[dict(seed=k, eps_lb=r.epsilon_lb, mu_lb=r.mu_lb) for k, r in bad],
                           claimed=res[0].claimed_epsilon, mu_claim=claim_mu(claim), mu_mean=float(mu.mean()),
                           mu_sd=float(mu.std()), cpu=time.process_time() - t0, exact=exact, exact_mu_mean=mean,
                           exact_mu_sd=sd)
    print(store["honest"], flush=True)
    _save(store)


def render(store: dict, out: Path) -> None:
    L = ["# Tight audit of the DP-SGD mechanism implementation (Dirac gradient canaries, every update observed)", "",
         "Made by `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tight_audit.py --parts tightness bugs false honest "
         "--out results/reference/tight_audit.md` (see the script's docstring for the setup; parts already in "
         "`tight_audit.json` are kept, so `--parts honest` alone re-makes only the 500-seed honest engine row).", "",
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
    L += _honest(store)
    L += _goals(store)
    out.write_text("\n".join(L))


def _honest(store: dict) -> list[str]:
    """The 500-seed honest engine row and what the investigation of the honest full-batch VIOLATION found."""
    h = store.get("honest")
    if not h:
        return []
    ub = clopper_pearson_upper(k=h["violations"], n=h["seeds"], alpha=0.05)
    p20 = 1 - (1 - h["exact"]) ** 20
    return [
        "## False violations of the honest engine (hooks, full batch σ = 2, T = 4, C = 2; 8,000 trials per audit; "
        "the verdict itself)", "",
        "Made by `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tight_audit.py --parts honest` (seeds 1000·k, "
        "k < 500: the bug table's 20 seeds included).", "",
        "| seeds | VIOLATION | rate | 95 % upper bound | VIOLATION seeds | μ_lb mean ± sd | exact per-audit "
        "probability (10⁶ simulated audits) | CPU s |", "|---:|---:|---:|---:|---|---:|---:|---:|",
        f"| {h['seeds']} | {h['violations']} | {h['violations'] / h['seeds']:.3f} | {ub:.4f} | "
        f"{', '.join(map(str, h['violating_seeds'])) or '-'} | {h['mu_mean']:.4f} ± {h['mu_sd']:.4f} | "
        f"{h['exact']:.2e} | {h['cpu']:.0f} |", "",
        "### The honest full-batch VIOLATION (seed 10000), investigated", "",
        *[f"- What it was (seed {v['seed']}): ε_lb = {v['eps_lb']:.3f} > claimed {h['claimed']:.3f} (μ_lb = "
          f"{v['mu_lb']:.3f} against the μ = {h['mu_claim']:.3f} the claim allows). The bk row shares the seeds "
          "and the noise draws, so it is the same event, not a second." for v in h.get("violating", [])],
        "- Not an implementation bug. What the auditor reads from the engine is b + s_t·z_t with z_t the engine's "
        "own noise generator's N(0, σ²C²) draws, to 1e-5, for seed 10000 and another, for hooks and bk (flat and "
        "per-layer clipping) and functorch, ghost and fused (flat) (`tests/test_mechanism_false_rate.py::"
        "test_engine_is_the_mechanism_math_with_its_own_noise_draws`): no noise or seed reuse, no wrong σ or C in "
        "the noise or in the score, no lost or extra step, no signal lost or added (with σ → 0 the reading is b "
        "itself).",
        f"- Not a biased estimator or an α that is not what it says. The rule's probability of a VIOLATION for "
        f"the honest mechanism at this setting is {h['exact']:.1e} (exact rule on 10⁶ simulated audits, "
        f"`audit.mechanism.false_rate.false_violation_probability`; tested against the estimator itself): far below "
        f"α = 0.05, since the Bonferroni split over the thresholds and both error rates is conservative. Over "
        f"{h['seeds']} seeds of the engine the verdict was VIOLATION {h['violations']} time(s) (only seed 10000) and "
        f"μ_lb had mean {h['mu_mean']:.4f} and sd {h['mu_sd']:.4f}, the exact rule's {h['exact_mu_mean']:.4f} ± "
        f"{h['exact_mu_sd']:.4f}.",
        f"- So seed 10000 is a tail draw of correct noise. The chance that some seed of a 20-seed row draws one is "
        f"1 − (1 − {h['exact']:.1e})²⁰ = {p20:.1%}; α itself only promises at most 5 % per audit (0.95²⁰ = 36 % for "
        f"20 of 20 at that bound). The pre-registered seeds were kept: choosing others until the row reads 20 of 20 "
        f"would make the table say nothing.", ""]


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
        L.append("- The honest full-batch VIOLATION (hooks and bk: one event, seed 10000) is a tail draw of correct "
                 "noise, not a bug: see 'The honest full-batch VIOLATION (seed 10000), investigated'.")
    h = store.get("honest")
    if h:
        L.append(f"- honest engine, {h['seeds']} seeds: {h['violations']} / {h['seeds']} VIOLATION (goal rate ≤ 0.05: "
                 f"{'met' if h['violations'] / h['seeds'] <= 0.05 else 'NOT met'})")
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
    ap.add_argument("--parts", nargs="+", choices=("tightness", "bugs", "false", "honest"), default=["tightness"])
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
        elif part == "honest":
            part_honest(store, args.false_seeds)
        else:
            part_false(store, args.false_seeds)
        render(store, args.out)
    render(store, args.out)


if __name__ == "__main__":
    main()
