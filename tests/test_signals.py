"""Tests for attacks.signals: the scaled logit, augmentations and signal extraction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from attacks.signals import (
    AugmentationSpec,
    augment_batch,
    compute_signals,
    log_prob_from_phi,
    loss_from_phi,
    prob_from_phi,
    scaled_logit,
)


def _naive_phi(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    out = []
    for row, y in zip(logits.astype(np.float64), labels):
        p = np.exp(row - row.max())
        p /= p.sum()
        out.append(math.log(p[y]) - math.log(sum(p[j] for j in range(len(row)) if j != y)))
    return np.array(out)


def test_scaled_logit_matches_naive_formula():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 10, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, 10, (64,), generator=g)
    phi = scaled_logit(logits, labels).numpy()
    np.testing.assert_allclose(phi, _naive_phi(logits.numpy(), labels.numpy()), rtol=1e-10, atol=1e-10)
    # and equals log p - log(1 - p) for moderate values
    p = torch.softmax(logits, 1).gather(1, labels[:, None]).squeeze(1).numpy()
    np.testing.assert_allclose(phi, np.log(p) - np.log1p(-p), rtol=1e-8, atol=1e-8)


def test_scaled_logit_extreme_logits_are_finite_and_exact():
    logits = torch.tensor([[1000.0, -1000.0, 0.0], [1000.0, -1000.0, 0.0], [-1000.0, -1000.0, 1000.0],
                           [1000.0, 1000.0, 1000.0]])
    labels = torch.tensor([0, 1, 2, 1])
    phi = scaled_logit(logits, labels)
    assert torch.isfinite(phi).all()
    # y=0: 1000 - logsumexp(-1000, 0) = 1000; y=1: -1000 - logsumexp(1000, 0) = -2000;
    # y=2: 1000 - logsumexp(-1000, -1000) = 2000 - log 2; all equal: 0 - log 2
    np.testing.assert_allclose(phi.numpy(), [1000.0, -2000.0, 2000.0 - math.log(2.0), -math.log(2.0)], rtol=1e-6)
    # two classes, 1000 apart: a naive 1 - p subtraction would give inf here
    phi2 = scaled_logit(torch.tensor([[500.0, -500.0]]), torch.tensor([0]))
    assert float(phi2) == pytest.approx(1000.0)


def test_scaled_logit_half_precision_and_errors():
    logits = torch.randn(8, 4).half()
    labels = torch.randint(0, 4, (8,))
    assert scaled_logit(logits, labels).dtype == torch.float32
    with pytest.raises(ValueError, match="at least 2 classes"):
        scaled_logit(torch.zeros(3, 1), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        scaled_logit(torch.zeros(2, 4), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="labels must have shape"):
        scaled_logit(torch.zeros(2, 4), torch.tensor([0, 1, 2]))


def test_loss_and_prob_from_phi_match_cross_entropy_and_softmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(32, 5, generator=g, dtype=torch.float64) * 4
    labels = torch.randint(0, 5, (32,), generator=g)
    phi = scaled_logit(logits, labels)
    ce = nn.functional.cross_entropy(logits, labels, reduction="none")
    p = torch.softmax(logits, 1).gather(1, labels[:, None]).squeeze(1)
    torch.testing.assert_close(loss_from_phi(phi), ce)
    torch.testing.assert_close(prob_from_phi(phi), p)
    np.testing.assert_allclose(loss_from_phi(phi.numpy()), ce.numpy(), rtol=1e-10)
    np.testing.assert_allclose(prob_from_phi(phi.numpy()), p.numpy(), rtol=1e-10)
    np.testing.assert_allclose(log_prob_from_phi(phi.numpy()), np.log(p.numpy()), rtol=1e-10)
    # stable in the tails
    big = np.array([-1000.0, 1000.0])
    assert np.isfinite(loss_from_phi(big)).all() and np.isfinite(log_prob_from_phi(big)).all()
    assert loss_from_phi(big)[0] == pytest.approx(1000.0)


def test_augmentation_names_are_stable():
    assert AugmentationSpec().names == ("identity",)
    assert AugmentationSpec(flip=True).names == ("identity", "hflip")
    names = AugmentationSpec(flip=True, shifts=1).names
    expected_shifts = [f"shift_{dy:+d}_{dx:+d}" for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy, dx) != (0, 0)]
    assert names == ("identity", *expected_shifts, "hflip", *(f"hflip_{s}" for s in expected_shifts))
    assert AugmentationSpec(shifts=4, stride=4).offsets == ((0, 0), (-4, -4), (-4, 0), (-4, 4), (0, -4),
                                                            (0, 4), (4, -4), (4, 0), (4, 4))


def test_flip_of_flip_is_identity_and_identity_first():
    x = torch.rand(3, 3, 6, 5)
    spec = AugmentationSpec(flip=True, shifts=2)
    aug = augment_batch(x, spec)
    assert aug.shape == (2 * 25, 3, 3, 6, 5)
    torch.testing.assert_close(aug[0], x)
    hflip = spec.names.index("hflip")
    torch.testing.assert_close(augment_batch(aug[hflip], spec)[hflip], x)
    torch.testing.assert_close(aug[hflip], x.flip(-1))


@pytest.mark.parametrize("padding", ["reflect", "zeros"])
def test_shift_semantics_match_numpy_pad(padding):
    x = torch.rand(2, 3, 7, 6)
    k = 2
    spec = AugmentationSpec(flip=True, shifts=k, padding=padding)
    aug = augment_batch(x, spec)
    mode = "reflect" if padding == "reflect" else "constant"
    padded = np.pad(x.numpy(), [(0, 0), (0, 0), (k, k), (k, k)], mode=mode)
    for a, (f, dy, dx) in enumerate(spec.augmentations):
        src = padded[..., ::-1] if f else padded   # flip first, then translate
        want = src[..., k - dy: k - dy + 7, k - dx: k - dx + 6]
        np.testing.assert_array_equal(aug[a].numpy(), want)
    down = spec.names.index("shift_+1_+0")          # content moves down by one row
    np.testing.assert_array_equal(aug[down][..., 1:, :].numpy(), x[..., :-1, :].numpy())


def test_augmentation_validation():
    with pytest.raises(ValueError, match="shifts must be an integer >= 0"):
        AugmentationSpec(shifts=-1)
    with pytest.raises(ValueError, match="stride must be an integer >= 1"):
        AugmentationSpec(stride=0)
    with pytest.raises(ValueError, match="padding must be one of"):
        AugmentationSpec(padding="wrap")
    with pytest.raises(ValueError, match="shifts < image size"):
        augment_batch(torch.zeros(1, 3, 2, 2), AugmentationSpec(shifts=2))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        augment_batch(torch.zeros(3, 2, 2), AugmentationSpec())


class _PoolLinear(nn.Module):
    """Pointwise conv, global average pool, linear head: invariant to horizontal flips."""

    def __init__(self, num_classes: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean(dim=(2, 3)))


def test_compute_signals_matches_manual_and_layouts():
    torch.manual_seed(0)
    model = _PoolLinear()
    model.train()
    rng = np.random.default_rng(0)
    x_u8 = rng.integers(0, 256, size=(10, 8, 8, 3), dtype=np.uint8)
    y = rng.integers(0, 4, size=10)
    spec = AugmentationSpec(flip=True, shifts=1)
    sig = compute_signals(model, x_u8, y, spec=spec, batch_size=3)
    assert sig.shape == (10, 18) and sig.dtype == np.float32
    assert model.training, "the model's train/eval mode must be restored"
    x_f = torch.from_numpy(x_u8).permute(0, 3, 1, 2).float() / 255.0
    sig_f = compute_signals(model, x_f, torch.from_numpy(y), spec=spec, batch_size=10)
    np.testing.assert_allclose(sig, sig_f, rtol=1e-5, atol=1e-5)
    model.eval()
    with torch.no_grad():
        manual = torch.stack([scaled_logit(model(a), torch.from_numpy(y)) for a in augment_batch(x_f, spec)], 1)
    np.testing.assert_allclose(sig, manual.numpy(), rtol=1e-5, atol=1e-5)
    # the model is flip-invariant (global pooling), so identity and hflip columns agree
    np.testing.assert_allclose(sig[:, 0], sig[:, spec.names.index("hflip")], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="y must have shape"):
        compute_signals(model, x_u8, y[:5], spec=spec)
    with pytest.raises(ValueError, match="batch_size"):
        compute_signals(model, x_u8, y, batch_size=0)
