"""Tests of audit.transfer.distortion_run: DP-FFT vs DP-LP-FFT feature-distortion trajectories."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from audit.transfer.distortion_run import TRAJECTORY_KEYS, distortion_trajectory_model
from training.config import ModelConfig
from training.data import ImageSet
from training.models import build_model


def _data(seed: int = 0) -> tuple[ImageSet, ImageSet]:
    """Two-class 8x8 images whose class sets the mean brightness (learnable, not trivially constant)."""
    rng = np.random.default_rng(seed)
    out = []
    for split, n in (("train", 48), ("test", 24)):
        y = np.arange(n) % 2
        x = np.clip(rng.normal(80 + 90 * y[:, None, None, None], 40, (n, 8, 8, 3)), 0, 255).astype(np.uint8)
        out.append(ImageSet(x=x, y=y.astype(np.int64), classes=("a", "b"), name="synthetic", split=split))
    return out[0], out[1]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(arch="small_cnn"), num_classes=3, input_shape=(3, 8, 8)).module


KW = dict(steps=6, noise_multiplier=1.0, batch_size=16, lr=0.5, eval_every=1, seed=3)


def test_lp_phase_keeps_features_and_fft_moves_them() -> None:
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = distortion_trajectory_model(model, data=_data(), strategy="lp_fft", lp_steps=3, **KW)
    assert [r["step"] for r in rows] == list(range(7))
    assert [r["phase"] for r in rows] == ["start", "lp", "lp", "lp", "fft", "fft", "fft"]
    for r in rows:
        assert set(r) == set(TRAJECTORY_KEYS)
        assert r["strategy"] == "lp_fft"
        assert 0.0 <= r["knn_ci_low"] <= r["knn_accuracy"] <= r["knn_ci_high"] <= 1.0
    for r in rows[:4]:  # start + the LP steps: backbone frozen, features bit-identical
        assert r["relative_change_train"] == 0.0 and r["relative_change_test"] == 0.0
    assert rows[0]["knn_accuracy"] == rows[3]["knn_accuracy"]
    assert all(r["relative_change_train"] > 0 and r["relative_change_test"] > 0 for r in rows[4:])
    eps = [r["epsilon"] for r in rows]
    assert eps[0] == 0.0 and all(b > a for a, b in zip(eps, eps[1:]))  # every DP step, LP included, spends
    for k, v in model.state_dict().items():  # the source module is untouched
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("head_init", ["zero", "random"])
def test_fft_moves_features_from_the_first_steps(head_init: str) -> None:
    rows = distortion_trajectory_model(_model(), data=_data(), strategy="fft", head_init=head_init,
                                       **{**KW, "eval_every": 2})
    assert [r["step"] for r in rows] == [0, 2, 4, 6]
    assert [r["phase"] for r in rows] == ["start", "fft", "fft", "fft"]
    assert rows[0]["relative_change_train"] == 0.0
    assert all(r["relative_change_train"] > 0 for r in rows[1:])


def test_same_seed_same_trajectory_and_bad_arguments() -> None:
    a = distortion_trajectory_model(_model(), data=_data(), strategy="fft", **{**KW, "steps": 2})
    b = distortion_trajectory_model(_model(), data=_data(), strategy="fft", **{**KW, "steps": 2})
    assert a == b
    with pytest.raises(ValueError, match="lp_steps"):
        distortion_trajectory_model(_model(), data=_data(), strategy="lp_fft", lp_steps=6, **KW)
    with pytest.raises(ValueError, match="lp_steps"):
        distortion_trajectory_model(_model(), data=_data(), strategy="fft", lp_steps=2, **KW)
    with pytest.raises(ValueError, match="strategy"):
        distortion_trajectory_model(_model(), data=_data(), strategy="lp", **KW)


def test_trajectory_is_the_one_loop_called_directly() -> None:
    """Rows of an LP-FFT trajectory equal the feature change measured around the loop run directly."""
    import copy

    from audit.transfer.features import FINAL_LAYER, extract_features
    from training.config import OptimConfig, PrivacyConfig
    from training.recipes.budget import PhaseBudget
    from training.recipes.finetune import finetune, finetune_phases, new_head

    train, test = _data()
    model = _model()
    kw = {**KW, "steps": 4, "eval_every": 1, "max_grad_norm": 0.7, "physical_batch_size": 5}
    rows = distortion_trajectory_model(model, data=(train, test), strategy="lp_fft", lp_steps=2,
                                       head_init="random", **kw)

    run_seed, _, head_seed = (int(v) for v in np.random.SeedSequence(3).generate_state(3))
    net = copy.deepcopy(model)
    head = new_head(net, 2, init="random", seed=head_seed)
    net.train()

    def feats(m: torch.nn.Module) -> np.ndarray:
        with torch.no_grad():
            return extract_features(m, train.x, layers=[FINAL_LAYER])[FINAL_LAYER].astype(np.float64)

    f0, changes = feats(net), [0.0]
    privacy = PrivacyConfig(enabled=True, noise_multiplier=1.0, max_grad_norm=0.7, accountant="rdp")
    phases = finetune_phases([PhaseBudget(name="lp", steps=2, noise_multiplier=1.0),
                              PhaseBudget(name="fft", steps=2, noise_multiplier=1.0)],
                             head=head, backbone=[n for n, _ in net.named_parameters()], x=train.x, y=train.y,
                             dataset="synthetic", batch_size=16, privacy=privacy,
                             optim=OptimConfig(name="sgd", lr=0.5, momentum=0.0), seed=run_seed)
    finetune(net, phases, seed=run_seed, device="cpu", physical_batch_size=5,
             on_step=lambda g, phase, stats, m: changes.append(
                 float(np.linalg.norm(feats(m) - f0) / np.linalg.norm(f0))))
    assert [r["phase"] for r in rows] == ["start", "lp", "lp", "fft", "fft"]
    assert changes[:3] == [0.0, 0.0, 0.0] and changes[3] > 0
    assert [r["relative_change_train"] for r in rows] == pytest.approx(changes, rel=1e-9, abs=1e-12)
