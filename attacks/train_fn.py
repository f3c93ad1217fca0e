"""Reference models trained by the user's own training code: ``train_fn(member_indices, seed) -> model``.

For a run whose model is the user's own class (recorded by :class:`audit.OpacusAuditor`), dp-audit cannot
re-implement the training; the user hands over the function that trained the target instead, and the auditor
calls it once per reference model (:func:`train_reference_models`) with

* ``member_indices``: int64 positions, in the user's dataset (the one wrapped by ``audit.AuditPool``), of the
  examples this reference model must train on (a balanced half of the pool: every example is IN for exactly K/2
  of the K models, as for the recipe's reference models, :func:`attacks.shadows.balanced_keep_masks`);
* ``seed``: a non-negative int for the model's own randomness (:func:`attacks.shadows.shadow_seeds`).

It must return the trained ``torch.nn.Module`` (Opacus's ``GradSampleModule`` and DDP wrappers are unwrapped):
the same class as the target, so its weights have the target's names and shapes, taking the pool's inputs as
recorded in ``pool.npz`` and returning ``(N, num_classes)`` logits. Returned in eval mode or not, the auditor puts
it in eval mode before querying it (:func:`check_returned`); anything else is refused in one line
(:class:`~foundation.errors.UserError`).

Each model's scaled logits on the pool are computed where it was trained (:func:`train_one`: the task keeps the
model; only its signals, predictions and weights come back). The first task also loads the target's verified
weights into a model of the user's class and scores the target, so no model class is ever rebuilt by dp-audit.

Executors: ``sequential`` (in this process, one model after another) and ``ray`` (one Ray task per model: Ray
ships ``train_fn`` to its workers with cloudpickle; the function is the user's own code in the user's own
process, so nothing foreign is unpickled). The ``batched`` executor trains dp-audit's own recipes many at a time
(torch.func); a user's ``train_fn`` is opaque code that trains one model per call, so it cannot be batched.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.signals import AugmentationSpec, iter_augmentations, scaled_logit
from foundation.errors import UserError
from training.models.build import unwrap_model

__all__ = ["Shared", "Trained", "check_returned", "pool_signals", "train_one", "train_reference_models",
           "EXECUTORS"]

#: executors that can run a user's train_fn
EXECUTORS = ("sequential", "ray")


@dataclasses.dataclass(frozen=True, eq=False)
class Shared:
    """What every task receives once: the user's function, the pool, the queries and the target's weights."""

    train_fn: Callable[[np.ndarray, int], Any]
    x: np.ndarray
    y: np.ndarray
    spec: AugmentationSpec
    target_state: Mapping[str, np.ndarray]
    num_classes: int
    batch_size: int = 512


@dataclasses.dataclass(frozen=True, eq=False)
class Trained:
    """One reference model's results: signals ``(n, A)`` on the pool, its weights, and (first task) the target's
    signals and predicted labels."""

    k: int
    phi: np.ndarray
    state: dict[str, np.ndarray]
    seconds: float
    target_phi: np.ndarray | None = None
    target_pred: np.ndarray | None = None


def check_returned(value: Any, *, k: int, target_state: Mapping[str, np.ndarray]) -> nn.Module:
    """The module ``train_fn`` returned for reference model ``k``, unwrapped and in eval mode; a one-line
    :class:`UserError` for anything else (None, a tuple, an optimizer, a state dict, another architecture).

    >>> check_returned(None, k=0, target_state={})
    Traceback (most recent call last):
    ...
    foundation.errors.UserError: train_fn returned None for reference model 0: it must return the trained torch.nn.Module (did the function forget 'return model'?)
    """
    where = f"for reference model {k}"
    if value is None:
        raise UserError(f"train_fn returned None {where}: it must return the trained torch.nn.Module (did the "
                        f"function forget 'return model'?)")
    if isinstance(value, tuple) and any(isinstance(v, nn.Module) for v in value):
        raise UserError(f"train_fn returned a tuple {where}: return only the trained torch.nn.Module, not "
                        f"({', '.join(type(v).__name__ for v in value)})")
    if isinstance(value, Mapping):
        raise UserError(f"train_fn returned a mapping (a state_dict?) {where}: return the trained torch.nn.Module "
                        f"itself")
    if not isinstance(value, nn.Module):
        raise UserError(f"train_fn returned a {type(value).__name__} {where}: it must return the trained "
                        f"torch.nn.Module")
    module = unwrap_model(value)
    have = {n: tuple(t.shape) for n, t in module.state_dict().items()}
    want = {n: tuple(a.shape) for n, a in target_state.items()}
    if have != want:
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        shape = sorted(n for n in set(have) & set(want) if have[n] != want[n])
        what = (f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}, which the target lacks" if extra
                else f"has {shape[0]!r} of shape {have[shape[0]]}, the target {want[shape[0]]}")
        raise UserError(f"train_fn returned a {type(module).__name__} {where} whose weights do not match the "
                        f"target's model.safetensors (it {what}): it must build the model class that trained the "
                        f"target")
    return module.eval()


@torch.no_grad()
def pool_signals(model: nn.Module, x: np.ndarray, y: np.ndarray, *, spec: AugmentationSpec, num_classes: int,
                 batch_size: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Scaled logits ``(n, A)`` of ``model`` on every augmented query of the pool, and its predicted labels
    ``(n,)`` (identity query), in eval mode on the device of the model's first parameter. Inputs of any shape
    for the identity query alone; flips and shifts need images ``(n, C, H, W)``.

    Raises:
        UserError: the model's output is not ``(batch, num_classes)`` logits, or is not finite.
    """
    first = next(iter(model.parameters()), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None and torch.is_floating_point(first) else torch.float32
    n = len(y)
    phi = np.empty((n, spec.n_augmentations), dtype=np.float32)
    pred = np.empty(n, dtype=np.int64)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, n, batch_size):
            xb = torch.from_numpy(np.ascontiguousarray(x[start:start + batch_size])).to(device, dtype)
            yb = torch.from_numpy(np.asarray(y[start:start + batch_size], dtype=np.int64)).to(device)
            queries = iter_augmentations(xb, spec) if spec.n_augmentations > 1 else iter([xb])
            for a, xa in enumerate(queries):
                out = model(xa.contiguous())
                if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(yb), num_classes):
                    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    raise UserError(f"the model train_fn returned gives {got} for a batch of {len(yb)} pool "
                                    f"inputs; it must return ({len(yb)}, {num_classes}) logits")
                if not torch.isfinite(out).all():
                    raise UserError("the model train_fn returned gives non-finite logits on the pool (diverged "
                                    "training?); lower its learning rate")
                phi[start:start + len(yb), a] = scaled_logit(out.float(), yb).cpu().numpy()
                if a == 0:
                    pred[start:start + len(yb)] = out.argmax(dim=1).cpu().numpy()
    finally:
        model.train(was_training)
    return phi, pred


def train_one(task: tuple[int, np.ndarray, int, bool], shared: Shared) -> Trained:
    """Train reference model ``k`` with the user's function, score it on the pool and (``with_target``) score the
    target too, its verified weights loaded into a model of the user's class. Runs in this process or a Ray task."""
    k, members, seed, with_target = task
    t0 = time.perf_counter()
    module = check_returned(shared.train_fn(np.array(members, dtype=np.int64), int(seed)), k=k,
                            target_state=shared.target_state)
    phi, _ = pool_signals(module, shared.x, shared.y, spec=shared.spec, num_classes=shared.num_classes,
                          batch_size=shared.batch_size)
    state = {n: t.detach().cpu().numpy().copy() for n, t in module.state_dict().items()}
    seconds = time.perf_counter() - t0
    target_phi = target_pred = None
    if with_target:
        device = next((p.device for p in module.parameters()), torch.device("cpu"))
        module.load_state_dict({n: torch.from_numpy(np.array(a)).to(device) for n, a in shared.target_state.items()},
                               strict=True)
        target_phi, target_pred = pool_signals(module, shared.x, shared.y, spec=shared.spec,
                                               num_classes=shared.num_classes, batch_size=shared.batch_size)
    return Trained(k=k, phi=phi, state=state, seconds=seconds, target_phi=target_phi, target_pred=target_pred)


def train_reference_models(*, shared: Shared, keep: np.ndarray, seeds: Sequence[int], executor: str,
                           ray: Any = None, todo: Sequence[int] | None = None, score_target: bool = True,
                           on_done: Callable[[int], None] | None = None,
                           on_model: Callable[[Trained], None] | None = None) -> list[Trained]:
    """Train the reference models ``keep`` describes with ``shared.train_fn``; the first also scores the target.

    Args:
        shared: the function, the pool and the target's weights.
        keep: ``(K, n)`` keep masks; model k gets ``np.flatnonzero(keep[k])`` as ``member_indices``.
        seeds: K seeds, model k gets ``seeds[k]``.
        executor: ``sequential`` or ``ray`` (:data:`EXECUTORS`).
        ray: an open :class:`attacks.ray_farm.RaySession` for ``ray``.
        todo: the models to train (default: all K), in order.
        score_target: the first model of ``todo`` also scores the target.
        on_done: called with the number of models finished so far.
        on_model: called with each finished model as it comes back (sequential: before the next one starts; Ray:
            as each task returns), so a caller can keep it even when a later model fails.

    Returns:
        One :class:`Trained` per model of ``todo``, in its order.

    Raises:
        UserError: an executor that cannot run a train_fn, or what :func:`check_returned` and
            :func:`pool_signals` refuse.
    """
    if executor not in EXECUTORS:
        raise UserError(f"attack.executor {executor!r} cannot run a train_fn: 'batched' and 'processes' train "
                        f"dp-audit's own recipes; your train_fn trains one model per call, so use 'sequential' "
                        f"(default) or 'ray'")
    order = list(range(len(keep))) if todo is None else [int(k) for k in todo]
    tasks = [(k, np.flatnonzero(keep[k]).astype(np.int64), int(seeds[k]), score_target and i == 0)
             for i, k in enumerate(order)]
    if executor == "ray":
        done = [0]

        def tick(_position: int) -> None:
            done[0] += 1
            if on_done is not None:
                on_done(done[0])

        return list(ray.run(train_one, tasks, shared=shared, on_done=tick,
                            on_result=None if on_model is None else (lambda _i, t: on_model(t))))
    out = []
    for task in tasks:
        out.append(train_one(task, shared))
        if on_model is not None:
            on_model(out[-1])
        if on_done is not None:
            on_done(len(out))
    return out
