"""Open a run directory once: every file checked against the manifest the first time it is used, then kept.

Auditors never trust a run directory blindly (DESIGN.md). :func:`open_run` parses ``manifest.json`` and returns a
:class:`VerifiedRun`; each of its parts is read from disk exactly once, checked, and kept:

* ``state_dict``: ``model.safetensors`` read once, its sha256 compared with the manifest's, decoded from the
  same bytes; :meth:`VerifiedRun.model` builds the architecture and loads these tensors (no second read);
* ``membership``: ``membership.npy``, sha256 and shape checked;
* ``config``: ``config.yaml`` (runs written by ``audit train``), sha256 against ``provenance.config_sha256``,
  validated into a :class:`~training.config.TrainConfig` with every download flag off (:func:`without_downloads`);
* ``pool`` / ``population``: rebuilt with :func:`training.pool.build_pool` from the config (input canaries
  included), or from ``import.json`` (:mod:`training.run.imported`), or from the manifest alone, and refused
  unless its fingerprint equals ``data.pool_fingerprint``.

``open_run(run_dir)`` checks everything up front (what ``audit attack`` and ``audit epsilon`` need);
``open_run(run_dir, verify=False)`` defers each check to the first use of that part (the report and the gate
only need the manifest, and the pool for thumbnails when it can be rebuilt). Either way nothing unverified is
ever handed out, and one command opens a run once and passes the :class:`VerifiedRun` down.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from training.config import TrainConfig
from training.data import ImageSet, SplitRows
from foundation.errors import CheckpointError
from foundation.io import sha256_bytes, sha256_file
from training.pool import Pool
from foundation.files import CANARY_PACKAGE_FILE, CONFIG_FILE, METRICS_FILE
from training.run.imported import pool_from_import, pool_from_manifest, read_import_record
from training.run.manifest import Manifest, model_config, read_manifest
from training.run.readers import (parse_yaml, check_finite_weights, decode_weights, read_config, read_membership,
                                  read_weights, without_downloads)

if TYPE_CHECKING:
    from training.trust import CodeTrust

__all__ = ["VerifiedRun", "open_run", "as_run", "read_weights", "decode_weights", "check_finite_weights",
           "read_membership", "read_config", "read_pool", "without_downloads",
           "canary_package_of"]


def canary_package_of(run: VerifiedRun) -> Path | None:
    """The run's own copy of the auditor's canary package (``training.canaries.from_file``) after checking it
    against the sha256 the manifest records; None when the run trained on no package.

    Raises:
        CheckpointError: the copy is missing or differs from the manifest's record.
    """
    if run.config is None or run.config.training.canaries.from_file is None:
        return None
    path = run.run_dir / CANARY_PACKAGE_FILE
    want = (run.manifest.data.canaries or {}).get("package_sha256")
    if not path.is_file() or want is None or sha256_file(path) != want:
        raise CheckpointError(f"{path} is missing or does not match the package sha256 in the manifest "
                              f"(data.canaries): the run does not carry the canary package it trained on")
    return path


def read_pool(run: VerifiedRun, built: Pool | None = None) -> tuple[ImageSet, ImageSet | None, str]:
    """``(pool, population, population_source)`` rebuilt for ``run`` and checked against its manifest.

    From ``config.yaml`` with :func:`training.pool.build_pool` (population: its test split, canary sources
    removed), else from ``import.json`` (population: the non-members held out at import), else from the
    manifest alone (no population). ``built``: the pool this process already built from the run's config (the
    trainer's), checked instead of rebuilt.

    Raises:
        CheckpointError: the rebuilt pool's fingerprint or size differs from the manifest's.
        DataError: the pool's data cannot be loaded.
    """
    return _read_pool(run, built)[:3]


def _read_pool(run: VerifiedRun, built: Pool | None) -> tuple[ImageSet, ImageSet | None, str, SplitRows | None]:
    """:func:`read_pool` and the training split's rows the pool was drawn from (runs with a recipe)."""
    from training.pool import build_pool

    manifest, population, source, rows = run.manifest, None, "none", None
    if run.has_recipe:
        config = run.config
        said = {k: getattr(manifest.data, k) for k in ("dataset", "split", "image_size")}
        used = {k: getattr(config.data, k) for k in said}
        if said != used:
            key = next(k for k in said if said[k] != used[k])
            raise CheckpointError(f"{run.run_dir}: the manifest's data.{key} = {said[key]!r} differs from "
                                  f"{CONFIG_FILE}'s data.{key} = {used[key]!r}: the run directory was edited; "
                                  f"restore it (or retrain) before auditing")
        built = built if built is not None else build_pool(config, canary_package=canary_package_of(run))
        pool, population, rows = built.images, built.test, built.split
        if population is not None:
            source = f"{config.data.dataset}/{config.data.test_split} (test split)"
    elif (record := read_import_record(run.run_dir)) is not None:
        pool, population = pool_from_import(record)
        if population is not None:
            src = record["nonmembers"]
            source = f"{src['dataset']}/{src['split']} (non-members held out at import)"
    else:
        pool = pool_from_manifest(manifest, run.run_dir)
    fingerprint = pool.fingerprint()
    if fingerprint != manifest.data.pool_fingerprint or len(pool) != manifest.data.pool_size:
        raise CheckpointError(
            f"the pool rebuilt for {run.run_dir} ({len(pool)} examples, fingerprint {fingerprint[:12]}...) does not "
            f"match the manifest ({manifest.data.pool_size} examples, {manifest.data.pool_fingerprint[:12]}...): "
            f"the data on disk differs from the data the model was trained on; point data.root at the original data")
    return pool, population, source, rows


class VerifiedRun:
    """A run directory whose parts are verified against its manifest once, on first use, and kept.

    Attributes:
        run_dir: the run directory.
        manifest: its validated manifest (parsed once).
        code: the fields of the run that name code and whether the user trusted them
            (:func:`training.trust.require_code_trust`); every model built from this run passes
            ``code.trust_code`` on to :func:`training.models.build_model`.
    """

    def __init__(self, run_dir: Path, manifest: Manifest, *, code: CodeTrust | None = None,
                 built_pool: Pool | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._built_pool = built_pool
        self.manifest = manifest
        if code is None:
            from training.trust import CodeTrust

            code = CodeTrust(trust_code=False)
        self.code = code
        self._weights_checked = False
        self._weight_bytes: bytes | None = None
        self._state: dict[str, torch.Tensor] | None = None

    @property
    def trust_code(self) -> bool:
        """Whether models named by an import path in this run may be built (``--trust-code``)."""
        return self.code.trust_code

    def __repr__(self) -> str:
        return f"VerifiedRun({str(self.run_dir)!r})"

    # ------------------------------------------------------------------------------------------- parts

    def _check_weights(self) -> None:
        if not self._weights_checked:
            self._weight_bytes = read_weights(self.run_dir, self.manifest)
            self._weights_checked = True

    @property
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The verified weights (CPU tensors), decoded from the bytes that were hashed."""
        if self._state is None:
            self._check_weights()
            if self._weight_bytes is None:  # freed by model(keep_weights=False): read and check again
                self._weights_checked = False
                self._check_weights()
            path = self.run_dir / self.manifest.model.weights_file
            state = decode_weights(self._weight_bytes, source=path)
            check_finite_weights(state, path)
            self._state, self._weight_bytes = state, None
        return self._state

    @functools.cached_property
    def membership(self) -> np.ndarray:
        """Bool mask over the pool (True = trained on), sha256-verified."""
        return read_membership(self.run_dir, self.manifest)

    @functools.cached_property
    def _config_text(self) -> bytes | None:
        path = self.run_dir / CONFIG_FILE
        return path.read_bytes() if path.is_file() else None

    @functools.cached_property
    def _config_parsed(self) -> Any:
        return None if self._config_text is None else parse_yaml(self.run_dir / CONFIG_FILE, self._config_text)

    @property
    def config_data(self) -> dict[str, Any] | None:
        """``config.yaml`` as a mapping, for display only (not checked); None when absent or not a mapping."""
        data = self._config_parsed
        return data if isinstance(data, dict) else None

    @property
    def config_sha256(self) -> str | None:
        """sha256 of the bytes of ``config.yaml`` as read (None when absent); not compared with the manifest."""
        return None if self._config_text is None else sha256_bytes(self._config_text)

    @functools.cached_property
    def config(self) -> TrainConfig | None:
        """The training recipe (``config.yaml``, sha256-checked and validated), or None for imported checkpoints."""
        if self._config_text is None:
            return None
        return read_config(self.run_dir, self.manifest, self._config_text, lambda: self._config_parsed)

    @functools.cached_property
    def _pool(self) -> tuple[ImageSet, ImageSet | None, str, SplitRows | None]:
        parts = _read_pool(self, self._built_pool)
        self._built_pool = None
        return parts

    @property
    def pool(self) -> ImageSet:
        """The rebuilt training pool; its fingerprint equals the manifest's."""
        return self._pool[0]

    @property
    def population(self) -> ImageSet | None:
        """Examples known to be OUT of the model (candidates for population samples z), or None."""
        return self._pool[1]

    @property
    def population_source(self) -> str:
        """Where :attr:`population` came from (for the record)."""
        return self._pool[2]

    @property
    def split_rows(self) -> SplitRows | None:
        """The training split and the pool's rows in it (runs with a recipe; None otherwise); its complement is
        part of the attacks' population (:func:`training.run.population.run_population`)."""
        return self._pool[3]

    # ------------------------------------------------------------------------------------------- identity

    @property
    def has_recipe(self) -> bool:
        """True when the run carries the recipe (``config.yaml``) that reference models need."""
        return self._config_text is not None

    @property
    def weights_sha256(self) -> str:
        """The manifest's weights sha256, after the weights file was checked against it."""
        self._check_weights()
        return self.manifest.model.weights_sha256

    @property
    def membership_sha256(self) -> str:
        """The manifest's membership sha256, after the membership file was checked against it."""
        self.membership
        return self.manifest.data.membership_sha256

    @property
    def pool_fingerprint(self) -> str:
        """The fingerprint of the pool the weights and membership belong to, as the manifest records it (the data
        on disk is compared with it when :attr:`pool` is first used)."""
        return self.manifest.data.pool_fingerprint

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS_FILE

    def verify(self) -> VerifiedRun:
        """Check every part now (weights, membership, config, pool); return ``self``.

        Raises:
            CheckpointError: any mismatch or missing file, with what was wrong and how to fix it.
            DataError: the pool's data cannot be loaded.
        """
        self.state_dict
        self.membership
        self.config
        self._pool
        if len(self.membership) != len(self.pool):
            raise CheckpointError(f"{self.run_dir}: membership has {len(self.membership)} entries but the pool has "
                                  f"{len(self.pool)} examples")
        return self

    # ------------------------------------------------------------------------------------------- model

    def model(self, *, device: str | torch.device = "cpu", keep_weights: bool = True) -> torch.nn.Module:
        """The architecture named in the manifest with the verified weights loaded (eval mode, on ``device``).

        Args:
            device: where the model goes.
            keep_weights: keep the verified tensors for another call; False frees them (a later call reads
                and verifies the file again).

        Raises:
            CheckpointError: the weights do not fit the architecture.
            ConfigError: the architecture cannot be built.
            UntrustedCodeError: the manifest names code to import and the run was not opened with ``trust_code``.
        """
        from training.models import build_model

        m = self.manifest.model
        built = build_model(model_config(self.manifest), num_classes=m.num_classes,
                            input_shape=tuple(m.input_shape), trust_code=self.trust_code)
        module = built.module
        try:
            module.load_state_dict(self.state_dict, strict=True)
        except RuntimeError as exc:  # torch: "Error(s) in loading state_dict for X:\n\t<first problem>\n\t..."
            problems = [" ".join(ln.split()) for ln in str(exc).splitlines()[1:] if ln.strip()]
            first = (problems or [str(exc)])[0]
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CheckpointError(f"weights in {self.run_dir / m.weights_file} do not fit architecture {m.arch} with "
                                  f"the manifest's num_classes={m.num_classes}, input_shape={tuple(m.input_shape)}: "
                                  f"{first[:300]}{more}") from None
        if not keep_weights:
            self._state = None
        return module.to(device).eval()


def open_run(run_dir: str | os.PathLike[str], *, trust_code: bool = False, verify: bool = True,
             scan_code: bool = True) -> VerifiedRun:
    """Open a run directory for auditing: its manifest parsed once, every other file verified once.

    Args:
        run_dir: a directory written by ``audit train``, ``audit import`` or the reference-model trainer.
        trust_code: allow the run to name code to import (an import-path ``model.arch``; ``--trust-code``): only
            when the user trusts who made the run directory. Checked first, before anything else is read.
        verify: check the weights, membership, config and pool now; False checks each on first use.
        scan_code: refuse a run that names code up front (:func:`training.trust.require_code_trust`); False for
            readers that never build a model (the report, the gate): :meth:`VerifiedRun.model` still refuses an
            import path unless ``trust_code``.

    Returns:
        The :class:`VerifiedRun`.

    Raises:
        UntrustedCodeError: the run names code to import and ``trust_code`` is False (nothing was read further).
        CheckpointError: the directory or manifest is missing or invalid, or (``verify``) any file does not
            match the manifest. DataError: (``verify``) the pool's data cannot be loaded.

    >>> open_run("/nonexistent/run")
    Traceback (most recent call last):
    ...
    foundation.errors.CheckpointError: run directory not found: /nonexistent/run
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise CheckpointError(f"run directory not found: {path}")
    from training.trust import CodeTrust, require_code_trust  # training.trust names this package's files

    code = require_code_trust(path, trust_code=trust_code) if scan_code else CodeTrust(trust_code=trust_code)
    run = VerifiedRun(path, read_manifest(path), code=code)
    return run.verify() if verify else run


def as_run(run: VerifiedRun | str | os.PathLike[str], *, trust_code: bool = False, verify: bool = True,
           scan_code: bool = True) -> VerifiedRun:
    """``run`` itself when it is already open (with the trust it was opened with), else :func:`open_run` of the
    path (so a command opens a run once and passes it down)."""
    if isinstance(run, VerifiedRun):
        return run.verify() if verify else run
    return open_run(run, trust_code=trust_code, verify=verify, scan_code=scan_code)
