"""The recipe shared by batched and one-at-a-time training of many small models, and its random streams.

Both :func:`training.batched.train_many` (all models at once, ``torch.func.vmap``) and
:func:`training.batched.train_one` (one model, the reference) draw every random quantity from the functions
in this module, so the two produce the same models up to floating-point rounding:

* model initialisation: the global torch RNG forked and seeded with ``derive_seed(seed, 0, STREAM_INIT)``;
* the batch of step ``t``: :func:`batch_indices` (Poisson: independent Bernoulli(q) draws over the model's
  members from ``np.random.default_rng([seed, t])``; shuffle: a per-epoch permutation);
* the DP noise of step ``t``: one flat ``torch.randn(D)`` from a ``torch.Generator`` seeded with
  ``derive_seed(seed, t, STREAM_NOISE)``, split over the trainable parameters in ``named_parameters`` order.

DP-SGD follows Abadi et al. 2016 ("Deep Learning with Differential Privacy"): per-example gradients are
clipped to L2 norm ``max_grad_norm`` (flat clipping, Opacus' factor ``min(1, C / (||g|| + 1e-6))``), summed,
Gaussian noise of standard deviation ``noise_multiplier * max_grad_norm`` is added per coordinate and the sum
is divided by the *expected* batch size ``batch_size`` (so the update is unbiased under Poisson sampling).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Literal

import numpy as np
import torch
from torch import nn

from training.errors import ConfigError

__all__ = [
    "TrainRecipe",
    "derive_seed",
    "batch_indices",
    "noise_generator",
    "seeded_init",
    "check_model",
    "make_optimizer",
    "trainable_names",
    "STREAM_INIT",
    "STREAM_NOISE",
]

STREAM_INIT = 1
STREAM_NOISE = 2
_STREAM_SHUFFLE = 3
CLIP_EPS = 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainRecipe:
    """How each model is trained; identical for every model of a batch (only seeds and masks differ).

    Attributes:
        steps: number of logical optimizer steps (> 0).
        batch_size: expected logical batch size B; Poisson rate q = B / n_k for a model with n_k members.
        lr: base learning rate (> 0).
        optimizer: "sgd" (with ``momentum``), "adam" or "adamw" (torch.optim semantics).
        momentum: SGD momentum in [0, 1).
        betas: Adam/AdamW betas.
        eps: Adam/AdamW epsilon.
        weight_decay: L2 penalty (sgd, adam) or decoupled decay (adamw), >= 0.
        lr_schedule: optional ``f(step) -> factor``; the learning rate of step t is ``lr * f(t)``
            (``torch.optim.lr_scheduler.LambdaLR`` convention). Must be picklable for the process executor.
        dp: train with DP-SGD (per-example clipping and Gaussian noise) instead of plain mini-batch steps.
        noise_multiplier: sigma >= 0 (noise std is sigma * max_grad_norm per coordinate of the summed gradient).
        max_grad_norm: clipping norm C > 0.
        sampling: "poisson" (what the DP guarantee assumes) or "shuffle" (epochs of disjoint batches of
            exactly B members, the last partial batch dropped).
        physical_batch_size: most examples (per model) whose per-example gradients are held at once.
    """

    steps: int
    batch_size: int
    lr: float
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    momentum: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    lr_schedule: Callable[[int], float] | None = None
    dp: bool = True
    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    sampling: Literal["poisson", "shuffle"] = "poisson"
    physical_batch_size: int = 256

    def __post_init__(self) -> None:
        _check_int("steps", self.steps, 1)
        _check_int("batch_size", self.batch_size, 1)
        _check_int("physical_batch_size", self.physical_batch_size, 1)
        _check_float("lr", self.lr, 0.0, inclusive=False)
        _check_float("weight_decay", self.weight_decay, 0.0)
        _check_float("noise_multiplier", self.noise_multiplier, 0.0)
        _check_float("max_grad_norm", self.max_grad_norm, 0.0, inclusive=False)
        _check_float("eps", self.eps, 0.0, inclusive=False)
        if self.optimizer not in ("sgd", "adam", "adamw"):
            raise ValueError(f"optimizer must be 'sgd', 'adam' or 'adamw', got {self.optimizer!r}")
        if self.sampling not in ("poisson", "shuffle"):
            raise ValueError(f"sampling must be 'poisson' or 'shuffle', got {self.sampling!r}")
        if not 0.0 <= float(self.momentum) < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if len(self.betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two floats in [0, 1), got {self.betas!r}")
        if self.lr_schedule is not None and not callable(self.lr_schedule):
            raise TypeError(f"lr_schedule must be callable step -> factor or None, got {type(self.lr_schedule)}")

    def lr_at(self, step: int) -> float:
        """Learning rate of ``step`` (0-based)."""
        factor = 1.0 if self.lr_schedule is None else float(self.lr_schedule(step))
        if not math.isfinite(factor) or factor < 0:
            raise ValueError(f"lr_schedule({step}) must be a finite factor >= 0, got {factor!r}")
        return self.lr * factor


def _check_int(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_float(name: str, value: object, low: float, *, inclusive: bool = True) -> None:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value < low if inclusive else value <= low):
        bound = ">=" if inclusive else ">"
        raise ValueError(f"{name} must be a finite number {bound} {low}, got {value!r}")


def derive_seed(seed: int, step: int, stream: int) -> int:
    """A 63-bit seed for a torch.Generator, a pure function of (seed, step, stream).

    >>> derive_seed(0, 3, STREAM_NOISE) == derive_seed(0, 3, STREAM_NOISE) != derive_seed(1, 3, STREAM_NOISE)
    True
    """
    state = np.random.SeedSequence([int(seed), int(step), int(stream)]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def batch_indices(members: np.ndarray, *, batch_size: int, seed: int, step: int,
                  sampling: str = "poisson") -> np.ndarray:
    """Pool indices of the logical batch of ``step`` for a model whose members are ``members``.

    Poisson: each member is kept independently with probability q = batch_size / len(members) (capped at
    1), from ``np.random.default_rng([seed, step]).random(len(members)) < q``. Shuffle: epoch
    ``e = step // (n // B)`` permutes the members with ``default_rng([seed, e, 3])`` and step takes the
    consecutive slice of B members (the last partial batch of an epoch is dropped; if n < B the whole set).

    Args:
        members: sorted int array of the model's pool indices.
        batch_size: expected batch size B.
        seed: the model's seed (>= 0).
        step: 0-based step.
        sampling: "poisson" or "shuffle".

    Returns:
        int64 array of pool indices (increasing for Poisson).

    >>> batch_indices(np.arange(10), batch_size=4, seed=0, step=0, sampling="shuffle").shape
    (4,)
    """
    n = len(members)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if sampling == "poisson":
        q = min(1.0, batch_size / n)
        keep = np.random.default_rng([int(seed), int(step)]).random(n) < q
        return np.asarray(members[keep], dtype=np.int64)
    if sampling == "shuffle":
        per_epoch = max(1, n // batch_size)
        epoch, pos = divmod(int(step), per_epoch)
        perm = np.random.default_rng([int(seed), epoch, _STREAM_SHUFFLE]).permutation(n)
        return np.asarray(members[perm[pos * batch_size:(pos + 1) * batch_size]], dtype=np.int64)
    raise ValueError(f"sampling must be 'poisson' or 'shuffle', got {sampling!r}")


def noise_generator(seed: int, step: int, device: torch.device | str) -> torch.Generator:
    """The torch.Generator of a model's DP noise at ``step`` (on ``device``)."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(derive_seed(seed, step, STREAM_NOISE))
    return gen


@contextlib.contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Run a block (model construction) with the CPU torch RNG seeded from ``seed``, restoring it after.

    The caller's global RNG state is untouched: the block runs inside ``torch.random.fork_rng``.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, 0, STREAM_INIT))
        yield


def check_model(model: nn.Module) -> None:
    """Refuse modules whose per-example gradients are not independent or not reproducible.

    Raises:
        ConfigError: the model has BatchNorm (mixes examples; use GroupNorm) or active dropout (random per
            call, so batched and one-at-a-time training could not agree).
    """
    bad = [name or type(model).__name__ for name, m in model.named_modules()
           if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm))]
    if bad:
        raise ConfigError(f"batched training needs models without BatchNorm (found it at {', '.join(bad[:3])}); "
                          "use GroupNorm (e.g. model.fix_batchnorm=true) or no normalisation")
    drop = [name for name, m in model.named_modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]
    if drop:
        raise ConfigError(f"batched training needs models without dropout (found p>0 at {', '.join(drop[:3])}); "
                          "set the dropout rate to 0")


def trainable_names(model: nn.Module) -> list[str]:
    """Names of parameters with ``requires_grad``, in ``named_parameters`` order (the noise order)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not names:
        raise ConfigError("the model has no trainable parameters (every parameter has requires_grad=False)")
    return names


def make_optimizer(params: Sequence[torch.Tensor], recipe: TrainRecipe) -> torch.optim.Optimizer:
    """The torch.optim optimizer of ``recipe`` over ``params``.

    SGD, Adam and AdamW update every coordinate independently, so the same optimizer over parameters
    stacked along a leading model axis performs exactly each model's own update.
    """
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay,
                               foreach=False)
    cls = torch.optim.Adam if recipe.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=recipe.lr, betas=tuple(recipe.betas), eps=recipe.eps, weight_decay=recipe.weight_decay,
               foreach=False)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
