"""White-box one-run audit of a training script built on Opacus's ``PrivacyEngine`` (a script we did not write).

A user adds a few lines to an existing script::

    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(module=model, optimizer=optimizer, data_loader=loader, ...)
    auditor = audit.OpacusAuditor(optimizer, engine, loader, run_dir="results/my-run", gradient_canaries=1000)
    ...train as before...
    auditor.finish(model)

and ``audit epsilon results/my-run`` / ``audit report results/my-run`` then work as on a run made by ``audit train``.
Built on an :class:`audit.AuditPool` (``DataLoader(audit.AuditPool(train, seed=0), ...)``: each example a member with
probability 1/2, recorded), the run can also be attacked with LiRA and RMIA: ``audit.attack(run_dir,
train_fn=train_fn)``, where ``train_fn(member_indices, seed)`` is the user's own training code returning one
reference model (:mod:`attacks.train_fn_runner`).

How (Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023, §5): m random unit
directions u_i over the trainable parameters (:class:`training.dp.canaries.GradientCanaries`, the generator
``audit train`` uses), each *included* with probability 1/2 (recorded). Opacus's ``DPOptimizer.pre_step`` clips
and accumulates the per-sample gradients into ``p.summed_grad``, then calls ``add_noise`` once per logical step
(virtual steps of ``BatchMemoryManager`` return before it). The auditor wraps that one method of the user's
optimizer instance: before the noise, every included canary that is Poisson-sampled at this step with the
accountant's own rate q adds C·u_i (C = the optimizer's current clipping norm) to the clipped sum. An included
canary is therefore exactly one more example whose clipped gradient is C·u_i, so the engine's (ε, δ) covers
it and the claim stays valid; excluded canaries are never added. The score −⟨θ_T − θ_0, u_i⟩ is higher for
members (θ_0 is snapshotted when the auditor attaches).

What the auditor handles, and what it refuses (with a one-line :class:`ValueError`/:class:`TypeError`):

* Poisson sampling (``make_private(poisson_sampling=True)``, Opacus's default): recorded as ``poisson``. A plain
  shuffling loader is accepted and recorded as ``shuffle`` with a note that the ε is then not a proven guarantee
  (Opacus accounts it as if it were Poisson).
* ``BatchMemoryManager``: handled (canaries join once per logical step, when the noise is added).
* Ghost clipping (``grad_sample_mode="ghost"``, ``DPOptimizerFastGradientClipping``): handled, its ``add_noise``
  reads the same clipped sum. Per-layer clipping: each canary is clipped per parameter to that layer's norm,
  as one example's gradient would be. ``AdaClipDPOptimizer``: the canary follows the current clipping norm.
* DPDDP (``DistributedDPOptimizer`` and its ghost variant): canaries join on rank 0 only (where Opacus adds
  the noise), so each enters the all-reduced sum once; only rank 0 writes the run directory.
* Refused: ``DistributedPerLayerOptimizer`` (noise is added per parameter inside backward hooks, before the
  whole clipped sum exists) and FSDP; an optimizer that is not a ``DPOptimizer``; an optimizer without the
  engine's accountant hook; an engine that already took steps (θ_0 would not be the start of training).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from audit.integrations.audit_pool import find_pool
from audit.integrations.canary_dataset import CanaryDataset
from training.dp.canaries import GradientCanaries
from training.models.build import unwrap_model
from training.pool import draw_membership
from training.run.manifest import Manifest

__all__ = ["OpacusAuditor", "AuditedRun", "unwrap_model"]


@dataclasses.dataclass(frozen=True)
class AuditedRun:
    """What :meth:`OpacusAuditor.finish` wrote: the run directory and its manifest."""

    run_dir: Path
    manifest: Manifest

    @property
    def claimed_epsilon(self) -> float:
        return self.manifest.privacy.claimed_epsilon


def _check_optimizer(optimizer: Any) -> str:
    """The clipping style of an Opacus optimizer the auditor can attach to; refuses the others."""
    from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer

    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(f"optimizer must be the DPOptimizer returned by PrivacyEngine.make_private, got "
                        f"{type(optimizer).__name__}")
    name = type(optimizer).__name__
    if name == "DistributedPerLayerOptimizer":
        raise ValueError("DPDDP with per-layer clipping (DistributedPerLayerOptimizer) is not supported: Opacus adds "
                         "its noise per parameter inside backward hooks, before the clipped sum a canary joins "
                         "exists; use clipping='flat' with DPDDP")
    if "FSDP" in name:
        raise ValueError(f"{name} (FSDP) is not supported: its clipped sum is sharded across ranks; use DPDDP")
    if getattr(optimizer, "step_hook", None) is None:
        raise ValueError("the optimizer has no accountant hook: pass the optimizer returned by "
                         "PrivacyEngine.make_private (the engine's accountant counts its steps)")
    if isinstance(optimizer, DPPerLayerOptimizer):
        return "per_layer"
    return "adaptive" if name == "AdaClipDPOptimizer" else "flat"


def _hook_sample_rate(optimizer: Any) -> float | None:
    """The sample rate the engine's accountant hook was created with (Opacus's ``get_optimizer_hook_fn``)."""
    try:
        value = inspect.getclosurevars(optimizer.step_hook).nonlocals.get("sample_rate")
    except (TypeError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


class OpacusAuditor:
    """Attach white-box gradient canaries (and record input canaries) to a user's Opacus training.

    Args:
        optimizer: the ``DPOptimizer`` returned by ``PrivacyEngine.make_private``.
        engine: the ``PrivacyEngine`` (its accountant makes the claim).
        data_loader: the data loader returned by ``make_private`` (q = 1/len(loader), as Opacus accounts it;
            a ``DPDataLoader`` means Poisson sampling).
        run_dir: the run directory :meth:`finish` writes.
        gradient_canaries: m, the number of gradient canaries (0: none; ≥ 2 for an audit).
        input_canaries: the :class:`~audit.integrations.canary_dataset.CanaryDataset` the loader was built on, or None.
            A loader built on an :class:`~audit.integrations.audit_pool.AuditPool` (alone or inside the
            ``CanaryDataset``) is found and recorded, so ``audit.attack(run, train_fn=...)`` can attack the run.
        seed: seed of the canary directions, inclusion and sampling; None draws one from the OS (recorded).
        delta: δ of the claim; default the engine-independent convention of ``audit train`` for the dataset size.
        claimed_epsilon: the ε the user claims; None: the engine accountant's ``get_epsilon(delta)`` at :meth:`finish`.
        run_name: name recorded in the manifest (default: the directory's name).
        dataset: name of the user's dataset, for the record.
        arch: a registered architecture name when the model is one (lets auditors rebuild it); default: the
            user's class name, recorded as not rebuildable.

    Raises:
        TypeError, ValueError: an argument the auditor cannot work with (the message says which and why).
    """

    def __init__(self, optimizer: Any, engine: Any, data_loader: Any, *, run_dir: str | Path,
                 gradient_canaries: int = 1000, input_canaries: CanaryDataset | None = None,
                 seed: int | None = None, delta: float | None = None, claimed_epsilon: float | None = None,
                 run_name: str | None = None, dataset: str = "user", arch: str | None = None) -> None:
        from opacus.data_loader import DPDataLoader

        self.clipping = _check_optimizer(optimizer)
        accountant = getattr(engine, "accountant", None)
        if accountant is None or not hasattr(accountant, "history"):
            raise TypeError(f"engine must be the opacus PrivacyEngine that made the optimizer, got "
                            f"{type(engine).__name__}")
        if accountant.history:
            raise ValueError("the engine's accountant already counts training steps: attach the auditor right after "
                             "make_private, before the first optimizer.step() (θ_0 must be the start of training)")
        if isinstance(gradient_canaries, bool) or not isinstance(gradient_canaries, (int, np.integer)) \
                or gradient_canaries < 0 or gradient_canaries == 1:
            raise ValueError(f"gradient_canaries must be 0 or an integer >= 2, got {gradient_canaries!r}")
        if input_canaries is not None and not isinstance(input_canaries, CanaryDataset):
            raise TypeError("input_canaries must be the audit.CanaryDataset the data loader was built on")
        if gradient_canaries == 0 and input_canaries is None:
            raise ValueError("nothing to audit: pass gradient_canaries >= 2 and/or input_canaries")
        if claimed_epsilon is not None and not (math.isfinite(claimed_epsilon) and claimed_epsilon > 0):
            raise ValueError(f"claimed_epsilon must be a finite number > 0, got {claimed_epsilon!r}")
        try:
            n_batches = len(data_loader)
        except TypeError:
            raise TypeError("data_loader must be the DataLoader returned by make_private (it needs a length)") from None
        if n_batches < 1:
            raise ValueError("data_loader is empty")
        self.sample_rate = 1.0 / n_batches
        hooked = _hook_sample_rate(optimizer)
        if hooked is not None and not math.isclose(hooked, self.sample_rate, rel_tol=1e-9):
            raise ValueError(f"data_loader has {n_batches} batches (q = {self.sample_rate:.6g}) but the engine "
                             f"accounts q = {hooked:.6g}: pass the data loader make_private returned")
        self.poisson = isinstance(data_loader, DPDataLoader)
        self.loader_sample_rate = float(getattr(data_loader.batch_sampler, "sample_rate", self.sample_rate)) \
            if self.poisson else self.sample_rate
        self.loader_dataset = data_loader.dataset
        self.pool = find_pool(data_loader.dataset)  # an audit.AuditPool: the members the auditor drew (LiRA/RMIA)
        if self.pool is not None:
            self.pool.check_stable()  # before training: finish() records every item once
        self.n_examples = len(data_loader.dataset)
        if input_canaries is not None and data_loader.dataset is not input_canaries:
            raise ValueError("input_canaries must be the dataset the data loader serves (wrap the dataset with "
                             "audit.CanaryDataset before building the DataLoader passed to make_private)")
        from training.accounting import default_delta

        self.delta = float(delta) if delta is not None else default_delta(self.n_examples)
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        self.optimizer, self.engine, self.input_canaries = optimizer, engine, input_canaries
        self.claimed_epsilon = None if claimed_epsilon is None else float(claimed_epsilon)
        self.run_dir = Path(run_dir)
        self.run_name = run_name or self.run_dir.name
        self.dataset, self.arch = str(dataset), arch
        self.seed = int(seed) if seed is not None else secrets.randbits(31)
        self.rank = int(getattr(optimizer, "rank", 0))
        self.world_size = int(getattr(optimizer, "world_size", 1))
        self.params = list(optimizer.params)
        self.theta0 = [p.detach().cpu().clone() for p in self.params]
        self.canaries = None
        if gradient_canaries:
            shapes = {str(i): tuple(p.shape) for i, p in enumerate(self.params)}
            self.canaries = GradientCanaries(param_shapes=shapes, count=int(gradient_canaries), seed=self.seed,
                                             included=draw_membership(int(gradient_canaries), p=0.5, seed=self.seed))
        self.steps: list[tuple[float, float, float]] = []  # (σ, q, C) as the noise was added, one per logical step
        self.canaries_added = 0
        self.canary_seconds = 0.0
        self._original_add_noise = optimizer.add_noise
        self._finished = False
        optimizer.add_noise = self._add_noise

    # ---------------------------------------------------------------------------------------- the step

    def _noise_multiplier(self) -> float:
        opt = self.optimizer
        return float(getattr(opt, "_adjusted_noise_multiplier", opt.noise_multiplier))

    def _add_noise(self) -> None:
        """Opacus's ``add_noise``, preceded by the sampled included canaries joining the clipped sum."""
        t0 = time.perf_counter()
        opt = self.optimizer
        try:
            k = int(opt.accumulated_iterations)
        except (ValueError, AttributeError):  # ghost clipping keeps no grad_sample
            k = 1
        q = min(1.0, self.sample_rate * k)
        C = float(opt.max_grad_norm)
        self.steps.append((self._noise_multiplier(), q, C))
        if self.canaries is not None and self.rank == 0:
            idx = self.canaries.sampled(len(self.steps) - 1, sample_rate=q)
            if idx.size:
                self._inject(idx, C)
                self.canaries_added += int(idx.size)
        self.canary_seconds += time.perf_counter() - t0
        self._original_add_noise()

    def _inject(self, idx: np.ndarray, C: float) -> None:
        opt, canaries = self.optimizer, self.canaries
        ref = self.params[0]
        if self.clipping == "per_layer":
            grads = [torch.zeros_like(p) for p in self.params]
            for i in idx:  # one canary = one example: each of its per-parameter parts clipped to that layer's norm
                one = canaries.gradient([int(i)], scale=C, device=ref.device, dtype=ref.dtype)
                for g, part, c_l in zip(grads, one, opt.max_grad_norms):
                    g += part * min(1.0, float(c_l) / (float(part.norm()) + 1e-12))
        else:
            grads = canaries.gradient(idx, scale=C, device=ref.device, dtype=ref.dtype)
        for p, g in zip(self.params, grads):
            if p.summed_grad is None:  # no example contributed to this parameter
                p.summed_grad = torch.zeros_like(p)
            p.summed_grad = p.summed_grad + g.to(device=p.summed_grad.device, dtype=p.summed_grad.dtype)

    # --------------------------------------------------------------------------------------- finishing

    def detach(self) -> None:
        """Give the optimizer its own ``add_noise`` back (training may go on unaudited; :meth:`finish` does it)."""
        if self.optimizer.add_noise == self._add_noise:
            self.optimizer.add_noise = self._original_add_noise

    def finish(self, model: nn.Module, *, test_accuracy: float | None = None,
               metrics: Mapping[str, Any] | None = None, overwrite: bool = False) -> AuditedRun | None:
        """Write the run directory: manifest (the claim from the engine's accountant history), weights, θ_0,
        the canary records, membership and metrics. Returns None on DPDDP ranks other than 0.

        Args:
            model: the trained model (as returned by ``make_private``, or the user's module inside it).
            test_accuracy: the user's own test accuracy, recorded in the manifest and ``metrics.json``.
            metrics: other JSON-ready numbers to record in ``metrics.json``.
            overwrite: replace an existing run directory's files.

        Raises:
            ValueError: the model does not hold the optimizer's parameters, no step was taken, the accountant's
                history disagrees with the steps the auditor saw, or the claim is infinite.
            CheckpointError: the run directory already holds a run (without ``overwrite``) or is not writable.
        """
        from audit.integrations.opacus_record import write_run

        self.detach()
        if self.rank != 0:
            return None
        if self._finished and not overwrite:
            raise ValueError(f"finish() already wrote {self.run_dir}; pass overwrite=True to write it again")
        manifest = write_run(self, model, test_accuracy=test_accuracy, metrics=dict(metrics or {}),
                             overwrite=overwrite)
        self._finished = True
        return AuditedRun(self.run_dir, manifest)

    def audit_mechanism(self, optimizer_factory: Any = None, *, sampler_factory: Any = None, trials: int = 20_000,
                        canaries_per_run: int = 2000, alpha: float = 0.05, seed: int = 0) -> Any:
        """Tight audit of this script's DP-SGD implementation (:mod:`audit.mechanism`) against the run's claim,
        after :meth:`finish`: Dirac gradient canaries through the script's optimizer and sampling, judged against
        the recorded (ε, δ) at the recorded σ, q, T; writes ``mechanism.json`` into the run directory (signed,
        bound to the run's claim), which ``audit report`` shows.

        Args:
            optimizer_factory: ``params -> DPOptimizer`` built as the script builds it; default
                :func:`~audit.mechanism.opacus_target.same_optimizer` of the script's optimizer (its class and
                overrides, base optimizer, σ, C, expected batch size; flat clipping).
            sampler_factory: ``(num_samples, generator) -> batches``; default what the script's loader does:
                Opacus's Poisson sampler at the loader's own rate (a ``DPDataLoader``) or shuffled batches.
            trials, canaries_per_run, alpha, seed: as :func:`audit.mechanism.api.audit_opacus_mechanism`.

        Returns:
            The :class:`~audit.mechanism.result.MechanismResult`.

        Raises:
            ValueError: :meth:`finish` has not written the run, or the claim has several DP phases.
            UserError: the optimizer cannot be rebuilt (pass ``optimizer_factory``) or an argument is out of range.
        """
        from audit.mechanism.opacus_target import (audit_opacus_mechanism, opacus_sampler, same_optimizer,
                                                   shuffle_sampler)
        from training.accounting import ACCOUNTANTS
        from training.run.manifest import read_manifest

        if not self._finished:
            raise ValueError("call auditor.finish(model) first: the mechanism is audited against the run's claim")
        p = read_manifest(self.run_dir).privacy
        phases = [ph for ph in p.phases if ph.dp]
        if len(phases) != 1 or p.epsilon is None:
            raise ValueError(f"the run's claim has {len(phases)} DP phases (σ, q or C changed while training); "
                             "audit each with audit.audit_opacus_mechanism(...)")
        ph = phases[0]
        if sampler_factory is None:
            rate = self.loader_sample_rate
            sampler_factory = opacus_sampler(rate) if self.poisson else shuffle_sampler(rate)
        return audit_opacus_mechanism(
            optimizer_factory=optimizer_factory or same_optimizer(self.optimizer), sampler_factory=sampler_factory,
            sample_rate=float(ph.sample_rate), steps=int(ph.steps), delta=float(p.delta), trials=trials,
            canaries_per_run=canaries_per_run, alpha=alpha, seed=seed,
            accountant=p.accountant if p.accountant in ACCOUNTANTS else "prv",
            noise_multiplier=float(ph.noise_multiplier), claimed_epsilon=float(p.epsilon), run_dir=self.run_dir)

    def __repr__(self) -> str:
        return (f"OpacusAuditor(run_dir={str(self.run_dir)!r}, canaries={self.canaries!r}, "
                f"steps={len(self.steps)}, poisson={self.poisson})")
