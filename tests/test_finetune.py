"""The one DP fine-tuning loop (training.recipes.finetune): head, phases, and the loop against plain SGD."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch

from training.config import ModelConfig, OptimConfig, PrivacyConfig
from training.models import build_model
from training.recipes.budget import PhaseBudget
from training.recipes.common import phase_seed
from training.recipes.finetune import classifier_of, finetune, finetune_phases, head_parameter_names, new_head


def _model(num_classes: int = 3) -> torch.nn.Module:
    return build_model(ModelConfig(arch="small_cnn"), num_classes=num_classes, input_shape=(3, 8, 8), seed=0).module


def _data(n: int = 24, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    x = np.clip(rng.normal(80 + 90 * y[:, None, None, None], 40, (n, 8, 8, 3)), 0, 255).astype(np.uint8)
    return x, y.astype(np.int64)


def test_new_head_zero_random_keep():
    model = _model()
    names = new_head(model, 5, init="zero")
    assert names == head_parameter_names(model) == ["net.head.weight", "net.head.bias"]
    assert classifier_of(model).weight.shape[0] == 5
    assert all(not p.any() for p in classifier_of(model).parameters())
    state = torch.random.get_rng_state()
    a, b, c = _model(), _model(), _model()
    for m, seed in ((a, 7), (b, 7), (c, 8)):
        new_head(m, 4, init="random", seed=seed)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    assert torch.equal(classifier_of(a).weight, classifier_of(b).weight)
    assert not torch.equal(classifier_of(a).weight, classifier_of(c).weight)
    kept = _model()
    before = classifier_of(kept).weight.clone()
    new_head(kept, 3, init="keep")
    assert torch.equal(classifier_of(kept).weight, before)
    with pytest.raises(ValueError, match="keep"):
        new_head(kept, 4, init="keep")
    with pytest.raises(ValueError, match="head init"):
        new_head(kept, 3, init="ones")  # type: ignore[arg-type]


def test_finetune_phases_trainable_sets_and_seeds():
    model = _model()
    head = new_head(model, 2, init="zero")
    every = [n for n, _ in model.named_parameters()]
    x, y = _data()
    lp_optim = OptimConfig(name="sgd", lr=0.1)
    phases = finetune_phases([PhaseBudget(name="lp", steps=2, noise_multiplier=1.0),
                              PhaseBudget(name="fft", steps=3, noise_multiplier=2.0)],
                             head=head, backbone=every, x=x, y=y, dataset="toy", batch_size=8,
                             privacy=PrivacyConfig(noise_multiplier=1.0), optim=OptimConfig(name="adamw"),
                             lp_optim=lp_optim, seed=9)
    assert [(p.name, p.steps, p.sigma, p.dp) for p in phases] == [("lp", 2, 1.0, True), ("fft", 3, 2.0, True)]
    assert phases[0].trainable == tuple(head) and phases[1].trainable == tuple(every)
    assert phases[0].optim is lp_optim and phases[1].optim.name == "adamw"
    assert [p.sampler_seed for p in phases] == [phase_seed(9, 0), phase_seed(9, 1)]
    off = finetune_phases([PhaseBudget(name="fft", steps=1, noise_multiplier=0.0)], head=head, backbone=every,
                          x=x, y=y, dataset="toy", batch_size=8, privacy=PrivacyConfig(enabled=False),
                          optim=OptimConfig(), seed=0)
    assert off[0].sigma is None and not off[0].dp
    with pytest.raises(ValueError, match="'lp' and 'fft'"):
        finetune_phases([PhaseBudget(name="private", steps=1, noise_multiplier=1.0)], head=head, backbone=every,
                        x=x, y=y, dataset="toy", batch_size=8, privacy=PrivacyConfig(enabled=False), optim=OptimConfig(),
                        seed=0)


def test_without_noise_on_full_batches_the_loop_is_plain_sgd(tmp_path, monkeypatch):
    """No DP, every step on all examples: LP then FFT equals a hand-written full-batch SGD loop."""
    monkeypatch.chdir(tmp_path)
    x, y = _data()
    model = _model()
    head = new_head(model, 2, init="random", seed=1)
    reference = copy.deepcopy(model)
    optim = OptimConfig(name="sgd", lr=0.2, momentum=0.0)
    phases = finetune_phases([PhaseBudget(name="lp", steps=2, noise_multiplier=0.0),
                              PhaseBudget(name="fft", steps=2, noise_multiplier=0.0)],
                             head=head, backbone=[n for n, _ in model.named_parameters()], x=x, y=y,
                             dataset="toy", batch_size=len(y), privacy=PrivacyConfig(enabled=False, sampling="shuffle"),
                             optim=optim, seed=0)
    seen: list[tuple[int, str]] = []
    out = finetune(model, phases, seed=0, device="cpu", physical_batch_size=5,
                   on_step=lambda g, phase, stats, m: seen.append((g, phase)))
    assert seen == [(1, "lp"), (2, "lp"), (3, "fft"), (4, "fft")]
    assert [c["name"] for c in out.completed] == ["lp", "fft"] and os.listdir(tmp_path) == []  # nothing written

    xt = torch.tensor(x, dtype=torch.float32).permute(0, 3, 1, 2) / 255.0
    yt = torch.tensor(y)
    losses = []
    for trainable in (set(head), None):
        for _ in range(2):
            loss = torch.nn.functional.cross_entropy(reference(xt), yt)
            losses.append(float(loss.detach()))
            params = [(n, p) for n, p in reference.named_parameters() if trainable is None or n in trainable]
            grads = torch.autograd.grad(loss, [p for _, p in params])
            with torch.no_grad():
                for (_, p), g in zip(params, grads):
                    p -= 0.2 * g
    for (name, got), want in zip(out.model.named_parameters(), reference.parameters()):
        assert torch.allclose(got, want, atol=1e-5), name
    assert out.final_loss == pytest.approx(losses[-1], rel=1e-5)  # the last step's loss, before its update


def test_dp_lp_leaves_the_backbone_bit_identical_and_noise_moves_the_head():
    x, y = _data()
    model = _model()
    head = new_head(model, 2, init="zero")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    phases = finetune_phases([PhaseBudget(name="lp", steps=3, noise_multiplier=2.0)], head=head,
                             backbone=[n for n, _ in model.named_parameters()], x=x, y=y, dataset="toy",
                             batch_size=6, privacy=PrivacyConfig(noise_multiplier=2.0),
                             optim=OptimConfig(name="sgd", lr=0.1, momentum=0.0), seed=4)
    out = finetune(model, phases, seed=4, device="cpu")
    after = out.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k not in head)
    assert all(not torch.equal(before[k], after[k]) for k in head)
    again = _model()
    new_head(again, 2, init="zero")
    assert all(torch.equal(after[k], v) for k, v in finetune(again, phases, seed=4, device="cpu").model
               .state_dict().items())
