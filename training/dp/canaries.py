"""White-box gradient canaries for one-run privacy auditing.

Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023), §5 (white-box):
m random unit directions u_1..u_m over the concatenated trainable-parameter vector. Each canary is
*included* (a member) or not; an included canary behaves exactly like one extra training example whose
clipped gradient is always C·u_i: at every step it is Poisson-sampled with the run's rate q, and when
sampled C·u_i is added to the clipped-gradient sum before the Gaussian noise. Excluded canaries are never
added. After training, the projection of the parameter change on each direction separates members from
non-members.

Sign convention: gradient descent moves θ *against* an added gradient, so an included canary makes
⟨θ_T − θ_0, u_i⟩ negative. :meth:`GradientCanaries.scores` returns −⟨θ_T − θ_0, u_i⟩, so
**higher score = member**; :meth:`GradientCanaries.projections` returns the raw ⟨θ_T − θ_0, u_i⟩.

Directions are regenerated from (seed, i) with NumPy (platform independent), one at a time, so memory is
O(P) unless the whole m×P matrix fits the cache budget.

>>> c = GradientCanaries(param_shapes={"w": (3, 4), "b": (4,)}, count=5, seed=0)
>>> c.dim, c.included.dtype.name, round(float(np.linalg.norm(c.direction(2))), 6)
(16, 'bool', 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["GradientCanaries", "flatten_parameters", "trainable_shapes"]

_DIRECTION_TAG = 0x43414E44  # "CAND"
_SAMPLE_TAG = 0x43414E53  # "CANS"
_INCLUDE_TAG = 0x43414E49  # "CANI"


def trainable_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Names and shapes of ``model``'s trainable parameters, in ``named_parameters`` order."""
    return {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}


def flatten_parameters(model_or_state: nn.Module | Mapping[str, torch.Tensor], names: Sequence[str]) -> np.ndarray:
    """Concatenate the named parameters (module or state dict) into one float64 vector, in ``names`` order.

    Args:
        model_or_state: a module (its ``named_parameters``) or a ``{name: tensor}`` mapping.
        names: parameter names, e.g. ``list(canaries.param_shapes)``.

    Returns:
        A 1-D float64 array.

    Raises:
        KeyError: if a name is missing.
    """
    if isinstance(model_or_state, nn.Module):
        table = dict(model_or_state.named_parameters())
    else:
        table = dict(model_or_state)
    missing = [n for n in names if n not in table]
    if missing:
        raise KeyError(f"parameters not found: {missing[:5]} (of {len(missing)} missing)")
    return np.concatenate([table[n].detach().cpu().double().reshape(-1).numpy() for n in names])


class GradientCanaries:
    """m random unit gradient directions with an inclusion mask and a per-step Poisson draw.

    Args:
        param_shapes: ``{name: shape}`` of the trainable parameters, in the order their gradients are
            concatenated (use :func:`trainable_shapes` of the unwrapped model).
        count: m ≥ 1, the number of canaries.
        seed: integer seed ≥ 0 of the directions, the default inclusion mask and the sampling.
        included: bool mask of length m (True = member). None: independent Bernoulli(1/2) from ``seed``,
            the draw the one-run audit assumes.
        cache_bytes: keep all directions in memory (float32) when m·P·4 is at most this many bytes.

    Raises:
        ValueError: if an argument is malformed.
    """

    def __init__(self, *, param_shapes: Mapping[str, Sequence[int]], count: int, seed: int,
                 included: np.ndarray | Sequence[bool] | None = None, cache_bytes: int = 256 * 2**20) -> None:
        if not param_shapes:
            raise ValueError("param_shapes must name at least one trainable parameter")
        self.param_shapes = {str(k): tuple(int(d) for d in v) for k, v in param_shapes.items()}
        self.sizes = [int(np.prod(s)) for s in self.param_shapes.values()]
        self.dim = int(sum(self.sizes))
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"count must be an integer >= 1, got {count!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.count, self.seed = int(count), int(seed)
        if included is None:
            included = np.random.default_rng([_INCLUDE_TAG, self.seed]).random(self.count) < 0.5
        included = np.asarray(included)
        if included.shape != (self.count,) or included.dtype != np.bool_:
            raise ValueError(f"included must be a bool array of shape ({self.count},), got "
                             f"{included.dtype} {included.shape}")
        self.included = included.copy()
        self._cache: dict[int, np.ndarray] | None = {} if self.count * self.dim * 4 <= cache_bytes else None

    @classmethod
    def for_model(cls, model: nn.Module, *, count: int, seed: int,
                  included: np.ndarray | Sequence[bool] | None = None) -> "GradientCanaries":
        """Canaries over ``model``'s trainable parameters (the unwrapped model)."""
        return cls(param_shapes=trainable_shapes(model), count=count, seed=seed, included=included)

    # ------------------------------------------------------------------------------------------ directions

    def direction(self, i: int) -> np.ndarray:
        """Unit direction u_i (float32, length P), a normalised standard Gaussian drawn from (seed, i)."""
        if not 0 <= i < self.count:
            raise ValueError(f"canary index must be in [0, {self.count}), got {i}")
        if self._cache is not None and i in self._cache:
            return self._cache[i]
        z = np.random.default_rng([_DIRECTION_TAG, self.seed, int(i)]).standard_normal(self.dim, dtype=np.float32)
        # the norm by numpy's pairwise sum, not BLAS: np.linalg.norm's BLAS call costs ~20x more on a busy machine
        u = (z / np.sqrt(np.square(z, dtype=np.float64).sum())).astype(np.float32)
        if self._cache is not None:
            self._cache[i] = u
        return u

    def sampled(self, step: int, *, sample_rate: float) -> np.ndarray:
        """Indices of the included canaries Poisson-sampled (rate ``sample_rate``) at step ``step``.

        Every canary gets a draw from ``default_rng([TAG, seed, step])``; only included ones are returned, so
        the sampling of one canary never depends on the inclusion of another.
        """
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        draw = np.random.default_rng([_SAMPLE_TAG, self.seed, int(step)]).random(self.count) < sample_rate
        return np.flatnonzero(draw & self.included)

    def gradient(self, indices: Sequence[int] | np.ndarray, *, scale: float, device: torch.device | str,
                 dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        """scale · Σ_{i ∈ indices} u_i, split into tensors shaped like the parameters (in ``param_shapes`` order)."""
        total = np.zeros(self.dim, dtype=np.float32)
        for i in indices:
            total += self.direction(int(i))
        flat = torch.from_numpy(total).to(device=device, dtype=dtype) * float(scale)
        return [chunk.view(shape) for chunk, shape in zip(flat.split(self.sizes), self.param_shapes.values())]

    # -------------------------------------------------------------------------------------------- scoring

    def projections(self, delta: np.ndarray | torch.Tensor) -> np.ndarray:
        """⟨Δθ, u_i⟩ for every canary (float64, length m), Δθ = θ_T − θ_0 flattened in ``param_shapes`` order."""
        if isinstance(delta, torch.Tensor):
            delta = delta.detach().cpu().double().numpy()
        delta = np.asarray(delta, dtype=np.float64).reshape(-1)
        if delta.shape[0] != self.dim:
            raise ValueError(f"parameter change must have {self.dim} entries (the canary dimension), "
                             f"got {delta.shape[0]}")
        return np.array([float(delta @ self.direction(i).astype(np.float64)) for i in range(self.count)])

    def scores(self, delta: np.ndarray | torch.Tensor) -> np.ndarray:
        """Membership scores −⟨Δθ, u_i⟩ (higher = member), Δθ = θ_T − θ_0 flattened in ``param_shapes`` order."""
        return -self.projections(delta)

    def __repr__(self) -> str:
        return (f"GradientCanaries(count={self.count}, seed={self.seed}, dim={self.dim}, "
                f"included={int(self.included.sum())})")
