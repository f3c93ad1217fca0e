"""The DP engine: samplers, clipping, gradient canaries, learning-rate schedules and the training step.

Import the pieces from their modules (``training.dp.engine``, ``training.dp.sampling``, ...); this package
re-exports the main entry points.
"""

from training.dp.canaries import GradientCanaries, flatten_parameters, trainable_shapes
from training.dp.engine import Stepper, StepStats, make_stepper
from training.dp.sampling import PoissonSampler, ShuffleSampler, make_sampler
from training.dp.schedules import lr_at

__all__ = [
    "GradientCanaries",
    "flatten_parameters",
    "trainable_shapes",
    "Stepper",
    "StepStats",
    "make_stepper",
    "PoissonSampler",
    "ShuffleSampler",
    "make_sampler",
    "lr_at",
]
