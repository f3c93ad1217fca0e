"""``privacy.grad_sample_mode: fused``: the training loop's :class:`~training.dp.stepper.Stepper` on the fused step.

:class:`FusedStepper` keeps the stepper's contract (``step(x, y) -> StepStats``, the learning-rate schedule, the
noise generator the loop reseeds every step, gradient canaries, EMA, ``state_dict``) and replaces the Opacus path
of a DP step by :class:`training.dp.fused.FusedDPStep`: the realised batch is moved to the device, augmented, and
padded to a fixed capacity (the Poisson batch size's 99.9 % quantile for the phase's n and q; a larger batch, about
one step in a thousand, is taken whole in a larger shape, a multiple of 64: nothing is ever dropped, so the
sampling stays exactly Poisson), so nearly every step has the same shapes and ``training.compile`` can capture it. A step
makes one device-to-host transfer, its statistics (which the loop's divergence check reads), instead of the Opacus
path's per-chunk norms, per-parameter loops and several ``.item()``-like reads.

Exactly the Opacus path's arithmetic: the same clipped sums, the same noise from the same generator state, the same
update (``tests/test_dp_fused.py``, against ``hooks`` and ``bk``, and whole ``audit train`` runs). Supported: flat
and automatic clipping, canaries, augmentation (multiplicity 1), EMA, one process. Refused with a one-line
:class:`~foundation.errors.ConfigError`: per-layer clipping, augmentation multiplicity > 1, secure mode (the noise
comes from the seeded generator), several ranks.
"""

from __future__ import annotations

import numpy as np
import torch

from foundation.errors import ConfigError
from training.dp.fused import FusedDPStep, poisson_capacity
from training.dp.stepper import StepStats, Stepper

__all__ = ["FusedStepper", "check_fused", "capacity_for"]


def check_fused(recipe, world) -> None:
    """Refuse what the fused step does not implement (see the module docstring).

    Raises:
        ConfigError: naming the setting and what to use instead.
    """
    problems = []
    if recipe.clipping == "per_layer":
        problems.append("privacy.clipping: per_layer (use flat or automatic)")
    if recipe.augment.multiplicity > 1:
        problems.append("training.augment.multiplicity > 1 (use grad_sample_mode: bk)")
    if recipe.secure_mode:
        problems.append("privacy.secure_mode (its noise must come from the OS CSPRNG; use grad_sample_mode: bk)")
    if world.distributed:
        problems.append("several ranks (use one process, or grad_sample_mode: bk)")
    if problems:
        raise ConfigError(f"privacy.grad_sample_mode: fused does not support {'; '.join(problems)}")


class FusedStepper(Stepper):
    """A :class:`Stepper` whose DP steps run :class:`~training.dp.fused.FusedDPStep` (see the module docstring).

    Built by :func:`training.dp.engine.make_stepper` for ``grad_sample_mode: fused``; ``capacity`` is the padded
    batch size, ``compile`` a :data:`training.dp.fused.COMPILE_MODES` entry (``training.compile`` on: ``default``).
    """

    def __init__(self, *, capacity: int, compile: str = "off", warn=None, debug_disable_noise: bool = False,
                 **kwargs) -> None:
        super().__init__(dp_optimizer=None, ghost_loss=None, **kwargs)
        self.precision = self.accel.ran(dp=True, device=self.device)  # DP steps: strict fp32
        self.capacity = int(capacity)
        self.fused = FusedDPStep(self._base_model, optimizer=self.optimizer,
                                 noise_multiplier=float(self.recipe.noise_multiplier),
                                 max_grad_norm=self.max_grad_norm, expected_batch_size=self.expected_batch_size,
                                 generator=self.generator, clipping=self.recipe.clipping, gamma=self.recipe.auto_gamma,
                                 physical_batch_size=self.physical_batch_size, loss_fn=self.loss_fn,
                                 compile=compile, warn=warn, debug_disable_noise=debug_disable_noise)
        self.oversized_steps = 0  # steps whose batch exceeded the capacity (a larger shape that step)

    @property
    def dp(self) -> bool:
        return True

    def _padded(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The realised batch on the device (transformed, augmented, laid out as the stepper's chunks are), padded
        with zero rows to the fixed capacity; and the ``valid`` mask."""
        n = len(y)
        parts = list(self._chunks(x, y))
        cap = self.capacity
        if n > cap:
            cap = -(-n // 64) * 64  # few distinct shapes for the rare large batch (compilation caches per shape)
            self.oversized_steps += 1
        if parts:
            xb, yb = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        else:  # an empty Poisson batch: no rows, the transformed shape
            xb, yb = x.to(self.device), y.to(self.device)
            if self.input_transform is not None:
                xb = self.input_transform(xb)
        xp = torch.cat([xb, xb.new_zeros((cap - n, *xb.shape[1:]))])
        yp = torch.cat([yb, yb.new_zeros(cap - n)])
        valid = torch.arange(cap, device=xp.device) < n
        return self.accel.layout(xp), yp, valid

    def _dp_step(self, x: torch.Tensor, y: torch.Tensor, lr: float, canary_idx: np.ndarray) -> StepStats:
        xp, yp, valid = self._padded(x, y)
        grad = self._canary_grad(canary_idx, self.max_grad_norm)
        self.fused.step(xp, yp, valid, canary_grad=grad)
        norms = self.fused.last_norms[valid]
        median = norms.median() if len(norms) else norms.new_full((), float("nan"))
        # one transfer: the step's sums and the median norm
        loss, n, clipped, norm_sum, median = torch.cat([self.fused.pop_stats(), median.reshape(1).double()]).tolist()
        n = int(n)
        nan = float("nan")
        return StepStats(step=self._step, loss=loss / n if n else nan, batch_size=n, lr=lr,
                         noise_std=0.0 if self.fused.debug_disable_noise
                         else self.noise_multiplier * self.max_grad_norm / self.expected_batch_size,
                         clipped_fraction=clipped / n if n else nan, grad_norm_mean=norm_sum / n if n else nan,
                         grad_norm_median=median if n else nan, canaries_added=len(canary_idx))

    def close(self) -> torch.nn.Module:
        """The plain model (holding the EMA weights when ``recipe.ema`` is on); no hooks to remove."""
        if self.ema_model is not None and not self._closed:
            with torch.no_grad():
                self._base_model.load_state_dict(self.ema_model.state_dict())
        self._closed = True
        return self._base_model


def capacity_for(*, expected_batch_size: float, sample_rate: float, tail: float = 1e-3) -> int:
    """The padded batch size of a phase: :func:`~training.dp.fused.poisson_capacity` at ``tail`` for n = B/q
    examples (a larger batch is taken whole, in a larger shape: :meth:`FusedStepper._padded`).

    >>> capacity_for(expected_batch_size=4096, sample_rate=4096 / 22500)
    4280
    """
    n = max(1, int(round(expected_batch_size / sample_rate)))
    return poisson_capacity(n, min(1.0, sample_rate), tail=tail)
