"""Where tensors run: the one resolver of a ``device`` setting (``auto``, ``cpu``, ``cuda``, ``cuda:1``, ...).

Every choice of a device, and every question to the CUDA runtime, goes through this module
(``tests/test_device.py`` greps the code base for ``.cuda(`` and hard-coded ``"cuda"`` strings elsewhere).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from foundation.errors import ConfigError

__all__ = ["resolve_device", "is_cuda", "rank_device", "bind_rank", "free_memory_bytes", "synchronize",
           "reset_peak_memory", "peak_memory_bytes", "device_name", "total_memory_bytes", "empty_cache",
           "on_new_stream"]

_CUDA = "cuda"


def resolve_device(name: str | torch.device, *, field: str = "device") -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; any other name as torch spells it.

    Args:
        name: The setting's value (a resolved :class:`torch.device` is returned as it is).
        field: The setting's name in the user's config, for the error message (e.g. ``"training.device"``).

    Raises:
        ConfigError: ``cuda`` asked for on a machine without a CUDA device, or a name torch does not know.
    """
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return torch.device(_CUDA if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"{field} {name!r} is not a device torch knows; use 'auto', 'cpu' or 'cuda'") from exc
    if device.type == _CUDA and not torch.cuda.is_available():
        raise ConfigError(f"{field} is {name!r} but no CUDA device is available; use 'auto' or 'cpu'")
    return device


def is_cuda(device: torch.device | str) -> bool:
    """Whether ``device`` is a CUDA device."""
    return torch.device(device).type == _CUDA


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    """The device of one process of a multi-process run: CUDA devices by local rank, anything else as it is."""
    return torch.device(_CUDA, int(local_rank)) if is_cuda(device) else device


def bind_rank(setting: str, local_rank: int) -> bool:
    """Make CUDA device ``local_rank`` the process's current one when ``setting`` resolves to CUDA; return that."""
    if resolve_device(setting, field="device").type != _CUDA:
        return False
    torch.cuda.set_device(int(local_rank))
    return True


def free_memory_bytes(device: torch.device) -> int:
    """Free memory of a CUDA ``device`` in bytes (0 for other devices: ask the host instead)."""
    return int(torch.cuda.mem_get_info(device)[0]) if is_cuda(device) else 0


def synchronize(device: torch.device) -> None:
    """Wait for the queued work of a CUDA ``device`` (timings); nothing for other devices."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window on a CUDA ``device``; nothing for other devices."""
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """Most memory torch held on a CUDA ``device`` since :func:`reset_peak_memory` (None for other devices)."""
    return int(torch.cuda.max_memory_allocated(device)) if is_cuda(device) else None


def device_name(device: torch.device) -> str:
    """The GPU's name for a CUDA ``device`` (e.g. for benchmark tables), else the device type.

    >>> device_name(torch.device("cpu"))
    'cpu'
    """
    return torch.cuda.get_device_name(device) if is_cuda(device) else device.type


def total_memory_bytes(device: torch.device) -> int | None:
    """The memory of a CUDA ``device`` in bytes (None for other devices)."""
    return int(torch.cuda.get_device_properties(device).total_memory) if is_cuda(device) else None


def empty_cache(device: torch.device) -> None:
    """Give torch's cached, unused blocks of a CUDA ``device`` back (between benchmark rows); nothing elsewhere."""
    if is_cuda(device):
        torch.cuda.empty_cache()


@contextlib.contextmanager
def on_new_stream(device: torch.device) -> Iterator[None]:
    """Run the block's work on a new CUDA stream of ``device`` (the thread's current stream for the block) and wait
    for that stream at the end; on other devices the block just runs. For several models trained concurrently from
    threads of one process."""
    if not is_cuda(device):
        yield
        return
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()
