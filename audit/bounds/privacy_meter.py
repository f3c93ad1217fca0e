"""Cross-check of our one-run ε lower bound against ML Privacy Meter's own DP-audit code, on the same canaries.

ML Privacy Meter (privacytrustlab/ml_privacy_meter) audits DP training with the one-run test of Steinke, Nasr &
Jagielski (2023) in its ``audit.py`` (``p_value_DP_audit``, ``get_eps_audit``,
``compute_abstain_attack_results[_for_k_pos_k_neg]``, used by its ``run_audit_dp.py``). That code is not on PyPI:
the only release, ``privacy-meter`` 1.0.1 (2022), predates it and imports TensorFlow in its attack classes
(``privacy_meter.metric`` → ``information_source`` → ``model``: ``import tensorflow``). So it is run from a
checkout of the repository at the pinned commit :data:`PINNED_COMMIT` (``audit.py``'s sha256 is checked), in a
separate interpreter (its top-level ``audit`` and ``attacks`` modules share our packages' names), never copied
into this package::

    git clone https://github.com/privacytrustlab/ml_privacy_meter pm && git -C pm checkout e384af8fd9319b8eeb1303aa82474df1441e3c59
    export PRIVACY_METER_SRC=$PWD/pm

:func:`crosscheck_one_run` feeds both implementations the same canary scores (ties broken once, by our rule) and
membership, and compares:

* **per guess set** (each ``(k_pos, k_neg)`` of our grid): the number of correct guesses and ε_lb at the same δ
  and α (Privacy Meter's guesses are "bottom ``k_neg`` OUT, ranks ≥ ``k_pos'`` IN", so ``k_pos' = m − k_pos``).
  Same theorem, same counts: these must agree to the bisection tolerance (Privacy Meter stops at 1e-5);
* **the search**: Privacy Meter's ``compute_abstain_attack_results`` tries every pair of a √m-step grid and reports
  the largest ε at level α *without* accounting for the search (and with δ = 0 by default); ours tests each pair
  at α / (number of pairs). Both are recorded, with ours recomputed on Privacy Meter's own grid, so the size of
  that difference is visible.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from audit.bounds.guesses import one_run_guess_counts
from audit.bounds.one_run import one_run_epsilon_bounds
from foundation.errors import UserError

__all__ = ["PINNED_COMMIT", "PINNED_SHA256", "SOURCE_ENV", "privacy_meter_source", "OneRunCrossCheck",
           "crosscheck_one_run", "tie_free_scores"]

PINNED_COMMIT = "e384af8fd9319b8eeb1303aa82474df1441e3c59"
PINNED_SHA256 = "d1eefe5df4ce08aeabc6e196cbda59c1b4adca74b2635bec1b18912d08080dc9"  # audit.py at PINNED_COMMIT
SOURCE_ENV = "PRIVACY_METER_SRC"
_TIMEOUT_S = 900

_RUNNER = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import audit as pm  # Privacy Meter's audit.py
z = np.load(sys.argv[2])
scores, member = z["scores"], z["member"].astype(np.int64)
args = json.loads(sys.argv[3])
pairs = [pm.compute_abstain_attack_results_for_k_pos_k_neg(scores, member, k_pos=int(kp), k_neg=int(kn),
                                                           delta=args["delta"], p_value=args["alpha"])
         for kp, kn in args["pairs"]]
out = {"pairs": [{"correct_num": int(p["correct_num"]), "eps": float(p["eps"])} for p in pairs]}
if args["search"]:
    s = pm.compute_abstain_attack_results(scores, member, delta=0.0, p_value=args["alpha"])
    out["search"] = {"eps_opt": float(s["eps_opt"]), "k_neg_opt": int(s["k_neg_opt"]), "k_pos_opt": int(s["k_pos_opt"]),
                     "correct_num_opt": int(s["correct_num_opt"]), "n_pairs": len(s["eps"]),
                     "k_neg": [int(k) for k in s["k_neg"]], "k_pos": [int(k) for k in s["k_pos"]]}
json.dump(out, sys.stdout)
"""


def privacy_meter_source(path: str | os.PathLike[str] | None = None) -> Path:
    """The Privacy Meter checkout to run (``path``, else ``$PRIVACY_METER_SRC``), after checking its ``audit.py``.

    Raises:
        UserError: no checkout given, or its ``audit.py`` is not the pinned one (says how to get it).
    """
    given = path if path is not None else os.environ.get(SOURCE_ENV)
    how = (f"clone https://github.com/privacytrustlab/ml_privacy_meter, check out {PINNED_COMMIT} and pass its path "
           f"(or set {SOURCE_ENV})")
    if not given:
        raise UserError(f"no ML Privacy Meter checkout: {how}")
    src = Path(given).resolve()
    audit_py = src / "audit.py"
    if not audit_py.is_file():
        raise UserError(f"{audit_py} not found: {how}")
    digest = hashlib.sha256(audit_py.read_bytes()).hexdigest()
    if digest != PINNED_SHA256:
        raise UserError(f"{audit_py} is not Privacy Meter's audit.py at {PINNED_COMMIT[:7]} (sha256 {digest[:12]}...): "
                        f"{how}")
    return src


def tie_free_scores(scores: Any, *, rng: np.random.Generator | int | None) -> np.ndarray:
    """Ranks 0..m−1 (float64; higher = member) ordering the scores as our one-run guesses do, ties broken by ``rng``.

    Both implementations then make exactly the same guesses (Privacy Meter sorts with an unstable ``argsort``).

    >>> float(tie_free_scores([0.5, 0.9, 0.5], rng=0)[1])
    2.0
    """
    s = np.asarray(scores, dtype=np.float64)
    keys = np.random.default_rng(rng).random(s.size)
    order = np.lexsort((keys, -s))  # the order of audit.bounds.guesses: descending score, random tie-break
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.arange(s.size - 1, -1, -1, dtype=np.float64)
    return ranks


@dataclasses.dataclass(frozen=True, kw_only=True)
class OneRunCrossCheck:
    """Our one-run bounds and Privacy Meter's on the same canaries.

    Attributes:
        m, delta, alpha: the canaries, δ and α of the comparison.
        pairs: per guess set ``{"k_pos", "k_neg", "r", "v_ours", "v_pm", "eps_ours", "eps_pm"}`` (each at α).
        max_eps_gap: the largest |ε_ours − ε_pm| over the pairs. counts_agree: every ``v_ours == v_pm``.
        ours_reported: our estimator's ε_lb (the search over ``pairs`` accounted for: each at α / len(pairs)).
        search: Privacy Meter's own search (δ = 0, its √m-step grid, not accounted for) beside ours on that grid:
            ``{"eps_pm", "k_pos", "k_neg", "v", "n_pairs", "eps_ours_same_grid_unaccounted",
            "eps_ours_same_grid_bonferroni"}``, or None.
    """

    m: int
    delta: float
    alpha: float
    pairs: tuple[dict[str, Any], ...]
    max_eps_gap: float
    counts_agree: bool
    ours_reported: float
    search: dict[str, Any] | None

    def agrees(self, *, tol: float = 1e-4) -> bool:
        """Same counts and ε within ``tol`` on every guess set."""
        return self.counts_agree and self.max_eps_gap <= tol

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def crosscheck_one_run(*, scores: Any, included: Any, delta: float, alpha: float, k_pos_grid: Any, k_neg_grid: Any,
                       source: str | os.PathLike[str] | None = None, search: bool = True,
                       rng: np.random.Generator | int | None = 0) -> OneRunCrossCheck:
    """Run our one-run estimator and Privacy Meter's ``audit.py`` on the same canaries (see the module docstring).

    Args:
        scores: one score per canary, higher = member. included: bool membership of each canary.
        delta, alpha: δ of the claim and the test's level. k_pos_grid, k_neg_grid: our guess grid.
        source: the Privacy Meter checkout (default ``$PRIVACY_METER_SRC``). search: also run Privacy Meter's search.
        rng: tie-breaking seed, used for both.

    Raises:
        UserError: no (or a wrong) Privacy Meter checkout, or its code failed (its error's last line).
    """
    src = privacy_meter_source(source)
    inc = np.asarray(included, dtype=bool)
    ranks = tie_free_scores(scores, rng=rng)
    counts = one_run_guess_counts(scores=ranks, included=inc, k_pos_grid=k_pos_grid, k_neg_grid=k_neg_grid, rng=rng)
    m = counts.m
    eps_ours = one_run_epsilon_bounds(m, counts.r, counts.v, float(delta), float(alpha))
    pm = _run_privacy_meter(src, ranks, inc, delta=float(delta), alpha=float(alpha), search=search,
                            pairs=[(m - int(kp), int(kn)) for kp, kn in zip(counts.k_pos, counts.k_neg)])
    pairs = tuple({"k_pos": int(kp), "k_neg": int(kn), "r": int(r), "v_ours": int(v), "v_pm": p["correct_num"],
                   "eps_ours": float(e), "eps_pm": p["eps"]}
                  for kp, kn, r, v, e, p in zip(counts.k_pos, counts.k_neg, counts.r, counts.v, eps_ours, pm["pairs"]))
    bonf = one_run_epsilon_bounds(m, counts.r, counts.v, float(delta), float(alpha) / counts.n_pairs)
    found = None
    if search:
        s = pm["search"]
        kp_pm = m - np.asarray(s["k_pos"], dtype=np.int64)  # their "ranks >= k_pos IN" as our number of IN guesses
        kn_pm = np.asarray(s["k_neg"], dtype=np.int64)
        keep = (kp_pm + kn_pm) >= 1
        r, v = _pair_counts(ranks, inc, kp_pm[keep], kn_pm[keep])
        same = one_run_epsilon_bounds(m, r, v, 0.0, float(alpha))
        same_b = one_run_epsilon_bounds(m, r, v, 0.0, float(alpha) / max(1, int(keep.sum())))
        found = {"eps_pm": s["eps_opt"], "k_pos": m - s["k_pos_opt"], "k_neg": s["k_neg_opt"],
                 "v": s["correct_num_opt"],
                 "n_pairs": s["n_pairs"], "eps_ours_same_grid_unaccounted": float(same.max(initial=0.0)),
                 "eps_ours_same_grid_bonferroni": float(same_b.max(initial=0.0))}
    gaps = [abs(p["eps_ours"] - p["eps_pm"]) for p in pairs]
    return OneRunCrossCheck(m=m, delta=float(delta), alpha=float(alpha), pairs=pairs,
                            max_eps_gap=max(gaps, default=0.0),
                            counts_agree=all(p["v_ours"] == p["v_pm"] for p in pairs),
                            ours_reported=float(bonf.max(initial=0.0)), search=found)


def _pair_counts(ranks: np.ndarray, inc: np.ndarray, k_pos: np.ndarray,
                 k_neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(r, v) of explicit guess pairs: top ``k_pos`` ranks IN, bottom ``k_neg`` OUT (ranks are distinct)."""
    inc_desc = inc[np.argsort(-ranks, kind="stable")]
    top_in = np.concatenate([[0], np.cumsum(inc_desc)])
    bottom_out = np.concatenate([[0], np.cumsum(~inc_desc[::-1])])
    return k_pos + k_neg, top_in[k_pos] + bottom_out[k_neg]


def _run_privacy_meter(src: Path, scores: np.ndarray, included: np.ndarray, *, delta: float, alpha: float,
                       search: bool, pairs: list[tuple[int, int]]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "canaries.npz"
        np.savez(data, scores=scores, member=included)
        args = json.dumps({"delta": delta, "alpha": alpha, "search": search, "pairs": pairs})
        proc = subprocess.run([sys.executable, "-I", "-c", _RUNNER, str(src), str(data), args], cwd=tmp,
                              capture_output=True, text=True, timeout=_TIMEOUT_S,
                              env={**os.environ, "MPLBACKEND": "Agg"})
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"Privacy Meter's audit.py failed in {src}: {last}")
    return json.loads(proc.stdout)
