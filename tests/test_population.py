"""The attacks' population: the test split plus the training split outside the pool (training.run.population)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attacks.config import AttackConfig
from attacks.runner import run_attack
from attacks.signal_cache import population_size
from audit.cli import main
from training.canary_package import write_package
from training.config import TrainConfig, apply_overrides
from training.data import split_rows
from foundation.errors import CheckpointError
from foundation.io import fingerprint_arrays
from training.run import open_run, run_population
from training.trainer import train

from fixtures_runs import TINY_TRAIN

N_TRAIN, N_TEST, POOL = 60, 20, 24


def _arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8), rng.integers(0, 4, size=n).astype(np.int64)


def _data(root: Path, *, duplicate: tuple[int, int] | None = None) -> Path:
    """``train.npz`` (60 images) and ``test.npz`` (20) under ``root``; ``duplicate=(dst, src)`` copies train
    image ``src`` over ``dst``."""
    root.mkdir(parents=True, exist_ok=True)
    x, y = _arrays(N_TRAIN, 1)
    if duplicate is not None:
        x[duplicate[0]] = x[duplicate[1]]
    np.savez(root / "train.npz", x=x, y=y)
    np.savez(root / "test.npz", **dict(zip("xy", _arrays(N_TEST, 2))))
    return root


def _train(tmp_path: Path, root: Path, **over) -> Path:
    cfg = apply_overrides(TINY_TRAIN, {
        "output_dir": str(tmp_path / "runs"), "data": {"dataset": "npz", "root": str(root), "pool_size": POOL,
                                                       "pool_seed": 3},
        "model.arch": "mlp", "privacy.enabled": False, "training.steps": 2, "training.batch_size": 8,
        "training.physical_batch_size": 8, **over})
    return train(TrainConfig.model_validate(cfg), progress=False).run_dir


def _pool_rows(n: int, size: int, seed: int) -> np.ndarray:
    """The pool draw written out (the reference for the complement)."""
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


def _digests(x: np.ndarray) -> set[bytes]:
    return {img.tobytes() for img in x}


def test_complement_is_the_split_outside_the_pool_and_deterministic(tmp_path: Path) -> None:
    root = _data(tmp_path / "data")
    run = open_run(_train(tmp_path, root))
    pop = run_population(run)
    pool_rows = _pool_rows(N_TRAIN, POOL, 3)
    outside = [i for i in range(N_TRAIN) if i not in set(pool_rows.tolist())]
    assert [(p.source, p.size) for p in pop.parts] == [
        ("npz/test (test split)", N_TEST), ("npz/train outside the pool (pool complement)", N_TRAIN - POOL)]
    images, kept, record = pop.take(np.arange(len(pop)))
    x, y = _arrays(N_TRAIN, 1)
    tx, ty = _arrays(N_TEST, 2)
    assert np.array_equal(kept, np.arange(N_TEST + N_TRAIN - POOL))
    assert np.array_equal(images.x, np.concatenate([tx, x[outside]]))
    assert np.array_equal(images.y, np.concatenate([ty, y[outside]]))
    assert not _digests(images.x) & _digests(run.pool.x)          # disjoint from the pool
    assert fingerprint_arrays(x[pool_rows], y[pool_rows]) == run.manifest.data.pool_fingerprint
    assert record["fingerprint"] == images.fingerprint()
    assert [s["used"] for s in record["sources"]] == [N_TEST, N_TRAIN - POOL]
    again = run_population(open_run(run.run_dir)).take(np.arange(len(pop)))
    assert again[2] == record                                        # deterministic, fingerprint included
    some = np.array([3, N_TEST + 1, N_TEST + 30])                   # lazy take of a few positions
    sub, kept_sub, rec_sub = pop.take(some)
    assert np.array_equal(sub.x, images.x[some]) and [s["used"] for s in rec_sub["sources"]] == [1, 2]
    man = run.manifest.data
    assert (man.split_size, man.split_labels_sha256) == (N_TRAIN, split_rows(run.config.data).labels_sha256())


def test_pool_duplicates_and_canaries_never_enter_the_population(tmp_path: Path) -> None:
    pool_rows = _pool_rows(N_TRAIN, POOL, 3)
    outside = np.setdiff1d(np.arange(N_TRAIN), pool_rows)
    root = _data(tmp_path / "data", duplicate=(int(outside[0]), int(pool_rows[0])))  # a non-pool copy of a pool image
    x, _ = _arrays(N_TRAIN, 1)
    package = write_package(tmp_path / "canaries.npz", x=x[outside[[5, 6]]], y=np.array([0, 1]), kind="mislabel",
                            num_classes=4, commitment="a" * 64)              # canaries copied from the complement
    run = open_run(_train(tmp_path, root, **{"training.canaries.from_file": str(package)}))
    assert len(run.pool) == POOL + 2
    images, _, record = run_population(run).take(np.arange(N_TEST + N_TRAIN - POOL))
    assert [s["dropped_pool_duplicates"] for s in record["sources"]] == [0, 3]
    assert len(images) == N_TEST + N_TRAIN - POOL - 3
    assert not _digests(images.x) & _digests(run.pool.x)


def test_mislabel_canary_sources_stay_out_of_the_population(tmp_path: Path) -> None:
    run = open_run(_train(tmp_path, _data(tmp_path / "data"), **{"training.canaries.count": 4,
                                                                  "training.canaries.kind": "mislabel"}))
    pop = run_population(run)
    assert pop.parts[0].size == N_TEST - 4                           # the canaries' test sources were removed
    images, _, record = pop.take(np.arange(len(pop)))
    assert not _digests(images.x) & _digests(run.pool.x[POOL:])
    assert sum(s["dropped_pool_duplicates"] for s in record["sources"]) == 0


def test_a_changed_split_is_refused(tmp_path: Path) -> None:
    root = _data(tmp_path / "data")
    run_dir = _train(tmp_path, root)
    outside = np.setdiff1d(np.arange(N_TRAIN), _pool_rows(N_TRAIN, POOL, 3))
    with np.load(root / "train.npz") as z:
        x, y = z["x"], z["y"].copy()
    y[outside[0]] = (y[outside[0]] + 1) % 4                         # a label outside the pool: the pool still verifies
    np.savez(root / "train.npz", x=x, y=y)
    run = open_run(run_dir)
    with pytest.raises(CheckpointError, match=r"split 'train' on disk has other labels .* attack.population: 0"):
        run_population(run)
    result = CliRunner().invoke(main, ["attack", str(run_dir), "--set", "attack.n_reference=0",
                                       "--set", "attack.attacks=[loss,attack_p]"])
    assert result.exit_code == 2 and result.output.startswith("error: ") and result.output.count("\n") == 1
    assert not (run_dir / "attack.json").exists()
    ok = run_attack(run_dir=run_dir, progress=False, config=AttackConfig(
        n_reference=0, attacks=("loss",), population=0, n_bootstrap=0, evaluation="target", device="cpu"))
    assert ok.report.setup.n_population == 0                        # population 0 needs no split
    np.savez(root / "train.npz", x=x[:-1], y=y[:-1])                # one image fewer: the pool draw itself moves
    with pytest.raises(CheckpointError, match="pool rebuilt"):
        open_run(run_dir)


def _attack(run_dir: Path, **kw) -> dict:
    cfg = dict(n_reference=0, attacks=("loss", "attack_p"), n_bootstrap=0, evaluation="target", device="cpu",
               flip=True)
    run_attack(run_dir=run_dir, config=AttackConfig(**{**cfg, **kw}), progress=False)
    return json.loads((run_dir / "attack.json").read_text())["setup"]


def test_population_all_uses_the_complement_and_a_memory_cap_draws_a_seeded_subset(tmp_path: Path) -> None:
    run_dir = _train(tmp_path, _data(tmp_path / "data"))
    setup = _attack(run_dir)
    total = N_TEST + N_TRAIN - POOL
    assert setup["n_population"] == total
    assert setup["population"]["capped"] is False and setup["population"]["requested"] == "all"
    assert [s["used"] for s in setup["population"]["sources"]] == [N_TEST, N_TRAIN - POOL]
    per_sample = 1 * 2 * 4 + 8 * 8 * 3                              # target x 2 queries float32 + one image
    budget = 30 * per_sample / 2**20
    assert population_size("all", total, n_models=1, n_augmentations=2, image_bytes=192, memory_mb=budget)[0] == 30
    capped = _attack(run_dir, population_memory_mb=budget, seed=5)
    pop = capped["population"]
    assert capped["n_population"] == 30 and pop["capped"] is True and pop["memory_mb"] == pytest.approx(budget)
    assert "capped at 30 by population_memory_mb" in capped["population_rule"]
    want = np.sort(np.random.default_rng([5, 0x504F50]).choice(total, size=30, replace=False))
    with np.load(run_dir / "signals.npz") as z:
        assert np.array_equal(z["population_index"], want)
    assert [s["used"] for s in pop["sources"]] == [int((want < N_TEST).sum()), int((want >= N_TEST).sum())]
    assert _attack(run_dir, population_memory_mb=budget, seed=5)["population"] == pop   # seeded: the same subset
    assert _attack(run_dir, population_memory_mb=budget, seed=6)["population"]["fingerprint"] != pop["fingerprint"]


def test_rmia_end_to_end_on_a_fixture_run_with_a_pool_complement(tmp_path: Path) -> None:
    """TINY_TRAIN (digits: a 240-image pool of the 1,347-image train split): RMIA with reference models whose pools
    are the target's pool, never a population image."""
    cfg = apply_overrides(TINY_TRAIN, {"output_dir": str(tmp_path), "training.steps": 4})
    run_dir = train(TrainConfig.model_validate(cfg), progress=False).run_dir
    result = run_attack(run_dir=run_dir, progress=False, config=AttackConfig(
        n_reference=2, attacks=("rmia_online", "rmia_offline"), n_bootstrap=0, evaluation="target", device="cpu",
        executor="batched", flip=False))
    setup = result.report.setup
    sources = {s.source: s for s in setup.population.sources}
    complement = sources["digits/train outside the pool (pool complement)"]
    assert complement.available == 1347 - 240 and complement.used + complement.dropped_pool_duplicates == 1107
    assert sources["digits/test (test split)"].available == 100
    assert setup.n_population == sum(s.used for s in sources.values())
    for name in ("rmia_online", "rmia_offline"):
        entry = result.report.attacks[name]
        assert entry.info["n_population"] == setup.n_population and np.isfinite(entry.metrics.auc)
    target = open_run(run_dir)
    images, _, _ = run_population(target).take(np.arange(len(run_population(target))))
    population = _digests(images.x)
    assert not population & _digests(target.pool.x)
    shadows = sorted((run_dir / "shadows").glob("[0-9]*"))
    assert len(shadows) == 2
    for shadow in shadows:
        ref = open_run(shadow)
        assert ref.manifest.data.pool_fingerprint == target.manifest.data.pool_fingerprint
        assert not population & _digests(ref.pool.x[ref.membership])  # what the reference model trained on
