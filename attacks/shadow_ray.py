"""The ``ray`` executor of reference models: tasks on a local Ray or a cluster (:mod:`attacks.ray_farm`).

Everything that decides the result is fixed before the first task starts: the keep masks, the per-model
seeds and the recipe (hash) are in ``shadows/index.json`` already (:func:`attacks.shadows.prepare_shadows`), and
each task receives its models' indices only, so the weights do not depend on which task ran where or when.

A task trains either a batch of models with :func:`training.dp.batched.train_many` (when the batched trainer
can follow the recipe: small models; the models are spread evenly over the cluster's task slots) or one model
with the regular trainer (any recipe; that model's resumable state survives a killed task). It writes each
model into ``shadows/.staging/<k>/`` and, once the model's manifest is written, renames it to ``shadows/<k>/``:
a ``shadows/<k>/`` directory is always complete. A model already in place is never trained again (a re-run,
or a retried task whose first attempt got that far). ``shadows/`` must be on a file system every Ray node
sees (a shared mount) when the cluster has more than one machine; the trainer tasks also read the dataset
from the recipe's data root on the node.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attacks.ray_farm import RayOptions, ray_session
from attacks.recipe import ShadowRecipe
from training.data import ImageSet
from training.run import is_complete
from foundation.files import STAGING_DIR

__all__ = ["STAGING_DIR", "plan_tasks", "publish", "train_on_ray"]



def plan_tasks(todo: Sequence[int], *, kind: str, slots: int, models_per_task: int | None) -> list[list[int]]:
    """Split the models to train into tasks: one model each for the trainer, even batches for batched.

    >>> plan_tasks([0, 1, 2, 3, 4], kind="batched", slots=2, models_per_task=None)
    [[0, 1, 2], [3, 4]]
    >>> plan_tasks([5, 7], kind="sequential", slots=8, models_per_task=None)
    [[5], [7]]
    """
    todo = list(todo)
    if kind != "batched":
        return [[k] for k in todo]
    size = models_per_task or max(1, math.ceil(len(todo) / max(1, slots)))
    return [todo[i:i + size] for i in range(0, len(todo), size)]


def publish(staged: Path, final: Path) -> None:
    """Move a complete model directory into place (a rename on one file system: never half there)."""
    if is_complete(final):  # an earlier attempt of this task already moved it
        shutil.rmtree(staged, ignore_errors=True)
        return
    if final.exists():  # an incomplete directory left by an interrupted in-process run
        shutil.rmtree(final)
    os.replace(staged, final)


def _task(task: dict[str, Any], shared: dict[str, Any]) -> list[int]:
    """One Ray task: train ``task["models"]`` into the staging directory, then move each into place."""
    import ray
    import torch

    from attacks.shadow_train import train_shadow_models
    from training.device import resolve_device
    from training.threads import ThreadBudget

    root = Path(shared["root"])
    staging = root / STAGING_DIR
    staging.mkdir(parents=True, exist_ok=True)
    todo = [k for k in task["models"] if not is_complete(root / str(k))]
    for k in todo:
        mine, left = staging / str(k), root / str(k)
        if task["kind"] == "batched":  # no resumable state: start the batch afresh
            shutil.rmtree(mine, ignore_errors=True)
        elif left.exists() and not mine.exists():  # resume what an interrupted in-process run left
            os.replace(left, mine)
    device = resolve_device("auto") if ray.get_gpu_ids() else torch.device("cpu")
    train_shadow_models(recipe=shared["recipe"], pool=shared["pool"], test=shared["test"], keep=shared["keep"],
                        seeds=shared["seeds"], todo=todo, root=root, target_name=shared["target_name"],
                        executor=task["kind"], device=device, max_models_per_batch=None,
                        trust_code=shared["trust_code"], staging=staging,
                        threads=ThreadBudget(role="ray_task", task_cpus=task["cpus"]))
    for k in todo:
        publish(staging / str(k), root / str(k))
    return list(task["models"])


def train_on_ray(*, recipe: ShadowRecipe, pool: ImageSet, test: ImageSet | None, keep: np.ndarray,
                 seeds: Sequence[int], todo: Sequence[int], root: Path, target_name: str, kind: str,
                 options: RayOptions, models_per_task: int | None = None, trust_code: bool = False,
                 on_done: Callable[[int], None] | None = None, show_progress: bool = False) -> None:
    """Train the reference models ``todo`` as Ray tasks into ``root/<k>/`` (arguments as
    :func:`attacks.shadow_train.train_shadow_models`; ``kind`` is ``batched`` or ``sequential``: how each task
    trains its models)."""
    root = Path(root).resolve()
    with ray_session(options) as session:
        groups = plan_tasks(todo, kind=kind, slots=session.slots, models_per_task=models_per_task)
        tasks = [{"models": g, "kind": kind, "cpus": options.cpus_per_task} for g in groups]
        shared = session.put({"recipe": recipe, "pool": pool, "test": test, "keep": keep, "seeds": list(seeds),
                              "root": str(root), "target_name": target_name, "trust_code": trust_code})
        bar = _bar(len(tasks)) if show_progress else None
        finished = {"tasks": 0, "models": 0}

        def done(i: int) -> None:
            finished["tasks"] += 1
            finished["models"] += len(groups[i])
            if bar is not None:
                bar[0].update(bar[1], completed=finished["tasks"])
            if on_done is not None:
                on_done(finished["models"])

        try:
            session.run(_task, tasks, shared=shared, on_done=done)
        finally:
            if bar is not None:
                bar[0].stop()
    staging = root / STAGING_DIR
    if staging.is_dir() and not any(staging.iterdir()):
        staging.rmdir()


def _bar(total: int) -> tuple[Any, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn("[bold]reference models (ray tasks)"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), transient=False)
    progress.start()
    return progress, progress.add_task("ray", total=total)
