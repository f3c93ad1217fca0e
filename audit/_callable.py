"""Make a module callable: ``audit.epsilon``, ``audit.report`` and ``audit.gate`` are packages/modules *and* the
public functions of :mod:`audit.api` with those names (``audit.epsilon(run)``; ``audit.epsilon.runner`` stays the
module). Python lets a module choose its class (``module.__class__``); the call is forwarded to the function."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["make_callable"]


class _CallableModule(types.ModuleType):
    _api_function = ""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module("audit.api"), self._api_function)(*args, **kwargs)


def make_callable(module_name: str, function: str) -> None:
    """Let ``sys.modules[module_name](...)`` call ``audit.api.<function>(...)``."""
    cls = type(f"CallableModule_{function}", (_CallableModule,), {"_api_function": function,
                                                                   "__doc__": _CallableModule.__doc__})
    sys.modules[module_name].__class__ = cls
