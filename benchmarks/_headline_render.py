"""The markdown of :mod:`gpu_headline`: one section per finished stage and the issue's goals, met or not met.

Only what ran is written: a stage stopped at its deadline shows what it had finished, a stage that did not run
says so, and a ``--smoke`` table says on its first line that its figures are toy CPU figures.
"""

from __future__ import annotations

ATTACKS = ("lira_online", "lira_offline", "rmia_offline")
FPRS = ("0.01", "0.001", "0.0001")
LIRA_DEMO = (0.686, 0.059)  # the LiRA paper's 16-model demo (WRN-28-2, online, fixed variance): AUC, TPR@0.1 %
GOAL_ACC, GOAL_SECONDS, GOAL_AUC, GOAL_TPR, GOAL_BUSY, GOAL_VIT_RATIO = 0.92, 180.0, 0.69, 0.059, 0.80, 1.3
DP_MODES = ("hooks", "ghost", "bk", "fused", "fused+compile")


def _pct(v, digits: int = 1) -> str:
    return "n/a" if v is None else f"{100 * v:.{digits}f} %"


def _bytes(n) -> str:
    return "n/a" if not n else (f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.0f} MiB")


def _tpr(row: dict, f: str) -> str:
    from attacks.resolution import format_tpr

    v = row["tpr"].get(f)
    if v is None:
        return "n/a"
    return format_tpr(v, float(f), row["n_nonmembers"], interval=row["tpr_ci"].get(f))


def _stage(done: list[dict], name: str) -> dict | None:
    return next((s for s in done if s["name"] == name), None)


def render(done: list[dict], *, device: str, smoke: bool, budget: float, command: str) -> str:
    lines = ["# The audit at the scale it is sold for: one GPU command (issue 32)", ""]
    if smoke:
        lines += ["**Toy run (`--smoke`) on a CPU: it checks that every stage runs; none of these figures is a GPU "
                  "figure or at the goals' scale.**", ""]
    lines += [f"Device: **{device}**. Budget {budget:.0f} s for all stages; each stage ran in its own process under "
              "its own deadline, and this file was re-written as each stage ended.", "",
              "## Stages", "", "| stage | status | wall time | GPU busy (NVML, whole stage) | peak memory (torch, "
              "stage's main process) | peak device memory (NVML) |", "|---|---|---:|---:|---:|---:|"]
    for s in done:
        r = s.get("result") or {}
        peak = r.get("peak_bytes") or max([x.get("peak_bytes") or 0 for x in r.get("runs", [])] +
                                          [x.get("peak_bytes") or 0 for x in r.get("rows", [])] + [0])
        lines.append(f"| {s['name']} | {s['status']} | {s['wall']:.1f} s | {_pct(s.get('busy'))} | {_bytes(peak)} | "
                     f"{_bytes(s.get('nvml_peak_bytes'))} |")
    lines.append("")
    lines += _target(_stage(done, "target")) + _references(_stage(done, "references"))
    lines += _dp_target(_stage(done, "dp_target")) + _table(_stage(done, "step_table"))
    lines += _goals(done, smoke)
    lines += ["## Re-make", "", "On a lent GPU, the recipe in `benchmarks/gpu_headline.py`'s docstring; this file came "
              "from:", "", "```", command, "```", ""]
    return "\n".join(lines)


def _target(s: dict | None) -> list[str]:
    if not s or not s["result"]:
        return []
    r = s["result"]
    return ["## a. Non-DP target (LiRA protocol)", "",
            f"`{r['arch']}` ({r['params']:,} parameters), {r.get('steps')} steps; pool {r['pool']:,} images, "
            f"{r['members']:,} members (Bernoulli(1/2)). Trained in {r['seconds']:.1f} s (the whole `audit train`: "
            f"data, whitening, training, evaluation).", "",
            "| test accuracy (the run's test split) | train accuracy |", "|---:|---:|",
            f"| {_pct(r.get('test_accuracy'), 2)} | {_pct(r.get('train_accuracy'), 2)} |", ""]


def _references(s: dict | None) -> list[str]:
    if not s or not s["result"]:
        return []
    r = s["result"]
    out = ["## b. Reference models and attacks", ""]
    p = r.get("probe")
    if p:
        k, s = p["plan"]
        out += [f"Concurrency probe: {p['models']} models of the reference recipe's network at once, {p['steps']} "
                f"timed steps each after a warm-up; projected time = start-up + {k} models x {s} steps / rate. The "
                "batched torch.func engine does not take BatchNorm networks.", "",
                "| way | model-steps per second | start-up | projected for the plan |", "|---|---:|---:|---:|"]
        out += [f"| {w}{' (chosen)' if w == p['best'] else ''} | {v:.1f} | {p['startup'][w]:.1f} s | "
                f"{p['projected'][w]:.0f} s |" for w, v in p["rates"].items()]
        out.append("")
    runs = r.get("runs", [])
    if runs:
        out += ["| K | attack | AUC [95% CI] | TPR@1% FPR | TPR@0.1% FPR | TPR@0.01% FPR |", "|---:|---|---:|---:|---:|---:|"]
        for run in runs:
            for name in ATTACKS:
                a = run["attacks"][name]
                ci = a["auc_ci"]
                out.append(f"| {run['k']} | {name} | {a['auc']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | "
                           + " | ".join(_tpr(a, f) for f in FPRS) + " |")
        out.append("")
        out += [f"K = {run['k']}: reference models trained in {run['train_seconds']:.1f} s ({run['how']}), attacks "
                f"in {run['attack_seconds']:.1f} s, {run['queries']} queries per image, "
                f"{run['attacks']['lira_online']['n_nonmembers']:,} non-members." for run in runs]
        out += ["", f"LiRA paper's 16-model demo (WRN-28-2, online, fixed variance): AUC {LIRA_DEMO[0]}, TPR@0.1 % "
                f"{LIRA_DEMO[1]:.1%}.", ""]
    out += [f"Note: {n}." for n in r.get("notes", [])]
    if r.get("skipped"):
        out += [f"Not run: {r['skipped']}.", ""]
    return out


def _dp_target(s: dict | None) -> list[str]:
    if not s or not s["result"]:
        return []
    r = s["result"]
    out = ["## c. DP target and its one-run ε lower bound", "",
           f"ε = {r['epsilon']:.2f}, δ = {r['delta']:g}, σ = {r['sigma']:.3f}, q = {r['q']:.4f}, {r['steps']} steps "
           f"(bk clipping); trained in {r['train_seconds']:.1f} s, audited in {r['seconds'] - r['train_seconds']:.1f} "
           f"s. Test accuracy **{_pct(r.get('test_accuracy'), 2)}**.", "",
           "| source | method | ε lower bound | α |", "|---|---|---:|---:|"]
    out += [f"| {e['source']} | {e['method']} | {e['epsilon_lb']:.3f} | {e['alpha']} |" for e in r["estimates"]]
    return out + ["", f"Verdict on the claim: {r['verdict']}.", ""]


def _table(s: dict | None) -> list[str]:
    if not s or not s["result"]:
        return []
    rows = s["result"]["rows"]
    base = {r["model"]: r.get("ms") for r in rows if r["mode"] == "non-DP"}
    out = ["## d. One process's training step", "",
           "| model | mode | ms per step (median) | × non-DP | GPU busy (kernel time / wall) | peak memory |",
           "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['mode']} | {r['error']} | | | |")
            continue
        ratio = r["ms"] / base[r["model"]] if base.get(r["model"]) else None
        out.append(f"| {r['model']} | {r['mode']} | {r['ms']:.1f} | {'n/a' if ratio is None else f'{ratio:.2f}'} | "
                   f"{_pct(r.get('busy'))} | {_bytes(r.get('peak_bytes'))} |")
    return out + ["", "hooks / ghost / bk: the Opacus-based stepper (`privacy.grad_sample_mode`); fused: the "
                  "fixed-shape step of `grad_sample_mode: fused` (torch.func per-example gradients, one transfer per step; "
                  "+compile: `torch.compile`).", ""]


def _goals(done: list[dict], smoke: bool) -> list[str]:
    def res(name):
        s = _stage(done, name)
        return (s or {}).get("result") or {}

    a, b, d = res("target"), res("references"), res("step_table")
    k16 = next((r for r in b.get("runs", []) if r["k"] == 16), None)
    lira = k16["attacks"]["lira_online"] if k16 else None
    rows = d.get("rows", [])
    dp_rows = [r for r in rows if r["mode"] in DP_MODES and r.get("busy") is not None]
    busiest = max(dp_rows, key=lambda r: r["busy"]) if dp_rows else None
    vit = {r["mode"]: r.get("ms") for r in rows if r["model"] == "ViT-S"}
    ratio = vit["bk"] / vit["non-DP"] if vit.get("bk") and vit.get("non-DP") else None
    total = a["seconds"] + k16["train_seconds"] if a and k16 else None
    checks = [
        (f"non-DP target >= {GOAL_ACC:.0%}", _pct(a.get("test_accuracy"), 2),
         None if a.get("test_accuracy") is None else a["test_accuracy"] >= GOAL_ACC),
        ("target + 16 reference models <= 3 minutes", "n/a" if total is None else f"{total:.0f} s",
         None if total is None else total <= GOAL_SECONDS),
        (f"LiRA online, 16 references, AUC >= {GOAL_AUC}", "n/a" if lira is None else f"{lira['auc']:.3f}",
         None if lira is None else lira["auc"] >= GOAL_AUC),
        (f"LiRA online, 16 references, TPR@0.1% >= {GOAL_TPR:.1%}", "n/a" if lira is None else _tpr(lira, "0.001"),
         None if lira is None or lira["tpr"].get("0.001") is None else lira["tpr"]["0.001"] >= GOAL_TPR),
        (f"one DP process keeps the GPU >= {GOAL_BUSY:.0%} busy", "n/a" if busiest is None else
         f"{_pct(busiest['busy'])} ({busiest['model']}, {busiest['mode']})",
         None if busiest is None else busiest["busy"] >= GOAL_BUSY),
        (f"ViT-S DP step with bk <= {GOAL_VIT_RATIO}x non-DP", "n/a" if ratio is None else f"{ratio:.2f}x",
         None if ratio is None else ratio <= GOAL_VIT_RATIO),
    ]
    out = ["## The issue's goals (one H100)", "", "| goal | measured | verdict |", "|---|---:|---|"]
    for goal, value, ok in checks:
        verdict = "not measured" if ok is None else ("met" if ok else "not met")
        if smoke:
            verdict = "toy run: not the goal's scale"
        out.append(f"| {goal} | {value} | {verdict} |")
    return out + [""]
