"""The registry of dp-audit's own architectures: name → factory, one contract for all.

A factory is called as ``factory(num_classes=..., input_shape=(C, H, W), **kwargs)`` and returns a network
with timm's classifier protocol (``forward_features``, ``forward_head(x, pre_logits=...)``,
``get_classifier``, ``reset_classifier``, ``feature_info``). Any timm architecture name and any
``package.module:factory`` import path work as well (see :func:`training.models.build.build_model`).

>>> sorted(MODELS.names())
['mlp', 'resnet20_cifar', 'small_cnn']
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

from training.models.cifar_resnet import CifarResNet
from training.models.small import MLP, SmallCNN

__all__ = ["ModelRegistry", "MODELS", "register_model", "ModelFactory"]

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


@register_model("resnet20_cifar")
def _resnet20_cifar(*, num_classes: int, input_shape: tuple[int, int, int],
                    widths: Any = (16, 32, 64), blocks_per_stage: int = 3) -> nn.Module:
    """He et al. (2016) §4.2 CIFAR ResNet-20 with option-A shortcuts (BatchNorm; DP fix applied by the builder)."""
    return CifarResNet(blocks_per_stage, num_classes=num_classes, widths=tuple(widths), in_chans=input_shape[0])
