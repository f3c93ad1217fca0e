"""The optimizer factory and the trainable-parameter order shared by both DP-SGD engines.

Both engines (Opacus's :class:`training.dp.engine.Stepper` and the batched
:class:`training.dp.batched.engine.BatchedTrainer`) build their optimizer with :func:`build_optimizer`, set
the learning rate of each step from :func:`training.dp.schedules.lr_at`, and lay out the trainable parameters
(and so the order in which DP noise is drawn) by :func:`trainable_names`.

>>> from torch import nn
>>> from training.config import OptimConfig
>>> m = nn.Linear(2, 1)
>>> trainable_names(m), type(build_optimizer(list(m.parameters()), OptimConfig(name="adamw"))).__name__
(['weight', 'bias'], 'AdamW')
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import torch
from torch import nn

from training.config import OptimConfig
from foundation.errors import ConfigError

__all__ = ["build_optimizer", "lr_scale_of", "trainable_names", "set_lr"]


def lr_scale_of(name: str, scales: dict[str, float]) -> float:
    """The learning-rate multiplier of parameter ``name``: the first glob of ``scales`` it matches, else 1.

    >>> lr_scale_of("net.head.weight", {"net.head.*": 5.0}), lr_scale_of("net.blocks.0.w", {"net.head.*": 5.0})
    (5.0, 1.0)
    """
    return next((float(s) for pattern, s in scales.items() if fnmatch.fnmatchcase(name, pattern)), 1.0)


def build_optimizer(params: Sequence[torch.Tensor], optim: OptimConfig, *, names: Sequence[str] | None = None,
                    foreach: bool | None = None) -> torch.optim.Optimizer:
    """The torch optimizer named by ``optim.name`` over ``params``: SGD (momentum), Adam or AdamW.

    SGD, Adam and AdamW update every coordinate independently, so the same optimizer over parameters
    stacked along a leading model axis (the batched engine) performs exactly each model's own update.
    With ``optim.lr_scales`` every parameter gets its own group (in the order given, so the DP noise order is
    unchanged) holding ``lr_scale``; :func:`set_lr` multiplies the step's rate by it (e.g. a faster head).

    Args:
        params: the tensors to optimise.
        optim: name, learning rate, momentum, betas, weight decay, lr_scales.
        names: the parameters' names (needed with ``optim.lr_scales``).
        foreach: torch's multi-tensor implementation switch (None: torch's default for the device).

    Raises:
        ConfigError: an unknown optimizer name, or lr_scales without names.
    """
    params = list(params)
    if optim.lr_scales:
        if names is None or len(names) != len(params):
            raise ConfigError("optim.lr_scales needs the parameters' names (this engine does not pass them)")
        params = [{"params": [p], "lr_scale": lr_scale_of(n, optim.lr_scales),
                   "lr": optim.lr * lr_scale_of(n, optim.lr_scales)} for n, p in zip(names, params)]
    if optim.name == "sgd":
        return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay,
                               foreach=foreach)
    if optim.name in ("adam", "adamw"):
        cls = torch.optim.Adam if optim.name == "adam" else torch.optim.AdamW
        return cls(params, lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay, foreach=foreach)
    raise ConfigError(f"optim.name must be sgd, adam or adamw, got {optim.name!r}")


def trainable_names(model: nn.Module) -> list[str]:
    """Names of the parameters with ``requires_grad``, in ``named_parameters`` order (the noise order).

    Raises:
        ConfigError: no parameter is trainable.
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not names:
        raise ConfigError("the model has no trainable parameters (check model.freeze patterns)")
    return names


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group (times its ``lr_scale``, see :func:`build_optimizer`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
