"""`audit train`: one training run (any recipe) that writes a run directory carrying its claim.

A run is a recipe (``training.recipe``) of one or more phases (:mod:`training.recipes`): ``standard`` (one DP or
non-DP phase), ``continual_pretrain`` (public non-DP pre-training, then DP on the private data) and ``finetune``
(DP linear probing and/or full fine-tuning from a checkpoint). The loop (:mod:`training.loop`) is
plain: a sampler yields the example indices of each logical step (Poisson by default, deterministic per (seed,
step)), the :class:`training.dp.engine.Stepper` does the clipped, noised update in physical chunks, and every
``checkpoint_every`` steps (and at every phase end) the full state is written atomically so that ``--resume``
after any interrupt (kill -9 included) continues exactly where the last checkpoint left off, across phase
boundaries too: the final weights equal an uninterrupted run's, and the accountant counts every DP step taken.
The claim composes the DP phases only; non-DP phases on public data are listed in the manifest with dp=false.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.accounting import DPPhase, cross_check, default_delta, epsilon_for
from training.config import ModelConfig, TrainConfig, dump_config
from foundation.errors import CheckpointError, UserError
from foundation.io import (check_output_dir, copy_file, read_json, remove_run_dir, sha256_bytes, sha256_file, write_npy,
                           write_text)
from training.models import count_parameters
from training.pool import Pool, build_pool, membership_mask
from training.progress import TrainLogger
from training.dp.rng import secret_seed
from training.device import rank_device, resolve_device
from training.distributed import World, agree, broadcast_object, current_world
from training.accel import Accel, recipe_record
from training.evaluate import accuracy
from training.loop import RunContext, run_phases
from training.recipes import RECIPES, RunSetup
from foundation.files import (CANARY_PACKAGE_FILE, CONFIG_FILE, GRADIENT_CANARY_FILE, INIT_WEIGHTS_FILE, LOCK_FILE,
                              MANIFEST_FILE, MEMBERSHIP_FILE, METRICS_FILE, TB_DIR)
from training.run.manifest import Manifest, PhaseInfo, PrivacyInfo, read_manifest
from training.run.state import clear_state, has_state, load_state
from training.run.writer import privacy_record, write_run
from training.threads import ThreadBudget, model_work, rank_budget, using_threads
from foundation.lock import run_lock

__all__ = ["TrainResult", "train", "SECURE_MODE_NOTE"]

SECURE_MODE_NOTE = ("secure mode: DP noise and batches drawn directly from the OS CSPRNG (os.urandom), the noise "
                    "hardened against floating-point attacks (sum of four normals / 2, as Opacus's secure mode); "
                    "no seed exists or is recorded (provenance.seed is null); not reproducible")


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path
    manifest: Manifest
    metrics: dict[str, Any]
    resumed_from: int = 0
    already_complete: bool = False
    warnings: tuple[str, ...] = ()
    pool: Pool | None = None  # the pool this call trained on (None when the run was already complete)


def _prepare_run_dir(run_dir: Path, config_sha: str, *, resume: bool, overwrite: bool) -> str:
    """Decide what to do with an existing run directory: 'fresh', 'resume' or 'complete'."""
    if overwrite and (run_dir.exists() or run_dir.is_symlink()):
        remove_run_dir(run_dir, keep=(LOCK_FILE,))
    if (run_dir / MANIFEST_FILE).exists():
        cfg_file = run_dir / CONFIG_FILE
        if cfg_file.exists() and sha256_file(cfg_file) == config_sha:
            return "complete"
        raise CheckpointError(f"{run_dir} already holds a finished run with a different config; choose another "
                              f"name (--set name=...) or pass --overwrite")
    if has_state(run_dir):
        if not resume:
            raise CheckpointError(f"{run_dir} holds an interrupted run; pass --resume to continue it or "
                                  f"--overwrite to start again")
        return "resume"
    return "fresh"


def _read_metrics(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / METRICS_FILE, what="metrics")


def _complete(run_dir: Path, membership: np.ndarray | None) -> TrainResult:
    """The result of a run that is already complete (with the membership asked for, if any)."""
    if membership is not None:
        stored = np.load(run_dir / MEMBERSHIP_FILE, allow_pickle=False)
        if stored.shape != membership.shape or not bool((stored == membership).all()):
            raise CheckpointError(f"{run_dir} holds a finished run with another membership mask; pass --overwrite")
    return TrainResult(run_dir, read_manifest(run_dir), _read_metrics(run_dir), already_complete=True)


def train(cfg: TrainConfig, *, run_dir: str | Path | None = None, resume: bool = False, overwrite: bool = False,
          membership: np.ndarray | None = None, progress: bool | None = None, command: str | None = None,
          stop_after: int | None = None, trust_code: bool = False, warn: Callable[[str], None] | None = None,
          canary_package: str | Path | None = None, threads: ThreadBudget | None = None,
          _debug_disable_noise: bool = False) -> TrainResult:
    """Train one model as ``cfg`` says and write its run directory.

    Args:
        cfg: the validated config.
        run_dir: where to write (default ``cfg.output_dir/cfg.name``).
        resume: continue an interrupted run from its last saved state.
        overwrite: delete an existing run directory first.
        membership: explicit bool mask over the pool (reference models); default from ``cfg.data``.
        progress: show a progress bar (default ``cfg.training.progress``).
        command: the command line, recorded in the provenance.
        warn: called with each warning as soon as it is found (e.g. a weak δ), before training starts; the
            warnings are also returned in :attr:`TrainResult.warnings`. None: only returned.
        stop_after: stop (with state saved) after this many steps (all phases together): simulates an
            interrupt in tests.
        trust_code: allow ``model.arch`` (or a fine-tuning checkpoint's) to be an import path, which is
            imported and called: True for the user's own config (``audit train``), False for a recipe read
            from a run directory someone else made (reference models), unless the user said ``--trust-code``.
        canary_package: where to read the auditor's package of ``training.canaries.from_file`` (reference
            models read their target's copy); None: the configured path (a resumed run: its own copy).
        threads: where this process runs, for its torch thread count (:mod:`training.threads`; recorded in
            ``provenance.threads``); None: one process, or a rank of ``torchrun`` sharing the node's cores.
        _debug_disable_noise: TEST ONLY. Skips the DP noise while the manifest still claims DP: a planted bug
            that the white-box audit must catch.

    Under torchrun (a default process group initialised, :mod:`training.distributed`) every rank calls this
    with the same arguments: each trains on its share of every logical batch, rank 0 alone locks and writes
    ``run_dir``, and every rank returns the result rank 0 wrote.

    Returns:
        TrainResult with the run directory, its manifest and metrics.

    Raises:
        UserError: bad config values, missing data, batch larger than the dataset, mismatched resume state.
    """
    run_dir = Path(run_dir) if run_dir is not None else cfg.run_dir()
    world = current_world()
    check_output_dir(run_dir, what="run directory")
    if overwrite and run_dir.is_symlink() and world.is_main:
        remove_run_dir(run_dir)  # refuses a symlinked run directory before anything is locked or written
    with ExitStack() as held:  # rank 0 takes the lock; the others learn whether it could
        agree(world, lambda: held.enter_context(run_lock(run_dir, command=command)))
        return _train(cfg, run_dir=run_dir, resume=resume, overwrite=overwrite, membership=membership,
                      progress=progress, command=command, stop_after=stop_after, trust_code=trust_code, warn=warn,
                      world=world, canary_package=canary_package, held=held,
                      threads=threads or (rank_budget() if world.distributed else ThreadBudget()),
                      _debug_disable_noise=_debug_disable_noise)


def _train(cfg: TrainConfig, *, run_dir: Path, resume: bool, overwrite: bool, membership: np.ndarray | None,
           progress: bool | None, command: str | None, stop_after: int | None, trust_code: bool,
           warn: Callable[[str], None] | None, world: World, canary_package: str | Path | None,
           held: ExitStack, threads: ThreadBudget, _debug_disable_noise: bool) -> TrainResult:
    """:func:`train` with the run directory locked (by rank 0); ``held`` keeps the thread count until it returns."""
    config_text = dump_config(cfg)
    config_sha = sha256_bytes(config_text.encode("utf-8"))
    mode = agree(world, lambda: _prepare_run_dir(run_dir, config_sha, resume=resume, overwrite=overwrite))
    if mode == "complete":
        return agree(world, lambda: _complete(run_dir, membership))

    tc, pc = cfg.training, cfg.privacy
    own_copy = run_dir / CANARY_PACKAGE_FILE
    if canary_package is None and mode == "resume" and own_copy.is_file():
        canary_package = own_copy
    pool = build_pool(cfg, canary_package=canary_package)
    if membership is not None:
        mask = np.asarray(membership, dtype=bool)
        if mask.shape != (len(pool.images),):
            raise UserError(f"membership mask has shape {mask.shape}, the pool has {len(pool.images)} examples")
        mem_info = {"membership_scheme": "explicit"}
    else:
        mask, mem_info = membership_mask(cfg, pool)
    members = np.flatnonzero(mask)
    n = len(members)
    if n == 0:
        raise UserError("the membership draw selected no training examples; enlarge the pool")
    if tc.batch_size > n:
        raise UserError(f"training.batch_size={tc.batch_size} is larger than the {n} training examples; "
                        f"lower it or enlarge the pool (data.pool_size / data.audit_split)")
    delta = pc.delta if pc.delta is not None else default_delta(n)
    notes: list[str] = []
    warnings: list[str] = []
    if pc.enabled and delta >= 1.0 / n:
        notes.append(f"delta={delta:g} is not below 1/n={1.0 / n:.3g}: the guarantee is weak")
        warnings.append(f"privacy.delta={delta:g} >= 1/n = {1.0 / n:.3g}; use a smaller delta")
    for message in warnings:
        if warn is not None and world.is_main:
            warn(message)
    if pc.enabled and pc.sampling != "poisson":
        notes.append("batches were formed by shuffling, not Poisson sampling; the epsilon below is computed as if "
                     "sampling were Poisson and is NOT a proven guarantee for this run")

    device = resolve_device(tc.device, field="training.device")
    if world.distributed:
        device = rank_device(device, world.local_rank)
    run_cfg, seed = cfg, tc.seed
    if tc.seed is None:  # secure mode (the config refuses a null seed otherwise): a secret, in memory only
        seed = broadcast_object(secret_seed() if world.is_main else None, world)  # every rank: rank 0's secret
        run_cfg = cfg.model_copy(update={"training": tc.model_copy(update={"seed": seed})})
    setup = RunSetup(cfg=run_cfg, pool=pool, members=members, delta=delta if pc.enabled else None, device=device,
                     notes=notes, trust_code=trust_code)
    main = world.is_main  # the other ranks write nothing, log nothing, evaluate nothing
    ctx = RunContext(run_dir=run_dir if main else None, config_sha=config_sha, seed=seed, device=device,
                     logger=None, physical_batch_size=tc.physical_batch_size, log_every=tc.log_every,
                     checkpoint_every=tc.checkpoint_every, eval_every=tc.eval_every if main else 0,
                     test=pool.test if main else None, delta=delta if pc.enabled else None,
                     hessian_every=tc.hessian.every if main else 0, stop_after=stop_after,
                     debug_disable_noise=_debug_disable_noise, world=world, accel=Accel.from_training(tc),
                     warn=warn if main else None)
    recipe = RECIPES[tc.recipe](setup, ctx)
    plan = threads.plan(work=model_work(params=count_parameters(recipe.model)[0],
                                        input_shape=pool.images.x.shape[1:3]))
    held.enter_context(using_threads(plan))
    if mode == "fresh" and main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / CONFIG_FILE, config_text)
    if main and pool.package is not None and pool.package.resolve() != own_copy.resolve():
        copy_file(pool.package, own_copy)  # the run carries the package it trained on (sha256 in the manifest)
    # rank 0 reads the saved state and sends it: the other ranks need no access to the run directory
    state = agree(world, lambda: load_state(run_dir, config_sha256=config_sha) if mode == "resume" else None)
    start = int(state["step"]) if state is not None else 0
    if tc.seed is None:
        notes.append(SECURE_MODE_NOTE + (f"; resumed at step {start} with a new secret, so the run is not "
                                          "bit-identical to an uninterrupted one" if start else ""))
    if main:
        ctx.logger = TrainLogger(run_dir / TB_DIR, total=recipe.total_steps(), start=start,
                                 show=tc.progress if progress is None else progress, dp=pc.enabled,
                                 claim_accountant=pc.accountant if pc.enabled else None)
    t0 = time.perf_counter()
    try:
        model = run_phases(ctx, recipe.model, recipe.next_phase, state=state)
    finally:
        if ctx.logger is not None:
            ctx.logger.close()
    wall = time.perf_counter() - t0
    if not main:  # rank 0 writes the run directory; the others return what it wrote
        manifest, metrics = broadcast_object(None, world)
        return TrainResult(run_dir, manifest, metrics, resumed_from=start, warnings=tuple(warnings), pool=pool)

    with ctx.accel.compute(dp=False, device=device):
        test_acc = accuracy(model, pool.test, device=device)
        train_acc = accuracy(model, pool.images.subset(members), device=device)
    phases = [p.model_copy(update={"fallback_layers": c.get("fallback_layers")})  # bk mode's fallback layers
              for p, c in zip(recipe.phase_infos(ctx.completed), ctx.completed)]
    privacy = _privacy_info(pc, phases, delta, notes)
    extra = recipe.metrics(ctx.completed)
    extra.update(recipe_record(cfg, phases, device=device))
    if world.distributed:
        extra["distributed"] = {"processes": world.size, "backend": torch.distributed.get_backend(),
                                "noise": "added once per logical step, by rank 0 (sums all-reduced)"}
    final_loss = ctx.history[-1].get("loss") if ctx.history else None
    metrics = {"test_accuracy": test_acc, "train_accuracy": train_acc, "steps": ctx.global_step,
               "epsilon_spent": privacy.epsilon, "final_loss": final_loss, "wall_seconds": wall,
               "history": ctx.history, **extra}
    frozen = ctx.completed[-1]["frozen"] if ctx.completed else []
    extra.update(_canary_record(run_dir, ctx))
    manifest = _finalize(run_dir, cfg, model=model, model_cfg=recipe.model_cfg, model_notes=recipe.model_notes,
                         frozen=frozen, pool=pool, mask=mask, mem_info=mem_info, privacy=privacy, metrics=metrics,
                         extra=extra, config_sha=config_sha, command=command, device=device,
                         threads=plan.record())
    broadcast_object((manifest, metrics), world)
    return TrainResult(run_dir, manifest, metrics, resumed_from=start, warnings=tuple(warnings), pool=pool)


def _canary_record(run_dir: Path, ctx: RunContext) -> dict[str, Any]:
    """Write the gradient canaries' inclusion mask and describe them for the manifest (what the white-box audit
    needs: the DP phase's q and T, θ_0 and the parameter order)."""
    canaries = ctx.canaries
    dp = [c for c in ctx.completed if c["dp"]]
    if canaries is None or not dp:
        return {}
    inc = write_npy(run_dir / GRADIENT_CANARY_FILE, canaries.included)
    return {"gradient_canaries": {
        "count": canaries.count, "seed": canaries.seed, "included_file": inc.name,
        "included_sha256": sha256_file(inc), "n_included": int(canaries.included.sum()),
        "sample_rate": dp[-1]["sample_rate"], "steps": dp[-1]["steps"],
        "scale": "max_grad_norm (C * u_i added to the clipped sum)", "param_names": list(canaries.param_shapes),
        "init_weights": INIT_WEIGHTS_FILE, "init_weights_sha256": sha256_file(run_dir / INIT_WEIGHTS_FILE)}}


def _privacy_info(pc, phases: list[PhaseInfo], delta: float, notes: list[str]) -> PrivacyInfo:
    """The claim: the configured accountant's composition of the DP phases (cross-checked by a second
    accountant); each DP phase also records its own ε alone."""
    dp_phases = [DPPhase(noise_multiplier=p.noise_multiplier, sample_rate=p.sample_rate, steps=p.steps)
                 for p in phases if p.dp]
    if not dp_phases:
        return privacy_record(phases=phases,
                              notes=notes + ["no DP phase: this checkpoint makes no privacy claim (epsilon = inf)"])
    check = cross_check(phases=dp_phases, delta=delta, accountant=pc.accountant)
    if len(dp_phases) == 1:
        phases = [p.model_copy(update={"epsilon": check["epsilon"]}) if p.dp else p for p in phases]
    else:
        phases = [p.model_copy(update={"epsilon": epsilon_for(phases=[DPPhase(
            noise_multiplier=p.noise_multiplier, sample_rate=p.sample_rate, steps=p.steps)], delta=delta,
            accountant=pc.accountant)}) if p.dp else p for p in phases]
    return privacy_record(phases=phases, epsilon=check["epsilon"], delta=delta, accountant=pc.accountant,
                          cross_check={"accountant": check["reference_accountant"],
                                       "epsilon": check["reference_epsilon"],
                                       "relative_difference": check["relative_difference"]}, notes=notes)


def _finalize(run_dir: Path, cfg: TrainConfig, *, model: torch.nn.Module, model_cfg: ModelConfig,
              model_notes: list[str], frozen: list[str], pool: Pool, mask: np.ndarray, mem_info: dict[str, Any],
              privacy: PrivacyInfo, metrics: dict, extra: dict, config_sha: str, command: str | None,
              device: torch.device, threads: dict[str, Any]) -> Manifest:
    """Write weights, membership, metrics and the manifest (last: its presence marks the run complete)."""
    manifest = write_run(
        run_dir, run_name=cfg.name, model=model_cfg, module=model, num_classes=len(pool.images.classes),
        input_shape=(3, *pool.images.x.shape[1:3]), frozen=frozen, notes=model_notes, membership=mask, **mem_info,
        data=cfg.data, pool_fingerprint=pool.images.fingerprint(), canaries=pool.canaries, privacy=privacy,
        split=pool.split_record, metrics=metrics,
        training={"recipe": cfg.training.recipe, "optimizer": cfg.optim.model_dump(mode="json"),
                  "steps": metrics["steps"], "batch_size": cfg.training.batch_size,
                  "test_accuracy": metrics["test_accuracy"], "train_accuracy": metrics["train_accuracy"], **extra},
        seed=cfg.training.seed, config_sha256=config_sha, command=command, device=str(device),
        streamed=pool.streamed, threads=threads)
    clear_state(run_dir)
    return manifest
