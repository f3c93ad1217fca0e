"""Where tensors run: the one resolver of a ``device`` setting (``auto``, ``cpu``, ``cuda``, ``cuda:1``, ...)."""

from __future__ import annotations

import torch

from training.errors import ConfigError

__all__ = ["resolve_device"]


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
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"{field} {name!r} is not a device torch knows; use 'auto', 'cpu' or 'cuda'") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{field} is {name!r} but no CUDA device is available; use 'auto' or 'cpu'")
    return device
