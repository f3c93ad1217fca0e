"""Tests for `audit epsilon`'s canary sources: input canaries (scores.npz, or the target's own scaled logit) and
gradient canaries (white-box: the final weights moved from θ_0 against known canary directions).

Run directories come from tests/epsilon_runs.py (no training); :func:`_white_box_run` builds a tiny MLP whose final
weights are its initial weights moved against the included canaries' directions, as the engine's sign has it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from epsilon_runs import make_run, read, write_scores

from audit.bounds.runner import run_epsilon
from audit.bounds.sources import Evidence, Skipped, gradient_canary_evidence, input_canary_evidence, pool_evidence
from audit.config import EpsilonConfig
from foundation.errors import CheckpointError
from foundation.io import save_safetensors, sha256_file, write_npy
from training.config import TrainConfig
from training.run import open_run
from training.run.manifest import ModelInfo


# ------------------------------------------------------------------------------------------- input canaries


def test_input_canaries_come_from_scores_npz_and_leave_the_pool(tmp_path):
    run = make_run(tmp_path / "r", pool=500, canaries=100, scheme="all")
    write_scores(run, signal=5.0)
    opened = open_run(run, verify=False)
    mem = opened.membership
    ev = input_canary_evidence(run=opened, attack="lira_online")
    assert isinstance(ev, Evidence) and ev.m == 100 and ev.black_box
    assert np.array_equal(ev.included, mem[400:]) and ev.provenance["first_index"] == 400
    # scheme 'all': the real pool is all members, so the pool source does not apply
    assert isinstance(pool_evidence(run=opened, attack="lira_online"), Skipped)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool", "input_canaries")))
    assert [e.source for e in report.estimates] == ["input_canaries", "input_canaries"]
    assert report.verdict.status == "VIOLATION"


def test_input_canaries_without_scores_use_the_target_models_scaled_logit(tmp_path):
    from attacks.signals import compute_signals
    from training.models import build_model
    from training.pool import build_pool

    cfg = TrainConfig.model_validate({"name": "ic", "data": {"dataset": "digits", "pool_size": 40},
                                      "model": {"arch": "mlp", "kwargs": {"hidden": [8]}},
                                      "training": {"steps": 1, "canaries": {"count": 24, "kind": "ood"}}})
    pool = build_pool(cfg)
    torch.manual_seed(0)
    net = build_model(cfg.model, num_classes=10, input_shape=(3, 8, 8)).module.eval()
    info = ModelInfo(arch="mlp", kwargs={"hidden": [8]}, num_classes=10, input_shape=(3, 8, 8), param_count=1,
                     trainable_param_count=1, weights_sha256="")
    run = make_run(tmp_path / "ic", pool=64, canaries=24, scheme="all", weights=net.state_dict(), config=cfg,
                   model=info, fingerprint=pool.images.fingerprint())
    ev = input_canary_evidence(run=open_run(run, verify=False), attack="lira_online")
    expected = compute_signals(net, pool.images.x[40:].copy(), pool.images.y[40:].copy())[:, 0]
    assert ev.m == 24 and np.allclose(ev.scores, expected, atol=1e-6) and ev.provenance["attack"] == "loss"
    other = make_run(tmp_path / "other", pool=64, canaries=24, scheme="all", weights=net.state_dict(), config=cfg,
                     model=info)
    with pytest.raises(CheckpointError, match="fingerprint"):
        input_canary_evidence(run=open_run(other, verify=False), attack="lira_online")


def test_pool_source_excludes_input_canaries(tmp_path):
    run = make_run(tmp_path / "r", pool=500, canaries=100)
    write_scores(run, signal=1.0)
    ev = pool_evidence(run=open_run(run, verify=False), attack="lira_online")
    assert ev.m == 400


# ------------------------------------------------------------------------------------------ gradient canaries


def _white_box_run(tmp_path: Path, *, signal: float, count: int = 300, noise: float = 1.0) -> Path:
    """A run whose final weights are θ_0 moved against the included canaries' directions (plus noise), with the
    manifest's gradient-canary record written as the trainer writes it. The head is 'frozen': not in the record."""
    from training.dp.canaries import GradientCanaries, trainable_shapes
    from training.models import build_model
    from training.pool import draw_membership

    cfg = TrainConfig.model_validate({"name": "wb", "model": {"arch": "mlp", "kwargs": {"hidden": [64]}},
                                      "privacy": {"target_epsilon": 1.0, "accountant": "rdp"},
                                      "training": {"steps": 100, "batch_size": 60}})  # as make_run's claim says
    torch.manual_seed(0)
    net = build_model(cfg.model, num_classes=10, input_shape=(3, 8, 8)).module
    init = {k: v.clone() for k, v in net.state_dict().items()}
    shapes = {k: v for k, v in trainable_shapes(net).items() if ".head." not in k}
    canaries = GradientCanaries(param_shapes=shapes, count=count, seed=3, included=draw_membership(count, p=0.5, seed=3))
    assert canaries.dim > 10 * count  # near-orthogonal directions
    step = sum(canaries.direction(i).astype(np.float64) for i in np.flatnonzero(canaries.included))
    rng = np.random.default_rng(0)
    move = -signal * step + noise * rng.normal(size=canaries.dim)  # descent: against the added gradient
    final, offset = {k: v.clone() for k, v in init.items()}, 0
    for name in shapes:
        size = init[name].numel()
        final[name] = init[name] + torch.from_numpy(move[offset:offset + size]).float().view_as(init[name])
        offset += size
    run = tmp_path / "wb"
    run.mkdir()
    init_file = save_safetensors(run / "model_init.safetensors", init)
    inc_file = write_npy(run / "gradient_canaries.npy", canaries.included)
    record = {"count": count, "seed": 3, "included_file": inc_file.name, "included_sha256": sha256_file(inc_file),
              "n_included": int(canaries.included.sum()), "sample_rate": 1.0, "steps": 1,
              "param_names": list(shapes), "init_weights": init_file.name,
              "init_weights_sha256": sha256_file(init_file)}
    info = ModelInfo(arch="mlp", kwargs={"hidden": [64]}, num_classes=10, input_shape=(3, 8, 8), param_count=1,
                     trainable_param_count=1, weights_sha256="")
    return make_run(run, epsilon=1.0, scheme="all", weights=final, config=cfg, model=info,
                    training={"gradient_canaries": record})


def test_gradient_canaries_separate_members_with_the_engine_sign(tmp_path):
    run = _white_box_run(tmp_path, signal=10.0)
    ev = gradient_canary_evidence(run=open_run(run, verify=False))
    assert isinstance(ev, Evidence) and not ev.black_box and ev.m == 300
    assert ev.provenance["dim"] == 192 * 64 + 64  # the frozen head is not spanned
    assert ev.scores[ev.included].min() > ev.scores[~ev.included].max()  # higher = member
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("gradient_canaries",)))
    assert report.verdict.status == "VIOLATION" and report.verdict.best_source == "gradient_canaries"
    assert read(run)["estimates"][0]["extra"]["evidence"]["dim"] == ev.provenance["dim"]


def test_gradient_canaries_without_signal_are_consistent(tmp_path):
    run = _white_box_run(tmp_path, signal=0.0)
    report = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("gradient_canaries",)))
    assert report.verdict.status == "CONSISTENT" and report.verdict.best_epsilon_lb < 1.0


def test_gradient_canaries_refuse_files_that_do_not_match_the_record(tmp_path):
    run = _white_box_run(tmp_path, signal=5.0)
    mask = np.load(run / "gradient_canaries.npy")
    write_npy(run / "gradient_canaries.npy", ~mask)
    with pytest.raises(CheckpointError, match="gradient_canaries.npy does not match the sha256"):
        gradient_canary_evidence(run=open_run(run, verify=False))
    write_npy(run / "gradient_canaries.npy", mask)
    (run / "model_init.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model_init.safetensors named in the manifest"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("gradient_canaries",)))


def test_gradient_canaries_are_skipped_for_runs_without_a_record(tmp_path):
    run = make_run(tmp_path / "imported")
    ev = gradient_canary_evidence(run=open_run(run, verify=False))
    assert isinstance(ev, Skipped) and "records no gradient canaries" in ev.reason
