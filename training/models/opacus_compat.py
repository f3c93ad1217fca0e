"""Make a network safe for Opacus's per-sample-gradient hooks, without changing what it computes.

Two things silently break or crash Opacus's hook-based per-sample gradients (``hooks``, ``functorch`` and
``ghost`` modes), and both are common in ImageNet architectures:

1. **Non-contiguous convolution inputs.** Opacus's ``Conv2d``/``Conv3d`` grad sampler unfolds the stored
   input with ``as_strided`` assuming contiguous NCHW memory (``opacus/utils/tensor_utils.py``,
   ``unfold2d``). A permuted or channels-last input (e.g. ConvNeXt's downsampling convolution after a
   ``LayerNorm2d`` that permutes) gives *wrong* per-sample gradients with no error; clipping and the DP
   guarantee then rest on wrong norms. :func:`contiguous_conv_inputs` adds a forward pre-hook to every
   ``Conv2d``/``Conv3d`` that makes its input contiguous (a no-op when it already is).

2. **In-place updates of a hooked layer's output.** Opacus records per-sample gradients with full backward
   hooks (``register_full_backward_hook``). PyTorch wraps the output of a hooked module in a view made by a
   custom autograd Function, and modifying that view in place is forbidden ("Output 0 of
   BackwardHookFunction is a view and is being modified inplace"). ImageNet CNNs do exactly that:
   ``ReLU(inplace=True)`` after a normalisation layer, and ``x += shortcut`` at the end of a residual block
   (timm's ResNet ``BasicBlock``/``Bottleneck``, and many more).

:func:`make_out_of_place` removes them, in place:

* modules with an ``inplace`` flag (``nn.ReLU``, timm activations, dropout) get ``inplace=False``;
* custom modules whose ``forward`` source contains an in-place update are traced with ``torch.fx`` and their
  in-place operations (``x += y``, ``x.add_(y)``, ``F.relu(x, inplace=True)``) replaced by the out-of-place
  ones, when the mutated tensor is not read again afterwards (so no other code could see the difference).
  The traced module keeps its submodules under the same names, so parameter names do not change.

>>> import torch
>>> from torch import nn
>>> class Block(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.lin = nn.Linear(4, 4)
...     def forward(self, x):
...         y = self.lin(x)
...         y += x
...         return torch.relu_(y)
>>> net = nn.Sequential(Block(), nn.ReLU(inplace=True))
>>> x = torch.randn(2, 4)
>>> before = net(x)
>>> print(make_out_of_place(net)[0].split(" (Opacus")[0])
1 activation/dropout module(s) set to inplace=False; 1 module(s) (Block) rewritten without in-place ops
>>> torch.equal(before, net(x))
True
"""

from __future__ import annotations

import inspect
import operator
import re

import torch
from torch import fx, nn

__all__ = ["make_out_of_place", "contiguous_conv_inputs", "make_opacus_safe"]

_INPLACE_SOURCE = re.compile(r"(\+=|-=|\*=|/=|\.[a-z][a-z0-9]*_\(|inplace=True|torch\.[a-z]+_\()")
_MODE_DEPENDENT = re.compile(r"\btraining\b|is_scripting|is_tracing|is_compiling")
_AUGMENTED = re.compile(r"(\+=|-=|\*=|/=)")  # fx records ``x += y`` on a proxy as ``x + y``
_AUG_OPS = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
            operator.itruediv: operator.truediv}


def _forward_source(m: nn.Module) -> str:
    if type(m).__module__.startswith("torch."):
        return ""
    try:
        return inspect.getsource(type(m).forward)
    except (OSError, TypeError):
        return ""


class _ShallowTracer(fx.Tracer):
    """Trace only the root's own forward: every submodule stays a call to that submodule (names preserved)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def _out_of_place_target(node: fx.Node) -> object | None:
    """The out-of-place replacement for an in-place node, or None if the node is not in-place."""
    if node.op == "call_function" and node.target in _AUG_OPS:
        # augmented assignment on a tensor; Python numbers never reach the graph as nodes
        return _AUG_OPS[node.target]
    if node.op == "call_method" and isinstance(node.target, str) and node.target.endswith("_") \
            and not node.target.startswith("_") and hasattr(torch.Tensor, node.target[:-1]):
        return node.target[:-1]
    if node.op == "call_function" and getattr(node.target, "__name__", "").endswith("_") \
            and hasattr(torch, node.target.__name__[:-1]) and getattr(torch, node.target.__name__, None) is node.target:
        return getattr(torch, node.target.__name__[:-1])
    if node.op in ("call_function", "call_method") and node.kwargs.get("inplace") is True:
        return "inplace-kwarg"
    return None


def _mutated_read_later(node: fx.Node, order: dict[fx.Node, int]) -> bool:
    target = node.args[0] if node.args else None
    if not isinstance(target, fx.Node):
        return True
    return any(order[u] > order[node] for u in target.users if u is not node)


def _rewrite(m: nn.Module, src: str) -> tuple[nn.Module | None, bool]:
    """(``fx.GraphModule`` computing ``m`` without in-place ops or None, whether ``m`` had to be left unsafe)."""
    if _MODE_DEPENDENT.search(src):  # tracing would freeze a train/eval branch: leave it alone
        return None, True
    try:
        graph = _ShallowTracer().trace(m)
    except Exception:  # data-dependent control flow etc.: leave the module alone
        return None, True
    order = {n: i for i, n in enumerate(graph.nodes)}
    changes = []
    for node in graph.nodes:
        new = _out_of_place_target(node)
        if new is None:
            continue
        if _mutated_read_later(node, order):
            return None, True
        changes.append((node, new))
    if not changes and not _AUGMENTED.search(src):
        return None, False  # nothing in-place survived tracing (e.g. an ``inplace`` flag now False)
    for node, new in changes:
        if new == "inplace-kwarg":
            node.kwargs = {**node.kwargs, "inplace": False}
        else:
            node.target = new
    graph.lint()
    gm = fx.GraphModule(m, graph, class_name=type(m).__name__)
    gm.train(m.training)
    return gm, False


def make_out_of_place(net: nn.Module) -> list[str]:
    """Make every module of ``net`` compute out-of-place (see the module docstring); changes ``net`` in place.

    Args:
        net: the network. Its top-level module is never replaced (only its descendants).

    Returns:
        A note (empty list when nothing changed).
    """
    flags = 0
    for m in net.modules():
        if isinstance(getattr(m, "inplace", None), bool) and m.inplace:
            m.inplace = False
            flags += 1
    rewritten: dict[str, int] = {}
    unsafe: list[str] = []
    for name, m in list(net.named_modules()):
        src = _forward_source(m) if name else ""
        if not _INPLACE_SOURCE.search(src):
            continue
        gm, left_unsafe = _rewrite(m, src)
        if left_unsafe:
            unsafe.append(name)
        if gm is None:
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(net.get_submodule(parent_name), child, gm)
        rewritten[type(m).__name__] = rewritten.get(type(m).__name__, 0) + 1
    notes = []
    parts = []
    if flags:
        parts.append(f"{flags} activation/dropout module(s) set to inplace=False")
    if rewritten:
        parts.append(f"{sum(rewritten.values())} module(s) ({', '.join(sorted(rewritten))}) rewritten without "
                     f"in-place ops")
    if parts:
        notes.append("; ".join(parts) + " (Opacus backward hooks forbid in-place updates of a hooked layer output)")
    if unsafe:
        notes.append(f"{len(unsafe)} module(s) may update tensors in place and could not be rewritten "
                     f"({', '.join(unsafe[:3])}{', ...' if len(unsafe) > 3 else ''}); if Opacus reports "
                     f"'BackwardHookFunction is a view ... modified inplace', choose another architecture")
    return notes


def _contiguous_inputs(_module: nn.Module, args: tuple) -> tuple:
    return tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)


def contiguous_conv_inputs(net: nn.Module) -> list[str]:
    """Give every ``Conv2d``/``Conv3d`` in ``net`` a forward pre-hook making its input contiguous (once).

    >>> from torch import nn
    >>> contiguous_conv_inputs(nn.Sequential(nn.Conv2d(3, 4, 2, stride=2)))
    ['1 Conv2d/Conv3d layer(s) get contiguous inputs (Opacus conv grad sampler assumes contiguous NCHW)']

    Returns:
        A note (empty when there are no such layers).
    """
    count = 0
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Conv3d)) and not getattr(m, "_dp_audit_contiguous", False):
            m.register_forward_pre_hook(_contiguous_inputs)
            m._dp_audit_contiguous = True
            count += 1
    if not count:
        return []
    return [f"{count} Conv2d/Conv3d layer(s) get contiguous inputs (Opacus conv grad sampler assumes contiguous NCHW)"]


def make_opacus_safe(net: nn.Module) -> list[str]:
    """:func:`make_out_of_place`, then :func:`contiguous_conv_inputs`; returns their notes."""
    return make_out_of_place(net) + contiguous_conv_inputs(net)
