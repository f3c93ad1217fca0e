"""timm's classifier protocol for our own networks, written once.

Our networks (``SmallCNN``, ``MLP``, ``CifarResNet``) each define ``forward_features`` and keep their final
``nn.Linear`` in one attribute (``head``, or ``linear`` where the attribute name must match published
checkpoints). :class:`LinearHeadMixin` gives them the rest of timm's protocol: ``forward_head(x, pre_logits)``
(global average pooling of 4-D feature maps, then the linear layer), ``forward``, ``get_classifier`` and
``reset_classifier``.

>>> import torch
>>> from torch import nn
>>> class Tiny(LinearHeadMixin, nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.head = nn.Linear(4, 2)
...     def forward_features(self, x):
...         return x
>>> net = Tiny(); net.reset_classifier(5); net(torch.zeros(3, 4, 2, 2)).shape
torch.Size([3, 5])
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LinearHeadMixin"]


class LinearHeadMixin:
    """``forward_head``/``forward``/``get_classifier``/``reset_classifier`` over one ``nn.Linear`` attribute.

    Attributes:
        head_attr: name of the attribute holding the final ``nn.Linear``.
    """

    head_attr: str = "head"

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - defined by each network
        raise TypeError(f"{type(self).__name__} must define forward_features")

    def init_head(self, linear: nn.Linear) -> None:
        """Initialise a new final layer (PyTorch's default initialisation unless a network overrides it)."""

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Global average pooling of (N, C, H, W) maps (2-D features pass through), then the linear layer unless
        ``pre_logits``."""
        if x.ndim == 4:
            x = x.mean(dim=(2, 3))
        return x if pre_logits else self.get_classifier()(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Linear:
        """The final linear layer."""
        return getattr(self, self.head_attr)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the final layer by a freshly initialised ``Linear(num_features, num_classes)``.

        Raises:
            ValueError: ``num_classes`` < 1, or a pooling other than average.
        """
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if global_pool not in (None, "avg"):
            raise ValueError(f"global_pool must be None or 'avg', got {global_pool!r}")
        old = self.get_classifier()
        new = nn.Linear(old.in_features, num_classes, device=old.weight.device, dtype=old.weight.dtype)
        self.init_head(new)
        setattr(self, self.head_attr, new)
        self.num_classes = num_classes
