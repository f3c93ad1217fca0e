"""Make a network trainable with DP-SGD and say what stands in the way.

DP-SGD (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016) clips each example's gradient,
so every trainable parameter needs a per-example gradient and no layer may mix examples in a batch.
BatchNorm does (its batch statistics), so :func:`replace_batchnorm` swaps it for GroupNorm (Wu & He,
"Group Normalization", ECCV 2018), which normalises each example on its own. :func:`dp_issues` lists what
Opacus would reject or handle only slowly; :func:`apply_freeze` freezes parameters by glob.

>>> from torch import nn
>>> net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16))
>>> replace_batchnorm(net, prefix="net")
['BatchNorm2d(16) -> GroupNorm(16, 16) at net.1 (DP-incompatible batch statistics)']
>>> type(net[1]).__name__, net[1].num_groups
('GroupNorm', 16)
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Sequence

import torch
from opacus.grad_sample import GradSampleModule
from opacus.validators import ModuleValidator
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from foundation.errors import ConfigError
from training.models.small import group_count

__all__ = ["replace_batchnorm", "dp_issues", "apply_freeze", "batchnorm_layers", "frozen_parameters",
           "freeze_functorch_unsafe", "opacus_inexact_layers"]


def _join(prefix: str, name: str) -> str:
    return ".".join(p for p in (prefix, name) if p)


def batchnorm_layers(module: nn.Module) -> list[str]:
    """Names of all BatchNorm layers (any subclass, e.g. timm's ``BatchNormAct2d``) in ``module``."""
    return [name for name, m in module.named_modules() if isinstance(m, _BatchNorm)]


def _group_norm_for(bn: _BatchNorm) -> nn.GroupNorm:
    """A GroupNorm (or timm GroupNormAct for a BatchNormAct2d) with the BatchNorm's affine weights."""
    c = bn.num_features
    groups = group_count(c, 32)
    weight = bn.weight if bn.affine else None
    dd = {"device": weight.device, "dtype": weight.dtype} if weight is not None else {}
    try:
        from timm.layers.norm_act import BatchNormAct2d, GroupNormAct
    except ImportError:  # pragma: no cover - timm is a dependency
        BatchNormAct2d = GroupNormAct = None
    if BatchNormAct2d is not None and isinstance(bn, BatchNormAct2d):
        gn: nn.GroupNorm = GroupNormAct(c, groups, eps=bn.eps, affine=bn.affine, apply_act=False, **dd)
        gn.act, gn.drop = bn.act, bn.drop  # keep the fused activation and dropout
    else:
        gn = nn.GroupNorm(groups, c, eps=bn.eps, affine=bn.affine, **dd)
    if bn.affine:
        with torch.no_grad():
            gn.weight.copy_(bn.weight)
            gn.bias.copy_(bn.bias)
        gn.weight.requires_grad_(bn.weight.requires_grad)
        gn.bias.requires_grad_(bn.bias.requires_grad)
    gn.train(bn.training)
    return gn


def replace_batchnorm(module: nn.Module, *, prefix: str = "") -> list[str]:
    """Replace every BatchNorm in ``module`` (in place) by GroupNorm with min(32, C)-or-fewer groups dividing C.

    The number of groups is the largest divisor of the channel count C that is at most 32 (Wu & He's default
    of 32 groups where C allows it). Affine weight and bias carry over; running statistics are dropped, so a
    pretrained network computes a different function afterwards.

    Args:
        module: the network, changed in place.
        prefix: prepended to layer names in the notes (e.g. ``"net"`` for the wrapped network).

    Returns:
        One note per replaced layer, e.g.
        ``"BatchNorm2d(16) -> GroupNorm(16, 16) at net.bn1 (DP-incompatible batch statistics)"``.

    Raises:
        ValueError: if ``module`` itself is a BatchNorm (there is no parent to replace it in).
    """
    if isinstance(module, _BatchNorm):
        raise ValueError("module must contain BatchNorm layers, not be one; wrap it in a container first")
    notes = []
    for name in batchnorm_layers(module):
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name)
        bn = getattr(parent, child)
        gn = _group_norm_for(bn)
        setattr(parent, child, gn)
        notes.append(f"{type(bn).__name__}({bn.num_features}) -> {type(gn).__name__}({gn.num_groups}, "
                     f"{gn.num_channels}) at {_join(prefix, name)} (DP-incompatible batch statistics)")
    return notes


def _single_input_forward(m: nn.Module) -> bool:
    try:
        params = list(inspect.signature(type(m).forward).parameters.values())[1:]  # drop self
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                   inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _stochastic(m: nn.Module) -> bool:
    return any(float(getattr(c, "p", 0.0) or 0.0) > 0 or float(getattr(c, "drop_prob", 0.0) or 0.0) > 0
               for c in m.modules() if "drop" in type(c).__name__.lower())


def freeze_functorch_unsafe(net: nn.Module, *, root_is_called: bool, prefix: str = "net") -> list[str]:
    """Freeze parameters whose per-sample gradients Opacus would get wrong or could not get at all.

    Opacus hands every module that owns trainable parameters but has no registered grad sampler (e.g. timm's
    ConvNeXt block with its layer-scale ``gamma``) to functorch, which re-runs the module's ``forward`` per
    example on the *first positional input only* (``opacus/grad_sample/functorch.py``). That is exact for a
    deterministic single-input forward. It is silently wrong when the forward takes more inputs (e.g. timm's
    rotary-embedding ``EvaBlock(x, rope=...)``), or draws dropout/drop-path masks (the re-run draws new ones),
    and it never happens for the root ``net`` when the wrapper calls its methods instead of ``net(x)``.
    Such modules' own parameters are frozen here (their children are unaffected and get hooks as usual).

    Args:
        net: the network, changed in place.
        root_is_called: whether the wrapper calls ``net(x)`` (hook-adapter networks) rather than its methods.
        prefix: prepended to names in the notes.

    Returns:
        One note per module whose parameters were frozen, with the reason.
    """
    notes = []
    for name, m in net.named_modules():
        own = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
        if not own or type(m) in GradSampleModule.GRAD_SAMPLERS:
            continue
        if m is net and not root_is_called:
            reason = "the wrapper calls its methods, never the module itself, so no hook sees them"
        elif not _single_input_forward(m):
            reason = "its forward takes more than one input; Opacus's functorch re-run sees only the first"
        elif _stochastic(m):
            reason = "it contains dropout/drop-path, and Opacus's functorch re-run would draw new masks"
        else:
            continue
        for n in own:
            getattr(m, n).requires_grad_(False)
        names = ", ".join(_join(_join(prefix, name), n) for n in own)
        notes.append(f"{names} ({type(m).__name__}) frozen: {reason} (no exact per-sample gradients)")
    return notes


def opacus_inexact_layers(module: nn.Module) -> list[str]:
    """Trainable layers whose per-sample gradient Opacus's own grad samplers (``hooks``, and the norms of ghost
    clipping) get wrong, as ``"name (why)"``.

    Checked against a batch-size-1 loop with Opacus 1.6: a Conv2d whose ``padding_mode`` is not ``zeros``
    (reflect, replicate, circular: the sampler unfolds the input with zero padding) and an Embedding with a
    ``padding_idx`` (the sampler gives the padding row a gradient that autograd does not). ``functorch`` (autograd
    of the real layer) and ``bk`` are exact for both.

    >>> from torch import nn
    >>> opacus_inexact_layers(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), nn.Conv2d(4, 4, 1),
    ...                                     nn.Embedding(5, 2, padding_idx=0)))
    ["0 (Conv2d padding_mode='reflect')", '2 (Embedding padding_idx=0)']
    """
    out = []
    for name, m in module.named_modules():
        if not any(p.requires_grad for p in m.parameters(recurse=False)):
            continue
        if isinstance(m, nn.modules.conv._ConvNd) and m.padding_mode != "zeros" and m.weight.requires_grad:
            out.append(f"{name} ({type(m).__name__} padding_mode={m.padding_mode!r})")
        elif isinstance(m, nn.Embedding) and m.padding_idx is not None and m.weight.requires_grad:
            out.append(f"{name} (Embedding padding_idx={m.padding_idx})")
    return out


def _first_sentence(text: str) -> str:
    text = " ".join(str(text).split())
    return text.split(". ")[0].rstrip(".")


def dp_issues(module: nn.Module) -> list[str]:
    """What stands between ``module`` and exact per-example gradients with Opacus, one line each.

    Reports (a) Opacus ``ModuleValidator.validate`` errors (run in training mode, grouped by message),
    (b) BatchNorm layers, trainable or not (in training mode their running statistics are computed from
    private batches), (c) trainable modules that hold buffers (Opacus's ``GradSampleModule`` refuses them in
    strict mode) and (d) modules with their own trainable parameters *and* children, which Opacus hands whole to
    functorch (exact once :func:`freeze_functorch_unsafe` has run, but no per-layer hooks below them: slower,
    more memory).

    Args:
        module: the network (its training mode is restored afterwards).

    Returns:
        A list of one-line notes; empty when Opacus can handle every trainable parameter with its fast path.
    """
    notes: list[str] = []
    was_training = module.training
    module.train()
    try:
        errors = ModuleValidator.validate(module, strict=False)
    finally:
        module.train(was_training)
    counts: dict[str, int] = {}
    for err in errors:
        key = f"{type(err).__name__}: {_first_sentence(err)}"
        counts[key] = counts.get(key, 0) + 1
    notes += [f"opacus ModuleValidator: {key} (x{n})" for key, n in counts.items()]
    bns = batchnorm_layers(module)
    if bns:
        notes.append(f"{len(bns)} BatchNorm layer(s) remain ({', '.join(bns[:3])}{', ...' if len(bns) > 3 else ''}):"
                     f" not DP in training mode; set model.fix_batchnorm=true")
    buffered = [name for name, m in module.named_modules()
                if any(p.requires_grad for p in m.parameters(recurse=False)) and any(True for _ in m.buffers())]
    if buffered:
        notes.append(f"trainable module(s) with buffers, refused by Opacus GradSampleModule(strict=True): "
                     f"{', '.join(buffered[:3])}{', ...' if len(buffered) > 3 else ''}")
    whole: dict[str, list[str]] = {}
    for name, m in module.named_modules():
        own = [n for n, p in m.named_parameters(recurse=False) if p.requires_grad]
        has_param_children = any(True for c in m.children() for _ in c.parameters())
        if own and has_param_children and type(m) not in GradSampleModule.GRAD_SAMPLERS:
            whole.setdefault(f"{type(m).__name__} (own {', '.join(own)})", []).append(name or "<root>")
    for kind, names in whole.items():
        notes.append(f"{len(names)} {kind} module(s) ({', '.join(names[:2])}{', ...' if len(names) > 2 else ''}) "
                     f"own trainable parameters and have children: Opacus computes their per-sample gradients "
                     f"with functorch over the whole submodule (exact for this single-input deterministic "
                     f"forward; slower, more memory)")
    return notes


def frozen_parameters(module: nn.Module) -> list[str]:
    """Names of the parameters of ``module`` with ``requires_grad=False``, in ``named_parameters`` order."""
    return [n for n, p in module.named_parameters() if not p.requires_grad]


def apply_freeze(module: nn.Module, patterns: Sequence[str]) -> list[str]:
    """Freeze (``requires_grad=False``) every parameter whose name matches one of the ``fnmatch`` globs.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    >>> apply_freeze(m, ["0.*"])
    ['0.weight', '0.bias']

    Args:
        module: the module whose ``named_parameters`` the patterns are matched against.
        patterns: glob patterns such as ``"net.patch_embed.*"``.

    Returns:
        The names of the parameters this call froze.

    Raises:
        ConfigError: if a pattern matches no parameter (usually a typo).
    """
    names = [n for n, _ in module.named_parameters()]
    frozen = []
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            example = names[0] if names else "<none>"
            raise ConfigError(f"model.freeze pattern {pattern!r} matches no parameter; names look like "
                              f"{example!r} (glob syntax, e.g. 'net.blocks.0.*')")
        frozen += [h for h in hits if h not in frozen]
    params = dict(module.named_parameters())
    for name in frozen:
        params[name].requires_grad_(False)
    return frozen
