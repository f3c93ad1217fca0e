"""The :class:`Stepper`: one logical DP-SGD (or plain) step over physical chunks, and :class:`StepStats`.

Built by :func:`training.dp.engine.make_stepper`, which explains the algorithm. The noise comes from the
caller's ``torch.Generator`` (saved in :meth:`Stepper.state_dict`) and the learning rate is a pure function of
the step, so a run resumed from ``state_dict`` plus the model weights continues bit-for-bit like the
uninterrupted run on the same device.
"""

from __future__ import annotations

import warnings

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.accel import FP32, Accel
from training.augment import Draw, apply, draw
from training.dp.canaries import GradientCanaries
from training.dp.ema import ema_update_
from training.dp.optim import set_lr
from training.dp.recipe import TrainRecipe
from training.distributed import SINGLE, World, all_reduce_sum_
from foundation.errors import CheckpointError

__all__ = ["StepStats", "Stepper", "cross_entropy_per_example", "LossFn", "STATE_FORMAT"]

STATE_FORMAT = "dp-audit-stepper/1"
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_per_example(logits: torch.Tensor, targets: torch.Tensor, *,
                              label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-example cross-entropy, shape (n,), optionally label-smoothed: the default loss."""
    return F.cross_entropy(logits, targets, reduction="none", label_smoothing=label_smoothing)


@dataclass(frozen=True)
class StepStats:
    """What one logical step did.

    Attributes:
        step: 0-based index of the step.
        loss: mean per-example loss over the logical batch (NaN for an empty batch).
        batch_size: realised number of examples in the batch.
        lr: learning rate used.
        noise_std: std of the noise per coordinate of the *averaged* gradient the optimizer received,
            σ·C / expected batch size (0 without DP or with the test-only noise switch).
        clipped_fraction: share of examples whose gradient was scaled down to the norm bound (flat and
            automatic: pre-clip norm > C; per-layer: some tensor above C/√L). None without DP; NaN for an
            empty DP batch.
        grad_norm_mean: mean pre-clip per-example gradient norm (None without DP; NaN for an empty batch).
        grad_norm_median: median pre-clip per-example gradient norm (None without DP; NaN for an empty batch).
        canaries_added: number of gradient canaries added at this step.
    """

    step: int
    loss: float
    batch_size: int
    lr: float
    noise_std: float
    clipped_fraction: float | None = None
    grad_norm_mean: float | None = None
    grad_norm_median: float | None = None
    canaries_added: int = 0


class _Criterion(nn.Module):
    """A per-example loss function with the ``reduction`` attribute Opacus's ghost-clipping loss expects."""

    def __init__(self, loss_fn: LossFn) -> None:
        super().__init__()
        self.loss_fn = loss_fn
        self.reduction = "mean"

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses = _per_example(self.loss_fn, logits, targets)
        if self.reduction == "none":
            return losses
        return losses.sum() if self.reduction == "sum" else losses.mean()


def _per_example(loss_fn: LossFn, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    losses = loss_fn(logits, targets)
    if losses.ndim != 1 or losses.shape[0] != logits.shape[0]:
        raise ValueError(f"loss_fn must return one loss per example, shape ({logits.shape[0]},); "
                         f"got {tuple(losses.shape)}")
    return losses


class Stepper:
    """Owns the (wrapped) model and optimizer; :meth:`step` performs one logical step.

    Build it with :func:`make_stepper`. Attributes of interest: ``dp`` (bool), ``noise_multiplier``,
    ``max_grad_norm``, ``sample_rate``, ``expected_batch_size``, ``canaries``, ``step_count``.
    """

    def __init__(self, *, module: nn.Module, base_model: nn.Module, optimizer: torch.optim.Optimizer,
                 dp_optimizer: Any | None, ghost_loss: Any | None, recipe: TrainRecipe, device: torch.device,
                 loss_fn: LossFn, input_transform: Callable[[torch.Tensor], torch.Tensor] | None,
                 generator: torch.Generator | None, canaries: GradientCanaries | None, sample_rate: float,
                 frozen_norm_layers: list[nn.Module], world: World = SINGLE, accel: Accel = FP32,
                 ema_model: nn.Module | None = None) -> None:
        self.module = module
        self._base_model = base_model
        self.optimizer = optimizer
        self.dp_optimizer = dp_optimizer
        self._ghost_loss = ghost_loss
        self.recipe = recipe
        self.total_steps = recipe.steps
        self.physical_batch_size = recipe.physical_batch_size
        self.device = device
        self.loss_fn = loss_fn
        self.input_transform = input_transform
        self.generator = generator
        self.canaries = canaries
        self.sample_rate = sample_rate
        self.expected_batch_size = float(recipe.batch_size)
        self.noise_multiplier = float(recipe.noise_multiplier) if recipe.dp else None
        self.max_grad_norm = float(recipe.max_grad_norm)
        self.secure_mode = bool(recipe.secure_mode and recipe.dp)
        self._frozen_norm_layers = frozen_norm_layers
        self._params = [p for p in base_model.parameters() if p.requires_grad]
        self._step = 0
        self._closed = False
        self.world = world  # several ranks: each steps on its share of the batch (training.distributed)
        if dp_optimizer is not None:
            dp_optimizer.world = world
        self.accel = accel
        self.precision = accel.ran(dp=dp_optimizer is not None, device=device)  # what the steps compute in
        self.ema_model = ema_model
        self._augment_choice: Draw | None = None

    # --------------------------------------------------------------------------------------- properties

    @property
    def dp(self) -> bool:
        return self.dp_optimizer is not None

    @property
    def base_model(self) -> nn.Module:
        """The unwrapped model (parameter names without Opacus's ``_module.`` prefix)."""
        return self._base_model

    @property
    def eval_model(self) -> nn.Module:
        """The model to evaluate: the EMA of the weights when ``recipe.ema`` is on, else :attr:`base_model`."""
        return self.ema_model if self.ema_model is not None else self._base_model

    @property
    def step_count(self) -> int:
        """Number of logical steps taken so far (the index of the next step)."""
        return self._step

    def lr(self, step: int | None = None) -> float:
        """Learning rate of ``step`` (default: the next step)."""
        return self.recipe.lr_at(self._step if step is None else step)

    @property
    def fallback_layers(self) -> list[str] | None:
        """``bk`` mode: the layers whose per-sample gradients come from the exact per-layer fallback
        (:class:`training.dp.bk.BKModule`); None in the other modes and without DP."""
        return list(self.module.fallback_layers) if self.dp and hasattr(self.module, "fallback_layers") else None

    # ---------------------------------------------------------------------------------------------- step

    def step(self, x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, *,
             augment_generator: torch.Generator | None = None) -> StepStats:
        """One logical step on the batch ``(x, y)`` (any length, 0 included), in physical chunks.

        Args:
            x: inputs, first dimension = batch (CPU or device; ``input_transform`` is applied per chunk).
            y: targets, same length as ``x``.
            augment_generator: the step's augmentation stream (:func:`training.dp.rng.augment_generator`),
                required when ``recipe.augment`` transforms anything; the choices for the whole logical batch are
                drawn first (:func:`training.augment.draw`), then applied chunk by chunk on the device.

        Returns:
            The step's :class:`StepStats`.

        Raises:
            ValueError: if ``x`` and ``y`` differ in length or the loss is not per-example.
            RuntimeError: if the stepper was closed.
        """
        if self._closed:
            raise RuntimeError("this Stepper was closed (its hooks were removed); build a new one")
        x = torch.as_tensor(x) if isinstance(x, np.ndarray) else x
        y = torch.as_tensor(y) if isinstance(y, np.ndarray) else y
        if len(x) != len(y):
            raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
        spec = self.recipe.augment
        self._augment_choice = None
        if spec.active or spec.multiplicity > 1:
            if spec.active and augment_generator is None:
                raise ValueError("recipe.augment is on: pass the step's augment_generator "
                                 "(training.dp.rng.augment_generator(seed, step))")
            self._augment_choice = draw(spec, len(y), generator=augment_generator) if spec.active else None
        lr = self.lr()
        set_lr(self.optimizer, lr)
        self.module.train()
        for m in self._frozen_norm_layers:
            m.eval()
        canary_idx = np.zeros(0, dtype=np.int64)
        if self.canaries is not None:
            canary_idx = self.canaries.sampled(self._step, sample_rate=self.sample_rate)
        with self.accel.compute(dp=self.dp, device=self.device):
            if self.dp:
                stats = self._dp_step(x, y, lr, canary_idx)
            else:
                stats = self._plain_step(x, y, lr, canary_idx)
        self._update_ema()
        self._step += 1
        return stats

    def _chunks(self, x: torch.Tensor, y: torch.Tensor):
        """(inputs, targets) of each physical chunk on the device, augmented: K copies of an example are consecutive
        rows (``multiplicity``), their targets repeated."""
        k, spec = self.recipe.augment.multiplicity, self.recipe.augment
        for start in range(0, len(y), self.physical_batch_size):
            stop = start + self.physical_batch_size
            xc = x[start:stop].to(self.device, non_blocking=True)
            yc = y[start:stop].to(self.device, non_blocking=True)
            if self.input_transform is not None:
                xc = self.input_transform(xc)
            c = self._augment_choice
            if c is not None:
                xc = apply(xc, Draw(dy=c.dy[start:stop], dx=c.dx[start:stop], flip=c.flip[start:stop]),
                           pad_mode=spec.padding_mode)
            elif k > 1:
                xc = xc.repeat_interleave(k, dim=0)
            yield self.accel.layout(xc), (yc.repeat_interleave(k) if k > 1 else yc)

    def _losses(self, out: torch.Tensor, yc: torch.Tensor) -> torch.Tensor:
        """Per-example losses of a chunk: the mean over an example's K augmented copies."""
        losses = _per_example(self.loss_fn, out, yc)
        k = self.recipe.augment.multiplicity
        return losses.view(-1, k).mean(1) if k > 1 else losses

    def _average_copies(self) -> None:
        """Per-sample gradients of the K copies of an example averaged into that example's, before clipping
        (augmentation multiplicity, De et al. 2022): each example then contributes one gradient, clipped once."""
        k = self.recipe.augment.multiplicity
        if k == 1:
            return
        for p in self.dp_optimizer.params:
            g = p.grad_sample
            if g is None:
                continue
            if isinstance(g, list):
                g = torch.cat(g)
            p.grad_sample = g.view(-1, k, *g.shape[1:]).mean(1)

    @torch.no_grad()
    def _update_ema(self) -> None:
        """θ_ema ← d·θ_ema + (1 − d)·θ over every floating tensor of the state (buffers too); others copied."""
        if self.ema_model is None:
            return
        ema_update_(self.ema_model, self._base_model, decay=self.recipe.ema_decay_at(self._step))

    def _canary_grad(self, idx: np.ndarray, scale: float) -> list[torch.Tensor] | None:
        if self.canaries is None or len(idx) == 0:
            return None
        return self.canaries.gradient(idx, scale=scale, device=self.device, dtype=self._params[0].dtype)

    def _dp_step(self, x: torch.Tensor, y: torch.Tensor, lr: float, canary_idx: np.ndarray) -> StepStats:
        with warnings.catch_warnings():
            # Opacus's hooks fire on the first layer although the input needs no gradient: expected, harmless
            warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
            return self._dp_step_inner(x, y, lr, canary_idx)

    def _dp_step_inner(self, x: torch.Tensor, y: torch.Tensor, lr: float, canary_idx: np.ndarray) -> StepStats:
        opt = self.dp_optimizer
        self._forget_stale_activations()
        opt.reset_sum()
        opt.zero_grad()
        loss_sum = torch.zeros((), device=self.device)
        for xc, yc in self._chunks(x, y):
            out = self.module(xc)
            if self._ghost_loss is not None:
                loss = self._ghost_loss(out, yc)
                loss.backward()  # two passes: norms, then the clipped sum in p.grad
                opt.record_norms(self.module.per_sample_gradient_norms)
                opt.accumulate()
                loss_sum += loss.loss_per_sample.detach().sum()
            else:
                losses = self._losses(out, yc)
                losses.mean().backward()
                self._average_copies()
                opt.clip_and_accumulate()
                loss_sum += losses.detach().sum()
            opt.zero_grad()
        norms = torch.cat(opt.sample_norms).cpu() if opt.sample_norms else torch.zeros(0)
        clipped = torch.cat(opt.sample_clipped).cpu() if opt.sample_clipped else torch.zeros(0, dtype=torch.bool)
        grad = self._canary_grad(canary_idx, self.max_grad_norm) if self.world.is_main else None  # added once
        opt.canary_grad = (lambda: grad) if grad is not None else None
        opt.finish_step()
        opt.canary_grad = None
        opt.zero_grad()
        nan = float("nan")
        # the logical batch's statistics (several ranks: sums over the ranks; the median is this rank's share's)
        totals = torch.tensor([float(loss_sum), float(len(y)), float(clipped.sum()), float(norms.sum())],
                              dtype=torch.float64, device=self.device)
        all_reduce_sum_([totals], self.world)
        loss_total, n, n_clipped, norm_total = totals.tolist()
        n = int(n)
        noise_std = (0.0 if opt.debug_disable_noise
                     else self.noise_multiplier * self.max_grad_norm / self.expected_batch_size)
        return StepStats(
            step=self._step,
            loss=loss_total / n if n else float("nan"),
            batch_size=n,
            lr=lr,
            noise_std=noise_std,
            clipped_fraction=n_clipped / n if n else nan,
            grad_norm_mean=norm_total / n if n else nan,
            grad_norm_median=float(norms.median()) if len(norms) else nan,
            canaries_added=len(canary_idx),
        )

    def _forget_stale_activations(self) -> None:
        """Drop activations Opacus's hooks recorded outside :meth:`step` (a forward in training mode with
        gradients on and no backward); they would change its batch-size bookkeeping."""
        for m in self.module.modules():
            if getattr(m, "activations", None):
                m.activations = []
            if hasattr(m, "max_batch_len"):
                del m.max_batch_len
        for p in self._params:
            p._forward_counter = 0
            if hasattr(p, "_current_grad_sample"):
                del p._current_grad_sample

    def _plain_step(self, x: torch.Tensor, y: torch.Tensor, lr: float, canary_idx: np.ndarray) -> StepStats:
        self.optimizer.zero_grad(set_to_none=True)
        n = len(y)
        if self.world.distributed:  # the mean over the logical batch, which the ranks share
            count = torch.tensor([float(n)], dtype=torch.float64, device=self.device)
            all_reduce_sum_([count], self.world)
            n = int(count.item())
        denom = n + len(canary_idx)  # a canary is one extra example whose gradient is C·u_i
        loss_sum = torch.zeros((), device=self.device)
        for xc, yc in self._chunks(x, y):
            losses = self._losses(self.module(xc), yc)
            (losses.sum() / denom).backward()
            loss_sum += losses.detach().sum()
        grad = self._canary_grad(canary_idx, self.max_grad_norm / max(denom, 1)) if self.world.is_main else None
        if grad is not None:
            for p, g in zip(self._params, grad):
                p.grad = g.clone() if p.grad is None else p.grad + g
        if self.world.distributed:
            for p in self._params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            all_reduce_sum_([p.grad for p in self._params] + [loss_sum], self.world)
        if denom > 0:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(step=self._step, loss=float(loss_sum) / n if n else float("nan"), batch_size=n, lr=lr,
                         noise_std=0.0, canaries_added=len(canary_idx))

    # --------------------------------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """Everything but the model weights needed to resume exactly: step, optimizer state, noise generator.

        In secure mode the generator's state is left out (whoever reads the checkpoint could otherwise
        recompute noise); a resumed secure run draws fresh noise. Save the weights separately
        (``base_model.state_dict()``). Contains only tensors, numbers, strings,
        lists and dicts: ``torch.load(weights_only=True)`` reads it, and :func:`training.dp.state.split_state`
        turns it into safetensors + JSON.
        """
        return {
            "format": STATE_FORMAT,
            "step": self._step,
            "dp": self.dp,
            "noise_multiplier": self.noise_multiplier if self.dp else None,
            "max_grad_norm": self.max_grad_norm if self.dp else None,
            "optimizer": self.optimizer.state_dict(),
            "generator": (self.generator.get_state() if self.generator is not None and not self.secure_mode
                          else None),
            **({"ema": {k: v.detach().clone() for k, v in self.ema_model.state_dict().items()}}
               if self.ema_model is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (into a stepper built with the same configuration).

        Raises:
            CheckpointError: if the state is malformed or was made with a different DP configuration.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise CheckpointError(f"training state is not a {STATE_FORMAT} state; delete state/ and restart the run")
        if bool(state.get("dp")) != self.dp:
            raise CheckpointError("training state was saved with privacy "
                                  f"{'on' if state.get('dp') else 'off'} but this run has it "
                                  f"{'on' if self.dp else 'off'}; resume with the original config")
        if self.dp and (state.get("noise_multiplier") != self.noise_multiplier
                        or state.get("max_grad_norm") != self.max_grad_norm):
            raise CheckpointError(
                f"training state used noise multiplier {state.get('noise_multiplier')} and clipping norm "
                f"{state.get('max_grad_norm')}, this run {self.noise_multiplier} and {self.max_grad_norm}; "
                "resume with the original config")
        self.load_optimizer_state(state["optimizer"])
        if self.ema_model is not None:
            if not isinstance(state.get("ema"), dict):
                raise CheckpointError("training state holds no EMA weights but this run averages them (training.ema); "
                                      "resume with the original config")
            self.ema_model.load_state_dict(state["ema"])
        if self.generator is not None and state.get("generator") is not None:
            self.generator.set_state(state["generator"].to(torch.uint8).cpu())
        self._step = int(state["step"])

    def load_optimizer_state(self, optimizer_state: dict[str, Any]) -> None:
        """Load only the optimizer state (e.g. to carry moments across training phases)."""
        try:
            self.optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"optimizer state does not fit this model/optimizer: {exc}") from None

    def close(self) -> nn.Module:
        """Remove Opacus's hooks and per-parameter attributes; return the plain model (holding the EMA weights when
        ``recipe.ema`` is on: what is evaluated and saved). The stepper is unusable after."""
        if self.dp and not self._closed:
            self.module._close()
        if self.ema_model is not None and not self._closed:
            with torch.no_grad():
                self._base_model.load_state_dict(self.ema_model.state_dict())
        self._closed = True
        return self._base_model
