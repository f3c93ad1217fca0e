"""Run directories for the `audit epsilon` tests, built from the manifest schema (no training).

:func:`make_run` writes a pool whose members are drawn Bernoulli(1/2) from the recorded seed, the manifest's claim
(σ from the accountant, so the claim follows from the mechanism) and placeholder weights unless given;
:func:`write_scores` writes a signed ``scores.npz`` as `audit attack` does. Used by tests/test_epsilon_runner.py,
tests/test_epsilon_canary_sources.py and tests/test_epsilon_power.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from fixtures_runs import write_signed

from foundation.io import fingerprint_arrays, save_safetensors, sha256_bytes, sha256_file, write_npy, write_text
from training.accounting import noise_multiplier_for
from training.config import TrainConfig, dump_config
from training.pool import draw_membership
from training.run import inputs_digest, open_run
from training.run.manifest import (DataInfo, Manifest, MembershipInfo, ModelInfo, PhaseInfo, PrivacyInfo, Provenance,
                                   write_manifest)

__all__ = ["TOP_KEYS", "ESTIMATE_KEYS", "VERDICT_KEYS", "make_run", "write_scores", "identity_digest", "read"]

# format, run, inputs, code: what every stage's result file opens with (foundation.result_json.RunResult)
TOP_KEYS = ["format", "run", "inputs", "code", "claimed_epsilon", "delta", "alpha", "estimates", "skipped", "power",
            "verdict", "evidence"]
ESTIMATE_KEYS = ["method", "source", "epsilon_lb", "alpha", "delta", "counts", "ceiling", "assumptions", "extra"]
VERDICT_KEYS = ["status", "claimed_epsilon", "claimed_delta", "best_epsilon_lb", "best_method", "best_source",
                "tightness", "inconclusive_above", "confidence", "max_ceiling", "violating", "notes", "findings"]


def make_run(run_dir: Path, *, pool: int = 600, epsilon: float | None = 1.0, delta: float = 1e-5, p: float = 0.5,
             scheme: str = "bernoulli", sample_rate: float = 0.1, canaries: int = 0, seed: int = 0,
             weights: dict | None = None, config: TrainConfig | None = None, model: ModelInfo | None = None,
             fingerprint: str | None = None, training: dict | None = None) -> Path:
    """A schema-valid run directory (weights are a placeholder file unless ``weights`` is given)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    membership = rng.random(pool) < p if scheme == "bernoulli" else np.ones(pool, dtype=bool)
    drawn = scheme == "bernoulli" and 0 < p < 1
    if drawn:  # the draw the manifest records, canaries included (the reader draws it again)
        membership = draw_membership(pool, p=p, seed=seed)
    if canaries:
        inclusion = rng.random(canaries) < 0.5
        if not drawn:
            membership[pool - canaries:] = inclusion
    write_npy(run_dir / "membership.npy", membership)
    if weights is None:
        write_text(run_dir / "model.safetensors", "placeholder weights")
    else:
        save_safetensors(run_dir / "model.safetensors", weights)
    config_sha = None
    if config is not None:
        text = dump_config(config)
        write_text(run_dir / "config.yaml", text)
        config_sha = sha256_bytes(text.encode("utf-8"))
    dp = epsilon is not None
    steps = 100 if epsilon != 0 else 0  # ε = 0 follows only from no step at all
    sigma = (noise_multiplier_for(target_epsilon=epsilon, sample_rate=sample_rate, steps=steps, delta=delta,
                                  accountant="rdp") if steps else 1.0) if dp else None  # the claim follows
    phase = PhaseInfo(name="private" if dp else "non-private", dp=dp, noise_multiplier=sigma,
                      sample_rate=sample_rate, steps=steps, epsilon=epsilon)
    x = np.zeros((pool, 8, 8, 3), dtype=np.uint8)
    model = model or ModelInfo(arch="mlp", num_classes=10, input_shape=(3, 8, 8), param_count=1,
                               trainable_param_count=1, weights_sha256="")
    manifest = Manifest(
        run_name=run_dir.name,
        model=model.model_copy(update={"weights_sha256": sha256_file(run_dir / "model.safetensors")}),
        data=DataInfo(dataset=config.data.dataset if config is not None else "synthetic",
                      split=config.data.split if config is not None else "train", pool_size=pool,
                      pool_fingerprint=fingerprint or fingerprint_arrays(x, np.zeros(pool, dtype=np.int64)),
                      membership_sha256=sha256_file(run_dir / "membership.npy"),
                      membership=MembershipInfo(scheme=scheme, p=p if scheme == "bernoulli" else None, seed=seed,
                                                n_members=int(membership.sum()), n_pool=pool),
                      canaries={"kind": "ood", "count": canaries, "seed": 0, "first_index": pool - canaries}
                      if canaries else None),
        privacy=PrivacyInfo(dp=dp, delta=delta if dp else None, accountant="rdp" if dp else None, epsilon=epsilon,
                            phases=[phase]),
        training=training or {},
        provenance=Provenance(package_version="0", seed=seed, config_sha256=config_sha,
                              created="2025-01-01T00:00:00+00:00"),
    )
    write_manifest(run_dir, manifest)
    return run_dir


def write_scores(run_dir: Path, *, signal: float, seed: int = 1, attacks=("lira_online", "loss"),
                 index: np.ndarray | None = None, flip_membership: bool = False) -> np.ndarray:
    """scores.npz over ``index`` (default: the whole pool): members shifted up by ``signal`` standard deviations."""
    membership = np.load(run_dir / "membership.npy")
    index = np.arange(membership.size) if index is None else index
    mem = membership[index]
    rng = np.random.default_rng(seed)
    arrays = {f"score_{a}": rng.normal(size=index.size) + signal * mem for a in attacks}
    recorded = ~mem if flip_membership else mem
    write_signed(run_dir, "scores.npz", pool_index=index, membership=recorded, labels=np.zeros(index.size),
                 inputs_digest=np.array(identity_digest(run_dir)), **arrays)
    return mem


def identity_digest(run_dir: Path) -> str:
    """What ``audit attack`` records in ``scores.npz``: the run's identity digest."""
    return inputs_digest(open_run(run_dir, verify=False))


def read(run_dir: Path) -> dict:
    return json.loads((run_dir / "epsilon.json").read_text())

