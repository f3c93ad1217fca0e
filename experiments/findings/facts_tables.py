"""The figures the findings' prose quotes from committed tables whose runs are not all kept (Ke et al.'s budget-split
tables, ``finetune_strategies[.scale].md``, and the H100 profile, ``seed_gpu/h100_profile.txt``): read back from
those files, every statistic as the table printed it."""

from __future__ import annotations

import re
import statistics

from experiments.findings.numbers import p2, thousands
from experiments.findings.rows import OUT

_KEYS = {"DP-LP (head only)": "lp", "DP-FFT (all parameters)": "fft"}
_ROW = re.compile(r"^\| (DP-[^|]+?) \| (\d) \| (\d+) \| [^|]+ \| [^|]+ \| ([\d.]+) ± ([\d.]+) \| [^|]+ \| ([^|]+) \|", re.M)
_TEST = re.compile(r"^  ε = (\d), (\d\d) % to LP, minus (DP-\S+).*?Holm over \d splits: (p [<=] [\d.]+)\)", re.M)


def _p(text: str) -> float:
    """``p = 0.051`` / ``p < 0.001`` back to a number (the bound for ``<``)."""
    return float(text.split()[-1])


def budget_table(scale: str) -> dict | None:
    """A ``finetune_strategies[.scale].md`` table read back: {(strategy, ε): (mean %, SD, seeds, drift)}, the Holm p of
    each (ε, split, baseline), the source's accuracy and the fine-tuning steps; None when there is no such table."""
    path = OUT / ("finetune_strategies.md" if scale == "cpu" else f"finetune_strategies.{scale}.md")
    if not path.is_file():
        return None
    text = path.read_text()
    rows = {}
    for m in _ROW.finditer(text):
        key = _KEYS.get(m.group(1)) or "lpfft" + re.search(r"(\d\d) %", m.group(1)).group(1)
        drift = re.match(r"\s*([\d.]+)", m.group(6))
        rows[(key, int(m.group(2)))] = (float(m.group(4)), float(m.group(5)), int(m.group(3)),
                                        float(drift.group(1)) if drift else None)
    holm_p = {(int(m.group(1)), "lpfft" + m.group(2), "lp" if m.group(3) == "DP-LP" else "fft"): m.group(4)
              for m in _TEST.finditer(text)}
    source = re.search(r"; ([\d.]+) % CIFAR-10 test accuracy", text)
    steps = re.search(r"(\d+) logical steps of batch", text)
    machine = re.search(r"(\d+) runs, ([\d.]+) min of training in total", text)
    return {"rows": rows, "holm": holm_p, "source": source.group(1) if source else "?",
            "steps": int(steps.group(1)) if steps else 0, "runs": machine.group(1) if machine else "?",
            "minutes": f"{float(machine.group(2)):.0f}" if machine else "?"}


def budget_split(scale: str = "gpu_full", small: str = "cpu_hour") -> dict[str, str]:
    """Ke et al.'s budget split: LP-FFT against DP-LP and DP-FFT per ε, from the committed tables."""
    t = budget_table(scale)
    if not t or ("lp", 8) not in t["rows"]:
        return {}
    rows, hp = t["rows"], t["holm"]
    splits = sorted(k for k, e in rows if k.startswith("lpfft") and e == 8)

    def gaps(eps: int, base: str) -> list[float]:
        return [rows[(k, eps)][0] - rows[(base, eps)][0] for k in splits]

    def best_p(eps: int, base: str) -> str:
        return min((hp[(eps, k, base)] for k in splits if (eps, k, base) in hp), key=_p, default="p = ?")

    lp8 = gaps(8, "lp")
    f = {
        "bs_source": t["source"], "bs_steps": thousands(t["steps"]), "bs_seeds": str(rows[("lp", 8)][2]),
        "bs_lp8_gap": f"{min(lp8):.0f}-{max(lp8):.0f}",
        "bs_lpfft8": f"{min(rows[(k, 8)][0] for k in splits):.1f}-{max(rows[(k, 8)][0] for k in splits):.1f}",
        "bs_lp8": f"{rows[('lp', 8)][0]:.1f}", "bs_p_lp8": best_p(8, "lp"),
        "bs_lp1_gap": f"{min(gaps(1, 'lp')):.1f}-{max(gaps(1, 'lp')):.1f}", "bs_p_lp1": best_p(1, "lp"),
        "bs_fft1_gap": f"{min(gaps(1, 'fft')):.1f}-{max(gaps(1, 'fft')):.1f}",
        "bs_fft8_gap": f"+{min(gaps(8, 'fft')):.1f}-{max(gaps(8, 'fft')):.1f}",
        "bs_p_fft8": p2(_p(best_p(8, "fft"))) if "<" not in best_p(8, "fft") else best_p(8, "fft"),
        "bs_drift": f"{(rows[('fft', 1)][3] + rows[('fft', 8)][3]) / 2:.2f}" if rows[("fft", 1)][3] else "?",
        "bs_runs": t["runs"], "bs_fft8": f"{rows[('fft', 8)][0]:.1f}",
    }
    from experiments.findings.finetune import nondp_reference, seeds_text

    ref = nondp_reference(scale)
    if "lp-nondp" in ref and "fft-nondp" in ref:  # the non-DP reference: what DP costs (table means, rounded)
        lp, fft = statistics.mean(ref["lp-nondp"]), statistics.mean(ref["fft-nondp"])
        f.update({"bs_ref_lp": seeds_text(ref["lp-nondp"]), "bs_ref_fft": seeds_text(ref["fft-nondp"]),
                  "bs_cost_lp8": f"{100 * lp - rows[('lp', 8)][0]:.1f}",
                  "bs_cost_fft8": f"{100 * fft - rows[('fft', 8)][0]:.1f}"})
    elif ref:  # one strategy's reference only: the other's cost stays unmeasured
        (k, v), = ref.items()
        f["bs_ref_partial"] = f"only {'LP' if k == 'lp-nondp' else 'FFT'} was fine-tuned without DP ({seeds_text(v)})"
    s = budget_table(small)
    if s and s["holm"]:
        f.update({"bss_source": s["source"], "bss_p_fft1": min((v for (e, _, b), v in s["holm"].items()
                                                                if e == 1 and b == "fft"), key=_p),
                  "bss_runs": s["runs"], "bss_minutes": s["minutes"]})
    return f


def h100_profile() -> dict[str, str]:
    """One process alone on the lent H100 (``python -m experiments gpu profile``): ms per step by mode."""
    path = OUT / "seed_gpu/h100_profile.txt"
    if not path.is_file():
        return {}
    text = path.read_text()
    ms = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(non-DP|DP, hooks|DP, bk): ([\d.]+) ms/step", text,
                                                             re.M)}
    return {"prof_hooks": f"{ms['DP, hooks']:.0f}", "prof_bk": f"{ms['DP, bk']:.0f}",
            "prof_nondp": f"{ms['non-DP']:.0f}"} if len(ms) == 3 else {}

