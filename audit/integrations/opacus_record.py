"""The run directory of an audited Opacus script: the same files ``audit train`` writes, from the user's objects.

:func:`write_run` turns an :class:`~audit.integrations.opacus.OpacusAuditor` after training into a run directory
that ``audit epsilon`` and ``audit report`` read like any other:

* ``model.safetensors`` (the user's module, unwrapped from Opacus) and ``model_init.safetensors`` (θ_0, the
  trainable parameters when the auditor attached);
* ``gradient_canaries.npy`` (inclusion mask) and the manifest record ``training.gradient_canaries`` (count, seed,
  parameter order, q, T, θ_0 and their sha256s) that :func:`audit.bounds.sources.gradient_canary_evidence` reads;
* ``input_canaries.npz`` (the canaries' inputs, labels and their scaled logits under the final model, scored in
  the user's process because the user's model class is not rebuilt by auditors) when a
  :class:`~audit.integrations.canary_dataset.CanaryDataset` was used;
* ``membership.npy`` (the user's examples, all members, then each input canary's inclusion), ``metrics.json``;
  with an :class:`~audit.integrations.audit_pool.AuditPool` behind the loader, the pool is the user's whole
  dataset, each item a member with probability 1/2 (scheme ``bernoulli``, the pool's seed), and ``pool.npz``
  holds its inputs and labels (sha256 and the draw in the manifest's ``training.audit_pool``), which
  ``audit.attack(run, train_fn=...)`` scores the target and its reference models on;
* ``manifest.json`` last. The claim is the engine accountant's ``get_epsilon(δ)`` over its own history (or the
  user's ``claimed_epsilon``); the DP phases are the (σ, q, C) the auditor saw at each noise addition, so the claim
  check of ``audit epsilon`` recomputes ε from what the optimizer did, not from what it was told.
"""

from __future__ import annotations

import math
import shlex
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from training.config import ModelConfig
from foundation.errors import CheckpointError
from foundation.files import GRADIENT_CANARY_FILE, INIT_WEIGHTS_FILE, INPUT_CANARY_FILE, MANIFEST_FILE, POOL_FILE
from foundation.io import check_output_dir, fingerprint_arrays, save_safetensors, sha256_file, write_npy, write_npz
from training.run.manifest import Manifest, PhaseInfo, PrivacyInfo
from training.run import writer as run_writer

if TYPE_CHECKING:
    from audit.integrations.opacus import OpacusAuditor

__all__ = ["write_run", "phases_from_steps", "GRADIENT_CANARY_FILE", "INPUT_CANARY_FILE"]

_CLIPPING = {"flat": "flat", "per_layer": "per_layer", "adaptive": "flat"}


def phases_from_steps(steps: list[tuple[float, float, float]], *, batch_size: int | None, sampling: str,
                      clipping: str, grad_sample_mode: str | None, optimizer: str | None,
                      lr: float | None) -> list[PhaseInfo]:
    """One DP phase per run of consecutive steps with the same (σ, q, C).

    >>> [(p.noise_multiplier, p.steps) for p in phases_from_steps([(1.0, 0.1, 1.0)] * 3 + [(0.5, 0.1, 1.0)],
    ...     batch_size=10, sampling="poisson", clipping="flat", grad_sample_mode="hooks", optimizer="SGD", lr=0.1)]
    [(1.0, 3), (0.5, 1)]
    """
    runs: list[list[Any]] = []
    for s in steps:
        if runs and runs[-1][0] == s:
            runs[-1][1] += 1
        else:
            runs.append([s, 1])
    return [run_writer.phase_record(name="opacus" if len(runs) == 1 else f"opacus-{k}", dp=True,
                                    noise_multiplier=sigma, sample_rate=q, steps=t, batch_size=batch_size,
                                    sampling=sampling, max_grad_norm=C, clipping=_CLIPPING[clipping],
                                    grad_sample_mode=grad_sample_mode, optimizer=optimizer, lr=lr)
            for k, ((sigma, q, C), t) in enumerate(runs)]


def _names(auditor: OpacusAuditor, base: nn.Module) -> list[str]:
    by_id = {id(p): n for n, p in base.named_parameters()}
    names = [by_id.get(id(p)) for p in auditor.params]
    if any(n is None for n in names):
        raise ValueError("the model passed to finish() does not hold the optimizer's parameters: pass the model "
                         "make_private returned (or the module inside it)")
    return names  # type: ignore[return-value]


def _history_steps(engine: Any) -> list[tuple[float, float, int]]:
    return [(float(s), float(q), int(t)) for s, q, t in engine.accountant.history]


def _check_history(auditor: OpacusAuditor) -> list[str]:
    """Compare the accountant's history with the steps the auditor saw; mismatches become manifest notes."""
    hist = _history_steps(auditor.engine)
    total = sum(t for _, _, t in hist)
    notes = []
    if total != len(auditor.steps):
        notes.append(f"the engine's accountant counted {total} steps but the optimizer added noise "
                     f"{len(auditor.steps)} times while the auditor was attached")
    seen = {(round(s, 12), round(q, 12)) for s, q, _ in auditor.steps}
    counted = {(round(s, 12), round(q, 12)) for s, q, _ in hist}
    if seen != counted:
        notes.append(f"the accountant's (σ, q) {sorted(counted)} differ from those the optimizer used {sorted(seen)}")
    return notes


def _claim(auditor: OpacusAuditor, phases: list[PhaseInfo], notes: list[str]) -> PrivacyInfo:
    from training.accounting import DPPhase, epsilon_for

    accountant = auditor.engine.accountant
    mechanism = str(accountant.mechanism())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            engine_eps = float(accountant.get_epsilon(delta=auditor.delta))
        except (ValueError, ZeroDivisionError, OverflowError):
            engine_eps = math.inf
    if auditor.claimed_epsilon is not None:
        claim = auditor.claimed_epsilon
        notes.append(f"claimed ε = {claim:g} given by the user; the engine's {mechanism} accountant gives "
                     f"{engine_eps:.6g} for the same steps")
    elif math.isfinite(engine_eps):
        claim = engine_eps
    else:
        raise ValueError(f"the engine's {mechanism} accountant gives ε = {engine_eps} (a noise multiplier of 0?): "
                         "pass claimed_epsilon= to audit the ε you claim")
    cross = None
    dp_phases = [DPPhase(noise_multiplier=p.noise_multiplier, sample_rate=p.sample_rate, steps=p.steps)
                 for p in phases if p.noise_multiplier and p.noise_multiplier > 0]
    if len(dp_phases) == len(phases):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            pld = epsilon_for(phases=dp_phases, delta=auditor.delta, accountant="pld")
        cross = {"accountant": "pld", "epsilon": pld, "engine_epsilon": engine_eps,
                 "relative_difference": 0.0 if pld == claim else ((claim - pld) / pld if pld > 0 else math.inf)}
    if not auditor.poisson:
        notes.append("batches were not Poisson-sampled (the data loader is not Opacus's DPDataLoader); the engine "
                     "accounts ε as if they were, so the claim is NOT a proven guarantee for this run")
    return run_writer.privacy_record(phases=phases, epsilon=claim, delta=auditor.delta, accountant=mechanism,
                                     cross_check=cross, notes=notes)


def _gradient_record(auditor: OpacusAuditor, run_dir: Path, names: list[str]) -> dict[str, Any]:
    canaries = auditor.canaries
    if canaries is None:
        return {}
    save_safetensors(run_dir / INIT_WEIGHTS_FILE, dict(zip(names, auditor.theta0)))
    inc = write_npy(run_dir / GRADIENT_CANARY_FILE, canaries.included)
    qs = sorted({q for _, q, _ in auditor.steps})
    return {"gradient_canaries": {
        "count": canaries.count, "seed": canaries.seed, "included_file": inc.name, "included_sha256": sha256_file(inc),
        "n_included": int(canaries.included.sum()), "sample_rate": qs[0] if len(qs) == 1 else qs,
        "steps": len(auditor.steps), "added": auditor.canaries_added,
        "scale": "max_grad_norm (C * u_i added to the clipped sum before Opacus's noise)",
        "param_names": names, "init_weights": INIT_WEIGHTS_FILE,
        "init_weights_sha256": sha256_file(run_dir / INIT_WEIGHTS_FILE)}}


def _input_record(auditor: OpacusAuditor, run_dir: Path, base: nn.Module) -> dict[str, Any] | None:
    ds = auditor.input_canaries
    if ds is None:
        return None
    phi = ds.scores(base)
    path = write_npz(run_dir / INPUT_CANARY_FILE, x=ds.canary_x, y=ds.canary_y, included=ds.included, phi=phi)
    first = {} if auditor.pool is None else {"first_index": auditor.pool.size}  # after the whole pool
    return {**ds.record(), **first, "file": path.name, "sha256": sha256_file(path),
            "scores": "phi: scaled logit of the final model, computed by OpacusAuditor.finish in the training process"}


def write_run(auditor: OpacusAuditor, model: nn.Module, *, test_accuracy: float | None,
              metrics: dict[str, Any], overwrite: bool) -> Manifest:
    """Write the run directory of ``auditor`` after training ``model``; returns the manifest (written last)."""
    from audit.integrations.opacus import unwrap_model

    run_dir = check_output_dir(auditor.run_dir, what="run directory")
    if (run_dir / MANIFEST_FILE).exists() and not overwrite:
        raise CheckpointError(f"{run_dir} already holds a finished run; choose another run_dir or pass overwrite=True")
    if not auditor.steps:
        raise ValueError("no training step was taken while the auditor was attached: nothing to audit")
    base = unwrap_model(model)
    names = _names(auditor, base)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MANIFEST_FILE).unlink(missing_ok=True)  # an overwritten run is incomplete until the new manifest lands

    opt = auditor.optimizer
    original = opt.original_optimizer
    lr = original.param_groups[0].get("lr") if original.param_groups else None
    phases = phases_from_steps(auditor.steps, batch_size=int(round(opt.expected_batch_size * auditor.world_size)),
                               sampling="poisson" if auditor.poisson else "shuffle", clipping=auditor.clipping,
                               grad_sample_mode=_grad_sample_mode(model), optimizer=type(original).__name__,
                               lr=None if lr is None else float(lr))
    notes = _check_history(auditor)
    if auditor.clipping == "adaptive":
        notes.append("adaptive clipping (AdaClipDPOptimizer): the clipping norm varied; phases record each value")
    privacy = _claim(auditor, phases, notes)

    extra = _gradient_record(auditor, run_dir, names)
    canaries = _input_record(auditor, run_dir, base)
    ds = auditor.input_canaries
    mask, fingerprint, pool_record = _membership(auditor, run_dir)
    if pool_record:
        extra["audit_pool"] = pool_record
    steps = len(auditor.steps)
    metrics_out = {"test_accuracy": test_accuracy, "steps": steps, "epsilon_spent": privacy.epsilon,
                   "canary_seconds": auditor.canary_seconds, "gradient_canaries_added": auditor.canaries_added,
                   **metrics}
    arch = auditor.arch or f"user-model/{type(base).__module__}.{type(base).__qualname__}".replace(":", ".")
    return run_writer.write_run(
        run_dir, run_name=auditor.run_name, model=ModelConfig(arch=arch, fix_batchnorm=False), module=base,
        num_classes=_num_classes(base, ds), input_shape=_input_shape(auditor),
        frozen=[n for n, p in base.named_parameters() if not p.requires_grad],
        notes=[] if auditor.arch else ["the user's model class (trained by an Opacus script); auditors read its "
                                       "weights but do not rebuild it"],
        data={"dataset": auditor.dataset, "split": "train"}, pool_fingerprint=fingerprint,
        membership=mask, membership_scheme="bernoulli" if auditor.pool is not None else "all",
        member_p=0.5 if auditor.pool is not None else None,
        membership_seed=auditor.pool.seed if auditor.pool is not None else (ds.seed if ds is not None else None),
        canaries=canaries, privacy=privacy, metrics=metrics_out,
        training={"recipe": "opacus", "integration": "audit.OpacusAuditor", "optimizer": type(original).__name__,
                  "lr": lr, "steps": steps, "batch_size": phases[0].batch_size, "test_accuracy": test_accuracy,
                  "world_size": auditor.world_size, **extra},
        seed=auditor.seed, command=shlex.join(sys.argv), device=str(auditor.params[0].device))


def _membership(auditor: OpacusAuditor, run_dir: Path) -> tuple[np.ndarray, str, dict[str, Any]]:
    """The membership mask over the pool, the pool's fingerprint and (with an ``AuditPool``) its record, after
    writing ``pool.npz``. Input canaries follow the pool, each with its inclusion bit."""
    ds, pool = auditor.input_canaries, auditor.pool
    if pool is None:
        mask = ds.membership() if ds is not None else np.ones(auditor.n_examples, dtype=bool)
        return mask, ds.fingerprint() if ds is not None else _size_fingerprint(auditor.n_examples), {}
    x, y = pool.arrays()
    path = write_npz(run_dir / POOL_FILE, x=x, y=y)
    record = {**pool.record(), "file": path.name, "sha256": sha256_file(path), "fingerprint": pool.fingerprint()}
    if ds is None:
        return pool.membership.copy(), record["fingerprint"], record
    return (np.concatenate([pool.membership, ds.included]),
            fingerprint_arrays(x, y, ds.canary_x, ds.canary_y), record)


def _size_fingerprint(n: int) -> str:
    from foundation.io import fingerprint_arrays

    return fingerprint_arrays(np.array([n], dtype=np.int64))


def _grad_sample_mode(model: nn.Module) -> str | None:
    """The engine's ``grad_sample_mode`` as Opacus names it: ``make_private(grad_sample_mode="functorch")``
    builds the same ``GradSampleModule`` class as ``"hooks"``, with ``force_functorch`` set."""
    name = type(model).__name__
    if name == "GradSampleModule" and getattr(model, "force_functorch", False):
        return "functorch"
    return {"GradSampleModule": "hooks", "GradSampleModuleExpandedWeights": "ew",
            "GradSampleModuleFastGradientClipping": "ghost"}.get(name, None)


def _input_shape(auditor: OpacusAuditor) -> tuple[int, int, int]:
    ds = auditor.input_canaries
    if ds is not None:
        shape = ds.input_shape
    else:
        import torch

        x0 = auditor.loader_dataset[0][0]
        shape = tuple(torch.as_tensor(x0).shape)
    shape = tuple(int(s) for s in shape)
    return (1, 1, shape[0]) if len(shape) == 1 else ((1, *shape) if len(shape) == 2 else shape[-3:])


def _num_classes(base: nn.Module, ds: Any) -> int:
    if ds is not None:
        return int(ds.num_classes)
    last = [m for m in base.modules() if isinstance(m, nn.Linear)]
    return int(last[-1].out_features) if last else 0
