"""Writing a run directory: the one writer behind every producer of runs.

``audit train`` (:mod:`training.trainer`), the batched reference-model trainer (:mod:`attacks.shadow_train`),
``audit import`` (:mod:`audit.importer`) and :class:`audit.OpacusAuditor` (:mod:`audit.integrations.opacus_record`)
all finish a run directory with :func:`write_run`. It writes ``config.yaml`` (when given), ``model.safetensors``,
``membership.npy`` and ``metrics.json`` atomically, takes every sha256 from the bytes it wrote, describes the
membership from the mask itself, counts the parameters, and writes ``manifest.json`` last: its presence marks the
directory complete. The privacy block is built by :func:`privacy_record` (one rule for whether a run claims DP)
from :func:`phase_record` entries (one rule for what a phase without DP records).
A producer writes its own extra files (``import.json``, gradient canaries, ...) before calling :func:`write_run`.

>>> import tempfile, torch
>>> from training.config import ModelConfig
>>> with tempfile.TemporaryDirectory() as d:
...     man = write_run(d, run_name="r", model=ModelConfig(arch="mlp"), module=torch.nn.Linear(3, 2),
...                     num_classes=2, input_shape=(1, 1, 3), membership=np.array([True, False, True]),
...                     membership_scheme="explicit", data={"dataset": "digits", "split": "train"},
...                     pool_fingerprint="0" * 64, privacy=privacy_record(notes=["no claim"]),
...                     training={"recipe": "external"}, metrics={"test_accuracy": None})
...     sorted(p.name for p in Path(d).iterdir())
['manifest.json', 'membership.npy', 'metrics.json', 'model.safetensors']
>>> man.data.membership.n_members, man.model.param_count, man.privacy.dp
(2, 8, False)
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from foundation.files import CONFIG_FILE, MEMBERSHIP_FILE, METRICS_FILE, WEIGHTS_FILE
from foundation.io import atomic_path, sha256_bytes, write_json, write_text
from training.config import DataConfig, ModelConfig
from training.run.manifest import Manifest, MembershipInfo, PhaseInfo, PrivacyInfo, build_manifest, write_manifest

if TYPE_CHECKING:
    from torch import nn

__all__ = ["write_run", "privacy_record", "phase_record", "write_weights", "write_membership"]


def _write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_weights(run_dir: str | os.PathLike[str], tensors: Mapping[str, Any]) -> str:
    """Save a name -> tensor map as ``<run_dir>/model.safetensors`` (atomically); return its sha256."""
    from safetensors.torch import save

    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()})
    _write_bytes(Path(run_dir) / WEIGHTS_FILE, data)
    return sha256_bytes(data)


def write_membership(run_dir: str | os.PathLike[str], mask: np.ndarray) -> str:
    """Save the bool membership mask as ``<run_dir>/membership.npy`` (no pickle, atomically); return its sha256.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     from foundation.io import sha256_file
    ...     sha = write_membership(d, np.array([True, False]))
    ...     sha == sha256_file(Path(d) / MEMBERSHIP_FILE)
    True
    """
    buf = io.BytesIO()
    np.save(buf, np.asarray(mask, dtype=bool), allow_pickle=False)
    data = buf.getvalue()
    _write_bytes(Path(run_dir) / MEMBERSHIP_FILE, data)
    return sha256_bytes(data)


def phase_record(*, name: str, dp: bool, steps: int, sample_rate: float | None, batch_size: int | None,
                 sampling: str = "poisson", optimizer: str | None = None, lr: float | None = None,
                 frozen: Sequence[str] = (), dataset: str | None = None, noise_multiplier: float | None = None,
                 max_grad_norm: float | None = None, clipping: str | None = None,
                 grad_sample_mode: str | None = None, epsilon: float | None = None) -> PhaseInfo:
    """One training phase of the privacy block. A non-DP phase records no σ, C, clipping or per-sample gradient
    mode, whatever the config held (the one rule every producer follows).

    >>> phase_record(name="public", dp=False, steps=10, sample_rate=0.1, batch_size=8, noise_multiplier=1.0,
    ...              max_grad_norm=1.0, clipping="flat").noise_multiplier is None
    True
    """
    return PhaseInfo(name=name, dp=dp, dataset=dataset, noise_multiplier=noise_multiplier if dp else None,
                     sample_rate=sample_rate, steps=int(steps), batch_size=batch_size, sampling=sampling,
                     max_grad_norm=max_grad_norm if dp else None, clipping=clipping if dp else None,
                     grad_sample_mode=grad_sample_mode if dp else None, optimizer=optimizer, lr=lr,
                     frozen=list(frozen), epsilon=epsilon)


def privacy_record(*, phases: Sequence[PhaseInfo] = (), epsilon: float | None = None, delta: float | None = None,
                   accountant: str | None = None, cross_check: Mapping[str, Any] | None = None,
                   notes: Sequence[str] = ()) -> PrivacyInfo:
    """The manifest's privacy block. A run is DP when one of its phases is, or when it claims an ε (an imported
    checkpoint's provider claim has no phases); ``epsilon`` None is no claim (a reference model, a non-DP run).

    >>> privacy_record(notes=["imported without a claim"]).claimed_epsilon
    inf
    >>> p = privacy_record(phases=[PhaseInfo(name="dp", dp=True, noise_multiplier=1.0, sample_rate=0.1, steps=5)],
    ...                    epsilon=2.0, delta=1e-5, accountant="prv")
    >>> p.dp, p.claimed_epsilon
    (True, 2.0)
    """
    return PrivacyInfo(dp=any(p.dp for p in phases) or epsilon is not None, delta=delta, accountant=accountant,
                       epsilon=epsilon, epsilon_cross_check=None if cross_check is None else dict(cross_check),
                       phases=list(phases), notes=list(notes))


def write_run(run_dir: str | os.PathLike[str], *, run_name: str, model: ModelConfig, module: nn.Module,
              num_classes: int, input_shape: Sequence[int], membership: np.ndarray,
              membership_scheme: Literal["bernoulli", "all", "explicit"], data: DataConfig | Mapping[str, Any],
              pool_fingerprint: str, privacy: PrivacyInfo, training: Mapping[str, Any], metrics: Mapping[str, Any],
              member_p: float | None = None, membership_seed: int | None = None, frozen: Sequence[str] = (),
              notes: Sequence[str] = (), canaries: Mapping[str, Any] | None = None,
              nonmember_split: str | None = None, seed: int | None = None, config_text: str | None = None,
              config_sha256: str | None = None, command: str | None = None, device: str | None = None,
              streamed: bool | None = None, split: tuple[int, str] | None = None,
              threads: Mapping[str, Any] | None = None) -> Manifest:
    """Write the run's files and its manifest (last); return the manifest.

    Args:
        run_dir: the run directory (created if missing).
        run_name, model, num_classes, input_shape, frozen, notes: the model as built (see
            :func:`~training.run.manifest.build_manifest`); ``module`` is the trained network: its
            ``state_dict()`` is saved and its parameters counted.
        membership: one bool per pool example (True = trained on); ``membership_scheme``, ``member_p`` and
            ``membership_seed`` say how it was drawn.
        data, pool_fingerprint, canaries, nonmember_split, streamed, split: the pool (as
            :func:`~training.run.manifest.build_manifest` takes them).
        privacy: the claim, from :func:`privacy_record`.
        training: recipe, optimizer, steps and metrics for the manifest; ``metrics``: ``metrics.json``.
        config_text: the resolved config to write as ``config.yaml``; or ``config_sha256`` of a ``config.yaml``
            already written (``audit train`` writes it first, for ``--resume``). Neither: the run has no recipe.
        seed, command, device, threads: provenance (``threads``: :meth:`training.threads.ThreadPlan.record`).

    Raises:
        ValueError: both ``config_text`` and ``config_sha256``, or a membership mask that is not one-dimensional.
    """
    from training.models import count_parameters

    if config_text is not None and config_sha256 is not None:
        raise ValueError("pass config_text (to write config.yaml) or config_sha256 (already written), not both")
    mask = np.asarray(membership, dtype=bool)
    if mask.ndim != 1:
        raise ValueError(f"membership must be one bool per pool example, got shape {mask.shape}")
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    if config_text is not None:
        write_text(out / CONFIG_FILE, config_text)
        config_sha256 = sha256_bytes(config_text.encode("utf-8"))
    weights_sha = write_weights(out, module.state_dict())
    membership_sha = write_membership(out, mask)
    write_json(out / METRICS_FILE, dict(metrics))
    total, trainable = count_parameters(module)
    manifest = build_manifest(
        run_name=run_name, model=model, num_classes=num_classes, input_shape=input_shape, param_count=total,
        trainable_param_count=trainable, weights_sha256=weights_sha, frozen=frozen, notes=notes, data=data,
        pool_fingerprint=pool_fingerprint, membership_sha256=membership_sha,
        membership=MembershipInfo(scheme=membership_scheme, p=member_p, seed=membership_seed,
                                  n_members=int(mask.sum()), n_pool=int(mask.size)),
        canaries=canaries, nonmember_split=nonmember_split, privacy=privacy, training=training, seed=seed,
        config_sha256=config_sha256, command=command, device=device, streamed=streamed, split=split,
        threads=threads)
    write_manifest(out, manifest)
    return manifest
