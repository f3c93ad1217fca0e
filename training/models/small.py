"""Small, fast networks for tests, digits (8×8) and quick CIFAR-sized (32×32) runs.

``SmallCNN`` is the kind of network used throughout the DP-SGD literature for small images: a few 3×3
convolutions with tanh activations, which train better than ReLU under DP-SGD (Papernot, Thakurta, Song,
Chien, Erlingsson, "Tempered Sigmoid Activations for Deep Learning with Differential Privacy", AAAI 2021),
optionally GroupNorm (never BatchNorm: its batch statistics are not DP), global average pooling and a
linear layer. ``MLP`` flattens the image. Both follow timm's classifier protocol (``forward_features``,
``forward_head(x, pre_logits=...)``, ``get_classifier``, ``reset_classifier``, ``feature_info``).

>>> import torch
>>> SmallCNN(num_classes=10)(torch.zeros(2, 3, 8, 8)).shape
torch.Size([2, 10])
>>> MLP(num_classes=3, input_shape=(3, 8, 8))(torch.zeros(2, 3, 8, 8)).shape
torch.Size([2, 3])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from training.models.head import LinearHeadMixin

__all__ = ["SmallCNN", "MLP", "ACTIVATIONS", "group_count"]

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


def group_count(channels: int, max_groups: int = 32) -> int:
    """The largest number of GroupNorm groups that divides ``channels`` and is at most ``max_groups``.

    >>> group_count(16), group_count(48), group_count(64), group_count(3)
    (16, 24, 32, 3)
    """
    if channels < 1 or max_groups < 1:
        raise ValueError(f"channels and max_groups must be >= 1, got {channels} and {max_groups}")
    return max(g for g in range(1, min(channels, max_groups) + 1) if channels % g == 0)


def _activation(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"act must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]()


class SmallCNN(LinearHeadMixin, nn.Module):
    """Conv3×3 blocks (the first at stride 1, the rest at stride 2), global average pooling, linear.

    Args:
        num_classes: outputs of the final layer.
        channels: output channels of each convolution block.
        act: activation name (``tanh``, ``relu``, ``gelu``, ``silu``).
        norm: ``"group"`` (GroupNorm with up to ``max_groups`` groups after each convolution) or ``"none"``.
        max_groups: upper bound on GroupNorm groups.
        in_chans: input channels.
    """

    def __init__(self, *, num_classes: int, channels: Sequence[int] = (16, 32, 64), act: str = "tanh",
                 norm: str = "group", max_groups: int = 8, in_chans: int = 3) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if len(channels) < 1 or any(int(c) < 1 for c in channels):
            raise ValueError(f"channels must be a non-empty sequence of positive ints, got {channels}")
        if norm not in ("group", "none"):
            raise ValueError(f"norm must be 'group' or 'none', got {norm!r}")
        blocks = []
        prev = in_chans
        for i, c in enumerate(int(c) for c in channels):
            layers: list[nn.Module] = [nn.Conv2d(prev, c, 3, stride=1 if i == 0 else 2, padding=1,
                                                 bias=norm == "none")]
            if norm == "group":
                layers.append(nn.GroupNorm(group_count(c, max_groups), c))
            layers.append(_activation(act))
            blocks.append(nn.Sequential(*layers))
            prev = c
        self.blocks = nn.Sequential(*blocks)
        self.num_features = prev
        self.num_classes = num_classes
        self.head = nn.Linear(prev, num_classes)
        self.feature_info = [dict(num_chs=int(c), reduction=2 ** i, module=f"blocks.{i}")
                             for i, c in enumerate(channels)]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Unpooled maps of the last block."""
        return self.blocks(x)


class MLP(LinearHeadMixin, nn.Module):
    """Flatten, then ``len(hidden)`` Linear+activation layers, then a linear classifier.

    Args:
        num_classes: outputs of the final layer.
        input_shape: (C, H, W) of the input.
        hidden: widths of the hidden layers.
        act: activation name.
    """

    def __init__(self, *, num_classes: int, input_shape: tuple[int, int, int], hidden: Sequence[int] = (256,),
                 act: str = "tanh") -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if any(int(h) < 1 for h in hidden):
            raise ValueError(f"hidden must hold positive widths, got {hidden}")
        prev = int(input_shape[0]) * int(input_shape[1]) * int(input_shape[2])
        layers = []
        for h in (int(h) for h in hidden):
            layers.append(nn.Sequential(nn.Linear(prev, h), _activation(act)))
            prev = h
        self.layers = nn.Sequential(*layers)
        self.num_features = prev
        self.num_classes = num_classes
        self.head = nn.Linear(prev, num_classes)
        self.feature_info = [dict(num_chs=int(h), reduction=1, module=f"layers.{i}") for i, h in enumerate(hidden)]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Output of the last hidden layer (N, hidden[-1]); the flattened input when there are none."""
        return self.layers(x.flatten(1))
