"""The training loop shared by every recipe: one phase at a time, resumable at any checkpoint, across phases too.

For a phase, :func:`run_phase` builds the :class:`training.dp.engine.Stepper` from the phase's
:class:`~training.dp.recipe.TrainRecipe`, carries the previous phase's optimizer state, then takes steps: the
batch of local step t comes from the phase's sampler (a pure function of (seed, t)), the noise generator is
reseeded for every global step (:func:`training.dp.rng.seed_noise`), so a resumed run continues
exactly like the uninterrupted one. After every step it logs (TensorBoard + history, with the ε curve of
:class:`training.accounting.RdpCurve`), measures tr(H) every ``training.hessian.every`` global steps, evaluates
test accuracy every ``training.eval_every`` steps, asks the recipe's ``decide`` callback whether to end the phase
early (continual pre-training's switch rules), and every ``checkpoint_every`` steps (and at the end of the
phase) saves the full state: weights, optimizer, noise generator, history, and the recipe's own state.

Secure mode (``privacy.secure_mode``): the DP noise and the batches are drawn directly from the OS CSPRNG
(:mod:`training.dp.csprng`), not from a seeded generator; the other streams (initialisation, probes) use a
secret seed drawn from the OS when the process starts (:func:`training.dp.rng.secret_seed`). Nothing is written
to the config, the manifest or the saved state that could recreate any of it, and the saved state holds no
generator state. A resumed secure run's remaining batches and noise are fresh and independent (what the DP
analysis needs), but the run is not bit-identical to an uninterrupted one — reproducibility and secure mode are
different settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.accel import FP32, Accel
from training.accounting import RdpCurve
from training.run.state import save_state
from training.data import ImageSet
from foundation.errors import TrainingDiverged
from training.dp.engine import Stepper, StepStats, make_stepper
from training.dp.optim import trainable_names
from training.dp.rng import augment_generator, seed_noise
from training.dp.sampling import ShardedSampler
from training.distributed import SINGLE, World, broadcast_object
from training.evaluate import accuracy
from training.hessian import HessianMonitor
from foundation.io import save_safetensors
from training.phases import PhaseSpec, carry_optimizer_state, set_trainable
from foundation.files import INIT_WEIGHTS_FILE

__all__ = ["RunContext", "PhaseResult", "NextPhase", "run_phase", "run_phases", "INIT_WEIGHTS_FILE",
           "check_finite_loss"]



def check_finite_loss(stats: StepStats, *, step: int, phase: str) -> None:
    """Stop a diverged run: a non-empty batch whose loss is not finite (NaN/inf weights or an exploding step).

    Raised before the step's state is saved, so the run directory keeps the last good state.

    Raises:
        TrainingDiverged: the loss is NaN or infinite.
    """
    if stats.batch_size > 0 and not math.isfinite(stats.loss):
        raise TrainingDiverged(
            f"training diverged at step {step} (phase '{phase}'): the loss is {stats.loss} at learning rate "
            f"{stats.lr:g}; lower optim.lr (or check privacy.max_grad_norm and the data), then train again with "
            "--overwrite; any state saved before this step is kept")


@dataclass
class RunContext:
    """Everything the loop needs besides the phases: where to write, how to log, what to measure.

    Attributes:
        run_dir, config_sha: the run directory and the resolved config's sha256 (stored in the state); run_dir
            None: nothing is written (in-memory fine-tuning, :func:`training.recipes.finetune.finetune`).
        seed: the run's effective seed (noise and sampler streams); in secure mode a secret from
            :func:`training.dp.rng.secret_seed`, never saved.
        device: where the model trains.
        logger: a :class:`training.progress.TrainLogger` (None: nothing is logged, tr(H) is not measured).
        physical_batch_size: largest chunk held in memory at once.
        log_every, checkpoint_every, eval_every: intervals in global steps (eval_every 0: never during training).
        test: the test set for ``test/accuracy`` (or None).
        delta: δ for the logged ε curve (None: no DP phase).
        hessian: tr(H) monitor, or None; ``hessian_every``: its interval in global steps (0: off).
        stop_after: stop (state saved) after this many global steps: a simulated interrupt for tests.
        debug_disable_noise: TEST ONLY (see :func:`training.dp.engine.make_stepper`).
        canaries: gradient canaries for the DP phase (at most one DP phase may use them), or None.
        history: logged rows (they go to ``metrics.json``).
        completed: one record per finished phase (index, name, dp, sigma, sample_rate, steps, reason, frozen).
        global_step: steps taken so far, all phases together.
        recipe_state: the recipe's own resumable state (JSON-like values only).
        on_step: called after every step with ``(global step, phase name, stats, model)`` (the model still
            carries Opacus's hooks: read it under ``torch.no_grad()``), or None.
        world: the ranks training together (:mod:`training.distributed`); each takes its share of every
            logical batch. Ranks other than 0 get ``run_dir=None`` and no logger: they write nothing.
        accel: channels-last, precision and compilation of the steps and evaluations (:mod:`training.accel`).
        warn: called with warnings found while training (a failed ``torch.compile``), or None.
    """

    run_dir: Path | None
    config_sha: str
    seed: int
    device: torch.device
    logger: Any
    physical_batch_size: int
    log_every: int
    checkpoint_every: int
    eval_every: int
    test: ImageSet | None
    delta: float | None
    hessian: HessianMonitor | None = None
    hessian_every: int = 0
    stop_after: int | None = None
    debug_disable_noise: bool = False
    canaries: Any = None
    history: list[dict[str, Any]] = field(default_factory=list)
    completed: list[dict[str, Any]] = field(default_factory=list)
    global_step: int = 0
    recipe_state: dict[str, Any] = field(default_factory=dict)
    curve: RdpCurve | None = None
    on_step: Callable[[int, str, StepStats, nn.Module], None] | None = None
    world: World = SINGLE
    accel: Accel = FP32
    warn: Callable[[str], None] | None = None

    def stopped(self) -> bool:
        """True when a simulated interrupt (``stop_after``) is due."""
        return self.stop_after is not None and self.global_step >= self.stop_after

    def dp_done(self) -> list[tuple[float, float, int]]:
        """(σ, q, steps) of the finished DP phases."""
        return [(c["sigma"], c["sample_rate"], c["steps"]) for c in self.completed if c["dp"]]


@dataclass
class PhaseResult:
    """How a phase ended.

    Attributes:
        record: its entry in :attr:`RunContext.completed`.
        optimizer_state: the optimizer's final state; ``names``: its parameters' names, in order.
    """

    record: dict[str, Any]
    optimizer_state: dict[str, Any]
    names: list[str]


@dataclass(frozen=True)
class NextPhase:
    """What a recipe returns for its next phase.

    Attributes:
        spec: the phase.
        prepare: changes the model before the phase starts (a new head, ...); called on resume too, before the
            saved weights are loaded when the run stopped inside this phase.
        decide: ``(local_steps_done, model) -> reason | None``: ends the phase early (switch rules).
        write_init: save the start weights as ``model_init.safetensors``.
    """

    spec: PhaseSpec
    prepare: Callable[[nn.Module], None] | None = None
    decide: Callable[[int, nn.Module], str | None] | None = None
    write_init: bool = False


def _loggable(stats: StepStats) -> StepStats:
    """Stats with None replaced by NaN (a non-DP phase, an empty Poisson batch): the logger skips NaN."""
    nan = float("nan")
    return replace(stats, clipped_fraction=nan if stats.clipped_fraction is None else stats.clipped_fraction,
                   grad_norm_mean=nan if stats.grad_norm_mean is None else stats.grad_norm_mean)


def _clean_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}


def run_phase(ctx: RunContext, spec: PhaseSpec, model: nn.Module, *, phase_index: int, start: int = 0,
              stepper_state: dict[str, Any] | None = None, previous: PhaseResult | None = None,
              decide: Callable[[int, nn.Module], str | None] | None = None,
              write_init: bool = False) -> tuple[PhaseResult, nn.Module]:
    """Run (or continue) one phase and return how it ended and the unwrapped model.

    Args:
        ctx: the run context (its ``global_step``, ``history`` and ``completed`` advance).
        spec: the phase.
        model: the unwrapped model (weights already loaded when resuming).
        phase_index: position of the phase in the recipe (stored in the state).
        start: local steps already taken (resume).
        stepper_state: the saved :meth:`Stepper.state_dict` to resume from (with ``start`` > 0).
        previous: the previous phase's result, whose optimizer state is carried as ``spec.carry`` says.
        decide: ``(local_steps_done, model) -> reason | None``; a reason ends the phase after that step.
        write_init: save the weights at the phase's start as ``model_init.safetensors`` (θ_0 of the white-box
            gradient-canary audit: the start of the first DP phase, or of the run when none is DP).

    Returns:
        ``(PhaseResult, model)`` with Opacus's hooks removed from ``model``.

    Raises:
        KeyboardInterrupt: when ``ctx.stop_after`` global steps are done inside the phase (state saved first);
            at a phase end :func:`run_phases` decides.
    """
    frozen = set_trainable(model, spec.trainable)
    names = trainable_names(model)
    if write_init and start == 0 and ctx.run_dir is not None:
        save_safetensors(ctx.run_dir / INIT_WEIGHTS_FILE, model.state_dict())  # θ_0 of the white-box audit
    generator = torch.Generator(device=ctx.device)
    if ctx.world.distributed:
        from opacus.distributed import DifferentiallyPrivateDistributedDataParallel

        DifferentiallyPrivateDistributedDataParallel(model.to(ctx.device))  # broadcasts rank 0's parameters
    stepper = make_stepper(
        model=model, recipe=spec.train_recipe(physical_batch_size=ctx.physical_batch_size),
        sample_rate=spec.sample_rate, generator=generator, device=ctx.device,
        gradient_canaries=ctx.canaries if spec.dp else None, world=ctx.world, accel=ctx.accel, warn=ctx.warn,
        _debug_disable_noise=ctx.debug_disable_noise and spec.dp)
    augmenting = stepper.recipe.augment.active
    if stepper_state is not None:
        stepper.load_state_dict(stepper_state)
    elif previous is not None and spec.carry != "none":
        stepper.load_optimizer_state(carry_optimizer_state(previous.optimizer_state, previous.names,
                                                           target=stepper.optimizer, target_names=names,
                                                           mode=spec.carry))
    if ctx.global_step == 0 and ctx.hessian is not None and ctx.hessian_every:  # tr(H) at initialisation
        hess = ctx.hessian.measure(model, 0)
        for k, v in hess.items():
            ctx.logger.scalar(f"hessian/{k}", v, 0)
        ctx.history.append({"step": 0, "phase": spec.name, **hess})
    sampler = spec.sampler()
    if ctx.world.distributed:
        sampler = ShardedSampler(sampler, rank=ctx.world.rank, world_size=ctx.world.size,
                                 broadcast=lambda batch: broadcast_object(batch, ctx.world))
    record: dict[str, Any] | None = None
    batches = None
    try:
        batches = spec.batches(sampler, start=start, device=ctx.device)  # in memory or streamed: the same batches
        for local, (xb, yb) in zip(range(start, spec.steps), batches):
            seed_noise(generator, ctx.seed, ctx.global_step)
            stats = stepper.step(xb, yb, augment_generator=augment_generator(ctx.seed, ctx.global_step)
                                 if augmenting else None)
            check_finite_loss(stats, step=ctx.global_step + 1, phase=spec.name)
            done = local + 1
            ctx.global_step += 1
            g = ctx.global_step
            end = decide(done, stepper.base_model) if decide is not None else None
            if decide is not None and ctx.world.distributed:
                end = broadcast_object(end, ctx.world)  # rank 0's switch decision, so the ranks stay together
            if end is not None or done == spec.steps:
                record = {"index": phase_index, "name": spec.name, "dp": spec.dp,
                          "sigma": float(spec.sigma) if spec.dp else None, "sample_rate": spec.sample_rate,
                          "steps": done, "reason": end or "steps", "frozen": frozen,
                          "fallback_layers": stepper.fallback_layers}
            _log_step(ctx, spec, stepper, stats, done=done, force=record is not None)
            if ctx.on_step is not None:
                ctx.on_step(g, spec.name, stats, stepper.base_model)
            if ctx.test is not None and len(ctx.test) and ctx.eval_every and g % ctx.eval_every == 0:
                with ctx.accel.compute(dp=False, device=ctx.device):
                    acc = accuracy(stepper.eval_model, ctx.test, device=ctx.device)
                ctx.logger.scalar("test/accuracy", acc, g)
            if record is not None:
                ctx.completed.append(record)
            if ctx.run_dir is not None and (g % ctx.checkpoint_every == 0 or record is not None or ctx.stopped()):
                save_state(ctx.run_dir, {
                    "step": g, "config_sha256": ctx.config_sha, "phase_index": phase_index, "phase_step": done,
                    "stepper": stepper.state_dict(), "names": names,
                    "model": {k: v.detach().cpu().clone() for k, v in stepper.base_model.state_dict().items()},
                    "history": ctx.history, "completed": ctx.completed, "recipe": ctx.recipe_state})
            if record is not None:
                break
            if ctx.stopped():
                raise KeyboardInterrupt
    finally:
        if batches is not None:
            batches.close()  # a streamed phase's DataLoader workers stop with it
        optimizer_state = stepper.optimizer.state_dict()
        model = stepper.close()
    return PhaseResult(record=record, optimizer_state=optimizer_state, names=names), model


def run_phases(ctx: RunContext, model: nn.Module, next_phase: Callable[[list[dict[str, Any]]], NextPhase | None], *,
               state: dict[str, Any] | None = None) -> nn.Module:
    """Run a recipe's phases in order (``next_phase(completed)`` gives the next one, None when done).

    Args:
        ctx: the run context.
        model: the freshly built model (its weights are replaced by the saved ones when resuming).
        next_phase: the recipe.
        state: saved state (``training.run.state.load_state``) to resume from, or None.

    Returns:
        The trained, unwrapped model.

    Raises:
        KeyboardInterrupt: a simulated interrupt (``ctx.stop_after``), state saved.
    """
    previous: PhaseResult | None = None
    start, stepper_state, weights = 0, None, None
    if state is not None:
        ctx.global_step = int(state["step"])
        ctx.history = list(state["history"])
        ctx.completed = [dict(c) for c in state["completed"]]
        ctx.recipe_state = dict(state["recipe"])
        weights = state["model"]
        if ctx.completed and ctx.completed[-1]["index"] == int(state["phase_index"]):  # stopped at a phase end
            previous = PhaseResult(record=ctx.completed[-1], optimizer_state=state["stepper"]["optimizer"],
                                   names=list(state["names"]))
            ema = state["stepper"].get("ema")
            model.load_state_dict(ema if ema is not None else weights)  # a finished phase's model is its EMA
            weights = None
        else:
            start, stepper_state = int(state["phase_step"]), state["stepper"]
    while True:
        nxt = next_phase(ctx.completed)
        if nxt is None:
            return model
        if ctx.stopped() and weights is None:
            raise KeyboardInterrupt
        if nxt.prepare is not None:
            nxt.prepare(model)
        if weights is not None:
            model.load_state_dict(weights)
            weights = None
        previous, model = run_phase(ctx, nxt.spec, model, phase_index=len(ctx.completed), start=start,
                                    stepper_state=stepper_state, previous=previous, decide=nxt.decide,
                                    write_init=nxt.write_init)
        start, stepper_state = 0, None


def _log_step(ctx: RunContext, spec: PhaseSpec, stepper: Stepper, stats: StepStats, *, done: int,
              force: bool) -> None:
    """TensorBoard scalars + a history row every ``log_every`` global steps, at phase ends and at tr(H) steps."""
    if ctx.logger is None:
        return
    g = ctx.global_step
    hess = None
    if ctx.hessian is not None and ctx.hessian_every and g % ctx.hessian_every == 0:
        hess = ctx.hessian.measure(stepper.base_model, g)
    if not (g % ctx.log_every == 0 or force or hess is not None):
        return
    eps = None
    if spec.dp and ctx.delta is not None:
        if ctx.curve is None:
            ctx.curve = RdpCurve(delta=ctx.delta)
        eps = ctx.curve([*ctx.dp_done(), (float(spec.sigma), spec.sample_rate, done)])
    row = _clean_row(ctx.logger.log(g, _loggable(stats), epsilon=eps))
    row["phase"] = spec.name
    if hess is not None:
        for k, v in hess.items():
            ctx.logger.scalar(f"hessian/{k}", v, g)
        row.update(hess)
    ctx.history.append(row)
