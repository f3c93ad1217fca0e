"""The peer section of ``attack_power.py``: our offline RMIA against ML Privacy Meter's, on the same models.

Privacy Meter's RMIA scoring is run from its own source file, never copied into this package: pass
``--privacy-meter PATH`` with ``PATH`` its ``modules/mia/attacks/rmia.py`` at the pinned commit (the file's sha256
is checked; it needs only numpy and scikit-learn)::

    git clone https://github.com/privacytrustlab/ml_privacy_meter pm && git -C pm checkout e384af8fd9319b8eeb1303aa82474df1441e3c59
    .venv/bin/python benchmarks/attack_power.py --privacy-meter pm/modules/mia/attacks/rmia.py ...

Both scorers read the same signals: the run's ``signals.npz`` (the target and its 16 reference models on every pool
image and on the population z), turned into Privacy Meter's input, the true-label softmax probability
``sigmoid(phi)`` of the identity query. Protocol: leave-one-out over the 16 reference models (about half the pool
is IN for each; the benchmark's 2,400-image pool leaves every round more than 1,000 non-members, so 0.1 % FPR is
resolvable; a TPR that is not is written as such); every other model
(the target included, its membership is known) is a reference. Per round, our ``rmia_offline`` chooses ``a`` on
its own references (the first one as pseudo-target, never the attacked model); Privacy Meter runs ``run_rmia`` at
that same ``a`` and, to favour it, also at the ``a`` that is best on the attacked model itself (an oracle no
attacker has).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
from scipy import special, stats

from attacks.metrics import compute_metrics
from attacks.registry import AttackInputs
from attacks.resolution import format_tpr, resolvable
from attacks.rmia import A_GRID, RmiaOffline, tie_summary

PINNED_COMMIT = "e384af8fd9319b8eeb1303aa82474df1441e3c59"
PINNED_FILE = "modules/mia/attacks/rmia.py"
PINNED_SHA256 = "852bcee2918a54ec67c4ce079cd1cc279e2bc839ced2cab14179cd8b44347e9e"
LEVELS = (0.01, 0.001)


def load_privacy_meter(path: Path) -> ModuleType:
    """Import Privacy Meter's ``rmia.py`` from ``path`` after checking it is the pinned file."""
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if digest != PINNED_SHA256:
        raise SystemExit(f"{path} is not Privacy Meter's {PINNED_FILE} at {PINNED_COMMIT[:7]} (sha256 {digest[:12]}...)")
    spec = importlib.util.spec_from_file_location("privacy_meter_rmia", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(scores_and_truth: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    ms = [compute_metrics(s, y, n_boot=0, fpr_targets=LEVELS) for s, y in scores_and_truth]
    return {"auc": np.array([m.auc for m in ms]), **{t: np.array([m.tpr_at[t] for m in ms]) for t in LEVELS},
            "n_non": min(m.n_nonmembers for m in ms),
            "top_tie": np.array([tie_summary(s)["top"] for s, _ in scores_and_truth])}


def compare(run_dir: Path, pm: ModuleType) -> dict[str, object]:
    """Score every leave-one-out round with both tools; returns per-row arrays of metrics."""
    with np.load(run_dir / "signals.npz", allow_pickle=False) as z:
        pool, pop, keep_refs = z["pool"].astype(np.float64), z["population"].astype(np.float64), z["keep"]
    keep = np.vstack([np.load(run_dir / "membership.npy")[None], keep_refs])
    models = pool.shape[0]
    prob, prob_z = special.expit(pool[..., 0]), special.expit(pop[..., 0])   # Privacy Meter's signal
    rows: dict[str, list] = {k: [] for k in ("ours", "ours_keep", "ours_a0", "ours_flip", "pm_same_a", "pm_oracle",
                                             "pm_a0", "pm_default")}
    chosen, oracle = [], []
    for t in range(1, models):
        o = np.arange(models) != t
        ident = AttackInputs(target=pool[t, :, :1], reference=pool[o, :, :1], reference_in=keep[o],
                             pop_target=pop[t, :, :1], pop_reference=pop[o, :, :1])
        scores, info = RmiaOffline().score_with_info(ident)
        a = info["a"]
        chosen.append(a)
        truth = keep[t]
        rows["ours"].append((scores, truth))
        rows["ours_keep"].append((RmiaOffline(a=a, ties="keep").score(ident), truth))
        rows["ours_a0"].append((RmiaOffline(a=0.0).score(ident), truth))
        full = AttackInputs(target=pool[t], reference=pool[o], reference_in=keep[o], pop_target=pop[t],
                            pop_reference=pop[o])
        rows["ours_flip"].append((RmiaOffline().score(full), truth))

        def pm_scores(a_value: float) -> np.ndarray:
            return np.asarray(pm.run_rmia(prob[t], prob[o].T, keep[o].T, prob_z[t], prob_z[o].T, a_value),
                              dtype=np.float64).ravel()

        rows["pm_same_a"].append((pm_scores(a), truth))
        rows["pm_a0"].append((pm_scores(0.0), truth))
        rows["pm_default"].append((pm_scores(0.3), truth))
        by_a = {float(b): pm_scores(float(b)) for b in A_GRID}
        best = max(by_a, key=lambda b: (compute_metrics(by_a[b], truth, n_boot=0).auc, -b))
        oracle.append(best)
        rows["pm_oracle"].append((by_a[best], truth))
    setup = json.loads((run_dir / "attack.json").read_text())["setup"]
    return {"rows": {k: _row(v) for k, v in rows.items()}, "chosen_a": chosen, "oracle_a": oracle,
            "population": setup.get("population_rule") or "n/a",
            "n_rounds": models - 1, "n_population": pop.shape[1], "n_pool": pool.shape[1], "n_models": models}


def _mean_ci(v: np.ndarray) -> tuple[float, float, float]:
    m = float(v.mean())
    h = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else float("nan")
    return m, m - h, m + h


def _cell(v: np.ndarray, level: float | None, n_non: int, pct: bool) -> str:
    if level is not None and not resolvable(level, n_non):
        return format_tpr(None, level, n_non)
    m, lo, hi = _mean_ci(v)
    return f"{100 * m:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]" if pct else f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


_LABELS = {
    "ours": "dp-audit `rmia_offline`: a tuned on references, ties broken (default)",
    "ours_keep": "dp-audit, same a, ties kept (the paper's fraction)",
    "pm_same_a": "Privacy Meter `run_rmia`, same a",
    "pm_oracle": "Privacy Meter, its best a on the attacked model (oracle)",
    "ours_a0": "dp-audit, a = 0",
    "pm_a0": "Privacy Meter, a = 0",
    "pm_default": "Privacy Meter, a = 0.3 (its default)",
    "ours_flip": "dp-audit default, identity + flip queries (not Privacy Meter's input)",
}


def render(result: dict[str, object], pm_path: Path) -> str:
    rows = result["rows"]
    lines = [
        "## Peer: offline RMIA against ML Privacy Meter on the same models (mlp)",
        "",
        f"Privacy Meter's own `{PINNED_FILE}` at commit `{PINNED_COMMIT[:7]}` (sha256 `{PINNED_SHA256[:12]}...`), "
        f"loaded from `{pm_path}` outside this package (e.g. `git -C <clone> show {PINNED_COMMIT[:7]}:{PINNED_FILE}` "
        f"into that path; results/ is not committed). Same signals for both: the true-label probability of the "
        f"identity query from `signals.npz`; {result['n_models']} models (the target and {result['n_rounds']} "
        f"references), "
        f"{result['n_pool']:,} pool images, {result['n_population']:,} population images z (`audit attack`'s "
        f"default, every known non-member: {result['population']}). Leave-one-out over the {result['n_rounds']} "
        f"reference models (each the attacked model in turn, "
        f"the other {result['n_models'] - 1} its references). Cells: mean over rounds [95% t-interval of the mean].",
        "",
        "| scorer | AUC | TPR@1% FPR | TPR@0.1% FPR | examples tied at the top score (mean) |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label in _LABELS.items():
        r = rows[key]
        lines.append(f"| {label} | {_cell(r['auc'], None, r['n_non'], False)} | "
                     f"{_cell(r[0.01], 0.01, r['n_non'], True)} | {_cell(r[0.001], 0.001, r['n_non'], True)} | "
                     f"{r['top_tie'].mean():.1f} |")
    ours, oracle = rows["ours"], rows["pm_oracle"]
    diffs = []
    for metric, name in (("auc", "AUC"), (0.01, "TPR@1%"), (0.001, "TPR@0.1%")):
        m, lo, hi = _mean_ci(ours[metric] - oracle[metric])
        scale = 1 if metric == "auc" else 100
        diffs.append(f"{name} {scale * m:+.3f} [{scale * lo:+.3f}, {scale * hi:+.3f}]"
                     f"{'' if metric == 'auc' else ' points'}")
    chosen = np.asarray(result["chosen_a"])
    lines += [
        "",
        f"Paired difference, dp-audit (tuned a, ties broken) minus Privacy Meter at its oracle a, mean over rounds "
        f"[95% t-interval]: {'; '.join(diffs)}. Our a, chosen per round on the references: "
        f"{', '.join(f'{v:g}' for v in sorted(set(chosen.tolist())))} (median {np.median(chosen):g}); the oracle a "
        f"of Privacy Meter: median {np.median(result['oracle_a']):g}.",
        "",
        "Where the two differ (read from Privacy Meter's `run_rmia`/`get_out_ref_signals`, same formulas otherwise): "
        "(1) ties: both count the fraction of z with ratio_x / ratio_z > 1, which takes only m + 1 values; when "
        "many examples beat every z they share the top score and the ROC's first step jumps over the low FPRs. We "
        "order tied examples by ratio_x (the same pairwise rule with a denser population; column 5), Privacy Meter "
        "keeps the ties. (2) Pr_OUT(x): Privacy Meter averages the `num_reference_models = K // 2` largest of the "
        "OUT-masked probabilities, so an example with fewer OUT references than that averages in zeros for its IN "
        "ones, and one with more drops its smallest OUT values; for z it averages the largest half of all K. We "
        "average exactly the OUT references of each example, and every reference for z. (3) Privacy Meter divides "
        "probabilities, we subtract log-probabilities (no underflow, no float32 saturation at p = 1). (4) a: "
        "Privacy Meter tunes it on a paired model with one reference; we tune on the first reference with all "
        "the others.",
        "",
    ]
    return "\n".join(lines)
