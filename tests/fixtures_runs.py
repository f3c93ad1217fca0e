"""Construct fake but schema-valid run directories for report and gate tests.

Every file is built with its writer's own model and written with its writer's function: ``manifest.json``
through :class:`training.run.manifest.Manifest`, ``attack.json`` through :class:`attacks.attack_file.AttackFile`,
``epsilon.json`` through :class:`audit.bounds.runner.EpsilonReport` (its verdict by the runner's own
:func:`~audit.bounds.runner.judge_estimates`), ``transfer.json`` through
:class:`audit.transfer.transfer_file.TransferFile`. So a reader that drifts from its writer fails here too.
Attack curves are binormal: with separation ``d`` (higher score = member), TPR(FPR) = Φ(Φ⁻¹(FPR) + d) and
AUC = Φ(d / √2), so every number is known in closed form.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.stats import norm

from attacks.attack_file import (AttackEntry, AttackFile, AttackMetrics, AttackSetup, ClassSlice, Roc, Utility,
                                 write_attack_file)
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.epsilon_file import write_epsilon_file
from audit.bounds.runner import EpsilonReport, SourcedEstimate, judge_estimates
from audit.transfer.transfer_file import (Accuracy, DecayEntry, Diagnostics, KnnEntry, LayerEntry, LinearProbeEntry,
                                          SplitInfo, TransferFile, TransferRow, write_transfer_file)
from foundation.evidence import EVIDENCE_KEY, sign_json, write_signed_npz
from foundation.io import fingerprint_arrays, read_json, sha256_file, write_json, write_npy, write_text
from training.pool import draw_membership
from training.run.freshness import evidence_identity
from training.run.manifest import (
    DataInfo,
    Manifest,
    MembershipInfo,
    ModelInfo,
    PhaseInfo,
    PrivacyInfo,
    Provenance,
    read_manifest,
    write_manifest,
)

__all__ = ["TINY_TRAIN", "LEVELS", "make_run", "update_json", "pool_arrays", "binormal_tpr", "attack_entry", "transfer_result"]

TINY_TRAIN: dict[str, Any] = {
    "name": "tiny",
    "data": {"dataset": "digits", "pool_size": 240, "test_size": 100},
    "model": {"arch": "mlp"},
    "privacy": {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "delta": 1e-4},
    "optim": {"name": "sgd", "lr": 0.5, "momentum": 0.9},
    "training": {"steps": 8, "batch_size": 32, "physical_batch_size": 16, "checkpoint_every": 2,
                 "progress": False, "log_every": 2},
}
"""A DP run of a small MLP on the embedded digits that trains in well under a second (tests override keys with
:func:`training.config.apply_overrides`)."""

LEVELS = ("0.01", "0.001", "0.0001")
ALL_ATTACKS = ("loss", "attack_p", "calibrated_loss", "lira_online", "lira_offline", "rmia_online", "rmia_offline")


def pool_arrays(n: int, *, seed: int = 0, size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """A deterministic tiny image pool: x uint8 (n, size, size, 3), y int64 in 0..9."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    return x, y


def binormal_tpr(fpr: np.ndarray | float, d: float) -> np.ndarray:
    """TPR of a binormal ROC with separation ``d`` at ``fpr``."""
    return norm.cdf(norm.ppf(np.clip(fpr, 1e-12, 1 - 1e-12)) + d)


def attack_entry(d: float, *, n_members: int, n_nonmembers: int, pool_size: int, rng: np.random.Generator
                  ) -> AttackEntry:
    fpr = np.concatenate([[0.0], np.geomspace(1.0 / n_nonmembers, 1.0, 40)])
    tpr = binormal_tpr(fpr, d)
    tpr[0] = 0.0
    width = 1.5 * np.sqrt(np.maximum(tpr * (1 - tpr), 1e-6) / n_members)
    tpr_at = {lv: float(binormal_tpr(float(lv), d)) for lv in LEVELS}
    tpr_ci = {lv: (max(0.0, v - 0.013 - 0.5 * v), min(1.0, v + 0.017 + 0.5 * v)) for lv, v in tpr_at.items()}
    auc = float(norm.cdf(d / np.sqrt(2)))
    return AttackEntry(
        params={"d": d},
        metrics=AttackMetrics(auc=auc, auc_ci=(auc - 0.0123, min(1.0, auc + 0.0117)), tpr_at_fpr=tpr_at,
                              tpr_at_fpr_ci=tpr_ci, balanced_accuracy=float(0.5 + 0.5 * (auc - 0.5)),
                              n_members=n_members, n_nonmembers=n_nonmembers),
        roc=Roc(fpr=fpr.tolist(), tpr=tpr.tolist(), tpr_lo=np.clip(tpr - width, 0, 1).tolist(),
                tpr_hi=np.clip(tpr + width, 0, 1).tolist()),
        per_class={str(c): ClassSlice(auc=float(auc + 0.01 * (c - 4.5) / 4.5), n=int(20 + c)) for c in range(10)},
        most_vulnerable=[int(i) for i in rng.choice(pool_size, size=8, replace=False)],
    )


def _accuracy(correct: int, total: int, half_width: float) -> Accuracy:
    acc = correct / total
    return Accuracy(correct=correct, total=total, accuracy=acc, ci_low=acc - half_width, ci_high=acc + half_width,
                    confidence=0.95, method="wilson")


def transfer_result(run: Path, manifest: Manifest) -> TransferFile:
    split = (lambda name, n: SplitInfo(split=name, n=n, fingerprint="e" * 64, classes_present=10))
    layers = [LayerEntry(layer=f"block{i}", dim=16, fuzziness=4.0 * 0.6 ** i, fisher=0.2 + 0.1 * i, residual=0.5)
              for i in range(4)]
    ok = TransferRow(
        dataset="cifar10", name="cifar10", root="/data/cifar10", status="ok", num_classes=10, image_size=8,
        train=split("train", 1000), test=split("test", 1000), feature_dim=16, features_cached=False,
        linear_probe=LinearProbeEntry(accuracy=_accuracy(712, 1000, 0.0112), C=1.0, val_accuracy={"1": 0.7},
                                      n_train=900, n_val=100, n_test=1000, converged=True),
        knn=KnnEntry(accuracy=_accuracy(654, 1000, 0.0111), k=20, temperature=0.07, n_train=1000, n_test=1000),
        diagnostics=Diagnostics(n_examples=200, measure="fuzziness", layers=layers,
                                decay=DecayEntry(rho=0.8123, intercept=1.386, r_squared=0.99, n_layers=4), note=None))
    missing = TransferRow(dataset="svhn", name="svhn", root=None, status="missing",
                          reason="missing: no data root for svhn")
    return TransferFile(run={"dir": str(run), "name": run.name},
                        model={"arch": manifest.model.arch, "weights_sha256": manifest.model.weights_sha256},
                        privacy={"dp": manifest.privacy.dp, "claimed_epsilon": manifest.privacy.claimed_epsilon},
                        image_size=8, device="cpu", suite={"name": "fixture"}, created="2025-01-01T00:00:00+00:00",
                        datasets=[ok, missing])


def make_run(
    run_dir: str | Path,
    *,
    dp: bool = True,
    epsilon: float = 8.0,
    delta: float = 1e-5,
    sampling: str = "poisson",
    pool_size: int = 200,
    dataset: str = "synthetic",
    num_classes: int = 10,
    attacks: Sequence[str] = ("loss", "lira_online", "rmia_online"),
    leakage: float = 0.5,
    n_reference: int = 8,
    with_metrics: bool = True,
    with_attack: bool = True,
    with_epsilon: bool = True,
    with_transfer: bool = True,
    with_config: bool = True,
    test_accuracy: float = 0.8765432,
    epsilon_lb: float = 1.2345678,
    ceiling: float = 6.54321,
    seed: int = 0,
    pool: tuple[np.ndarray, np.ndarray] | None = None,
    config_data: dict[str, Any] | None = None,
) -> Path:
    """Write a complete fake run directory and return its path.

    Args:
        run_dir: directory to create.
        dp, epsilon, delta, sampling: the privacy claim (``dp=False`` gives a non-DP run with no claim).
        attacks: attack names to include in ``attack.json``; ``leakage`` scales their binormal separations.
        with_*: include the optional files.
        epsilon_lb, ceiling: the best estimate's lower bound and ceiling; the verdict follows from them.
        pool: the pool's (x, y) arrays (default: :func:`pool_arrays`); the manifest holds their fingerprint.
        config_data: the ``data`` section written to ``config.yaml`` (default: a synthetic dataset).
    """
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    x, y = pool if pool is not None else pool_arrays(pool_size, seed=seed)
    pool_size = len(y)
    rng.random(pool_size)  # the stream the rest of the fixture draws from stays as it was
    membership = draw_membership(pool_size, p=0.5, seed=seed)  # what the manifest records (a re-draw must match)
    write_npy(run / "membership.npy", membership)
    write_text(run / "model.safetensors", "not real weights")
    n_members = int(membership.sum())
    phases = [PhaseInfo(name="private", dp=dp, noise_multiplier=1.1 if dp else None,
                        sample_rate=0.0390625 if dp else None, steps=1250, batch_size=64,
                        sampling=sampling if dp else "shuffle", max_grad_norm=1.0 if dp else None,
                        clipping="flat" if dp else None, epsilon=epsilon if dp else None)]
    manifest = Manifest(
        run_name=run.name,
        model=ModelInfo(arch="small_cnn", num_classes=num_classes, input_shape=(3, 8, 8), param_count=12345,
                        trainable_param_count=12345, weights_sha256=sha256_file(run / "model.safetensors")),
        data=DataInfo(dataset=dataset, split="train", pool_size=pool_size, pool_seed=0,
                      pool_fingerprint=fingerprint_arrays(x, y),
                      membership_sha256=sha256_file(run / "membership.npy"),
                      membership=MembershipInfo(scheme="bernoulli", p=0.5, seed=seed, n_members=n_members,
                                                n_pool=pool_size)),
        privacy=PrivacyInfo(dp=dp, delta=delta if dp else None, accountant="prv" if dp else None,
                            epsilon=epsilon if dp else None,
                            epsilon_cross_check={"accountant": "pld", "epsilon": epsilon * 1.001} if dp else None,
                            phases=phases),
        provenance=Provenance(package_version="0.1.0", git_commit="abc1234", torch="2.14.1", opacus="1.6.0",
                              timm="1.0.31", seed=seed, config_sha256="f" * 64, created="2025-01-01T00:00:00+00:00",
                              command="audit train eval_configs/quickstart.yaml"),
    )
    write_manifest(run, manifest)
    if with_config:
        data_cfg = config_data if config_data is not None else {"dataset": dataset, "pool_size": pool_size}
        write_text(run / "config.yaml", yaml.safe_dump({"name": run.name, "data": data_cfg}, sort_keys=False))
    if with_metrics:
        write_json(run / "metrics.json", {"test_accuracy": test_accuracy, "train_accuracy": test_accuracy + 0.0412,
                                          "steps": 1250, "epsilon_spent": epsilon if dp else None,
                                          "final_loss": 0.61234})
    claimed = epsilon if dp else float("inf")
    identity = {"weights_sha256": manifest.model.weights_sha256, "membership_sha256": manifest.data.membership_sha256,
                "pool_fingerprint": manifest.data.pool_fingerprint}
    signed_for = evidence_identity(manifest)
    if with_attack:
        n_non = pool_size - n_members
        entries = {name: attack_entry(leakage * (0.3 + 0.25 * ALL_ATTACKS.index(name)), n_members=n_members,
                                       n_nonmembers=n_non, pool_size=pool_size, rng=rng) for name in attacks}
        write_attack_file(run, AttackFile(
            run=run.name, inputs=identity,
            setup=AttackSetup(n_reference=n_reference, augmentations=["identity", "flip"], pool_size=pool_size,
                              n_members=n_members, n_population=100, evaluation="target", recipe_hash="1234abcd",
                              executor="sequential", shadow_train_seconds=1.5),
            attacks=entries, utility=Utility(test_accuracy=test_accuracy, train_accuracy=None)),
            identity=evidence_identity(manifest, claim=False))
    if with_epsilon:
        one_run = EpsilonEstimate(method="one_run", epsilon_lb=epsilon_lb, alpha=0.05, delta=delta,
                                  counts={"m": pool_size, "r": 60, "v": 57, "k_pos": 30, "k_neg": 30}, ceiling=ceiling,
                                  assumptions="members drawn independently with probability 1/2")
        gdp = EpsilonEstimate(method="gdp", epsilon_lb=epsilon_lb / 2.1, alpha=0.05, delta=delta, counts={"n": pool_size},
                              ceiling=float("inf"), assumptions="Gaussian trade-off curve", extra={"mu": 0.3})
        estimates = (SourcedEstimate(source="pool", estimate=one_run, in_verdict=True),
                     SourcedEstimate(source="pool", estimate=gdp, in_verdict=False))
        write_epsilon_file(run, EpsilonReport(
            run=run.name, inputs=identity, claimed_epsilon=claimed,
            delta=delta, alpha=0.05, estimates=estimates, skipped=(),
            verdict=judge_estimates(claimed_epsilon=claimed, delta=delta, estimates=estimates)).to_file(),
            identity=signed_for)
    if with_transfer:
        write_transfer_file(run / "transfer.json", transfer_result(run, manifest), identity=signed_for)
    return run


def update_json(run_dir: str | Path, name: str, mutate: Callable[[dict[str, Any]], None], *,
                resign: bool = True) -> None:
    """Load ``run_dir/name``, apply ``mutate`` in place, and write it back; a signed evidence file is re-signed
    with the test session's key for the identity it records (``resign=False``: left as a forger would)."""
    path = Path(run_dir) / name
    data = read_json(path)
    record = data.pop(EVIDENCE_KEY, None) if isinstance(data, dict) else None
    mutate(data)
    data = json.loads(json.dumps(data))
    if record is not None:
        data = sign_json(data, identity=record["identity"]) if resign else {**data, EVIDENCE_KEY: record}
    write_json(path, data)


def write_signed(run_dir: str | Path, name: str, **arrays: np.ndarray) -> Path:
    """Write ``run_dir/name`` as this auditor would: the arrays signed with the test session's key for the run's
    identity as its manifest records it (for tests of what the readers do with the content)."""
    run_dir = Path(run_dir)
    return write_signed_npz(run_dir / name, identity=evidence_identity(read_manifest(run_dir), claim=False),
                            arrays=arrays)
