"""Evidence for the one-run ε audit: canary scores and inclusion bits read back from a run directory.

A one-run audit (Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023) needs
``m`` canaries, each included in training independently with probability 1/2, and one score per canary
(higher score = member). Each loader below rebuilds such a set from files a training run wrote, checks them
against the manifest, and returns an :class:`Evidence` (or a :class:`Skipped` saying why the source does not
apply to this run):

* :func:`pool_evidence` — the target's own pool, whose members were drawn Bernoulli(1/2); scores of the
  configured attack from ``scores.npz`` (``audit attack``). Black-box.
* :func:`input_canary_evidence` — input canaries appended to the pool at training time (manifest
  ``data.canaries``); scores from ``scores.npz`` when it covers them, else the scaled logit
  φ = log p_y − log Σ_{y'≠y} p_y' of the target model (the LOSS attack's ranking: loss = softplus(−φ)).
  Black-box.
* :func:`gradient_canary_evidence` — white-box gradient canaries (``training.gradient_canaries``): directions
  u_i regenerated from the seed the manifest records, score −⟨θ_T − θ_0, u_i⟩ (higher = member) from the
  verified final weights and the recorded θ_0.

Problems the user can fix (a missing ``scores.npz``, a file that does not match the manifest) raise
:class:`~foundation.errors.UserError` subclasses with one line; a source that cannot apply to this kind of run
(no canaries, membership not Bernoulli(1/2)) is skipped with a reason.
"""

from __future__ import annotations

import dataclasses
import math
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from foundation.errors import CheckpointError, DataError, UserError
from foundation.evidence import read_signed_npz
from foundation.io import sha256_file
from training.run import CONFIG_FILE, VerifiedRun, evidence_identity
from training.run.manifest import Manifest
from foundation.files import SCORES_FILE

__all__ = ["Evidence", "Skipped", "SOURCES", "SCORES_FILE", "pool_evidence", "input_canary_evidence",
           "gradient_canary_evidence", "ZERO_UPDATE", "read_scores", "check_index_array", "finite_scores", "inclusion_is_half",
           "run_recipe"]

SOURCES = ("pool", "input_canaries", "gradient_canaries", "multi_run", "auditor_canaries")
"""Evidence sources; ``multi_run`` trains models (:mod:`audit.bounds.multi_run_source`); ``auditor_canaries``
scores the auditor's own committed canaries against reference models it trains (:mod:`audit.bounds.auditor_source`);
the rest read files."""
#: Why the gradient canaries are skipped when the recorded θ_0 equals the final weights; the runner turns it into a
#: ``zero_update`` finding (error): training with noise cannot leave every canaried parameter exactly unchanged.
ZERO_UPDATE = ("the recorded initial weights θ_0 equal the final weights θ_T on every canaried parameter (a zero "
               "update): no training run with noise ends where it started, so model_init or the weights were swapped")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evidence:
    """Canary scores and inclusion bits for one source, with where they came from.

    Attributes:
        source: ``"pool"``, ``"input_canaries"`` or ``"gradient_canaries"``.
        scores: float64 (m,), one finite score per canary; higher = member.
        included: bool (m,), whether each canary was in training (independent Bernoulli(1/2)).
        black_box: whether the scores use only the model's outputs.
        provenance: how the scores were obtained (files, attack, sha256s), copied into each estimate's ``extra``.
    """

    source: str
    scores: np.ndarray
    included: np.ndarray
    black_box: bool
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {self.source!r}")
        scores = np.asarray(self.scores, dtype=np.float64)
        included = np.asarray(self.included)
        if scores.ndim != 1 or scores.size == 0 or not np.all(np.isfinite(scores)):
            raise ValueError(f"scores must be a non-empty finite 1-D array, got shape {scores.shape}")
        if included.dtype != np.bool_ or included.shape != scores.shape:
            raise ValueError(f"included must be a bool array of shape {scores.shape}, got {included.dtype} "
                             f"{included.shape}")
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "included", included)
        object.__setattr__(self, "provenance", MappingProxyType(dict(self.provenance)))

    @property
    def m(self) -> int:
        """Number of canaries."""
        return int(self.scores.size)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A source that does not apply to this run, and why (one line)."""

    source: str
    reason: str


def inclusion_is_half(manifest: Manifest, *, canaries: bool) -> str | None:
    """Why pool examples (or input canaries) were NOT included independently with probability 1/2, or None.

    The trainer draws the whole pool Bernoulli(p) under ``scheme="bernoulli"`` (canaries included), and only the
    canaries Bernoulli(1/2) under ``scheme="all"`` (real examples are then all members).
    """
    mem = manifest.data.membership
    if mem.scheme == "bernoulli":
        if mem.p is None or not math.isclose(mem.p, 0.5, rel_tol=0.0, abs_tol=1e-12):
            return f"members were drawn Bernoulli(p={mem.p}), the one-run audit needs p = 0.5 (data.member_prob)"
        return None
    if mem.scheme == "all" and canaries:
        return None
    return (f"membership scheme is '{mem.scheme}': {'canaries' if canaries else 'pool examples'} were not "
            "included independently with probability 1/2")


# ------------------------------------------------------------------------------------------------ scores.npz


def read_scores(run_dir: Path, *, attack: str, identity: Mapping[str, Any] | None = None,
                n_pool: int | None = None) -> tuple[dict[str, np.ndarray], str]:
    """Arrays of ``<run_dir>/scores.npz`` (``pool_index``, ``membership``, ``score_<attack>``) and its sha256.

    Only a file signed by this auditor's evidence key is read (:mod:`foundation.evidence`), fresh against
    ``identity`` when given; its arrays are checked structurally (1-D, one length, unique indices in
    ``[0, n_pool)``, no NaN).

    Raises:
        CheckpointError: the file is missing, unreadable, unsigned, edited, stale, lacks an array, or its arrays
            are malformed.
        UserError: the file has no scores for ``attack`` (names the attacks it has).
    """
    path = Path(run_dir) / SCORES_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found: run 'audit attack {run_dir}' first (the pool source needs "
                              "attack scores), or choose other sources with --sources")
    remake = f"audit attack {run_dir}"
    arrays = read_signed_npz(path, remake=remake, identity=identity)
    for key in ("pool_index", "membership"):
        if key not in arrays:
            raise CheckpointError(f"{path} lacks the array '{key}'; re-run 'audit attack'")
    key = f"score_{attack}"
    if key not in arrays:
        have = sorted(k.removeprefix("score_") for k in arrays if k.startswith("score_"))
        raise UserError(f"{path} has no scores for attack '{attack}' (it has: {', '.join(have) or 'none'}); "
                        f"pass --attack with one of those or re-run 'audit attack' with that attack")
    n = arrays["pool_index"].shape
    for k in ("membership", key):
        if arrays[k].shape != n:
            raise CheckpointError(f"{path}: array '{k}' has shape {arrays[k].shape}, pool_index has {n}")
    check_index_array(arrays["pool_index"], n_pool=n_pool, what=f"{path}: pool_index", remake=remake)
    if arrays[key].dtype.kind not in "fiu" or arrays["membership"].dtype != np.bool_:
        raise CheckpointError(f"{path}: '{key}' must hold numbers and 'membership' bools; re-run '{remake}'")
    return {"pool_index": arrays["pool_index"].astype(np.int64), "membership": arrays["membership"].astype(bool),
            "scores": arrays[key].astype(np.float64)}, sha256_file(path)


def check_index_array(index: np.ndarray, *, n_pool: int | None, what: str, remake: str) -> None:
    """Refuse an index array that is not 1-D integers, unique, and (given ``n_pool``) in ``[0, n_pool)``: a row
    duplicated or an index out of range would count one example several times or score another run's.

    >>> check_index_array(np.array([0, 2, 2]), n_pool=3, what="x", remake="audit attack")
    Traceback (most recent call last):
    ...
    foundation.errors.CheckpointError: x: 1 index value(s) repeated (rows duplicated); re-run 'audit attack'
    """
    if index.ndim != 1 or index.dtype.kind not in "iu":
        raise CheckpointError(f"{what} must be a 1-D integer array, got {index.dtype} of shape {index.shape}; "
                              f"re-run '{remake}'")
    repeated = int(index.size - np.unique(index).size)
    if repeated:
        raise CheckpointError(f"{what}: {repeated} index value(s) repeated (rows duplicated); re-run '{remake}'")
    if n_pool is not None and index.size and (int(index.min()) < 0 or int(index.max()) >= n_pool):
        raise CheckpointError(f"{what}: indices outside [0, {n_pool}); re-run '{remake}'")


def finite_scores(scores: np.ndarray, *, what: str) -> np.ndarray:
    """Scores with ±inf replaced by finite values beyond every finite score (order kept); NaN is an error.

    >>> finite_scores(np.array([1.0, np.inf, -np.inf, 0.5]), what="x").tolist()
    [1.0, 2.0, -0.5, 0.5]
    """
    s = np.asarray(scores, dtype=np.float64).copy()
    if np.isnan(s).any():
        raise DataError(f"{what}: {int(np.isnan(s).sum())} score(s) are NaN; re-run the step that wrote them")
    finite = s[np.isfinite(s)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    s[s == np.inf] = hi + 1.0
    s[s == -np.inf] = lo - 1.0
    return s


def _check_scores_membership(membership: np.ndarray, scores: Mapping[str, np.ndarray], index: np.ndarray,
                             run_dir: Path) -> None:
    if index.size and (index.min() < 0 or index.max() >= membership.size):
        raise CheckpointError(f"{run_dir / SCORES_FILE}: pool_index out of range [0, {membership.size}); "
                              "it belongs to another run")
    if not np.array_equal(scores["membership"], membership[index]):
        raise CheckpointError(f"{run_dir / SCORES_FILE} records a membership that differs from the run's "
                              "membership.npy: it was computed for another run; re-run 'audit attack'")


# ------------------------------------------------------------------------------------------------- sources


def _canary_range(manifest: Manifest) -> tuple[int, int] | None:
    c = manifest.data.canaries
    if not c or int(c.get("count", 0)) <= 0:
        return None
    first, count = int(c["first_index"]), int(c["count"])
    if first < 0 or first + count > manifest.data.pool_size:
        raise CheckpointError(f"manifest data.canaries [{first}, {first + count}) lies outside the pool of "
                              f"{manifest.data.pool_size}")
    return first, count


def pool_evidence(*, run: VerifiedRun, attack: str) -> Evidence | Skipped:
    """The pool's real examples (input canaries excluded) as one-run canaries, scored by ``attack``.

    Raises:
        UserError: ``scores.npz`` is missing, lacks ``attack``, or does not match the run.
    """
    run_dir, manifest, membership = run.run_dir, run.manifest, run.membership
    why = inclusion_is_half(manifest, canaries=False)
    if why is not None:
        return Skipped("pool", why)
    if str(manifest.model.arch).startswith("user-model/") and not (run_dir / SCORES_FILE).is_file():
        # an OpacusAuditor run over an audit.AuditPool, not attacked yet: its canaries still audit it
        return Skipped("pool", f"no attack scores yet ({SCORES_FILE}): your training function makes them, "
                               f"audit.attack({str(run_dir)!r}, train_fn=train_fn)")
    arrays, sha = read_scores(run_dir, attack=attack, identity=evidence_identity(run, claim=False),
                              n_pool=membership.size)
    index = arrays["pool_index"]
    _check_scores_membership(membership, arrays, index, run_dir)
    keep = np.ones(index.size, dtype=bool)
    span = _canary_range(manifest)
    if span is not None:
        keep &= (index < span[0]) | (index >= span[0] + span[1])
    if not keep.any():
        return Skipped("pool", f"{SCORES_FILE} holds no scores for real pool examples")
    return Evidence(source="pool", scores=finite_scores(arrays["scores"][keep], what=f"{SCORES_FILE}:{attack}"),
                    included=membership[index[keep]], black_box=True,
                    provenance={"scores": f"{SCORES_FILE}:score_{attack}", "attack": attack, "scores_sha256": sha,
                                "n_examples": int(keep.sum())})


def input_canary_evidence(*, run: VerifiedRun, attack: str) -> Evidence | Skipped:
    """The input canaries of ``manifest.data.canaries``: scores from ``scores.npz`` if it covers them all,
    else the scaled logit of the target model (black-box LOSS ranking).

    Raises:
        UserError: the run's files do not match its manifest (config, pool fingerprint, weights).
    """
    run_dir, manifest, membership = run.run_dir, run.manifest, run.membership
    span = _canary_range(manifest)
    if span is None:
        return Skipped("input_canaries", "the run has no input canaries (training.canaries.count = 0)")
    if (manifest.data.canaries or {}).get("kind") == "auditor":
        return Skipped("input_canaries", "the canaries are an auditor's package (all members; the auditor holds the "
                                         "inclusion bits): audit them with --canaries SECRET (source auditor_canaries)")
    why = inclusion_is_half(manifest, canaries=True)
    if why is not None:
        return Skipped("input_canaries", why)
    idx = np.arange(span[0], span[0] + span[1])
    included = membership[idx]
    kind = str((manifest.data.canaries or {}).get("kind", "unknown"))
    if (Path(run_dir) / SCORES_FILE).is_file():
        try:
            arrays, sha = read_scores(run_dir, attack=attack, identity=evidence_identity(run, claim=False),
                                      n_pool=membership.size)
        except CheckpointError:
            raise
        except UserError:  # no scores for this attack: score the canaries directly
            arrays = None
        if arrays is not None:
            _check_scores_membership(membership, arrays, arrays["pool_index"], run_dir)
            where = {int(p): k for k, p in enumerate(arrays["pool_index"])}
            if all(int(i) in where for i in idx):
                pos = np.array([where[int(i)] for i in idx])
                return Evidence(source="input_canaries",
                                scores=finite_scores(arrays["scores"][pos], what=f"{SCORES_FILE}:{attack}"),
                                included=included, black_box=True,
                                provenance={"scores": f"{SCORES_FILE}:score_{attack}", "attack": attack,
                                            "scores_sha256": sha, "kind": kind, "first_index": span[0]})
    if (manifest.data.canaries or {}).get("file") and not run.has_recipe:
        return _recorded_canary_evidence(run, included, kind, span[0])
    return Evidence(source="input_canaries", scores=_scaled_logits(run, idx), included=included,
                    black_box=True,
                    provenance={"scores": "scaled logit of the target model (LOSS ranking), un-augmented query",
                                "attack": "loss", "kind": kind, "first_index": span[0]})


def _recorded_canary_evidence(run: VerifiedRun, included: np.ndarray, kind: str, first: int) -> Evidence:
    """Input canaries of a run trained by the user's own script (``audit.OpacusAuditor``): the canary file the
    manifest names (sha256-checked) holds their inputs, inclusion and the scaled logit φ of the final model, scored
    in the training process because the user's model class is not rebuilt by auditors."""
    rec = run.manifest.data.canaries or {}
    path = _recorded_file(run.run_dir, rec, "file", "sha256", what="input-canary")
    try:
        with np.load(path, allow_pickle=False) as npz:
            phi, inc = npz["phi"].astype(np.float64), npz["included"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{path} is not a readable input-canary record ({exc}); re-run the training") from None
    if phi.shape != included.shape or not np.array_equal(inc, included):
        raise CheckpointError(f"{path} does not match the run's membership file (canary inclusion differs)")
    return Evidence(source="input_canaries", scores=finite_scores(phi, what=str(path)), included=included,
                    black_box=True,
                    provenance={"scores": f"{path.name}:phi, scaled logit recorded by the training process "
                                          "(audit.OpacusAuditor; the model class is the user's)",
                                "attack": "loss", "kind": kind, "first_index": first, "scores_sha256": rec["sha256"]})


def _scaled_logits(run: VerifiedRun, idx: np.ndarray) -> np.ndarray:
    """φ of the verified target model on the verified pool's examples ``idx``."""
    from attacks.signals import compute_signals

    phi = compute_signals(run.model(), run.pool.x[idx], run.pool.y[idx])
    return phi[:, 0].astype(np.float64)


def run_recipe(run: VerifiedRun):
    """The run's verified training config (``config.yaml``).

    Raises:
        CheckpointError: the run has no ``config.yaml`` (an imported checkpoint), or it differs from the manifest's.
    """
    if run.config is None:
        raise CheckpointError(f"{run.run_dir / CONFIG_FILE} not found: the run directory is incomplete")
    return run.config


def gradient_canary_evidence(*, run: VerifiedRun) -> Evidence | Skipped:
    """White-box scores −⟨θ_T − θ_0, u_i⟩ of the gradient canaries (higher = member).

    Everything comes from the manifest's record ``training.gradient_canaries`` (written by the trainer): the count
    and seed that regenerate the directions u_i, the inclusion mask file and its sha256, the order of the
    trainable parameters the directions span, and θ_0 (the weights at the start of the DP phase) with its sha256.
    θ_T is ``model.safetensors``, checked against the manifest.

    Raises:
        CheckpointError: a recorded file is missing, does not match its sha256, or does not fit the parameters.
    """
    from training.dp.canaries import GradientCanaries, flatten_parameters
    from foundation.io import load_safetensors

    run_dir, manifest = run.run_dir, run.manifest
    rec = manifest.training.get("gradient_canaries")
    if not rec:
        return Skipped("gradient_canaries", "the run records no gradient canaries (training.gradient_canaries.count "
                                            "= 0, or a checkpoint not trained by dp-audit)")
    inc_path = _recorded_file(run_dir, rec, "included_file", "included_sha256")
    init_path = _recorded_file(run_dir, rec, "init_weights", "init_weights_sha256")
    count, seed, names = int(rec["count"]), int(rec["seed"]), [str(n) for n in rec["param_names"]]
    try:
        included = np.load(inc_path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:  # a pickle, a truncated or foreign file: never unpickled
        raise CheckpointError(f"{inc_path} is not a plain .npy bool array ({exc}); re-train the run") from None
    if not isinstance(included, np.ndarray) or included.dtype != np.bool_ or included.shape != (count,):
        raise CheckpointError(f"{inc_path} must hold {count} booleans, got {included.dtype} {included.shape}")
    final = run.state_dict
    init = load_safetensors(init_path)
    missing = [n for n in names if n not in final]
    if missing:
        raise CheckpointError(f"{run_dir / manifest.model.weights_file} lacks the canaries' parameter {missing[0]!r}")
    shapes = {n: tuple(final[n].shape) for n in names}
    bad = [n for n in names if n not in init or tuple(init[n].shape) != shapes[n]]
    if bad:
        raise CheckpointError(f"{init_path} does not fit the final weights (parameter {bad[0]!r})")
    delta = flatten_parameters(final, names) - flatten_parameters(init, names)
    if not np.any(delta):
        return Skipped("gradient_canaries", ZERO_UPDATE)
    canaries = GradientCanaries(param_shapes=shapes, count=count, seed=seed, included=included)
    return Evidence(source="gradient_canaries", scores=canaries.scores(delta), included=canaries.included,
                    black_box=False,
                    provenance={"scores": "-<theta_T - theta_0, u_i> (white-box)", "seed": seed,
                                "dim": canaries.dim, "sample_rate": rec.get("sample_rate"),
                                "steps": rec.get("steps"), "init_weights_sha256": rec["init_weights_sha256"],
                                "update_norm": float(np.linalg.norm(delta))})


def _recorded_file(run_dir: Path, rec: Mapping[str, Any], name_key: str, sha_key: str,
                   what: str = "gradient-canary") -> Path:
    """A file named in the manifest's gradient-canary (or input-canary) record, after checking its sha256."""
    try:
        path, expected = run_dir / str(rec[name_key]), str(rec[sha_key])
    except KeyError as exc:
        raise CheckpointError(f"manifest's {what} record lacks '{exc.args[0]}'; re-train the run") from None
    if Path(str(rec[name_key])).name != str(rec[name_key]):
        raise CheckpointError(f"manifest's {what} record names {rec[name_key]!r}, not a file inside the run directory")
    if not path.is_file():
        raise CheckpointError(f"{path} named in the manifest's {what} record is missing")
    if sha256_file(path) != expected:
        raise CheckpointError(f"{path} does not match the sha256 in the manifest's {what} record: it was "
                              "modified or belongs to another run")
    return path
