"""Inline SVG figures for the report, drawn with matplotlib's object API (no pyplot, no global state).

Every figure is returned as an ``<svg>`` string ready to paste into HTML: the XML prolog, DOCTYPE, metadata
and namespace declarations are removed, so the report loads nothing from any URL. Text stays text
(``svg.fonttype: none``) and element ids are salted per figure, so several figures can share one page.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np

from audit.reporting import fmt
from attacks.attack_file import AttackFile
from audit.reporting.model import EstimateRow, TransferRow

__all__ = ["roc_svg", "epsilon_svg", "transfer_svg", "figure_to_svg"]

_PALETTE = ["#1f5fa8", "#d9572b", "#2e8b57", "#8e44ad", "#b8860b", "#c0392b", "#17a2b8", "#555555"]


def figure_to_svg(fig, *, salt: str) -> str:
    """Serialise a matplotlib ``Figure`` to an inline ``<svg>`` element (no prolog, no external references).

    >>> from matplotlib.figure import Figure
    >>> fig = Figure(figsize=(1, 1)); _ = fig.add_subplot().plot([0, 1])
    >>> s = figure_to_svg(fig, salt="t"); s.startswith("<svg") and "http" not in s
    True
    """
    import matplotlib
    from matplotlib.text import Text

    for t in fig.findobj(Text):  # names from a run directory render literally: "$...$" is never mathtext
        t.set_parse_math(False)
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"dp-audit-{salt}",
                                "text.parse_math": False}):
        fig.savefig(buf, format="svg",
                    metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    text = re.sub(r"<svg ", f'<svg role="img" class="figure" data-figure="{salt}" ', text, count=1)
    return text.strip()


def _new_figure(width: float, height: float, *, left: float = 0.8, bottom: float = 0.55, top: float = 0.35):
    """A figure with fixed margins in inches (cheaper than a layout engine, and deterministic)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    fig.subplots_adjust(left=left / width, right=1 - 0.15 / width, bottom=bottom / height, top=1 - top / height)
    return fig


def _resample(fpr: np.ndarray, curves: list[np.ndarray], *, floor: float, points: int = 300
              ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Sample step curves (value at x = last point with fpr <= x) on a log grid, to keep the SVG small.

    >>> x, (y,) = _resample(np.array([0.0, 0.1, 1.0]), [np.array([0.0, 0.5, 1.0])], floor=0.01, points=3)
    >>> x.round(3).tolist(), y.tolist()
    ([0.01, 0.1, 1.0], [0.0, 0.5, 1.0])
    """
    order = np.argsort(fpr, kind="stable")
    fpr = fpr[order]
    grid = np.geomspace(floor, 1.0, points)
    idx = np.clip(np.searchsorted(fpr, grid, side="right") - 1, 0, len(fpr) - 1)
    return grid, [np.asarray(c, float)[order][idx] for c in curves]


def roc_svg(attack: AttackFile, *, names: dict[str, str] | None = None, levels: list[float] = ()) -> str | None:
    """ROC curves on log-log axes with their confidence bands (higher score = member).

    Args:
        attack: the parsed ``attack.json``.
        names: display names per attack key.
        levels: FPR levels to mark with vertical dotted lines.

    Returns:
        An ``<svg>`` string, or None when no attack has a ROC curve.
    """
    entries = [(k, e) for k, e in attack.attacks.items() if e.roc.fpr]
    if not entries:
        return None
    n_non = [e.metrics.n_nonmembers for _, e in entries if e.metrics.n_nonmembers]
    positive = [f for _, e in entries for f in e.roc.fpr if f > 0]
    candidates = ([1.0 / (2 * max(n_non))] if n_non else []) + ([min(positive) / 2] if positive else [])
    floor = max(min(candidates, default=1e-5), 1e-7)
    fig = _new_figure(6.4, 4.6)
    ax = fig.add_subplot()
    grid = np.geomspace(floor, 1.0, 200)
    ax.plot(grid, grid, color="#999999", lw=1, ls="--", label="chance (no leakage)")
    for i, (key, e) in enumerate(entries):
        color = _PALETTE[i % len(_PALETTE)]
        raw_fpr = np.asarray(e.roc.fpr, float)
        curves = [np.asarray(e.roc.tpr, float)]
        band = (e.roc.tpr_lo is not None and e.roc.tpr_hi is not None
                and len(e.roc.tpr_lo) == len(raw_fpr) == len(e.roc.tpr_hi))
        if band:
            curves += [np.asarray(e.roc.tpr_lo, float), np.asarray(e.roc.tpr_hi, float)]
        if len(raw_fpr) > 400:
            fpr, curves = _resample(raw_fpr, curves, floor=floor)
        else:
            fpr = raw_fpr
        resolved = fpr > 0  # no band below the smallest measurable FPR
        fpr = np.clip(fpr, floor, 1.0)
        curves = [np.clip(c, floor, 1.0) for c in curves]
        label = f"{(names or {}).get(key, key)} (AUC {fmt.prob(e.metrics.auc)})"
        ax.step(fpr, curves[0], where="post", color=color, lw=1.6, label=label)
        if band:
            ax.fill_between(fpr, curves[1], curves[2], where=resolved, step="post", color=color, alpha=0.15,
                            lw=0)
    for lv in levels:
        if floor < lv < 1:
            ax.axvline(lv, color="#cccccc", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(floor, 1.0)
    ax.set_ylim(floor, 1.0)
    ax.set_xlabel("false positive rate (non-members wrongly flagged)")
    ax.set_ylabel("true positive rate (members found)")
    ax.set_title("Membership inference ROC (log-log; shaded: confidence band)", fontsize=10)
    ax.grid(True, which="major", color="#eeeeee", lw=0.6)
    ax.legend(fontsize=8, loc="lower right", frameon=False)
    return figure_to_svg(fig, salt="roc")


def epsilon_svg(rows: list[EstimateRow], *, claimed: float | None) -> str | None:
    """Horizontal bars of each epsilon lower bound, its ceiling (open marker) and the claim (dashed line).

    Returns:
        An ``<svg>`` string, or None when there are no estimates.
    """
    if not rows:
        return None
    labels = [f"{r.method} ({r.source})" for r in rows]
    lbs = [r.epsilon_lb if math.isfinite(r.epsilon_lb) else float("nan") for r in rows]
    ceilings = [r.ceiling if (r.ceiling is not None and math.isfinite(r.ceiling)) else float("nan") for r in rows]
    finite = [v for v in lbs + ceilings if not math.isnan(v)]
    if claimed is not None and math.isfinite(claimed):
        finite.append(claimed)
    top = max(finite + [1.0]) * 1.12
    longest = max(len(label) for label in labels)
    fig = _new_figure(6.4, 0.42 * len(rows) + 1.45, left=0.25 + 0.062 * longest, bottom=0.7)
    ax = fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    ax.barh(y, np.nan_to_num(lbs, nan=0.0), color="#1f5fa8", height=0.55, label="ε lower bound")
    for yi, c in zip(y, ceilings):
        if not math.isnan(c):
            ax.plot([c], [yi], marker="|", markersize=14, mew=2, color="#d9572b")
    ax.plot([], [], marker="|", markersize=10, mew=2, ls="", color="#d9572b", label="ceiling (best reachable)")
    if claimed is not None and math.isfinite(claimed):
        ax.axvline(claimed, color="#c0392b", ls="--", lw=1.4, label=f"claimed ε = {fmt.eps(claimed)}")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlim(0, top)
    ax.set_title("Empirical ε lower bounds", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=3, frameon=False)
    ax.set_axisbelow(True)
    ax.grid(True, axis="x", color="#eeeeee", lw=0.6)
    return figure_to_svg(fig, salt="epsilon")


def transfer_svg(rows: list[TransferRow]) -> str | None:
    """Per-block representation diagnostics of each transfer dataset.

    Plots the fuzziness ``D = Tr(SS_w SS_b^+)`` (log scale; lower = classes better separated) when present,
    else the separability value given per block.

    Returns:
        An ``<svg>`` string, or None when no dataset has layer diagnostics.
    """
    series = [(r.dataset, r.layers) for r in rows if r.status == "ok" and r.layers]
    if not series:
        return None
    use_fuzz = any(layer.get("fuzziness") is not None for _, layers in series for layer in layers)
    key = "fuzziness" if use_fuzz else "separability"
    names = [str(layer.get("block")) for layer in max((layers for _, layers in series), key=len)]
    rotate = max(len(n) for n in names) > 3
    fig = _new_figure(6.4, 3.7 if rotate else 3.4, bottom=0.8 if rotate else 0.55)
    ax = fig.add_subplot()
    for i, (name, layers) in enumerate(series):
        values = [float("nan") if layer.get(key) is None else float(layer[key]) for layer in layers]
        ax.plot(range(len(values)), values, marker="o", color=_PALETTE[i % len(_PALETTE)], label=name)
    if use_fuzz:
        ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, fontsize=7, rotation=30 if rotate else 0, ha="right" if rotate else "center")
    ax.set_xlabel("feature block")
    ax.set_ylabel("fuzziness D (lower = more separable)" if use_fuzz else "class separability", fontsize=9)
    ax.set_title("Representation diagnostics per block", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(True, color="#eeeeee", lw=0.6)
    return figure_to_svg(fig, salt="transfer")
