"""Evidence from the auditor's own canaries (``audit epsilon RUN --canaries SECRET``): black-box, bits committed.

The run trained on the auditor's package (:mod:`training.canary_package`, ``training.canaries.from_file``); the
auditor now reveals its secret (:mod:`audit.canaries.secret`). Before any score is computed:

1. the secret must reproduce its own commitment (:func:`~audit.canaries.secret.verify_secret`);
2. the run's manifest must record an auditor package (``data.canaries.kind = "auditor"``) with **this**
   commitment and this package sha256, and the run must carry that package (its copy is checked against the sha256
   when the pool is rebuilt, and the pool against the manifest's fingerprint);
3. the canaries the run trained on must be exactly the secret's included canaries in package order, all members.

Any mismatch is a :class:`~foundation.errors.CheckpointError` (one line, exit 2). Then every canary, included or
not, is scored black-box: the target's scaled logit φ against reference models the auditor trains itself on pool
data + random halves of all canaries (:mod:`audit.canaries.references`), with LiRA online (fixed variance,
Carlini et al. 2022 §VI; higher = member). For a claimed-DP run two reference sets are trained, the claimed σ and
σ = 0; the one whose IN/OUT mixture explains the target's φ best (largest Σ_i log(½N_in + ½N_out)) scores the
canaries. The choice looks only at the model's outputs and at reference models trained independently of the
inclusion bits, so it is a post-processing of the trained model and the one-run theorem (Steinke et al. 2023,
guesses may be any function of the output) still holds; no α is spent on it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from attacks.lira import LiraOnline, fit_gaussians, gaussian_logpdf
from attacks.registry import AttackInputs
from attacks.signals import compute_signals
from audit.canaries.references import ReferenceSet, prepare_reference_set, reference_recipes
from audit.canaries.secret import CanarySecret, read_secret
from audit.bounds.sources import Evidence
from foundation.errors import CheckpointError
from training.run import VerifiedRun
from foundation.files import CANARY_REFERENCE_DIR

__all__ = ["check_run_against_secret", "lira_canary_scores", "mixture_loglik", "auditor_canary_evidence",
           "CANARY_REFERENCE_DIR", "AUDITOR_CANARY_LIMITS"]

#: What the auditor's own canaries cannot show (also a note of every verdict they take part in).
AUDITOR_CANARY_LIMITS = (
    "The auditor's canaries catch a forged claim on a faithful training run; they cannot show that the vendor trained "
    "on the package as its manifest says: a vendor who drops or down-weights the (identifiable) package canaries "
    "makes the model look private whatever it did to its own data.")
LIRA = LiraOnline(fix_variance=True, location="mean")  # the same centre as mixture_loglik's fit_gaussians


def check_run_against_secret(run: VerifiedRun, secret: CanarySecret) -> tuple[int, int]:
    """Check that ``run`` trained on exactly the package ``secret`` committed to; return (first_index, count).

    Raises:
        CheckpointError: the run trained on no auditor package, on another one, or on an altered one.
    """
    c = run.manifest.data.canaries or {}
    if c.get("kind") != "auditor":
        raise CheckpointError(f"run {run.run_dir} did not train on an auditor's canary package (its manifest records "
                              f"no data.canaries of kind 'auditor'): the vendor must train with "
                              f"training.canaries.from_file set to the package")
    if c.get("commitment") != secret.commitment:
        raise CheckpointError(f"the commitment recorded in run {run.run_dir} ({str(c.get('commitment'))[:16]}...) is "
                              f"not this secret's ({secret.commitment[:16]}...): the run trained on another package")
    if secret.package_sha256 is not None and c.get("package_sha256") != secret.package_sha256:
        raise CheckpointError(f"the canary package run {run.run_dir} trained on (sha256 "
                              f"{str(c.get('package_sha256'))[:16]}...) is not the file this secret wrote "
                              f"({secret.package_sha256[:16]}...)")
    first, count = int(c.get("first_index", -1)), int(c.get("count", -1))
    pool = run.pool  # rebuilt from the run's own package copy (sha256-checked) and checked against the fingerprint
    if count != secret.package_order.size or first < 0 or first + count != len(pool):
        raise CheckpointError(f"run {run.run_dir} trained on {count} canaries at [{first}, {first + count}) of a "
                              f"pool of {len(pool)}; the secret's package holds {secret.package_order.size}")
    if not (np.array_equal(pool.x[first:], secret.package_x) and np.array_equal(pool.y[first:], secret.package_y)):
        raise CheckpointError(f"the canaries run {run.run_dir} trained on differ from the secret's included canaries: "
                              "the package was altered")
    if not run.membership[first:].all():
        raise CheckpointError(f"run {run.run_dir}'s membership leaves out some package canaries; every package "
                              "canary must be trained on")
    return first, count


def lira_canary_scores(target_phi: np.ndarray, refs: ReferenceSet) -> np.ndarray:
    """LiRA-online scores (fixed variance) of every canary: higher = member."""
    return LIRA.score(AttackInputs(target=target_phi, reference=refs.phi, reference_in=refs.keep))


def mixture_loglik(target_phi: np.ndarray, refs: ReferenceSet) -> float:
    """Σ_i log(½ N(φ_i; IN_i) + ½ N(φ_i; OUT_i)) with the per-canary Gaussians LiRA fits (fixed variance).

    How well a reference set explains the target's outputs, whatever the (unknown) bits; used to choose the set.
    """
    fin = fit_gaussians(refs.phi, refs.keep, fix_variance=True)
    fout = fit_gaussians(refs.phi, ~refs.keep, fix_variance=True)
    a = gaussian_logpdf(target_phi, fin.mu, fin.var)
    b = gaussian_logpdf(target_phi, fout.mu, fout.var)
    return float((np.logaddexp(a, b) - np.log(2.0)).sum())


def auditor_canary_evidence(*, run: VerifiedRun, secret_path: str | Path, n_models: int, seed: int,
                            reference_dir: str | Path | None, sigma0: bool,
                            log: Callable[[str], None] | None = None) -> Evidence:
    """Verify the commitment, score every canary with LiRA against the auditor's references, return the evidence.

    Args:
        run: the verified target.
        secret_path: the auditor's secret file.
        n_models: K reference models per set; seed: their keep masks and seeds.
        reference_dir: where reference sets are kept (None: ``<run>/canary_references``); sets are keyed by
            what they were trained on, so one directory may serve many runs.
        sigma0: also train the σ = 0 set for a claimed-DP run.
        log: progress messages.

    Raises:
        CheckpointError: the secret or the run does not match the commitment (see the module docstring).
        UserError: the run's recipe cannot be followed by the batched engine.
    """
    secret = read_secret(secret_path)
    check_run_against_secret(run, secret)
    recipes, shadow = reference_recipes(run, sigma0=sigma0)
    root = Path(reference_dir) if reference_dir is not None else run.run_dir / CANARY_REFERENCE_DIR
    if reference_dir is None and root.is_symlink():  # shipped with the run: never followed, never written through
        (log or (lambda _m: None))(f"{root} is a symbolic link received with the run: removed (its target is left "
                                   f"alone), reference models are trained afresh")
        root.unlink()
    batch = shadow.config.training.batch_size
    sets = [prepare_reference_set(run=run, secret=secret, name=name, recipe=recipe, n_models=n_models, seed=seed,
                                  root=root, target_batch=batch, log=log) for name, recipe in recipes]
    target_phi = compute_signals(run.model(), secret.x, secret.y).astype(np.float64)
    if not np.isfinite(target_phi).all():
        raise CheckpointError(f"the model of {run.run_dir} gives non-finite outputs on the canaries")
    fits = [mixture_loglik(target_phi, s) for s in sets]
    best = int(np.argmax(fits))
    scores = lira_canary_scores(target_phi, sets[best])
    described: list[dict[str, Any]] = [{**s.describe(), "mixture_loglik": f, "used": i == best}
                                       for i, (s, f) in enumerate(zip(sets, fits))]
    return Evidence(source="auditor_canaries", scores=scores, included=secret.included.copy(), black_box=True,
                    provenance={"scores": "LiRA online (fixed variance) of the scaled logit on every canary",
                                "attack": "lira_online", "commitment": secret.commitment,
                                "package_sha256": secret.package_sha256, "kind": secret.kind, "m": secret.count,
                                "n_included": int(secret.included.sum()), "reference_sets": described,
                                "reference_set_used": sets[best].name,
                                "selection": "largest IN/OUT mixture log-likelihood of the target's outputs "
                                             "(bits not used)"})
