"""The probe: a model whose every trainable coordinate belongs to exactly one Dirac canary, and how to read it.

:class:`Probe` holds two bias-free ``Linear(m, 1)`` layers (two parameter tensors, so per-layer clipping has two
layers). Canary ``i``'s input is ``S/√2 · e_i`` in both halves and its loss is ``target · output``; its per-sample
gradient is therefore ``target · S · v_i`` with ``v_i = (e_i, e_i)/√2`` a unit vector on coordinates that no
other canary touches. With ``S`` = 100·C every clipping style turns it into (almost exactly) ``±C · v_i``: flat
clipping exactly, per-layer clipping (C/√2 per tensor) exactly, automatic clipping to C·S/(S + γ), a hair below
C (which only makes the audit more conservative). The target is the step's sign ``s_t``
(:func:`audit.mechanism.scoring.alternating_signs`).

With plain SGD at learning rate 1 the update of step t is ``-(noisy clipped sum)/B``, so

    y_t[i] = -B · ⟨θ_{t+1} - θ_t, v_i⟩ / C

is the noisy sum along ``v_i`` in units of C, for members and non-members alike; ``s_t · y_t`` is what
:func:`~audit.mechanism.scoring.trial_scores` scores.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

__all__ = ["Probe", "probe_loss", "canary_inputs", "flat_weights", "read_sums", "SCALE"]

SCALE = 100.0  # the canary gradient's norm, in units of C: far above the clipping norm


class Probe(nn.Module):
    """Two bias-free linear maps ``R^m → R`` on the two halves of a ``(n, 2m)`` input, outputs added.

    >>> p = Probe(3)
    >>> p(torch.zeros(2, 6)).shape
    torch.Size([2, 1])
    """

    def __init__(self, m: int) -> None:
        super().__init__()
        if m < 1:
            raise ValueError(f"the probe needs at least one canary, got m={m}")
        self.m = int(m)
        self.a = nn.Linear(m, 1, bias=False)
        self.b = nn.Linear(m, 1, bias=False)
        with torch.no_grad():
            self.a.weight.zero_()
            self.b.weight.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x[:, : self.m]) + self.b(x[:, self.m:])


def probe_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example loss ``target · output``: its gradient is ``target`` times the input."""
    return logits[:, 0] * targets.to(logits.dtype)


def canary_inputs(idx: np.ndarray, m: int, *, max_grad_norm: float) -> torch.Tensor:
    """``(len(idx), 2m)`` inputs of canaries ``idx``: ``SCALE · C/√2`` at coordinate i of both halves."""
    idx = np.asarray(idx, dtype=np.int64)
    x = torch.zeros(len(idx), 2 * m)
    value = SCALE * max_grad_norm / math.sqrt(2.0)
    rows = torch.arange(len(idx))
    x[rows, torch.as_tensor(idx)] = value
    x[rows, torch.as_tensor(idx) + m] = value
    return x


def flat_weights(model: Probe) -> np.ndarray:
    """The probe's two weight vectors as a ``(2, m)`` float64 array."""
    return np.stack([model.a.weight.detach().double().cpu().numpy()[0], model.b.weight.detach().double().cpu().numpy()[0]])


def read_sums(before: np.ndarray, after: np.ndarray, *, batch_size: float, lr: float, max_grad_norm: float
              ) -> np.ndarray:
    """``y[i]``: the noisy clipped sum of one SGD step along each canary's direction, in units of C.

    Args:
        before: ``(2, m)`` weights before the step (:func:`flat_weights`).
        after: ``(2, m)`` weights after it.
        batch_size: the expected batch size B the step divides by (the claim's).
        lr: the learning rate.
        max_grad_norm: C.
    """
    delta = (after - before).sum(axis=0) / math.sqrt(2.0)
    return -delta * batch_size / (lr * max_grad_norm)
