"""Evaluate one checkpoint on a transfer suite and write ``transfer.json``.

For each dataset of the suite: load the training and test splits (``training.data.load_dataset``), extract
frozen features once (cached under ``<run_dir>/features/``, see :mod:`audit.transfer.features`), run the
enabled protocols (linear probe, k-NN, fine-tuning) and the per-layer separation diagnostics. A dataset whose
files are absent or unreadable becomes a row ``{"status": "missing", "reason": "missing: ..."}``: it is
reported, never dropped and never a crash. A dataset that loads but cannot be evaluated (one class in its
training split, an empty test split) gets ``"status": "error"`` with the reason; a fine-tune the DP engine
refuses (e.g. BatchNorm layers under DP) is reported inside the row and the other protocols are kept.

Every random choice (validation split, diagnostics subset, fine-tuning batches and noise) draws from a seed
stream derived from ``(suite.seed, dataset label, purpose)``, so results do not depend on dataset order.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from audit.transfer.features import FINAL_LAYER, block_names, cached_features
from audit.transfer.knn import knn_classify
from audit.transfer.probes import linear_probe
from audit.transfer.separability import separation_profile
from audit.transfer.suite import TransferDataset, TransferSuite
from training.run import VerifiedRun, as_run, evidence_identity
from training.data import ImageSet, limit_indices, load_dataset
from training.device import resolve_device
from foundation.files import TRANSFER_FILE
from foundation.errors import DataError, UserError
from audit.transfer.transfer_file import (TRANSFER_FORMAT, TransferFile, TransferRow,
                                          write_transfer_file)

__all__ = ["TransferResult", "evaluate_transfer"]

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class TransferResult:
    """What :func:`evaluate_transfer` wrote: the whole ``transfer.json`` content and where it went.

    Attributes:
        data: the result (:class:`~audit.transfer.transfer_file.TransferFile`).
        path: the file written.
    """

    data: TransferFile
    path: Path

    def row(self, dataset: str) -> TransferRow:
        """The result row of one dataset (by its suite label).

        Raises:
            KeyError: if the suite had no such dataset.
        """
        return self.data.row(dataset)


def _cap(*limits: int | None) -> int | None:
    given = [int(v) for v in limits if v is not None]
    return min(given) if given else None


def _subseed(seed: int, key: str, purpose: str) -> np.random.SeedSequence:
    """A seed stream per (suite seed, dataset, purpose), stable across runs and dataset order."""
    return np.random.SeedSequence([int(seed) & 0xFFFFFFFF, zlib.crc32(key.encode()), zlib.crc32(purpose.encode())])


def _model_id(manifest: Any) -> str:
    """Identity of the checkpoint for the feature cache: weights sha256 plus architecture and preprocessing."""
    blob = json.dumps(manifest.model.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def suite_root_hint(index: int) -> str:
    """How to point a suite's dataset at its data (the suite's key, not a training config's ``data.root``).

    >>> suite_root_hint(1)
    'set datasets.1.root in the suite to the folder holding it (or --set datasets.1.root=PATH)'
    """
    return f"set datasets.{index}.root in the suite to the folder holding it (or --set datasets.{index}.root=PATH)"


def _missing_row(spec: TransferDataset, exc: DataError, index: int) -> dict[str, Any]:
    msg = str(exc).split("; set data.root", 1)[0]  # the loader's hint names a training config's keys
    msg = msg if msg.startswith("missing:") else f"missing: {msg}"
    return {"dataset": spec.key, "name": spec.name, "root": spec.root, "status": "missing",
            "reason": f"{msg}; {suite_root_hint(index)}"}


def _none_evaluated(rows: list[dict[str, Any]]) -> str | None:
    """One line when no dataset of the suite could be evaluated (every row missing or an error), else None."""
    if any(r["status"] == "ok" for r in rows):
        return None
    first = rows[0]
    return (f"none of the suite's {len(rows)} dataset(s) could be evaluated; first: {first['dataset']}: "
            f"{first['reason'].removeprefix('missing: ')}")


def _split_info(s: ImageSet, fingerprint: str) -> dict[str, Any]:
    return {"split": s.split, "n": len(s), "fingerprint": fingerprint, "classes_present": int(np.unique(s.y).size)}


def _diagnostics(model: torch.nn.Module, train: ImageSet, *, suite: TransferSuite, key: str, model_id: str,
                 image_size: int, cache_dir: Path | None, device: torch.device) -> dict[str, Any]:
    """Separation of each ``feature_blocks()`` output on a seeded subset of the training split."""
    cfg = suite.protocols.diagnostics
    names = block_names(model)
    layers = names if names else [FINAL_LAYER]
    if len(train) > cfg.max_examples:  # seeded, class-balanced subset
        perm = np.random.default_rng(_subseed(suite.seed, key, "diagnostics")).permutation(len(train))
        train = train.subset(np.sort(perm[limit_indices(train.y[perm], cfg.max_examples)]))
    feats, _ = cached_features(model, train.x, layers=layers, model_id=model_id,
                               data_fingerprint=train.fingerprint(), image_size=image_size,
                               cache_dir=cache_dir, batch_size=suite.batch_size, device=device)
    if np.unique(train.y).size < 2:
        return {"n_examples": len(train), "layers": [], "decay": None,
                "note": "diagnostics need at least 2 classes in the subset"}
    rows, decay, note = separation_profile(feats, train.y)
    if not names:
        note = "model has no feature_blocks(); only the final features were measured"
    return {"n_examples": len(train), "measure": "fuzziness D = Tr(SS_w SS_b^+) (He & Su 2023)",
            "layers": [r.to_dict() for r in rows], "decay": decay.to_dict() if decay else None, "note": note}


def _evaluate_dataset(model: torch.nn.Module, spec: TransferDataset, *, suite: TransferSuite, model_id: str,
                      image_size: int, cache_dir: Path | None, device: torch.device, log: Log,
                      index: int = 0) -> dict[str, Any]:
    key = spec.key
    try:
        train = load_dataset(spec.name, root=spec.root, split=spec.train_split, image_size=image_size,
                             limit=_cap(spec.train_limit, suite.budget.max_train_examples))
        test = load_dataset(spec.name, root=spec.root, split=spec.test_split, image_size=image_size,
                            limit=_cap(spec.test_limit, suite.budget.max_test_examples))
    except DataError as exc:
        row = _missing_row(spec, exc, index)
        log(f"{key}: {row['reason']}")
        return row
    fp_train, fp_test = train.fingerprint(), test.fingerprint()
    row: dict[str, Any] = {"dataset": key, "name": spec.name, "root": spec.root, "status": "ok",
                           "num_classes": len(train.classes), "image_size": image_size,
                           "train": _split_info(train, fp_train), "test": _split_info(test, fp_test)}
    if np.unique(train.y).size < 2 or len(test) == 0:
        row.update(status="error", reason=f"{key}: need at least 2 classes in the training split and a "
                                          f"non-empty test split, got {row['train']['classes_present']} "
                                          f"class(es) and {len(test)} test examples")
        return row
    protocols = suite.protocols
    if protocols.linear_probe.enabled or protocols.knn.enabled:
        log(f"{key}: features of {len(train)} train / {len(test)} test images")
        f_tr, hit_tr = cached_features(model, train.x, layers=[FINAL_LAYER], model_id=model_id,
                                       data_fingerprint=fp_train, image_size=image_size,
                                       cache_dir=cache_dir, batch_size=suite.batch_size, device=device)
        f_te, hit_te = cached_features(model, test.x, layers=[FINAL_LAYER], model_id=model_id,
                                       data_fingerprint=fp_test, image_size=image_size,
                                       cache_dir=cache_dir, batch_size=suite.batch_size, device=device)
        x_tr, x_te = f_tr[FINAL_LAYER], f_te[FINAL_LAYER]
        row["feature_dim"] = int(x_tr.shape[1])
        row["features_cached"] = bool(hit_tr[FINAL_LAYER] and hit_te[FINAL_LAYER])
        if protocols.linear_probe.enabled:
            lp = protocols.linear_probe
            log(f"{key}: linear probe")
            row["linear_probe"] = linear_probe(
                train_features=x_tr, train_labels=train.y, test_features=x_te, test_labels=test.y,
                c_grid=lp.c_grid, val_fraction=lp.val_fraction, max_iter=lp.max_iter,
                rng=np.random.default_rng(_subseed(suite.seed, key, "linear_probe"))).to_dict()
        if protocols.knn.enabled:
            log(f"{key}: k-NN")
            row["knn"] = knn_classify(train_features=x_tr, train_labels=train.y, test_features=x_te,
                                      test_labels=test.y, k=protocols.knn.k,
                                      temperature=protocols.knn.temperature).to_dict()
    if protocols.diagnostics.enabled:
        log(f"{key}: separation diagnostics")
        row["diagnostics"] = _diagnostics(model, train, suite=suite, key=key, model_id=model_id,
                                          image_size=image_size, cache_dir=cache_dir, device=device)
    if protocols.finetune.enabled:
        from audit.transfer.finetune import finetune_evaluate  # the DP engine loads only when fine-tuning

        log(f"{key}: fine-tuning ({'DP' if protocols.finetune.dp else 'non-DP'})")
        try:
            row["finetune"] = finetune_evaluate(
                model, train, test, protocol=protocols.finetune, device=device, eval_batch_size=suite.batch_size,
                seed=_subseed(suite.seed, key, "finetune")).to_dict()
        except UserError as exc:  # e.g. the DP engine rejects a layer: report it, keep the other results
            log(f"{key}: fine-tuning failed ({exc})")
            row["finetune"] = {"status": "error", "reason": str(exc)}
    return row


def evaluate_transfer(*, run_dir: str | os.PathLike[str] | VerifiedRun, suite: TransferSuite,
                      out_path: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                      log: Log | None = None, trust_code: bool = False) -> TransferResult:
    """Evaluate the checkpoint in ``run_dir`` on every dataset of ``suite``; write ``transfer.json``.

    Args:
        run_dir: a run directory (``model.safetensors`` + ``manifest.json``; weights are sha256-checked), or the
            run already opened with :func:`training.run.open_run`.
        suite: the transfer suite (:func:`audit.transfer.suite.load_suite`).
        out_path: where to write the result (default ``<run_dir>/transfer.json``).
        cache_dir: feature cache folder (default ``<run_dir>/features``).
        log: called with one line per stage (progress); None is silent.
        trust_code: allow the run to name code to import (``--trust-code``); recorded under ``code``.

    Returns:
        :class:`TransferResult`; every dataset of the suite has a row, in suite order.

    Raises:
        UntrustedCodeError: the run names code to import and ``trust_code`` is False (nothing was run).
        DataError: no dataset of the suite could be evaluated (nothing is written).
        CheckpointError: the run directory, manifest or weights are missing or do not match.
        ConfigError: ``device: cuda`` without a GPU.
    """
    run = as_run(run_dir, trust_code=trust_code, verify=False)
    run_dir, manifest = run.run_dir, run.manifest
    say: Log = log or (lambda _msg: None)
    device = resolve_device(suite.device, field="suite device")
    model = run.model(device=device)
    model_id = _model_id(manifest)
    image_size = int(suite.image_size or manifest.model.input_shape[1])
    cache = Path(cache_dir) if cache_dir is not None else run_dir / "features"
    if cache_dir is None and cache.is_symlink():  # received with the run: never followed, never written through
        say(f"{cache} is a symbolic link received with the run (to {os.readlink(cache)}): removed, its target left "
            "as it was; features are extracted afresh")
        cache.unlink()
    rows = [_evaluate_dataset(model, spec, suite=suite, model_id=model_id, image_size=image_size,
                              cache_dir=cache, device=device, log=say, index=i)
            for i, spec in enumerate(suite.datasets)]
    nothing = _none_evaluated(rows)
    if nothing is not None:  # a transfer.json of nothing but "missing" rows would read as a result
        raise DataError(nothing)
    data = TransferFile.from_data({
        "format": TRANSFER_FORMAT,
        "run": {"dir": str(run_dir), "name": manifest.run_name},
        "model": {"arch": manifest.model.arch, "weights_sha256": manifest.model.weights_sha256,
                  "model_id": model_id, "input_shape": list(manifest.model.input_shape)},
        "privacy": {"dp": manifest.privacy.dp, "claimed_epsilon": manifest.privacy.claimed_epsilon,
                    "delta": manifest.privacy.delta},
        "image_size": image_size,
        "device": str(device),
        "suite": suite.model_dump(mode="json"),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "datasets": rows,
        "code": run.code.to_dict(),
    })
    path = Path(out_path) if out_path is not None else run_dir / TRANSFER_FILE
    write_transfer_file(path, data, identity=evidence_identity(run))
    return TransferResult(data=data, path=path)
