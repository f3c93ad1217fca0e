"""Split a nested state (dicts, lists, tensors, numbers) into safetensors-ready tensors plus a JSON tree.

Resumable training state (optimizer moments, generator state, step counter) must be saved without pickle:
:func:`split_state` moves every tensor into a flat ``{key: tensor}`` map (for ``save_safetensors``) and leaves
a JSON-serialisable skeleton (for ``write_json``); :func:`join_state` is its exact inverse.

>>> import torch
>>> state = {"step": 3, "opt": {"state": {0: {"m": torch.ones(2)}}, "param_groups": [{"betas": (0.9, 0.99)}]}}
>>> tensors, meta = split_state(state)
>>> sorted(tensors)
['opt.state.0.m']
>>> back = join_state(tensors, meta)
>>> back["opt"]["state"][0]["m"].tolist(), back["opt"]["param_groups"][0]["betas"], back["step"]
([1.0, 1.0], (0.9, 0.99), 3)
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["split_state", "join_state"]


def split_state(state: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """Return ``(tensors, skeleton)``: contiguous CPU copies of every tensor, and a JSON-able skeleton.

    Args:
        state: nested dicts (str or int keys), lists, tuples, tensors, numbers, strings, bools and None.

    Returns:
        ``tensors`` keyed by dotted paths, and the skeleton referencing them.

    Raises:
        TypeError: for an unsupported leaf type (the message names its path).
    """
    tensors: dict[str, torch.Tensor] = {}

    def enc(obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            tensors[path] = obj.detach().cpu().clone().contiguous()
            return {"__tensor__": path}
        if isinstance(obj, dict):
            for k in obj:
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise TypeError(f"state key at {path or '(root)'} must be str or int, got {type(k).__name__}")
            return {"__dict__": [[k, enc(v, f"{path}.{k}" if path else str(k))] for k, v in obj.items()]}
        if isinstance(obj, tuple):
            return {"__tuple__": [enc(v, f"{path}.{i}") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [enc(v, f"{path}.{i}") for i, v in enumerate(obj)]
        if isinstance(obj, float) and not math.isfinite(obj):
            return {"__float__": repr(obj)}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        raise TypeError(f"state value at {path or '(root)'} has unsupported type {type(obj).__name__}")

    return tensors, enc(state, "")


def join_state(tensors: dict[str, torch.Tensor], skeleton: Any) -> Any:
    """Rebuild the state that :func:`split_state` split.

    Raises:
        KeyError: if the skeleton references a tensor that ``tensors`` lacks.
    """

    def dec(obj: Any) -> Any:
        if isinstance(obj, dict):
            if "__tensor__" in obj:
                return tensors[obj["__tensor__"]]
            if "__dict__" in obj:
                return {k: dec(v) for k, v in obj["__dict__"]}
            if "__tuple__" in obj:
                return tuple(dec(v) for v in obj["__tuple__"])
            if "__float__" in obj:
                return float(obj["__float__"])
            raise ValueError(f"malformed state skeleton node with keys {sorted(obj)}")
        if isinstance(obj, list):
            return [dec(v) for v in obj]
        return obj

    return dec(skeleton)
