"""training.evaluate: the one batched evaluation loop against a naive one-image-at-a-time reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from training.config import ModelConfig
from training.data import ImageSet
from training.evaluate import accuracy, mean_loss, predict
from training.models import build_model


def _images(n: int = 23, seed: int = 0) -> ImageSet:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
    return ImageSet(x=x, y=rng.integers(0, 3, size=n), classes=("a", "b", "c"), name="toy", split="test")


def _model() -> torch.nn.Module:
    model = build_model(ModelConfig(arch="small_cnn"), num_classes=3, input_shape=(3, 8, 8), seed=1).module
    return model.train()


def _naive(model: torch.nn.Module, images: ImageSet) -> tuple[np.ndarray, float]:
    """Predictions and mean cross-entropy, one image at a time, written out by hand."""
    model.eval()
    preds, losses = [], []
    with torch.no_grad():
        for img, label in zip(images.x, images.y):
            x = torch.tensor(img, dtype=torch.float32).permute(2, 0, 1).unsqueeze(0) / 255.0
            logits = model(x)[0].double()
            preds.append(int(logits.argmax()))
            losses.append(float(torch.logsumexp(logits, 0) - logits[int(label)]))
    model.train()
    return np.array(preds), float(np.mean(losses))


@pytest.mark.parametrize("batch_size", [1, 4, 23, 512])
def test_batched_loop_equals_the_naive_per_example_loop(batch_size):
    images, model = _images(), _model()
    preds, loss = _naive(model, images)
    assert predict(model, images.x, device="cpu", batch_size=batch_size).tolist() == preds.tolist()
    assert accuracy(model, images, device="cpu", batch_size=batch_size) == np.mean(preds == images.y)
    assert mean_loss(model, images, device="cpu", batch_size=batch_size) == pytest.approx(loss, rel=1e-5)
    assert model.training  # the caller's mode is restored


def test_accuracy_counts_a_known_classifier_exactly():
    images = _images(n=40, seed=3)

    class Oracle(torch.nn.Module):  # right on the first 30 examples, wrong on the last 10
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def forward(self, x):
            start = self.calls
            self.calls += len(x)
            y = torch.as_tensor(images.y[start:start + len(x)].copy())
            y = torch.where(torch.arange(start, start + len(x)) < 30, y, (y + 1) % 3)
            return torch.nn.functional.one_hot(y, 3).float()

    assert accuracy(Oracle(), images, device="cpu", batch_size=7) == 30 / 40


def test_empty_or_missing_images_and_bad_arguments():
    model, images = _model(), _images()
    empty = images.subset(np.zeros(0, dtype=np.int64))
    assert accuracy(model, None, device="cpu") is None and accuracy(model, empty, device="cpu") is None
    assert np.isnan(mean_loss(model, empty, device="cpu"))
    assert predict(model, empty.x, device="cpu").shape == (0,)
    with pytest.raises(ValueError, match="batch_size"):
        predict(model, images.x, device="cpu", batch_size=0)


def test_mode_is_restored_when_the_forward_pass_fails():
    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    model = Broken().train()
    with pytest.raises(RuntimeError, match="boom"):
        predict(model, _images().x, device="cpu")
    assert model.training
