"""``ImageClassifier``: the one model interface the rest of dp-audit sees.

It takes float images in [0, 1], shape (N, C, H, W), normalises them with fixed per-channel mean/std
(non-persistent buffers, so state dicts hold only the network's weights) and returns logits. It wraps the
network as ``.net`` (so parameter names are ``net.<timm or our names>``) and offers what linear probes,
fine-tuning and the transfer diagnostics need, in timm's vocabulary:

* ``forward_features(x)`` → pooled pre-logit features (N, D);
* ``forward_head(features)`` → logits, so ``forward(x) == forward_head(forward_features(x))``;
* ``head`` (the final classifier, an ``nn.Linear`` for every built-in model) and ``reset_classifier(n)``;
* ``feature_blocks()`` → the ordered blocks whose outputs are pooled per layer (conv stages, ViT blocks).

Two kinds of network are wrapped. Networks with timm's protocol (``forward_features``, ``forward_head(x,
pre_logits=True)``, ``get_classifier``, ``reset_classifier``: timm models and ours) are driven through it.
Any other network is wrapped around its final ``nn.Linear`` (``head_name``): its features are the input that
layer receives, captured with a forward pre-hook, and ``forward`` is simply ``net(x)``.

>>> import torch
>>> from training.models.small import SmallCNN
>>> model = ImageClassifier(SmallCNN(num_classes=10), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
>>> x = torch.rand(4, 3, 8, 8)
>>> model.forward_features(x).shape
torch.Size([4, 64])
>>> torch.allclose(model(x), model.forward_head(model.forward_features(x)))
True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["ImageClassifier", "has_timm_protocol"]


def has_timm_protocol(net: nn.Module) -> bool:
    """True when ``net`` offers ``forward_features``, ``forward_head``, ``get_classifier``, ``reset_classifier``."""
    return all(callable(getattr(net, a, None))
               for a in ("forward_features", "forward_head", "get_classifier", "reset_classifier"))


def _owns_params(m: nn.Module) -> bool:
    return any(True for _ in m.parameters())


class ImageClassifier(nn.Module):
    """Normalise, run the network, return logits; expose features, head and per-layer blocks.

    Args:
        net: the network (stored as ``self.net``).
        mean: per-channel mean subtracted from the [0, 1] input, or None for no normalisation.
        std: per-channel standard deviation the input is divided by (given together with ``mean``).
        head_name: the dotted name in ``net`` of its final ``nn.Linear`` when ``net`` lacks timm's protocol;
            None to use the protocol.

    Raises:
        ValueError: if only one of mean/std is given, they have the wrong length, std is not positive, or
            ``head_name`` is missing/not an ``nn.Linear`` for a network without timm's protocol.
    """

    def __init__(self, net: nn.Module, *, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 head_name: str | None = None) -> None:
        super().__init__()
        if (mean is None) != (std is None):
            raise ValueError("mean and std must be given together (or neither)")
        if head_name is None and not has_timm_protocol(net):
            raise ValueError(f"net ({type(net).__name__}) lacks timm's classifier protocol: pass head_name, the "
                             f"name of its final nn.Linear")
        if head_name is not None and not isinstance(net.get_submodule(head_name), nn.Linear):
            raise ValueError(f"head_name must name an nn.Linear in net, got {head_name!r}")
        self.net = net
        self.head_name = head_name
        self.normalized = mean is not None
        if mean is not None:
            m = torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
            s = torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
            if m.numel() != s.numel() or m.numel() < 1:
                raise ValueError(f"mean and std must have one value per channel, got {len(mean)} and {len(std)}")
            if not bool((s > 0).all()):
                raise ValueError(f"std must be > 0 in every channel, got {tuple(std)}")
            self.register_buffer("mean", m, persistent=False)
            self.register_buffer("std", s, persistent=False)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / std per channel, or x unchanged when no normalisation was given."""
        if not self.normalized:
            return x
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    @property
    def head(self) -> nn.Module:
        """The final classifier layer (``nn.Linear`` for every built-in model)."""
        if self.head_name is None:
            return self.net.get_classifier()
        return self.net.get_submodule(self.head_name)

    @property
    def num_classes(self) -> int:
        """Number of logits."""
        return int(self.head.out_features)

    def head_prefix(self) -> str:
        """The classifier's module name inside ``net`` (e.g. ``"head"`` or ``"fc"``)."""
        if self.head_name is not None:
            return self.head_name
        head = self.head
        return next(name for name, m in self.net.named_modules() if m is head)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled pre-logit features (N, D) of float images in [0, 1]."""
        x = self.normalize(x)
        if self.head_name is None:
            return self.net.forward_head(self.net.forward_features(x), pre_logits=True)
        captured: list[torch.Tensor] = []
        handle = self.head.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
        try:
            self.net(x)
        finally:
            handle.remove()
        return captured[-1]

    def forward_head(self, features: torch.Tensor) -> torch.Tensor:
        """Logits from pooled features."""
        return self.head(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (N, num_classes) of float images in [0, 1]."""
        if self.head_name is None:
            return self.forward_head(self.forward_features(x))
        return self.net(self.normalize(x))  # the head runs inside net, once (Opacus hooks count calls)

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the classifier by a freshly initialised one with ``num_classes`` outputs."""
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if self.head_name is None:
            self.net.reset_classifier(num_classes)
            self.head.train(self.training)
            return
        old = self.head
        new = nn.Linear(old.in_features, num_classes, bias=old.bias is not None,
                        device=old.weight.device, dtype=old.weight.dtype)
        new.train(self.training)
        parent_name, _, child = self.head_name.rpartition(".")
        setattr(self.net.get_submodule(parent_name), child, new)

    def feature_blocks(self) -> list[nn.Module]:
        """The ordered blocks whose outputs the transfer diagnostics pool, one per layer.

        timm's ``feature_info`` entries that own parameters (ResNet ``layer1``..``layer4``, ViT ``blocks.i``,
        ConvNeXt ``stages.i``; our models declare theirs); otherwise the network's top-level children that own
        parameters, without the classifier. Outputs are (N, C, H, W) maps for CNNs and (N, L, D) token
        sequences for ViTs (prefix tokens first).
        """
        info = getattr(self.net, "feature_info", None)
        blocks: list[nn.Module] = []
        if isinstance(info, (list, tuple)) and all(isinstance(d, dict) and "module" in d for d in info):
            for d in info:
                try:
                    m = self.net.get_submodule(str(d["module"]))
                except AttributeError:
                    continue
                if _owns_params(m):
                    blocks.append(m)
        if blocks:
            return blocks
        head = self.head
        return [m for m in self.net.children() if m is not head and _owns_params(m)]
