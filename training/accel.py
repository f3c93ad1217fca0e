"""The GPU path's settings: channels-last memory format, TF32/bf16 precision, ``torch.compile``, resident data.

:class:`Accel` holds ``training.channels_last``, ``training.precision`` and ``training.compile``. Each is an
optimisation, never a requirement: every path also runs on the CPU (``device: cpu``), which is how the tests run it.

Precision and DP: per-sample gradients and their clipping are computed in strict fp32 (TF32 matmuls off, no
autocast) in every DP phase, whatever ``precision`` says, so the norm each clipping factor is computed from is the
fp32 norm of the fp32 gradient that is summed. ``tf32`` and ``bf16`` apply to non-DP phases and to evaluation;
:meth:`Accel.ran` names what actually ran, for the manifest (``tf32`` on a CPU is plain fp32: TF32 is a CUDA
feature; ``bf16`` autocast runs on the CPU too, where torch supports it).

:class:`ResidentImages` keeps a uint8 image set as a tensor on the training device when it fits (CIFAR-sized sets
do: 50 000 × 32 × 32 × 3 bytes = 150 MB) and builds each batch there: an index, a cast and a permute on the
device instead of a host-side float conversion and a copy per step.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from training.config import TrainingConfig
from training.device import free_memory_bytes, is_cuda

__all__ = ["Accel", "ResidentImages", "FP32", "recipe_record"]

Precision = Literal["fp32", "tf32", "bf16"]


@dataclass(frozen=True, kw_only=True)
class Accel:
    """How tensors are laid out and computed on the device (see the module docstring)."""

    channels_last: bool = False
    precision: Precision = "fp32"
    compile: bool = False

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "tf32", "bf16"):
            raise ValueError(f"precision must be 'fp32', 'tf32' or 'bf16', got {self.precision!r}")

    @classmethod
    def from_training(cls, tc: TrainingConfig) -> "Accel":
        return cls(channels_last=tc.channels_last, precision=tc.precision, compile=tc.compile)

    def ran(self, *, dp: bool, device: torch.device) -> str:
        """The precision a phase (``dp``) or evaluation (``dp=False``) computes in on ``device``."""
        if dp or self.precision == "fp32":
            return "fp32"
        if self.precision == "tf32":
            return "tf32" if is_cuda(device) else "fp32"
        return "bf16" if _autocast_supported(device) else "fp32"

    @contextlib.contextmanager
    def compute(self, *, dp: bool, device: torch.device) -> Iterator[str]:
        """Run a block (forward and backward, or evaluation) in the precision :meth:`ran` names; yields that name.

        TF32 is switched on (``tf32``, ``bf16``) or off (``fp32``, every DP phase) for the block only, on CUDA;
        the process-wide flags are restored afterwards.
        """
        ran = self.ran(dp=dp, device=device)
        with contextlib.ExitStack() as stack:
            if is_cuda(device):
                stack.enter_context(_tf32(ran != "fp32"))
            if ran == "bf16":
                stack.enter_context(torch.autocast(device_type=device.type, dtype=torch.bfloat16))
            yield ran

    def prepare(self, model: nn.Module) -> nn.Module:
        """``model`` in channels-last format when asked (in place; returned for chaining)."""
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def layout(self, x: Tensor) -> Tensor:
        """A 4-D batch in the model's memory format."""
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last and x.ndim == 4 else x

    def compiled(self, model: nn.Module, *, warn=None) -> nn.Module:
        """``torch.compile(model)`` when asked and it works, else ``model`` (with a warning when compiling failed).

        Compilation is lazy in torch: a compiled module that fails at its first call is caught by
        :func:`call_compiled`, which falls back to the eager module the same way.
        """
        if not self.compile:
            return model
        try:
            return _Compiled(torch.compile(model), model, warn)
        except Exception as exc:  # noqa: BLE001 - any failure of an optional optimisation falls back
            _warn(warn, f"training.compile: torch.compile failed ({type(exc).__name__}: {exc}); running eagerly")
            return model


class _Compiled(nn.Module):
    """A compiled module that falls back to the eager one if its first call fails (compilation happens there)."""

    def __init__(self, compiled: nn.Module, eager: nn.Module, warn) -> None:
        super().__init__()
        object.__setattr__(self, "_compiled", compiled)  # not registered: state_dict names stay the eager ones
        self.eager = eager
        object.__setattr__(self, "_warn", warn)
        object.__setattr__(self, "_ok", None)

    def forward(self, *args, **kwargs):
        if self._ok is False:
            return self.eager(*args, **kwargs)
        try:
            out = self._compiled(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - see Accel.compiled
            if self._ok:  # it worked before: a real error of the model, not of compilation
                raise
            object.__setattr__(self, "_ok", False)
            _warn(self._warn, f"training.compile: the compiled model failed ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}); running eagerly")
            return self.eager(*args, **kwargs)
        object.__setattr__(self, "_ok", True)
        return out


def _warn(warn, message: str) -> None:
    if warn is not None:
        warn(message)
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _autocast_supported(device: torch.device) -> bool:
    return bool(torch.amp.autocast_mode.is_autocast_available(device.type))


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """CUDA TF32 matmuls and convolutions on or off for a block; the previous flags are restored."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = cudnn


FP32 = Accel()


class ResidentImages:
    """uint8 images (N, H, W, 3) and labels held as tensors on ``device`` when they fit; float batches built there.

    Args:
        x: uint8 (N, H, W, 3) images; y: int labels (N,).
        device: the training device.
        budget_fraction: the share of the device's free memory the images may take (CUDA); on the CPU the
            images are shared with the numpy array (read-only ones too: nothing writes to them), not copied.

    Attributes:
        resident: whether the images live on ``device`` (False: each batch is copied over from the host).
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, *, device: torch.device, budget_fraction: float = 0.25) -> None:
        x = np.asarray(x)
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3:
            raise ValueError(f"images must be uint8 (N, H, W, 3), got {x.dtype} {x.shape}")
        self.device = torch.device(device)
        with warnings.catch_warnings():  # a read-only pool is shared, not copied: nothing here writes to it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            host_x = torch.from_numpy(np.ascontiguousarray(x))
        host_y = torch.from_numpy(np.asarray(y, dtype=np.int64).copy())
        fits = (not is_cuda(self.device)
                or host_x.numel() + 8 * host_y.numel() <= budget_fraction * free_memory_bytes(self.device))
        self.resident = bool(fits)
        where = self.device if fits else torch.device("cpu")
        self.x, self.y = host_x.to(where), host_y.to(where)

    def __len__(self) -> int:
        return len(self.y)

    def batch(self, rows: np.ndarray | Tensor) -> tuple[Tensor, Tensor]:
        """Float (n, 3, H, W) in [0, 1] and int64 labels of ``rows``, on the device."""
        idx = torch.as_tensor(np.asarray(rows, dtype=np.int64)).to(self.x.device)
        xb = self.x.index_select(0, idx).to(self.device, non_blocking=True)
        yb = self.y.index_select(0, idx).to(self.device, non_blocking=True)
        return xb.permute(0, 3, 1, 2).float().div_(255.0).contiguous(), yb


def recipe_record(cfg, phases, *, device: torch.device) -> dict:
    """The manifest's record of how the weights were computed: precision per phase and for evaluation, layout,
    compilation, and the augmentation / label smoothing / EMA options when any is on."""
    tc = cfg.training
    accel = Accel.from_training(tc)
    out: dict = {"precision": {
        "setting": tc.precision,
        "phases": {p.name: accel.ran(dp=p.dp, device=device) for p in phases},
        "evaluation": accel.ran(dp=False, device=device),
        "note": "DP phases compute per-sample gradients and clip in strict fp32 whatever the setting"},
        "channels_last": tc.channels_last, "compile": tc.compile}
    if tc.augment.active or tc.augment.multiplicity > 1:
        out["augment"] = tc.augment.model_dump(mode="json")
    if tc.label_smoothing:
        out["label_smoothing"] = tc.label_smoothing
    if tc.ema.decay is not None:
        out["ema"] = {**tc.ema.model_dump(mode="json"),
                      "weights": "the saved model.safetensors holds the EMA of the weights (what was evaluated); "
                                 "the DP claim covers it as post-processing"}
    return out
