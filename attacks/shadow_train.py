"""Train reference (shadow) models with a target's recipe: batched, sequential, in worker processes, or on Ray.

Executors:

- ``batched``: all models at once with :func:`training.dp.batched.train_many` (``torch.func`` ``vmap`` over stacked
  parameters, per-model data masks, per-model DP-SGD clipping and noise). Only for recipes that
  :func:`attacks.recipe.batched_unsupported` accepts (small models, flat clipping, one phase).
- ``sequential``: :func:`training.trainer.train` once per model, with ``membership=keep[k]``.
- ``processes``: the same trainer in ``attack.workers`` worker processes at once (default 4) on this machine,
  sharing its GPU: for models too small to keep a GPU busy from one process.
- ``ray``: tasks on a local or remote Ray (:mod:`attacks.shadow_ray`): each task trains a batch of models
  (when batched can follow the recipe) or one model with the trainer, and moves its finished ``<k>/`` into place.
- ``auto``: batched when the recipe allows it, else sequential.

Every model becomes a normal run directory (weights, ``manifest.json``, ``membership.npy``, ``config.yaml``,
``metrics.json``): the regular trainer writes its own; for batched models :func:`write_batched_run` writes the
same files with the same manifest schema.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from attacks.recipe import ShadowRecipe, batched_unsupported, model_factory, shadow_config
from training.config import TrainConfig, dump_config
from training.data import ImageSet, to_float_tensor
from foundation.errors import ConfigError
from training.evaluate import accuracy
from training.models import build_model, count_parameters
from training.run.manifest import Manifest
from training.run.writer import phase_record, privacy_record, write_run
from training.threads import ThreadBudget, model_work, using_threads

__all__ = ["Executor", "resolve_executor", "train_shadow_models", "write_batched_run"]

Executor = Literal["auto", "batched", "sequential", "processes", "ray"]
EXECUTORS: tuple[str, ...] = ("auto", "batched", "sequential", "processes", "ray")
#: worker processes of the ``processes`` executor when ``attack.workers`` is not set
DEFAULT_PROCESSES = 4


def resolve_executor(requested: str, *, recipe: ShadowRecipe, num_classes: int,
                     input_shape: tuple[int, int, int], streamed: bool = False) -> str:
    """The executor that will train the models (``auto`` resolved; a pool that streams from disk,
    :mod:`training.data.stream`, is not copied into memory by ``auto``: the trainer streams it per model).

    Raises:
        ConfigError: ``batched`` was asked for a recipe it cannot follow (the message says why), or an
            unknown executor name.
    """
    if requested not in EXECUTORS:
        raise ConfigError(f"attack.executor must be one of {', '.join(EXECUTORS)}; got {requested!r}")
    if requested in ("sequential", "processes", "ray") or (requested == "auto" and streamed):
        return "sequential" if requested == "auto" else requested
    reason = batched_unsupported(recipe, num_classes=num_classes, input_shape=input_shape)
    if requested == "batched" and reason is not None:
        raise ConfigError(f"attack.executor=batched cannot train these reference models: {reason}; "
                          f"use --executor sequential, processes or ray")
    return "batched" if reason is None else "sequential"


def write_batched_run(run_dir: Path, *, cfg: TrainConfig, recipe: ShadowRecipe, state: dict[str, torch.Tensor],
                      mask: np.ndarray, pool: ImageSet, test: ImageSet | None, target_name: str,
                      wall_seconds: float, device: torch.device, threads: dict[str, Any] | None = None) -> Manifest:
    """Write one batched-trained reference model as a run directory (the trainer's files and manifest schema).

    The manifest's privacy section records the DP-SGD phase the model went through (sigma, its own sample
    rate ``B / n_k``, steps, C); a reference model makes no privacy claim of its own, so ``epsilon`` is None.
    ``manifest.json`` is written last: its presence marks the directory complete. ``threads``: the torch threads
    the batch trained with and why (:meth:`training.threads.ThreadPlan.record`).
    """
    num_classes, input_shape = len(pool.classes), (3, *pool.x.shape[1:3])
    built = build_model(cfg.model, num_classes=num_classes, input_shape=input_shape)
    module = built.module
    module.load_state_dict(state, strict=True)
    module.to(device)
    members = pool.subset(np.flatnonzero(mask))
    metrics = {"test_accuracy": accuracy(module, test, device=device),
               "train_accuracy": accuracy(module, members, device=device), "steps": recipe.steps,
               "epsilon_spent": None, "final_loss": None, "wall_seconds": wall_seconds, "history": [],
               "trainer": "batched (training.dp.batched.train_many)"}
    pc, optim = cfg.privacy, cfg.optim
    phase = phase_record(
        name="private" if recipe.dp else "non-private", dp=recipe.dp, dataset=cfg.data.dataset,
        noise_multiplier=recipe.noise_multiplier, sample_rate=min(1.0, recipe.batch_size / int(mask.sum())),
        steps=recipe.steps, batch_size=recipe.batch_size, sampling=pc.sampling, max_grad_norm=recipe.max_grad_norm,
        clipping="flat", grad_sample_mode="functorch (batched)", optimizer=optim.name, lr=optim.lr,
        frozen=built.frozen)
    privacy = privacy_record(phases=[phase], delta=recipe.delta, notes=[
        f"reference model for auditing {target_name!r}: trained with the target's recipe on a keep mask; it makes "
        f"no privacy claim of its own"])
    return write_run(
        run_dir, run_name=cfg.name, model=cfg.model, module=module, num_classes=num_classes, input_shape=input_shape,
        frozen=built.frozen, notes=built.notes, membership=mask, membership_scheme="explicit", data=cfg.data,
        pool_fingerprint=pool.fingerprint(), privacy=privacy, metrics=metrics,
        training={"recipe": cfg.training.recipe, "optimizer": optim.model_dump(mode="json"), "steps": recipe.steps,
                  "batch_size": recipe.batch_size, "test_accuracy": metrics["test_accuracy"],
                  "train_accuracy": metrics["train_accuracy"], "trainer": "batched"},
        seed=cfg.training.seed, config_text=dump_config(cfg),
        command=f"audit attack (reference model of {target_name}, batched)", device=str(device), threads=threads)


def _train_batched(*, recipe: ShadowRecipe, pool: ImageSet, test: ImageSet | None, keep: np.ndarray,
                   seeds: Sequence[int], todo: Sequence[int], root: Path, out: Path, target_name: str,
                   device: torch.device, max_models_per_batch: int | None, threads: ThreadBudget) -> None:
    from training.dp.batched import train_many

    cfg = recipe.config
    input_shape = (3, *pool.x.shape[1:3])
    factory = model_factory(cfg.model, num_classes=len(pool.classes), input_shape=input_shape)
    at_once = min(len(todo), max_models_per_batch or len(todo))
    plan = threads.plan(work=model_work(params=count_parameters(factory())[0], input_shape=input_shape,
                                        models=at_once))
    with using_threads(plan):
        t0 = time.perf_counter()
        states = train_many(
            model_factory=factory, x=to_float_tensor(pool.x),
            y=torch.as_tensor(np.array(pool.y), dtype=torch.int64), masks=keep[list(todo)],
            seeds=[seeds[k] for k in todo], recipe=recipe.train, device=device, executor="auto",
            max_models_per_batch=max_models_per_batch)
        share = (time.perf_counter() - t0) / max(1, len(todo))
        for k, state in zip(todo, states):
            scfg = shadow_config(recipe, name=f"{target_name}-ref{k}", seed=seeds[k], output_dir=str(root))
            write_batched_run(out / str(k), cfg=scfg, recipe=recipe, state=state, mask=keep[k], pool=pool,
                              test=test, target_name=target_name, wall_seconds=share, device=device,
                              threads=plan.record())


def _train_with_trainer(task: dict[str, Any]) -> str:
    """Train one reference model with the regular trainer (resuming its directory's saved state, if any)."""
    from training.trainer import train

    cfg = TrainConfig.model_validate(task["config"])
    train(cfg, run_dir=task["run_dir"], membership=np.asarray(task["mask"], dtype=bool), progress=False,
          resume=True, command=task["command"], trust_code=bool(task.get("trust_code", False)),
          canary_package=task.get("canary_package"), threads=task.get("threads"))
    return task["run_dir"]


def train_shadow_models(*, recipe: ShadowRecipe, pool: ImageSet, test: ImageSet | None, keep: np.ndarray,
                        seeds: Sequence[int], todo: Sequence[int], root: Path, target_name: str, executor: str,
                        device: torch.device | str = "cpu", max_models_per_batch: int | None = None,
                        on_done: Callable[[int], None] | None = None, trust_code: bool = False,
                        staging: Path | None = None, ray: Any = None, show_progress: bool = False,
                        canary_package: Path | None = None, threads: ThreadBudget | None = None,
                        workers: int | None = None) -> None:
    """Train the reference models ``todo`` (indices into ``keep``/``seeds``) into ``root/<k>/``.

    Args:
        recipe: the target's recipe.
        pool, test: the target's pool (what ``keep`` indexes) and test set (for accuracy metrics).
        keep: ``(K, n)`` keep masks; model k trains on ``keep[k]``.
        seeds: K seeds; model k's initialisation, batches and noise follow ``seeds[k]``.
        todo: which models to train.
        root: the shadow directory; model k goes to ``root/str(k)``.
        target_name: the target run's name (recorded in each model's manifest).
        executor: ``batched``, ``sequential`` or ``ray`` (resolve ``auto`` first).
        device: where to train (``ray``: each task trains on the GPU Ray gave it, else on CPU).
        max_models_per_batch: most models stacked in one batched step (None: as many as fit; ``ray``: models
            per task, None: the models spread evenly over the cluster's task slots).
        on_done: called with the number of models finished after each one (sequential, ray) or at the end.
        trust_code: let the regular trainer import an import-path ``model.arch`` of the recipe (the batched
            trainer takes registered architectures only, so it never imports anything).
        staging: write model k to ``staging/<k>`` instead of ``root/<k>`` (the Ray tasks' private directories,
            moved into place once complete); configs still name ``root``.
        ray: :class:`attacks.ray_farm.RayOptions` for ``ray`` (None: a local Ray on all cores).
        show_progress: ``ray``: a progress bar over the tasks.
        canary_package: the target's copy of an auditor's canary package (the regular trainer rebuilds the pool
            from it, not from the path in the target's config).
        threads: where this process runs, for its torch thread count (:mod:`training.threads`): a Ray task
            passes its reserved CPUs; None: one process on this machine's cores.
    """
    todo = list(todo)
    if not todo:
        return
    out = root if staging is None else staging
    if executor == "ray":
        from attacks.ray_farm import RayOptions
        from attacks.shadow_ray import train_on_ray

        kind = "batched" if batched_unsupported(recipe, num_classes=len(pool.classes),
                                                input_shape=(3, *pool.x.shape[1:3])) is None else "sequential"
        train_on_ray(recipe=recipe, pool=pool, test=test, keep=keep, seeds=seeds, todo=todo, root=root,
                     target_name=target_name, kind=kind, options=ray or RayOptions(),
                     models_per_task=max_models_per_batch, trust_code=trust_code, on_done=on_done,
                     show_progress=show_progress)
        return
    device = torch.device(device)
    if executor == "batched":
        _train_batched(recipe=recipe, pool=pool, test=test, keep=keep, seeds=seeds, todo=todo, root=root, out=out,
                       target_name=target_name, device=device, max_models_per_batch=max_models_per_batch,
                       threads=threads or ThreadBudget())
        if on_done is not None:
            on_done(len(todo))
        return
    if executor not in ("sequential", "processes"):
        raise ValueError(f"executor must be 'batched', 'sequential', 'processes' or 'ray'; got {executor!r}")
    n_proc = min(len(todo), workers or DEFAULT_PROCESSES) if executor == "processes" else 1
    if n_proc > 1:
        threads = ThreadBudget(role="rank", processes=n_proc)  # the cores shared by the worker processes

    def task(k: int) -> dict[str, Any]:
        cfg = shadow_config(recipe, name=f"{target_name}-ref{k}", seed=seeds[k], output_dir=str(root))
        return {"config": cfg.model_dump(mode="json"), "run_dir": str(out / str(k)), "mask": keep[k].tolist(),
                "trust_code": trust_code, "canary_package": None if canary_package is None else str(canary_package),
                "threads": threads, "command": f"audit attack (reference model of {target_name}, {executor})"}

    if n_proc == 1:
        for i, k in enumerate(todo, 1):
            _train_with_trainer(task(k))
            if on_done is not None:
                on_done(i)
        return
    _train_in_processes([task(k) for k in todo], n_proc, on_done)


def _train_in_processes(tasks: list[dict[str, Any]], n_proc: int, on_done: Callable[[int], None] | None) -> None:
    """The ``processes`` executor: ``n_proc`` worker processes (spawned: safe with CUDA) share this machine and
    its GPU, each training one model at a time with the regular trainer; several small models keep a GPU busier
    than one process can. The first failure stops the rest and is raised."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

    with ProcessPoolExecutor(n_proc, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(_train_with_trainer, t) for t in tasks]
        done_count = 0
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for f in done:
                f.result()  # raises the worker's error
                done_count += 1
                if on_done is not None:
                    on_done(done_count)
