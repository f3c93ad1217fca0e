"""DP-SGD, written once: the building blocks and the two engines that use them.

Building blocks (each in its own module):

* :mod:`training.dp.recipe` — :class:`TrainRecipe`, the typed, frozen recipe both engines take;
* :mod:`training.dp.sampling` — the sampler contract (:class:`BatchSampler`, ``indices(step)``) and the
  Poisson and shuffle samplers (:func:`make_sampler`);
* :mod:`training.dp.rng` — :func:`derive_seed`, the one seed derivation (exact in integers), and
  :func:`secret_seed` for secure mode;
* :mod:`training.dp.csprng` — secure mode's noise, uniforms and permutations, read from ``os.urandom``;
* :mod:`training.dp.optim` — :func:`build_optimizer` and :func:`trainable_names` (the noise order);
* :mod:`training.dp.schedules` — :func:`lr_at`, the learning rate as a pure function of the step;
* :mod:`training.dp.clipping`, :mod:`training.dp.canaries`, :mod:`training.dp.state`;
* :mod:`training.dp.bk` and :mod:`training.dp.bk_layers` — book-keeping clipping (``grad_sample_mode: bk``);
* :mod:`training.dp.fused` and :mod:`training.dp.fused_stepper` — the fixed-shape step that keeps a GPU busy
  (``grad_sample_mode: fused``: device-side padded batches, torch.func per-example gradients, one transfer a
  step, ``torch.compile`` with ``training.compile``), equal to the Opacus path's arithmetic.

Engines: :func:`training.dp.engine.make_stepper` (Opacus: every clipping style, one model, physical chunks)
and :mod:`training.dp.batched` (torch.func: many small models at once, flat clipping). Both draw their
batches from :func:`make_sampler`, their noise from :func:`training.dp.rng.noise_generator` streams and their
optimizer from :func:`build_optimizer`; ``tests/test_dp_agreement.py`` checks that they agree.
"""

from training.dp.canaries import GradientCanaries, flatten_parameters, trainable_shapes
from training.dp.engine import Stepper, StepStats, make_stepper
from training.dp.optim import build_optimizer, trainable_names
from training.dp.recipe import TrainRecipe
from training.dp.rng import Stream, derive_seed, secret_seed
from training.dp.sampling import BatchSampler, PoissonSampler, ShuffleSampler, make_sampler
from training.dp.schedules import lr_at

__all__ = [
    "GradientCanaries",
    "flatten_parameters",
    "trainable_shapes",
    "Stepper",
    "StepStats",
    "make_stepper",
    "build_optimizer",
    "trainable_names",
    "TrainRecipe",
    "Stream",
    "derive_seed",
    "secret_seed",
    "BatchSampler",
    "PoissonSampler",
    "ShuffleSampler",
    "make_sampler",
    "lr_at",
]
