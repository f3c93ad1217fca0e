"""The training recipe both DP-SGD engines take: :class:`TrainRecipe`, typed and frozen.

One recipe describes how a model is trained — steps, expected batch size, optimizer and learning-rate
schedule, DP-SGD's σ, C and clipping style, the sampling scheme — independently of the data and of the
engine: :func:`training.dp.engine.make_stepper` (Opacus, every clipping style, one model) and
:func:`training.dp.batched.train_many` (torch.func, flat clipping, many small models at once) both take it.

:meth:`TrainRecipe.from_config` derives it from a training config plus the numbers the run fixed (steps,
batch size, σ); reference models derive theirs from the target's config and manifest the same way
(:func:`attacks.recipe.shadow_recipe`).

>>> from training.config import OptimConfig
>>> r = TrainRecipe(steps=10, batch_size=32, optim=OptimConfig(lr=0.5, schedule="linear"), noise_multiplier=1.0)
>>> r.lr_at(0), r.lr_at(9), r.dp
(0.5, 0.0, True)
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Literal

from training.config import AugmentConfig, EMAConfig, OptimConfig, PrivacyConfig, TrainConfig, TrainingConfig
from training.dp.schedules import lr_at
from foundation.errors import ConfigError

__all__ = ["TrainRecipe", "training_options"]

Clipping = Literal["flat", "per_layer", "automatic"]
GradSampleMode = Literal["hooks", "functorch", "ghost", "bk", "fused"]


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"TrainRecipe.{name} must be an integer >= {low}, got {value!r}")


def _check_float(name: str, value: object, low: float, *, strict: bool) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= low if strict else value < low):
        raise ValueError(f"TrainRecipe.{name} must be a finite number {'>' if strict else '>='} {low}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainRecipe:
    """How a model is trained, whichever engine trains it.

    Attributes:
        steps: number of logical steps (≥ 1); also the span of the learning-rate schedule.
        batch_size: expected logical batch size B ≥ 1: the DP-SGD denominator, and q = B / n for n examples.
        optim: optimizer and learning-rate schedule (:func:`training.dp.schedules.lr_at`).
        dp: DP-SGD (per-example clipping and Gaussian noise) or plain mini-batch steps.
        noise_multiplier: σ ≥ 0; the noise std per coordinate of the clipped sum is σ·C (DP only).
        max_grad_norm: clipping norm C > 0.
        clipping: ``flat``, ``per_layer`` or ``automatic`` (see :mod:`training.dp.clipping`).
        auto_gamma: γ > 0 of automatic clipping.
        sampling: ``poisson`` (what the DP analysis assumes) or ``shuffle``.
        grad_sample_mode: how per-sample gradients are computed: Opacus's ``hooks``, ``functorch``, ``ghost``,
            book-keeping ``bk`` (:mod:`training.dp.bk`), or ``fused`` (the fixed-shape step of
            :mod:`training.dp.fused_stepper`).
        secure_mode: noise resistant to floating-point attacks, seeds from the OS CSPRNG (see
            :mod:`training.dp.rng`).
        physical_batch_size: most examples whose per-example gradients are held at once (≥ 1).
        augment: training augmentation (random crop, flip, multiplicity K; :mod:`training.augment`); with K > 1
            an example's gradient is the mean over its K copies, clipped once.
        label_smoothing: ε of the label-smoothed cross-entropy, in [0, 1).
        ema: exponential moving average of the weights (decay None: off); :meth:`ema_decay_at`.

    Raises:
        ValueError: a value out of range (the message names the field).
        ConfigError: ghost clipping with a non-flat clipping style.
    """

    steps: int
    batch_size: int
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    dp: bool = True
    noise_multiplier: float = 0.0
    max_grad_norm: float = 1.0
    clipping: Clipping = "flat"
    auto_gamma: float = 0.01
    sampling: Literal["poisson", "shuffle"] = "poisson"
    grad_sample_mode: GradSampleMode = "hooks"
    secure_mode: bool = False
    physical_batch_size: int = 256
    augment: AugmentConfig = dataclasses.field(default_factory=AugmentConfig)
    label_smoothing: float = 0.0
    ema: EMAConfig = dataclasses.field(default_factory=EMAConfig)

    def __post_init__(self) -> None:
        _check_int("steps", self.steps, 1)
        _check_int("batch_size", self.batch_size, 1)
        _check_int("physical_batch_size", self.physical_batch_size, 1)
        _check_float("noise_multiplier", self.noise_multiplier, 0.0, strict=False)
        _check_float("max_grad_norm", self.max_grad_norm, 0.0, strict=True)
        _check_float("auto_gamma", self.auto_gamma, 0.0, strict=True)
        _check_float("label_smoothing", self.label_smoothing, 0.0, strict=False)
        if self.label_smoothing >= 1.0:
            raise ValueError(f"TrainRecipe.label_smoothing must be < 1, got {self.label_smoothing!r}")
        for name, kind in (("optim", OptimConfig), ("augment", AugmentConfig), ("ema", EMAConfig)):
            if not isinstance(getattr(self, name), kind):
                raise TypeError(f"TrainRecipe.{name} must be an {kind.__name__}, got "
                                f"{type(getattr(self, name)).__name__}")
        for name, allowed in (("clipping", ("flat", "per_layer", "automatic")), ("sampling", ("poisson", "shuffle")),
                              ("grad_sample_mode", ("hooks", "functorch", "ghost", "bk", "fused"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"TrainRecipe.{name} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")
        if self.dp and self.grad_sample_mode == "ghost" and self.clipping != "flat":
            raise ConfigError(f"ghost clipping supports privacy.clipping: flat only, got {self.clipping!r}; "
                              "use privacy.grad_sample_mode: hooks for per_layer or automatic clipping")
        if self.dp and self.augment.multiplicity > 1 and self.grad_sample_mode not in ("hooks", "functorch", "bk"):
            raise ConfigError(f"training.augment.multiplicity > 1 averages per-sample gradients over the copies "
                              f"before clipping, which privacy.grad_sample_mode {self.grad_sample_mode!r} does not "
                              "materialise; use grad_sample_mode: hooks, functorch or bk")

    def ema_decay_at(self, step: int) -> float:
        """EMA decay after (0-based) ``step``: d, or min(d, (1 + t) / (10 + t)) with warm-up (0 without EMA)."""
        d = self.ema.decay
        if d is None:
            return 0.0
        return min(d, (1.0 + step) / (10.0 + step)) if self.ema.warmup else d

    def lr_at(self, step: int) -> float:
        """Learning rate of (0-based) ``step``."""
        return lr_at(step, optim=self.optim, total_steps=self.steps)

    @property
    def noise_std(self) -> float:
        """σ·C/B: std per coordinate of the noise in the averaged gradient (0 without DP)."""
        return self.noise_multiplier * self.max_grad_norm / self.batch_size if self.dp else 0.0

    @classmethod
    def from_privacy(cls, *, privacy: PrivacyConfig, optim: OptimConfig, steps: int, batch_size: int,
                     noise_multiplier: float | None, physical_batch_size: int,
                     training: TrainingConfig | None = None) -> "TrainRecipe":
        """The recipe of one phase: the privacy section's clipping and sampling, σ as the run fixed it.

        Args:
            privacy: DP settings (``enabled``, C, clipping style, γ, sampling, grad-sample mode, secure mode).
            optim: optimizer and schedule.
            steps, batch_size: the phase's length and expected batch size.
            noise_multiplier: σ (None or ignored without DP).
            physical_batch_size: memory chunk.
            training: the training section whose augmentation, label smoothing and EMA apply (None: none).
        """
        dp = bool(privacy.enabled)
        if dp and noise_multiplier is None:
            raise ValueError("noise_multiplier is required when privacy is enabled")
        return cls(steps=int(steps), batch_size=int(batch_size), optim=optim, dp=dp,
                   noise_multiplier=float(noise_multiplier) if dp else 0.0, max_grad_norm=privacy.max_grad_norm,
                   clipping=privacy.clipping, auto_gamma=privacy.auto_gamma, sampling=privacy.sampling,
                   grad_sample_mode=privacy.grad_sample_mode, secure_mode=privacy.secure_mode and dp,
                   physical_batch_size=int(physical_batch_size), **training_options(training))

    @classmethod
    def from_config(cls, cfg: TrainConfig, *, steps: int, batch_size: int,
                    noise_multiplier: float | None) -> "TrainRecipe":
        """The recipe of a single-phase run of ``cfg`` with the given length, batch size and σ."""
        return cls.from_privacy(privacy=cfg.privacy, optim=cfg.optim, steps=steps, batch_size=batch_size,
                                noise_multiplier=noise_multiplier,
                                physical_batch_size=cfg.training.physical_batch_size, training=cfg.training)


def training_options(training: TrainingConfig | None) -> dict[str, object]:
    """The :class:`TrainRecipe` keywords a training section sets (augmentation, label smoothing, EMA)."""
    if training is None:
        return {}
    return {"augment": training.augment, "label_smoothing": float(training.label_smoothing), "ema": training.ema}
