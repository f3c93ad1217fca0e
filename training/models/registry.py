"""The registry of dp-audit's own architectures: name → factory, one contract for all.

A factory is called as ``factory(num_classes=..., input_shape=(C, H, W), **kwargs)`` and returns a network
with timm's classifier protocol (``forward_features``, ``forward_head(x, pre_logits=...)``,
``get_classifier``, ``reset_classifier``, ``feature_info``). Any timm architecture name and any
``package.module:factory`` import path work as well (see :func:`training.models.build.build_model`).

>>> sorted(MODELS.names())
['fastnet', 'mlp', 'resnet110_cifar', 'resnet20_cifar', 'resnet32_cifar', 'resnet44_cifar', 'resnet56_cifar', 'resnet_cifar', 'small_cnn']
>>> MODELS.register("mlp", lambda **kw: None)
Traceback (most recent call last):
...
ValueError: model name 'mlp' is already registered
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from training.models.cifar_resnet import CIFAR_RESNET_DEPTHS, CifarResNet, blocks_for_depth
from training.models.fastnet import FastNet
from training.models.small import MLP, SmallCNN

__all__ = ["ModelRegistry", "MODELS", "register_model", "ModelFactory", "canonical_arch"]

ModelFactory = Callable[..., nn.Module]


class ModelRegistry:
    """A name → factory map that rejects duplicate and unknown names."""

    def __init__(self) -> None:
        self._factories: dict[str, ModelFactory] = {}

    def register(self, name: str, factory: ModelFactory) -> ModelFactory:
        """Add ``factory`` under ``name``.

        Raises:
            ValueError: if ``name`` is empty, contains ':' (reserved for import paths) or is taken.
        """
        if not name or ":" in name:
            raise ValueError(f"model name must be non-empty and contain no ':', got {name!r}")
        if name in self._factories:
            raise ValueError(f"model name {name!r} is already registered")
        self._factories[name] = factory
        return factory

    def get(self, name: str) -> ModelFactory:
        """The factory registered under ``name``.

        Raises:
            ValueError: for an unknown name (listing the known ones).
        """
        if name not in self._factories:
            raise ValueError(f"unknown model name {name!r}; registered: {', '.join(sorted(self._factories))}")
        return self._factories[name]

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._factories)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def allowed_kwargs(self, name: str) -> list[str]:
        """Keyword arguments the factory accepts besides ``num_classes`` and ``input_shape``."""
        params = inspect.signature(self.get(name)).parameters
        return [p for p in params if p not in ("num_classes", "input_shape")
                and params[p].kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]


MODELS = ModelRegistry()


def register_model(name: str) -> Callable[[ModelFactory], ModelFactory]:
    """Decorator: ``@register_model("my_net")`` adds a factory to :data:`MODELS`."""

    def decorator(factory: ModelFactory) -> ModelFactory:
        return MODELS.register(name, factory)

    return decorator


@register_model("small_cnn")
def _small_cnn(*, num_classes: int, input_shape: tuple[int, int, int], channels: Any = (16, 32, 64),
               act: str = "tanh", norm: str = "group", max_groups: int = 8) -> nn.Module:
    """Tanh CNN with GroupNorm (see :class:`training.models.small.SmallCNN`); works from 8×8 up."""
    return SmallCNN(num_classes=num_classes, channels=tuple(channels), act=act, norm=norm, max_groups=max_groups,
                    in_chans=input_shape[0])


@register_model("mlp")
def _mlp(*, num_classes: int, input_shape: tuple[int, int, int], hidden: Any = (256,),
         act: str = "tanh") -> nn.Module:
    """Flatten → hidden layers → classes (see :class:`training.models.small.MLP`)."""
    return MLP(num_classes=num_classes, input_shape=input_shape, hidden=tuple(hidden), act=act)


@register_model("fastnet")
def _fastnet(*, num_classes: int, input_shape: tuple[int, int, int], widths: Any = (64, 256, 256),
             whiten_kernel: int = 2, logit_scale: float = 1 / 9, whiten_images: int = 5000) -> nn.Module:
    """Whitened fast convnet of airbench's class (see :class:`training.models.fastnet.FastNet`)."""
    return FastNet(num_classes=num_classes, widths=tuple(widths), whiten_kernel=whiten_kernel,
                   logit_scale=logit_scale, whiten_images=whiten_images, in_chans=input_shape[0])


def _cifar_resnet_factory(name_depth: int | None) -> ModelFactory:
    name = "resnet_cifar" if name_depth is None else f"resnet{name_depth}_cifar"

    def factory(*, num_classes: int, input_shape: tuple[int, int, int], widths: Any = (16, 32, 64),
                depth: int | None = None, blocks_per_stage: int | None = None) -> nn.Module:
        if depth is None and blocks_per_stage is None:
            depth = name_depth          # the name's depth; blocks_per_stage alone overrides it (older configs)
        if depth is None and blocks_per_stage is None:
            raise ValueError(f"{name} needs its depth: kwargs {{\"depth\": 6n + 2}}, e.g. {{\"depth\": 110}}, or use "
                             f"{', '.join(f'resnet{d}_cifar' for d in CIFAR_RESNET_DEPTHS)}")
        if depth is not None and name_depth is not None and depth != name_depth:
            raise ValueError(f"{name} is the {name_depth}-layer network but depth={depth} was given: use "
                             f"arch resnet{depth}_cifar (or resnet_cifar with depth {depth})")
        n = blocks_for_depth(depth) if depth is not None else int(blocks_per_stage)
        if depth is not None and blocks_per_stage is not None and blocks_per_stage != n:
            raise ValueError(f"depth={depth} means blocks_per_stage={n}, but blocks_per_stage={blocks_per_stage} "
                             f"was given: give one of them")
        return CifarResNet(n, num_classes=num_classes, widths=tuple(widths), in_chans=input_shape[0])

    factory.__name__ = f"_{name}"
    factory.__doc__ = (f"He et al. (2016) §4.2 CIFAR ResNet{'' if name_depth is None else f'-{name_depth}'} with "
                       f"option-A shortcuts (BatchNorm; DP fix applied by the builder); ``depth = 6n + 2``.")
    return factory


for _depth in CIFAR_RESNET_DEPTHS:
    MODELS.register(f"resnet{_depth}_cifar", _cifar_resnet_factory(_depth))
MODELS.register("resnet_cifar", _cifar_resnet_factory(None))


def canonical_arch(arch: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The name that says which network ``arch`` with ``kwargs`` builds (for manifests).

    A CIFAR ResNet given by ``depth`` or ``blocks_per_stage`` is named by its real depth: ``resnet56_cifar``
    (kwargs without depth / blocks_per_stage) for a depth He et al. report, else ``resnet_cifar`` with ``depth``.
    Anything else is returned unchanged.

    >>> canonical_arch("resnet20_cifar", {"blocks_per_stage": 9})
    ('resnet56_cifar', {})
    >>> canonical_arch("resnet_cifar", {"depth": 8, "widths": [8, 16, 32]})
    ('resnet_cifar', {'widths': [8, 16, 32], 'depth': 8})
    """
    if arch not in MODELS or not (arch == "resnet_cifar" or (arch.startswith("resnet") and arch.endswith("_cifar"))):
        return arch, dict(kwargs)
    rest = {k: v for k, v in kwargs.items() if k not in ("depth", "blocks_per_stage")}
    if "depth" in kwargs:
        depth = int(kwargs["depth"])
    elif "blocks_per_stage" in kwargs:
        depth = 6 * int(kwargs["blocks_per_stage"]) + 2
    else:
        return arch, dict(kwargs)
    if depth in CIFAR_RESNET_DEPTHS:
        return f"resnet{depth}_cifar", rest
    return "resnet_cifar", {**rest, "depth": depth}
