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

from collections.abc import Sequence

import torch
from torch import nn

from training.config import OptimConfig
from training.errors import ConfigError

__all__ = ["build_optimizer", "trainable_names", "set_lr"]


def build_optimizer(params: Sequence[torch.Tensor], optim: OptimConfig, *,
                    foreach: bool | None = None) -> torch.optim.Optimizer:
    """The torch optimizer named by ``optim.name`` over ``params``: SGD (momentum), Adam or AdamW.

    SGD, Adam and AdamW update every coordinate independently, so the same optimizer over parameters
    stacked along a leading model axis (the batched engine) performs exactly each model's own update.

    Args:
        params: the tensors to optimise.
        optim: name, learning rate, momentum, betas, weight decay.
        foreach: torch's multi-tensor implementation switch (None: torch's default for the device).

    Raises:
        ConfigError: an unknown optimizer name.
    """
    params = list(params)
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
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
