"""The rows of Ke et al.'s budget-split table (``finetune_strategies[.scale].md``): the per-seed runs when they
are on this machine, else the committed table's rounded mean ± SD."""

from __future__ import annotations

import re

from experiments.findings.rows import row
from experiments.papers.runs import OUT, groups
from experiments.stats import chance_test, fmt_p, holm, verdict, welch, welch_from_summary


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
    from experiments.papers.runs import SCALES as RUN_SCALES

    if scale not in RUN_SCALES:
        return {}
    out = {}
    for name, runs in groups("finetune", scale).items():
        m = re.fullmatch(r"(\w+)-e(\d+)", name)
        if m:
            out[(m.group(1), int(m.group(2)))] = [100 * x["test_accuracy"] for _, _, x in runs]
    return out


#: the non-DP reference strategies of ``finetune_strategies.yaml`` (``privacy.enabled: false``), by variant base
NONDP_REFERENCE = (("lp-nondp", "LP"), ("fft-nondp", "FFT"))


def nondp_reference(scale: str) -> dict[str, list[float]]:
    """{variant base: per-seed test accuracy in [0, 1]} of the non-DP reference fine-tunings at ``scale``: the runs
    on this machine, else the committed ``seed_findings.per_seed.json`` (``finetune/<scale>``); empty without."""
    import json

    from experiments.papers.runs import SCALES as RUN_SCALES

    if scale not in RUN_SCALES:
        return {}
    g = groups("finetune", scale)
    got = {k: [x["test_accuracy"] for _, _, x in g[k]] for k, _ in NONDP_REFERENCE if g.get(k)}
    if got:
        return got
    path = OUT / "seed_findings.per_seed.json"
    kept = json.loads(path.read_text()).get(f"finetune/{scale}", {}) if path.is_file() else {}
    return {k: [kept[k][s] for s in sorted(kept[k], key=int)] for k, _ in NONDP_REFERENCE if kept.get(k)}


def seeds_text(values: list[float]) -> str:
    """Accuracies in [0, 1] as ``41.0 ± 1.4 % (2 seeds)`` or, for one, ``25.0 % (1 seed)``."""
    from experiments.stats import fmt_mean_sd

    n = len(values)
    return f"{fmt_mean_sd(values, '.1f', 100)} % ({n} seeds)" if n > 1 else f"{100 * values[0]:.1f} % (1 seed)"


def nondp_text(scale: str) -> str:
    """The rows' sentence on what DP costs on the task: the non-DP reference, or that there is none."""
    ref = nondp_reference(scale)
    if not ref:
        return ("No non-DP fine-tuning of the same source on this task was run, so what DP costs here is not "
                "measured.")
    missing = [label for k, label in NONDP_REFERENCE if k not in ref]
    return ("Without DP (the same source, steps and learning rates; per seed in `seed_findings.per_seed.json`): "
            + ", ".join(f"{label} {seeds_text(ref[k])}" for k, label in NONDP_REFERENCE if k in ref)
            + (f"; {' and '.join(missing)} without DP not run" if missing else "") + ": what DP costs here.")


def finetune_table_rows(scale: str) -> list[str]:
    """Ke et al.'s budget-split claims at ``scale``, tested as ``finetune_strategies[.scale].md`` tests them: Welch
    per split against the other strategy, Holm over the 3 splits. The per-seed accuracies of the runs when they are
    on this machine (then the verdicts equal the table's), else the table's rounded mean ± SD."""
    from experiments.papers.finetune import SPLITS
    from experiments.papers.runs import SCALES as RUN_SCALES, remake, scale_config

    rows: list[str] = []
    s = _finetune_summary(scale)
    if not s or scale not in RUN_SCALES:
        return rows
    raw = _finetune_runs(scale)
    exact = all(k in raw and len(raw[k]) == s[k][2] >= 2 for k in s)
    source = ("the per-seed runs" if exact else "the table's rounded mean ± SD (its per-seed runs are not archived "
              "here or in any committed file)")
    n_runs = sum(v[2] for v in s.values())
    missing = "" if exact else f" The {n_runs} per-seed runs are not archived; only the table's mean ± SD is."
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
                             f"{s[(other, eps)][0]:.1f} ± {s[(other, eps)][1]:.1f} %, {seeds} seeds.{near}{missing} "
                             + nondp_text(scale),
                             f"Welch per split on {source}, Holm over 3 splits: {fmt_p(adj[i])} for the largest "
                             f"difference ({SPLITS[i][5:]} % to LP)", v, cmd))
    return rows
