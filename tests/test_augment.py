"""Training augmentation (training.augment): the transforms against slow references, LiRA's queries, the streams.

* Each copy equals the obvious construction: pad the (flipped) image by p (``F.pad`` reflect / zeros) and crop the
  window at offset (p - dy, p - dx).
* A copy with choice (flip, dy, dx) is exactly LiRA's signal query (flip, dy, dx) (attacks.signals), so a target
  trained with the augmentation is queried in distribution.
* The choices are a pure function of (seed, step) and differ between steps; with every transform off the batch is
  returned untouched and nothing is drawn.
* Signals are computed without training augmentation: the identity query of a model trained with augmentation is
  the model's plain forward pass on the raw images, whatever the augmentation stream.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attacks.signals import AugmentationSpec, compute_signals, iter_augmentations, scaled_logit
from training.augment import Draw, apply, augment, draw
from training.config import AugmentConfig
from training.dp.rng import augment_generator


def reference(x: torch.Tensor, flip: bool, dy: int, dx: int, pad: int, mode: str) -> torch.Tensor:
    """One image (C, H, W): flip, pad, crop — the textbook random crop."""
    h, w = x.shape[-2:]
    img = torch.flip(x, dims=(-1,)) if flip else x
    padded = F.pad(img[None], (pad, pad, pad, pad), mode="reflect" if mode == "reflect" else "constant")[0]
    return padded[:, pad - dy: pad - dy + h, pad - dx: pad - dx + w]


@pytest.mark.parametrize("mode", ["reflect", "zeros"])
def test_apply_equals_pad_and_crop(mode):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(6, 3, 7, 5, generator=g)
    spec = AugmentConfig(crop_padding=3, padding_mode=mode, flip=True, multiplicity=4)
    choice = draw(spec, len(x), generator=augment_generator(1, 2))
    out = apply(x, choice, pad_mode=mode)
    assert out.shape == (24, 3, 7, 5)
    assert choice.flip.any() and not choice.flip.all() and choice.dy.abs().max() == 3
    for i in range(6):
        for k in range(4):
            want = reference(x[i], bool(choice.flip[i, k]), int(choice.dy[i, k]), int(choice.dx[i, k]), 3, mode)
            assert torch.equal(out[i * 4 + k], want)


@pytest.mark.parametrize("mode", ["reflect", "zeros"])
def test_every_choice_is_a_lira_query(mode):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(3, 3, 6, 6, generator=g)
    spec = AugmentationSpec(flip=True, shifts=2, stride=1, padding=mode)
    for (f, dy, dx), query in zip(spec.augmentations, iter_augmentations(x, spec)):
        c = Draw(dy=torch.full((3, 1), dy), dx=torch.full((3, 1), dx), flip=torch.full((3, 1), f))
        assert torch.equal(apply(x, c, pad_mode=mode), query), (f, dy, dx)


def test_choices_are_a_function_of_seed_and_step():
    spec = AugmentConfig(crop_padding=4, flip=True, multiplicity=2)
    a, b = draw(spec, 50, generator=augment_generator(7, 3)), draw(spec, 50, generator=augment_generator(7, 3))
    c = draw(spec, 50, generator=augment_generator(7, 4))
    assert torch.equal(a.dy, b.dy) and torch.equal(a.dx, b.dx) and torch.equal(a.flip, b.flip)
    assert not torch.equal(a.dy, c.dy)
    counts = np.bincount((a.dy + 4).reshape(-1).numpy(), minlength=9)
    assert counts.min() > 0  # every offset in [-4, 4] occurs


def test_off_means_untouched_and_a_generator_is_required_when_on():
    x = torch.rand(2, 3, 4, 4)
    assert augment(x, AugmentConfig(), generator=None) is x
    with pytest.raises(ValueError, match="Generator"):
        augment(x, AugmentConfig(flip=True), generator=None)
    with pytest.raises(ValueError, match="reflect"):
        apply(x, Draw(dy=torch.full((2, 1), 4), dx=torch.zeros(2, 1, dtype=torch.int64),
                      flip=torch.zeros(2, 1, dtype=torch.bool)), pad_mode="reflect")


def test_channels_last_batches_stay_channels_last():
    x = torch.rand(2, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    out = augment(x, AugmentConfig(crop_padding=1, flip=True), generator=augment_generator(0, 0))
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, augment(x.contiguous(), AugmentConfig(crop_padding=1, flip=True),
                                    generator=augment_generator(0, 0)))


def test_signals_see_no_training_augmentation(tmp_path):
    """A model trained with augmentation (the stepper): its identity signal is its forward pass on the raw
    images, and the flip query is its forward pass on the flipped images — nothing random in between."""
    from training.config import OptimConfig
    from training.dp.engine import make_stepper
    from training.dp.recipe import TrainRecipe

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 4 * 4, 3))
    recipe = TrainRecipe(steps=3, batch_size=8, optim=OptimConfig(lr=0.5), dp=False,
                         augment=AugmentConfig(crop_padding=2, flip=True))
    stepper = make_stepper(model=model, recipe=recipe, sample_rate=1.0, generator=None, device="cpu")
    x, y = torch.rand(8, 3, 6, 6), torch.arange(8) % 3
    for t in range(3):
        stepper.step(x, y, augment_generator=augment_generator(0, t))
    trained = stepper.close().eval()
    phi = compute_signals(trained, x, y, spec=AugmentationSpec(flip=True))
    with torch.no_grad():
        plain = scaled_logit(trained(x), y).numpy()
        flipped = scaled_logit(trained(torch.flip(x, dims=(-1,))), y).numpy()
    np.testing.assert_array_equal(phi[:, 0], plain)
    np.testing.assert_array_equal(phi[:, 1], flipped)
    assert not np.allclose(phi[:, 0], phi[:, 1])  # the flip query is a real query
