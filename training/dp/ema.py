"""Exponential moving average of a model's weights, one formula for both training engines.

After step t: θ_ema ← d_t·θ_ema + (1 − d_t)·θ for every floating tensor of the state (parameters and floating
buffers such as BatchNorm statistics); integer buffers are copied. ``d_t`` is
:meth:`training.dp.recipe.TrainRecipe.ema_decay_at`. The average is a function of the released iterates only, so
under DP it is post-processing: the claim is unchanged.

>>> import torch
>>> avg, new = torch.zeros(2), torch.ones(2)
>>> ema_tensors_([avg], [new], decay=0.75); avg.tolist()
[0.25, 0.25]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["ema_tensors_", "ema_update_"]


@torch.no_grad()
def ema_tensors_(avg: Sequence[Tensor], new: Sequence[Tensor], *, decay: float) -> None:
    """In place: ``a ← decay·a + (1 − decay)·n`` for floating tensors, ``a ← n`` for the others."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay must be in [0, 1), got {decay!r}")
    if len(avg) != len(new):
        raise ValueError(f"{len(avg)} averaged tensors for {len(new)} new ones")
    for a, n in zip(avg, new):
        if a.is_floating_point():
            a.mul_(decay).add_(n.detach().to(a.dtype), alpha=1.0 - decay)
        else:
            a.copy_(n)


def ema_update_(ema_model: nn.Module, model: nn.Module, *, decay: float) -> None:
    """:func:`ema_tensors_` over the two models' state dicts (same names required)."""
    avg, new = ema_model.state_dict(), model.state_dict()
    if avg.keys() != new.keys():
        raise ValueError("the EMA model and the model have different state names")
    ema_tensors_(list(avg.values()), [new[k] for k in avg], decay=decay)
