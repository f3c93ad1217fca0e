"""Read weights files safely and load them into networks strictly.

``.safetensors`` files are read with :func:`foundation.io.load_safetensors`; ``.pt``/``.pth``/``.th``/``.bin``
files with ``torch.load(..., weights_only=True)``, which refuses arbitrary pickled objects. Wrappers such as
``{"state_dict": ...}`` (e.g. the public CIFAR ResNet-20 checkpoints) or ``{"model": ...}`` are unwrapped and
the ``module.`` prefix that DataParallel adds is removed.

>>> import tempfile, torch, os
>>> path = os.path.join(tempfile.mkdtemp(), "w.pt")
>>> torch.save({"state_dict": {"module.fc.weight": torch.ones(2, 2)}}, path)
>>> list(load_weights_file(path))
['fc.weight']
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from foundation.errors import CheckpointError
from foundation.io import load_safetensors

__all__ = ["load_weights_file", "strip_prefix", "key_mismatch", "load_state_strict", "TORCH_SUFFIXES"]

TORCH_SUFFIXES = (".pt", ".pth", ".th", ".bin")
_WRAPPER_KEYS = ("state_dict", "model", "model_state_dict")
_PREFIXES = ("module.", "_orig_mod.")  # DataParallel/DDP and torch.compile


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Remove ``prefix`` from the keys when *every* key starts with it; otherwise return a plain copy.

    >>> list(strip_prefix({"net.a": 1, "net.b": 2}, "net."))
    ['a', 'b']
    """
    if state and all(k.startswith(prefix) for k in state):
        return {k[len(prefix):]: v for k, v in state.items()}
    return dict(state)


_TORCH_BOILERPLATE = ("Weights only load failed", "Check the documentation", "Please file an issue")


def _torch_load_reason(exc: Exception) -> str:
    """What ``torch.load(weights_only=True)`` refused, without torch's advice to unpickle the file anyway."""
    text = str(exc).split("WeightsUnpickler error:")[-1]
    parts = [" ".join(p.split()) for p in text.split("\n\n")]
    parts = [p for p in parts if p and not p.startswith(_TORCH_BOILERPLATE)]
    return (parts[0].split(" Please use")[0] if parts else type(exc).__name__)[:160]


def load_weights_file(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Load a name → tensor map from a weights file, on CPU, without unpickling arbitrary objects.

    Args:
        path: a ``.safetensors`` file, or a ``.pt``/``.pth``/``.th``/``.bin`` file saved with ``torch.save``.

    Returns:
        The state dict, unwrapped from ``{"state_dict": ...}``/``{"model": ...}`` and with ``module.``
        (and ``_orig_mod.``) prefixes removed.

    Raises:
        CheckpointError: if the file is missing, has an unknown suffix, is corrupt, needs unsafe unpickling,
            or does not hold a name → tensor map.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        obj: object = load_safetensors(path)
    elif suffix in TORCH_SUFFIXES:
        try:
            with warnings.catch_warnings():  # torch warns about pickle protocols before refusing a file
                warnings.simplefilter("ignore")
                obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for bad files
            raise CheckpointError(f"weights file {path} is corrupt, or holds pickled objects besides tensors, which "
                                  f"dp-audit never unpickles ({_torch_load_reason(exc)}); re-save it as a state dict "
                                  f"or .safetensors") from None
    else:
        raise CheckpointError(f"weights file {path} has unsupported suffix {suffix!r}; use .safetensors or "
                              f"one of {', '.join(TORCH_SUFFIXES)}")
    for _ in range(3):  # {"state_dict": {"model": ...}} and similar nestings
        if isinstance(obj, Mapping):
            inner = next((obj[k] for k in _WRAPPER_KEYS if isinstance(obj.get(k), Mapping)), None)
            if inner is not None:
                obj = inner
                continue
        break
    if not isinstance(obj, Mapping) or not obj:
        raise CheckpointError(f"weights file {path} does not hold a state dict (got {type(obj).__name__})")
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"weights file {path} holds {len(bad)} non-tensor entries (first: {bad[0]!r}); "
                              f"expected a name -> tensor state dict")
    state = dict(obj)
    for prefix in _PREFIXES:
        state = strip_prefix(state, prefix)
    return state


def _expected_keys(net: nn.Module) -> set[str]:
    # BatchNorm's num_batches_tracked is optional in old checkpoints; torch fills it in on load.
    return {k for k in net.state_dict() if not k.endswith("num_batches_tracked")}


def key_mismatch(net: nn.Module, state: Mapping[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """(missing, unexpected) keys of ``state`` against ``net.state_dict()``, ignoring ``num_batches_tracked``."""
    expected = _expected_keys(net)
    given = {k for k in state if not k.endswith("num_batches_tracked")}
    return sorted(expected - given), sorted(given - expected)


def _few(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (", ..." if len(keys) > n else "")


def load_state_strict(net: nn.Module, state: Mapping[str, torch.Tensor], *, source: str,
                      head_prefix: str | None = None, hint: str = "") -> list[str]:
    """Load ``state`` into ``net`` with exact keys and shapes; only the classifier may differ in shape.

    When the tensors under ``head_prefix`` (the classifier's name inside ``net``) have other shapes than the
    network's (a checkpoint for another number of classes), they are skipped and the freshly initialised
    classifier is kept; the returned note says so. Any other difference is an error.

    Args:
        net: the network, changed in place.
        state: name → tensor map with the network's own parameter names.
        source: what to call the weights in messages (usually the file path).
        head_prefix: the classifier's module name in ``net`` (e.g. ``"head"``), or None.
        hint: appended to error messages (how to fix a mismatch).

    Returns:
        Notes about what was loaded.

    Raises:
        CheckpointError: on missing or unexpected keys, or shape mismatches outside the classifier.
    """
    missing, unexpected = key_mismatch(net, state)
    if missing or unexpected:
        raise CheckpointError(f"weights {source} do not match the model: {len(missing)} missing key(s)"
                              f"{' (' + _few(missing) + ')' if missing else ''}, {len(unexpected)} unexpected "
                              f"key(s){' (' + _few(unexpected) + ')' if unexpected else ''}{hint}")
    own = net.state_dict()
    wrong = [k for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    head = [k for k in wrong if head_prefix and k.startswith(head_prefix + ".")]
    other = [k for k in wrong if k not in head]
    if other:
        k = other[0]
        raise CheckpointError(f"weights {source} do not match the model: {len(other)} tensor(s) of the wrong "
                              f"shape (first: {k} is {tuple(state[k].shape)}, model has {tuple(own[k].shape)})"
                              f"{hint}")
    kept = {k: v for k, v in state.items() if k not in head}
    result = net.load_state_dict(kept, strict=False)
    left = [k for k in result.missing_keys if not k.endswith("num_batches_tracked") and k not in head]
    if left or result.unexpected_keys:  # cannot happen after the key check; guard against torch changes
        raise CheckpointError(f"weights {source} did not load cleanly: missing {_few(left)}, "
                              f"unexpected {_few(result.unexpected_keys)}")
    notes = [f"loaded {len(kept)} tensors from {source}"]
    if head:
        k = head[0]
        notes.append(f"classifier {head_prefix} not loaded from {source} ({k} is {tuple(state[k].shape)}, model "
                     f"has {tuple(own[k].shape)}): freshly initialised for this number of classes")
    return notes
