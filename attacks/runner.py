"""`audit attack`: verify a run, get reference models, compute signals, run every attack, write the results.

:func:`run_attack` does, in order:

1. :func:`training.run.open_run`: weights, membership, config and pool fingerprint checked against the manifest
   (once; a :class:`~training.run.VerifiedRun` passed in is used as it is).
2. :func:`attacks.shadows.prepare_shadows` (only when an attack or the leave-one-out evaluation needs
   reference models): K models with the target's recipe, re-used when they match.
3. Signals: the scaled logit phi (:mod:`attacks.signals`) of the target and every reference model on every
   pool example and on ``population`` samples z (known non-members of the target and of every reference model:
   the test split and the training split's images outside the pool, or the non-members held out at import;
   :mod:`training.run.population`), for each augmented query; cached in ``signals.npz`` under a key over the
   target's verified identity, the reference index, the augmentations and the population
   (:mod:`training.run.freshness`).
4. Each configured attack (:data:`attacks.registry.ATTACK_SPECS`), evaluated against the real target's
   membership (``evaluation: target``), by leave-one-out over the reference models (``leave_one_out``: each
   reference in turn is the target and the others its references, Carlini et al. 2022 Sec. V; the per-attack
   metrics then describe reference model 0) or both.
5. ``attack.json`` (:class:`attacks.attack_file.AttackFile`) and ``scores.npz`` (``pool_index``, ``membership``,
   ``labels``, ``score_<attack>``; every score "higher = member"; ``inputs_digest``: the target's identity,
   :func:`training.run.inputs_digest`, so ``audit epsilon`` refuses scores made for other weights), written
   atomically.

The settings are an :class:`attacks.config.AttackConfig` (the ``attack:`` section of an experiment config).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attacks.attack_file import ATTACK_FORMAT, AttackFile, read_attack_file, write_attack_file
from attacks.config import AttackConfig
from attacks.registry import ATTACK_SPECS, AttackInputs, configured_attack, leave_one_out, needs_reference
from attacks.results import evaluate_scores, loo_summary
from attacks.shadows import ShadowSet, prepare_shadows
from attacks.signal_cache import Signals, load_or_compute_signals
from training.device import resolve_device
from training.models.build import USER_MODEL_PREFIX, user_model_refusal
from training.run.manifest import read_manifest
from foundation.errors import CheckpointError, UserError
from training.evaluate import accuracy
from foundation.evidence import read_signed_npz, write_signed_npz
from training.run import VerifiedRun, as_run, evidence_identity, inputs_digest, inputs_record, is_current
from foundation.lock import run_lock
from foundation.files import ATTACK_FILE, SCORES_FILE, has_recorded_pool

__all__ = ["AttackResult", "run_attack", "measure_utility", "score_attacks", "write_attack_results",
           "attack_is_complete", "check_scores_identity", "SCORES_FILE"]




def _recorded_arch(run_dir: str | os.PathLike[str] | VerifiedRun) -> str:
    """``model.arch`` as the run's manifest records it ("" when the manifest cannot be read)."""
    if isinstance(run_dir, VerifiedRun):
        return str(run_dir.manifest.model.arch)
    try:
        return str(read_manifest(run_dir).model.arch)
    except UserError:
        return ""


def _user_model_attack_refusal(run_dir: str | os.PathLike[str] | VerifiedRun, arch: str) -> str:
    """Why ``audit attack`` cannot run on a run of the user's own model class, and (when it recorded its pool, an
    ``audit.AuditPool``) that the Python API with the user's training function can."""
    path = run_dir.run_dir if isinstance(run_dir, VerifiedRun) else Path(run_dir)
    try:
        pooled = has_recorded_pool(read_manifest(path))
    except UserError:
        pooled = False
    if not pooled:
        return user_model_refusal(arch)
    return (f"model.arch {arch!r} is your own model class, recorded by OpacusAuditor with its weights only: the "
            f"command cannot rebuild or retrain it; attack it from Python with the function that trained it, "
            f"audit.attack({str(path)!r}, train_fn=train_fn) (train_fn(member_indices, seed) returns one trained "
            f"reference model)")


def recipe_augment(run: VerifiedRun) -> dict[str, Any] | None:
    """The target's ``training.augment`` as its ``config.yaml`` records it (None: no recipe, an import)."""
    data = run.config_data
    if data is None:
        return None
    augment = (data.get("training") or {}).get("augment") or {}
    return augment if isinstance(augment, dict) else {}


def _settings(config: AttackConfig) -> AttackConfig:
    if not isinstance(config, AttackConfig):
        raise TypeError(f"config must be an attacks.config.AttackConfig, got {type(config).__name__}")
    return config


@dataclasses.dataclass(frozen=True, eq=False)
class AttackResult:
    """What :func:`run_attack` wrote: the ``attack.json`` content and the per-example scores."""

    run_dir: Path
    report: AttackFile
    scores: dict[str, np.ndarray]
    membership: np.ndarray
    shadows_trained: int

    def rows(self) -> list[dict[str, Any]]:
        """One summary row per attack (name, AUC and interval, TPR at each FPR level)."""
        from attacks.attack_file import summary_rows

        return summary_rows(self.report)


def _logger(progress: bool) -> Callable[[str], None]:
    from attacks.stage_log import StageLog

    return StageLog(show=progress)


def _check_attacks(settings: AttackConfig, target: VerifiedRun) -> None:
    need = [a for a in settings.attacks if needs_reference(a)]
    if settings.needs_references and not target.has_recipe:
        what = f"attack(s) {', '.join(need)}" if need else "leave-one-out evaluation"
        raise UserError(f"{what} need(s) reference models trained with the target's recipe, but {target.run_dir} "
                        f"has no config.yaml (an imported checkpoint); use --set attack.attacks=[loss,attack_p] "
                        f"and attack.evaluation=target")
    if settings.evaluation != "leave_one_out":
        n_in = int(target.membership.sum())
        if n_in == 0 or n_in == len(target.membership):
            raise UserError(f"the target's membership mask has {n_in} members of {len(target.membership)}: the "
                            f"attack needs members and non-members in the pool (train with data.audit_split: true, "
                            f"or use --set attack.evaluation=leave_one_out)")


def measure_utility(target: VerifiedRun, device: Any = "cpu") -> dict[str, float | None]:
    """Test and train accuracy measured here on the auditor's own copy of the data (test: the population source,
    or the pool's non-members; train: the pool's members). ``metrics.json`` is the run's own record and is never
    copied: the gate decides on what the auditor measured."""
    model = target.model(device=device)
    test = target.population if target.population is not None else target.pool.subset(~target.membership)
    return {"test_accuracy": accuracy(model, test, device=device),
            "train_accuracy": accuracy(model, target.pool.subset(target.membership), device=device)}


def _inputs(phi: Signals, model: int, others: np.ndarray | None, labels: np.ndarray) -> AttackInputs:
    has_pop = phi.population.shape[1] > 0
    has_ref = others is not None and others.size > 0
    return AttackInputs(
        target=phi.pool[model], labels=labels,
        reference=phi.pool[others] if has_ref else None,
        reference_in=phi.keep[others - 1] if has_ref else None,
        pop_target=phi.population[model] if has_pop else None,
        pop_reference=phi.population[others] if has_pop and has_ref else None)


def run_attack(*, run_dir: str | os.PathLike[str] | VerifiedRun, config: AttackConfig, retrain_shadows: bool = False,
               progress: bool = True, trust_code: bool = False) -> AttackResult:
    """Attack the run in ``run_dir`` as ``config`` says and write ``attack.json`` and ``scores.npz`` there.

    Args:
        run_dir: a run directory (``audit train`` or ``audit import``), or the run already opened with
            :func:`training.run.open_run`.
        config: the attack settings.
        retrain_shadows: delete and retrain the reference models.
        progress: print progress messages on stderr.
        trust_code: allow the run (and its reference models) to name code to import (``--trust-code``);
            recorded in ``attack.json`` under ``code``. A run already opened keeps the trust it was opened with.

    Returns:
        The :class:`AttackResult`.

    Raises:
        UntrustedCodeError: the run names code to import and ``trust_code`` is False (nothing was run).
        CheckpointError: the run or its reference models do not verify, or another process holds the run's lock.
        UserError: attacks that cannot run on this run (no recipe, no members/non-members, K odd, ...).
        TypeError: ``config`` is not an :class:`~attacks.config.AttackConfig`.
    """
    settings = _settings(config)
    path = run_dir.run_dir if isinstance(run_dir, VerifiedRun) else Path(run_dir)
    if not path.is_dir():
        raise CheckpointError(f"run directory not found: {path}")
    with run_lock(path):  # one writer: a concurrent attack (or its --retrain-shadows) fails fast instead
        return _run_attack(run_dir=run_dir, settings=settings, retrain_shadows=retrain_shadows, progress=progress,
                           trust_code=trust_code)


def _run_attack(*, run_dir: str | os.PathLike[str] | VerifiedRun, settings: AttackConfig, retrain_shadows: bool,
                progress: bool, trust_code: bool) -> AttackResult:
    """:func:`run_attack` with the run directory locked."""
    say = _logger(progress)
    try:
        target = as_run(run_dir, trust_code=trust_code)
        arch = str(target.manifest.model.arch)
    except UserError:  # an OpacusAuditor run fails on its pool first: say why the run cannot be attacked at all
        arch = _recorded_arch(run_dir)
        if not arch.startswith(USER_MODEL_PREFIX):
            raise
    if arch.startswith(USER_MODEL_PREFIX):
        raise UserError(_user_model_attack_refusal(run_dir, arch))
    queries_from = settings.queries_from(target.config_data is not None)
    settings = settings.for_target(recipe_augment(target))  # attack.flip/shifts 'auto': as the target was trained
    _check_attacks(settings, target)
    device = resolve_device(settings.device, field="attack.device")
    shadows: ShadowSet | None = None
    if settings.needs_references:
        shadows = prepare_shadows(target=target, n_models=settings.n_reference, seed=settings.seed,
                                  executor=settings.executor, ray=settings.ray_options(), device=device,
                                  max_models_per_batch=settings.max_models_per_batch, retrain=retrain_shadows,
                                  log=say if progress else None, workers=settings.workers)  # None: no progress bar either
    phi = load_or_compute_signals(target=target, shadows=shadows, spec=settings.augmentations,
                                  n_population=settings.population, seed=settings.seed, device=device,
                                  batch_size=settings.signal_batch_size,
                                  population_memory_mb=settings.population_memory_mb, log=say)
    labels = np.asarray(target.pool.y)
    k = 0 if shadows is None else shadows.n_models
    truth = target.membership if settings.evaluation != "leave_one_out" else phi.keep[0]
    entries, scores = score_attacks(settings, phi, labels=labels, truth=truth, n_reference=k, say=say)
    utility = measure_utility(target, device)
    report = AttackFile.from_data({
        "format": ATTACK_FORMAT,
        "run": target.manifest.run_name,
        "inputs": inputs_record(target, config_sha256=settings.sha256()),
        "setup": {"n_reference": k, "augmentations": list(settings.augmentations.names),
                  "queries_from": queries_from, "pool_size": len(labels),
                  "n_members": int(target.membership.sum()), "n_population": int(phi.population.shape[1]),
                  "population_rule": phi.population_rule if phi.population.shape[1] else "none",
                  "population": phi.population_record,
                  "evaluation": settings.evaluation,
                  "recipe_hash": None if shadows is None else shadows.index["recipe_hash"],
                  "executor": None if shadows is None else shadows.executor,
                  "ray_address": None if shadows is None else shadows.index.get("ray_address"),
                  "shadow_train_seconds": 0.0 if shadows is None else shadows.train_seconds},
        "attacks": entries,
        "utility": utility,
        "code": target.code.to_dict(),
    })
    out = target.run_dir
    write_attack_results(target, report, scores=scores, truth=truth, labels=labels)
    return AttackResult(run_dir=out, report=report, scores=scores, membership=truth,
                        shadows_trained=0 if shadows is None else shadows.trained)


def score_attacks(settings: AttackConfig, phi: Signals, *, labels: np.ndarray, truth: np.ndarray, n_reference: int,
                  say: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Every configured attack on the signals ``phi`` (model 0 the target, 1..K the references): its
    ``attack.json`` entry (parameters, info, metrics against ``truth``, leave-one-out when configured) and its
    per-example scores (higher = member). One loop for every way reference models were made."""
    k = n_reference
    refs = np.arange(1, k + 1)
    entries: dict[str, Any] = {}
    scores: dict[str, np.ndarray] = {}
    for name in settings.attacks:
        attack = configured_attack(name, **settings.attack_params())
        say(f"running {name}")
        loo = None
        if settings.evaluation != "target":
            rounds = leave_one_out(attack, phi.pool[1:], phi.keep, labels,
                                   pop_phi=phi.population[1:] if phi.population.shape[1] else None)
            loo = loo_summary([(r.scores, r.membership) for r in rounds])
        if settings.evaluation == "leave_one_out":   # round 0: reference 1 is the target, references 2..K its own
            score, info = attack.score_with_info(_inputs(phi, 1, refs[1:], labels))
        else:
            score, info = attack.score_with_info(_inputs(phi, 0, refs if k else None, labels))
        scores[name] = np.asarray(score, dtype=np.float64)
        entry = {"params": {"attack": ATTACK_SPECS[name][0], **attack.params()}, "info": info,
                 **evaluate_scores(scores[name], truth, labels, n_boot=settings.n_bootstrap, seed=settings.seed,
                                   top_k=settings.top_vulnerable)}
        if loo is not None:
            entry["leave_one_out"] = loo
        entries[name] = entry
    return entries, scores


def write_attack_results(target: VerifiedRun, report: AttackFile, *, scores: dict[str, np.ndarray],
                         truth: np.ndarray, labels: np.ndarray) -> None:
    """``scores.npz`` and ``attack.json`` in the target's run directory, signed for its identity."""
    out = target.run_dir
    write_signed_npz(out / SCORES_FILE, identity=evidence_identity(target, claim=False), arrays={
        "pool_index": np.arange(len(labels)), "membership": truth, "labels": labels,
        "inputs_digest": np.array(inputs_digest(target)), **{f"score_{n}": s for n, s in scores.items()}})
    write_attack_file(out, report, identity=evidence_identity(target, claim=False))


def attack_is_complete(run_dir: str | os.PathLike[str] | VerifiedRun, config: AttackConfig) -> bool:
    """True when ``attack.json`` and ``scores.npz`` exist and were made from this run's verified weights and
    membership (and the pool its manifest records) with these attack settings (:func:`training.run.is_current`)."""
    path = run_dir.run_dir if isinstance(run_dir, VerifiedRun) else Path(run_dir)
    if not (path / ATTACK_FILE).is_file() or not (path / SCORES_FILE).is_file():
        return False
    try:
        run = as_run(run_dir, verify=False)
        report = read_attack_file(path, identity=evidence_identity(run, claim=False))
        settings = _settings(config).for_target(recipe_augment(run))
        if not is_current(report.inputs, run, config_sha256=settings.sha256()):
            return False
        check_scores_identity(run)
        return True
    except UserError:
        return False


def check_scores_identity(run: VerifiedRun) -> None:
    """Refuse ``scores.npz`` unless this auditor signed it (:mod:`foundation.evidence`) for this run's identity
    (:func:`training.run.evidence_identity`: verified weights and membership, the manifest's pool) and
    it records :func:`training.run.inputs_digest`, as :func:`run_attack` writes it. Scores made for other weights
    (a checkpoint swapped after the attack, or copied from another run), or edited, would otherwise be judged as
    this model's.

    Raises:
        CheckpointError: the file is unreadable, unsigned, edited, stale, or records another identity (nothing
            when absent).
    """
    path = run.run_dir / SCORES_FILE
    if not path.is_file():
        return
    npz = read_signed_npz(path, remake=f"audit attack {run.run_dir}",
                          identity=evidence_identity(run, claim=False))
    recorded = str(npz["inputs_digest"]) if "inputs_digest" in npz else None
    if recorded != inputs_digest(run):
        raise CheckpointError(f"{path} was not computed from this run's weights, membership and pool (it records "
                              f"{'no' if recorded is None else 'another'} identity); re-run 'audit attack "
                              f"{run.run_dir}'")
