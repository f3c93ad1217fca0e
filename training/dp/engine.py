"""The training step: one logical (Poisson or shuffled) batch, split into physical chunks, DP or not.

DP-SGD (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016) with Opacus underneath:

1. per-sample gradients of every physical chunk (``GradSampleModule``: ``hooks`` or ``functorch``; or
   ghost clipping, ``GradSampleModuleFastGradientClipping``, which never materialises them; or book-keeping,
   :mod:`training.dp.bk`, per-sample norms and the clipped sum from one backward pass);
2. clipping (flat, per-layer or automatic, see :mod:`training.dp.clipping`) and accumulation of the
   clipped sum over all chunks of the logical batch;
3. once per logical step: the sampled white-box gradient canaries (C·u_i each) join the sum, Gaussian
   noise N(0, σ²C²) is added, the result is divided by the *expected* batch size, and the wrapped
   optimizer (SGD, Adam, AdamW) updates the parameters. An empty Poisson batch still takes this
   noise-only step, as DP-SGD's analysis requires.

The noise comes from the caller's ``torch.Generator`` (its state is part of :meth:`Stepper.state_dict`),
the learning rate is a pure function of the step (:func:`training.dp.schedules.lr_at`), so a run resumed
from ``state_dict`` and the model weights continues bit-for-bit like the uninterrupted run on the same device.
Without DP, the step minimises the mean loss over the realised batch.

Evaluate the model with ``stepper.base_model`` under ``torch.no_grad()`` (Opacus's hooks record
activations in training mode with gradients enabled).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import torch
from torch import nn

from training.accel import FP32, Accel
from training.dp.canaries import GradientCanaries
from training.dp.clipping import (
    AutomaticDPOptimizer,
    FlatDPOptimizer,
    GhostDPOptimizer,
    PerLayerDPOptimizer,
    per_layer_norms,
)
from training.dp.optim import build_optimizer
from training.dp.recipe import TrainRecipe
from training.dp.stepper import LossFn, StepStats, Stepper, _Criterion, cross_entropy_per_example
from training.distributed import SINGLE, World
from foundation.errors import ConfigError
from training.models.dp_compat import opacus_inexact_layers

__all__ = ["StepStats", "Stepper", "make_stepper", "cross_entropy_per_example"]


def _dp_incompatible_layers(model: nn.Module) -> tuple[list[nn.Module], list[str]]:
    """(frozen batch-norm layers to keep in eval mode, problems that forbid DP training)."""
    frozen, problems = [], []
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            if any(p.requires_grad for p in m.parameters(recurse=False)):
                problems.append(f"trainable BatchNorm '{name}'")
            else:
                frozen.append(m)
    if not problems:
        from opacus.validators import ModuleValidator

        for err in ModuleValidator.validate(model, strict=False):
            problems.append(str(err).split(". ")[0])
    return frozen, problems


def _fused_stepper(*, model, base_opt, recipe, generator, frozen_bn, sample_rate, warn, debug, common) -> Stepper:
    """``grad_sample_mode: fused`` (:mod:`training.dp.fused_stepper`): the fixed-shape step, compiled when
    ``training.compile`` is on."""
    from training.dp.fused_stepper import FusedStepper, capacity_for, check_fused

    check_fused(recipe, common["world"])
    return FusedStepper(module=model, base_model=model, optimizer=base_opt, generator=generator,
                        frozen_norm_layers=frozen_bn, warn=warn, debug_disable_noise=debug,
                        capacity=capacity_for(expected_batch_size=float(recipe.batch_size), sample_rate=sample_rate),
                        compile="default" if common["accel"].compile else "off", **common)


def make_stepper(*, model: nn.Module, recipe: TrainRecipe, sample_rate: float, generator: torch.Generator | None,
                 device: torch.device | str, gradient_canaries: GradientCanaries | None = None,
                 loss_fn: LossFn | None = None, input_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 world: World = SINGLE, accel: Accel = FP32, warn: Callable[[str], None] | None = None,
                 _debug_disable_noise: bool = False) -> Stepper:
    """Build the :class:`Stepper` for one training phase.

    Args:
        model: the model (moved to ``device``); its trainable parameters are those with ``requires_grad``.
        recipe: the phase's :class:`~training.dp.recipe.TrainRecipe`: ``dp``, σ, C, clipping style, γ,
            grad-sample mode, secure mode, optimizer and schedule, ``steps`` (the schedule's span),
            ``batch_size`` (the DP-SGD denominator) and ``physical_batch_size``. ``secure_mode`` selects
            Opacus's noise sampling that resists floating-point attacks (arXiv:2107.10138) and keeps the
            generator's state out of :meth:`Stepper.state_dict`; the caller seeds ``generator`` from the OS
            CSPRNG (:func:`training.dp.rng.secret_seed`).
        sample_rate: q, the per-example sampling probability (used to sample gradient canaries).
        generator: source of the Gaussian noise, on ``device``'s type (CPU generator for CPU, CUDA for
            CUDA); required with DP. Its state is saved in :meth:`Stepper.state_dict` (not in secure mode).
        device: where the model and the chunks live.
        gradient_canaries: white-box canaries over the model's trainable parameters (see
            :mod:`training.dp.canaries`), or None.
        loss_fn: ``(logits, targets) -> per-example losses (n,)``; default cross-entropy.
        input_transform: applied to every physical chunk of inputs after it moved to ``device``.
        world: the ranks that share each logical batch (:mod:`training.distributed`); each rank steps on its
            share, rank 0 alone adds canaries and noise, the sums are all-reduced.
        accel: channels-last, precision and compilation (:mod:`training.accel`); DP steps always run in fp32
            and are compiled only under ``grad_sample_mode: fused`` (Opacus's hooks cannot be).
        warn: called with a warning (a failed ``torch.compile``); None: :func:`warnings.warn`.
        _debug_disable_noise: TEST ONLY, never for real runs: skip the Gaussian noise while everything else
            (clipping, canaries, scaling, accounting by the caller) is unchanged. It deliberately breaks DP
            so tests can prove the audits catch a broken implementation.

    Returns:
        A ready :class:`Stepper`.

    Raises:
        ConfigError: for an impossible combination (a model with trainable BatchNorm under DP, no trainable
            parameters, canaries that do not match the model).
        ValueError: for out-of-range numbers (the message names the parameter).
    """
    device = torch.device(device)
    if not isinstance(recipe, TrainRecipe):
        raise TypeError(f"recipe must be a TrainRecipe, got {type(recipe).__name__}")
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
    model = accel.prepare(model.to(device))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ConfigError("the model has no trainable parameters (check model.freeze patterns)")
    if gradient_canaries is not None:
        expected = [(n, tuple(p.shape)) for n, p in named]
        if list(gradient_canaries.param_shapes.items()) != expected:
            raise ConfigError("gradient canaries were built for other parameters than the model's trainable ones; "
                              "build them with GradientCanaries.for_model(model, ...) after freezing")
    base_opt = build_optimizer([p for _, p in named], recipe.optim, names=[n for n, _ in named])
    if loss_fn is None:
        loss_fn = (functools.partial(cross_entropy_per_example, label_smoothing=recipe.label_smoothing)
                   if recipe.label_smoothing else cross_entropy_per_example)
    ema_model = None
    if recipe.ema.decay is not None:
        ema_model = copy.deepcopy(model)
        ema_model.requires_grad_(False)
    common = dict(recipe=recipe, device=device, loss_fn=loss_fn, input_transform=input_transform,
                  canaries=gradient_canaries, sample_rate=float(sample_rate), world=world, accel=accel,
                  ema_model=ema_model)
    if not recipe.dp:
        if _debug_disable_noise:
            raise ValueError("_debug_disable_noise only applies to DP training (privacy.enabled)")
        return Stepper(module=accel.compiled(model, warn=warn), base_model=model, optimizer=base_opt,
                       dp_optimizer=None, ghost_loss=None,
                       generator=generator, frozen_norm_layers=[], **common)

    if generator is None:
        raise ValueError("a torch.Generator for the noise is required when privacy is enabled")
    if generator.device.type != device.type:
        raise ValueError(f"the noise generator lives on {generator.device.type} but the model on {device.type}; "
                         f"create it with torch.Generator(device='{device.type}')")
    frozen_bn, problems = _dp_incompatible_layers(model)
    if problems:
        raise ConfigError(f"the model cannot be trained with DP: {'; '.join(problems[:3])}; replace BatchNorm by "
                          "GroupNorm (model.fix_batchnorm: true) or freeze those layers")
    if recipe.grad_sample_mode == "fused":
        return _fused_stepper(model=model, base_opt=base_opt, recipe=recipe, generator=generator, frozen_bn=frozen_bn,
                              sample_rate=float(sample_rate), warn=warn, debug=bool(_debug_disable_noise),
                              common=common)
    if recipe.grad_sample_mode in ("hooks", "ghost"):
        inexact = opacus_inexact_layers(model)
        if inexact:
            raise ConfigError(f"privacy.grad_sample_mode: {recipe.grad_sample_mode}: Opacus computes wrong per-sample "
                              f"gradients for {', '.join(inexact[:3])}{' ...' if len(inexact) > 3 else ''}; use "
                              "grad_sample_mode: bk or functorch (exact for these layers), or padding_mode='zeros' / "
                              "no padding_idx in the model")
    C = float(recipe.max_grad_norm)
    dp_kwargs = dict(noise_multiplier=float(recipe.noise_multiplier), expected_batch_size=float(recipe.batch_size),
                     loss_reduction="mean", generator=generator, secure_mode=recipe.secure_mode)
    ghost_loss = None
    if recipe.grad_sample_mode == "ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        module = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="mean",
                                                      max_grad_norm=C, use_ghost_clipping=True)
        dp_opt = GhostDPOptimizer(base_opt, max_grad_norm=C, **dp_kwargs)
        ghost_loss = DPLossFastGradientClipping(module, dp_opt, _Criterion(loss_fn), loss_reduction="mean")
    elif recipe.grad_sample_mode == "bk":
        from training.dp.bk import BKDPOptimizer, BKModule

        module = BKModule(model, copies=recipe.augment.multiplicity)
        dp_opt = BKDPOptimizer(base_opt, bk=module, clipping=recipe.clipping, gamma=recipe.auto_gamma,
                               max_grad_norm=C, **dp_kwargs)
    else:
        from opacus.grad_sample import GradSampleModule

        module = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=True,
                                  force_functorch=recipe.grad_sample_mode == "functorch")
        if recipe.clipping == "flat":
            dp_opt = FlatDPOptimizer(base_opt, max_grad_norm=C, **dp_kwargs)
        elif recipe.clipping == "per_layer":
            dp_opt = PerLayerDPOptimizer(base_opt, max_grad_norm=per_layer_norms(C, len(named)), **dp_kwargs)
        else:
            dp_opt = AutomaticDPOptimizer(base_opt, max_grad_norm=C, gamma=recipe.auto_gamma, **dp_kwargs)
    dp_opt.debug_disable_noise = bool(_debug_disable_noise)
    dp_opt.reset_stats()
    return Stepper(module=module, base_model=model, optimizer=base_opt, dp_optimizer=dp_opt, ghost_loss=ghost_loss,
                   generator=generator, frozen_norm_layers=frozen_bn, **common)
