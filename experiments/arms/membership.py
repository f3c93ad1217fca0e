"""Bu et al. 2024's membership claim under the suite's strongest attacks: LiRA and RMIA on the continual arm's models.

The continual arm (:func:`experiments.arms.bu.continual_arm`) attacks each checkpoint with LOSS and Attack-P only,
which need no reference models; at 1 % FPR they are at chance even on the non-DP model, so they could not have
detected a leak. LiRA and RMIA need reference models trained like the target on other halves of the same pool. This
arm trains, for each training recipe (a *family*: the continual arm's non-DP, σ = 0, DP-from-scratch or
continual-with-a-fixed-switch trainings, :func:`experiments.arms.bu.continual_phases`), ``membership_models`` models,
model ``i`` with seed ``i`` on the member half the continual arm's seed ``i`` uses (so models 0-4 are that arm's
runs again), queries each on every private image and on the test images (a population OUT of every model) with
and without a horizontal flip, and attacks every model in turn with the others of its family as references
(:func:`attacks.registry.leave_one_out`, the LiRA paper's protocol). Every attack of
:data:`attacks.registry.ATTACK_SPECS` is scored (LOSS, Attack-P, calibrated LOSS, LiRA online and offline with
per-example and with fixed variance, RMIA online and offline, each as :func:`attacks.registry.configured_attack`
builds it); per target, AUC and
TPR at 1 % and 0.1 % FPR with stratified-bootstrap 95 % intervals (:func:`attacks.metrics.compute_metrics`); pooled
over the targets (the LiRA paper's ROC over all of them: ``membership_models`` × the non-members), the same with
its intervals; and the strongest attack of each family by the suite's one definition (:mod:`attacks.strongest`,
on the pooled metrics). The signals are kept (safetensors) so the attacks can be re-scored without training.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.arms.bu import FIXED_ARMS, continual_phases, member_half
from experiments.arms.common import ArmScale, build, chosen_parts, load_arm_data, test_acc, train

__all__ = ["MEMBERSHIP_FAMILIES", "MEMBERSHIP_ATTACKS", "FPRS", "membership_arm", "score_family", "load_signals",
           "rescore_parts"]

#: the continual arm's trainings this arm can attack (the plateau rule's switch varies by seed: not a family)
MEMBERSHIP_FAMILIES = FIXED_ARMS
#: the attacks scored on every family: every config name of :data:`attacks.registry.ATTACK_SPECS` (LiRA with
#: per-example and with fixed variance, the latter the LiRA paper's choice for few reference models)
MEMBERSHIP_ATTACKS = ("loss", "attack_p", "calibrated_loss", "lira_online", "lira_online_fixed_var", "lira_offline",
                      "lira_offline_fixed_var", "rmia_online", "rmia_offline")
#: the FPR levels reported (the issue's 1 % and 0.1 %)
FPRS = (0.01, 0.001)
_N_BOOT = 200


def _key(fpr: float) -> str:
    return f"{fpr:g}"


def _metrics(scores: np.ndarray, labels: np.ndarray, seed: int) -> dict[str, Any]:
    from attacks.metrics import compute_metrics

    m = compute_metrics(scores, labels, rng=seed, n_boot=_N_BOOT, fpr_targets=FPRS)
    return {"auc": m.auc, "auc_ci": list(m.auc_ci),
            **{f"tpr_{_key(f)}": m.tpr_at[f] for f in FPRS},
            **{f"tpr_{_key(f)}_ci": list(m.tpr_at_ci[f]) for f in FPRS},
            "n_members": m.n_members, "n_nonmembers": m.n_nonmembers}


def score_family(phi: np.ndarray, keep: np.ndarray, pop_phi: np.ndarray, *,
                 attacks: tuple[str, ...] = MEMBERSHIP_ATTACKS) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """Leave-one-out attacks on one family's signals: ``phi`` ``(M, n, A)`` on the pool, ``keep`` ``(M, n)``,
    ``pop_phi`` ``(M, m, A)`` on population images OUT of every model.

    Returns ``(per_target, summary)``: ``per_target[f"{attack}_{metric}"]`` one value per model (``auc``,
    ``tpr_0.01``, ``tpr_0.001`` and their ``_ci``), and ``summary``: per attack the pooled metrics over every
    target's scores (``pooled``), then ``strongest`` (:func:`attacks.strongest.strongest` on the pooled metrics),
    ``reference_fpr`` (the level it compared at) and ``n_nonmembers_pooled``.
    """
    from attacks.registry import configured_attack, leave_one_out
    from attacks.strongest import reference_level, strongest

    per_target: dict[str, list[Any]] = {}
    pooled: dict[str, dict[str, Any]] = {}
    for name in attacks:
        rounds = leave_one_out(configured_attack(name), phi, keep, pop_phi=pop_phi)
        for t, r in enumerate(rounds):
            for k, v in _metrics(r.scores, r.membership, seed=t).items():
                per_target.setdefault(f"{name}_{k}", []).append(v)
        pooled[name] = _metrics(np.concatenate([r.scores for r in rounds]),
                                np.concatenate([r.membership for r in rounds]), seed=len(rounds))
    cands = {n: (p["auc"], {_key(f): p[f"tpr_{_key(f)}"] for f in FPRS}, p["n_nonmembers"])
             for n, p in pooled.items()}
    return per_target, {"pooled": pooled, "strongest": strongest(cands), "reference_fpr": reference_level(cands),
                        "n_nonmembers_pooled": next(iter(pooled.values()))["n_nonmembers"]}


def _save_signals(path: Path, phi: np.ndarray, keep: np.ndarray, pop_phi: np.ndarray) -> None:
    from foundation.io import save_safetensors

    path.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors(path, {"phi": torch.from_numpy(np.ascontiguousarray(phi, dtype=np.float32)),
                            "keep": torch.from_numpy(keep.astype(np.uint8)),
                            "pop_phi": torch.from_numpy(np.ascontiguousarray(pop_phi, dtype=np.float32))})


def load_signals(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(phi, keep, pop_phi)`` of one family as :func:`membership_arm` kept them (float32 signals, bool keep)."""
    from foundation.io import load_safetensors

    t = load_safetensors(path)
    return t["phi"].numpy(), t["keep"].numpy().astype(bool), t["pop_phi"].numpy()


def rescore_parts(parts: list[Path], signals_dir: Path, *,
                  attacks: tuple[str, ...] = MEMBERSHIP_ATTACKS) -> list[Path]:
    """Re-score the membership arm's part files ``parts`` (one training each) from the signals they kept in
    ``signals_dir`` with ``attacks``, without training: each part's attack metrics and summary are replaced, its
    accuracies and settings kept, ``rescored_attacks`` recorded. Returns the parts rewritten.

    Raises:
        ValueError: a part whose signals are not in ``signals_dir``.
    """
    import json

    from foundation.io import write_json

    done = []
    for path in parts:
        part = json.loads(Path(path).read_text())
        for fam in list(part.get("summary", {})):
            sig = Path(signals_dir) / f"{fam}.safetensors"
            if not sig.is_file():
                raise ValueError(f"{path}: no signals for {fam!r} at {sig}; run the part again")
            got, summ = score_family(*load_signals(sig), attacks=attacks)
            kept = {k: v for k, v in part["per_seed"].items() if not k.startswith(f"{fam}_") or k == f"{fam}_acc"}
            part["per_seed"] = {**kept, **{f"{fam}_{k}": v for k, v in got.items()}}
            part["summary"][fam] = summ
        part.update({"attacks": list(attacks), "rescored_attacks": list(attacks)})
        write_json(path, part)
        done.append(Path(path))
    return done


def membership_arm(scale: ArmScale, *, device="cpu", log: Callable[[str], None] | None = None,
                   signals_dir: Path | None = None) -> dict[str, Any]:
    """Per family of ``scale.continual_arms`` (see the module docstring): ``membership_models`` models, their test
    accuracy, the attacks' per-target metrics (``per_seed``: one value per model, in model order) and the pooled
    ones (``summary``). ``signals_dir``: where each family's signals are kept (``<family>.safetensors``)."""
    from attacks.signals import AugmentationSpec, compute_signals

    families = chosen_parts(scale, "continual_arms", MEMBERSHIP_FAMILIES)
    m_models = int(scale.membership_models)
    if m_models < 4:
        raise ValueError(f"membership_models must be >= 4 (each target needs IN and OUT references), got {m_models}")
    data = load_arm_data(scale, device=device)
    n_priv = len(data.private)
    spec = AugmentationSpec(flip=True, shifts=0)
    keep = np.stack([member_half(n_priv, i) for i in range(m_models)])
    per_seed: dict[str, list[Any]] = {}
    summary: dict[str, Any] = {}
    for fam in families:
        phis, pops = [], []
        for i in range(m_models):
            phases = continual_phases(fam, scale, data, members=np.flatnonzero(keep[i]), seed=i)
            model = train(build(scale, data, seed=i, device=device), phases, seed=i, device=device)
            per_seed.setdefault(f"{fam}_acc", []).append(test_acc(model, data.test, device))
            phis.append(compute_signals(model, data.private.x, data.private.y, spec=spec, device=device))
            pops.append(compute_signals(model, data.test.x, data.test.y, spec=spec, device=device))
            if log:
                log(f"  {fam} model {i}: test accuracy {per_seed[f'{fam}_acc'][-1]:.3f}")
        phi, pop_phi = np.stack(phis), np.stack(pops)
        if signals_dir is not None:
            _save_signals(Path(signals_dir) / f"{fam}.safetensors", phi, keep, pop_phi)
        got, summ = score_family(phi, keep, pop_phi)
        per_seed.update({f"{fam}_{k}": v for k, v in got.items()})
        summary[fam] = summ
        if log:
            s = summ["strongest"]
            log(f"  {fam}: strongest {s}, pooled TPR at 1 % FPR {summ['pooled'][s]['tpr_0.01']:.4f}, "
                f"at 0.1 % {summ['pooled'][s]['tpr_0.001']:.4f}")
    return {"arm": "membership", "scale": scale.name, "seeds": list(range(m_models)), "targets": m_models,
            "n_members_mean": n_priv / 2, "n_population": len(data.test), "augmentations": list(spec.names),
            "attacks": list(MEMBERSHIP_ATTACKS), "fprs": list(FPRS), "n_boot": _N_BOOT, "per_seed": per_seed,
            "summary": summary}
