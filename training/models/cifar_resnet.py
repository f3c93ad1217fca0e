"""The CIFAR ResNet of He et al. (2016), section 4.2, with parameter-free "option A" shortcuts.

He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition", CVPR 2016, §4.2: a 3×3 convolution
(3→16 channels), then three stages of ``n`` basic blocks with 16, 32 and 64 channels on 32×32, 16×16 and
8×8 maps, global average pooling and a linear classifier; depth ``6n + 2`` (ResNet-20: ``n = 3``, 0.27M
parameters). The first block of stages 2 and 3 has stride 2, and its shortcut has no parameters: it keeps
every second pixel and zero-pads the new channels ("option A").

Parameter names follow the widely used public checkpoints of this network (``conv1``, ``bn1``,
``layer1.0.conv1``, ..., ``linear``), so such a state dict loads with ``strict=True`` once a DataParallel
``module.`` prefix is stripped.

The network follows timm's classifier protocol (``forward_features`` → unpooled maps,
``forward_head(x, pre_logits=...)``, ``get_classifier``, ``reset_classifier``, ``feature_info``), so it can be
wrapped like any timm model. Its ops are all out-of-place, as Opacus's backward hooks require.

>>> import torch
>>> net = resnet20(num_classes=10)
>>> net(torch.zeros(2, 3, 32, 32)).shape
torch.Size([2, 10])
>>> sum(p.numel() for p in net.parameters())
269722
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training.models.head import LinearHeadMixin

__all__ = ["CifarResNet", "BasicBlock", "ShortcutA", "CIFAR_RESNET_DEPTHS", "blocks_for_depth", "depth_in_state",
           "depth_mismatch",
           "resnet20", "resnet32", "resnet44", "resnet56", "resnet110"]

#: the depths He et al. (2016) Table 6 reports on CIFAR-10; each is registered as ``resnet<depth>_cifar``
CIFAR_RESNET_DEPTHS: tuple[int, ...] = (20, 32, 44, 56, 110)


def blocks_for_depth(depth: int) -> int:
    """Blocks per stage ``n`` of the CIFAR ResNet of ``depth = 6n + 2`` layers.

    >>> blocks_for_depth(20), blocks_for_depth(110)
    (3, 18)
    >>> blocks_for_depth(21)
    Traceback (most recent call last):
    ...
    ValueError: depth must be 6n + 2 for an integer n >= 1 (8, 14, 20, 26, 32, ...); got 21
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
        raise ValueError(f"depth must be 6n + 2 for an integer n >= 1 (8, 14, 20, 26, 32, ...); got {depth!r}")
    return (depth - 2) // 6


def depth_in_state(state) -> int | None:
    """The depth ``6n + 2`` of the CIFAR ResNet whose state dict this is (``n``: blocks in ``layer1``), or None
    when the keys are not those of this network.

    >>> depth_in_state(resnet32().state_dict()), depth_in_state({"fc.weight": None})
    (32, None)
    """
    blocks = {int(k.split(".")[1]) for k in state if k.startswith("layer1.") and k.split(".")[1].isdigit()}
    if not blocks or "conv1.weight" not in state:
        return None
    return 6 * (max(blocks) + 1) + 2


def depth_mismatch(net: nn.Module, state, *, arch: str, flag: str = "--arch") -> str | None:
    """Why ``state`` cannot load into ``net`` when both are CIFAR ResNets of different depths, naming the fix;
    None when they agree (or either is not this network).

    >>> print(depth_mismatch(resnet20(), resnet32().state_dict(), arch="resnet20_cifar"))
    the weights hold a 32-layer CIFAR ResNet (5 blocks per stage, detected from the state dict's layer1.* keys) but --arch resnet20_cifar builds 20 layers: use --arch resnet32_cifar
    """
    found = depth_in_state(state)
    if not isinstance(net, CifarResNet) or found is None or found == net.depth:
        return None
    fix = (f"{flag} resnet{found}_cifar" if found in CIFAR_RESNET_DEPTHS
           else f"{flag} resnet_cifar with depth {found}")
    return (f"the weights hold a {found}-layer CIFAR ResNet ({(found - 2) // 6} blocks per stage, detected from the "
            f"state dict's layer1.* keys) but {flag} {arch} builds {net.depth} layers: use {fix}")


class ShortcutA(nn.Module):
    """Parameter-free shortcut ("option A"): subsample by ``stride`` and zero-pad channels on both sides."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        if out_channels < in_channels:
            raise ValueError(f"out_channels must be >= in_channels ({in_channels}), got {out_channels}")
        self.stride = stride
        self.pad_front = (out_channels - in_channels) // 2
        self.pad_back = out_channels - in_channels - self.pad_front

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad_front, self.pad_back))


class BasicBlock(nn.Module):
    """conv3×3-BN-ReLU-conv3×3-BN, plus the shortcut, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = ShortcutA(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(LinearHeadMixin, nn.Module):
    """CIFAR ResNet with ``blocks_per_stage`` basic blocks in each of three stages (depth ``6n + 2``).

    Args:
        blocks_per_stage: ``n``; 3 gives ResNet-20, 5 ResNet-32, 9 ResNet-56.
        num_classes: number of outputs of the final linear layer.
        widths: channels of the three stages (16, 32, 64 in the paper).
        in_chans: input channels.
    """

    head_attr = "linear"  # the attribute name of published CIFAR ResNet checkpoints

    def __init__(self, blocks_per_stage: int = 3, *, num_classes: int = 10,
                 widths: tuple[int, int, int] = (16, 32, 64), in_chans: int = 3) -> None:
        super().__init__()
        if blocks_per_stage < 1:
            raise ValueError(f"blocks_per_stage must be >= 1, got {blocks_per_stage}")
        if len(widths) != 3 or any(int(w) < 1 for w in widths):
            raise ValueError(f"widths must be three positive channel counts, got {widths}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        w1, w2, w3 = (int(w) for w in widths)
        self.depth = 6 * blocks_per_stage + 2
        self.num_classes = num_classes
        self.num_features = w3
        self.conv1 = nn.Conv2d(in_chans, w1, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(w1)
        self.layer1 = self._stage(w1, w1, blocks_per_stage, stride=1)
        self.layer2 = self._stage(w1, w2, blocks_per_stage, stride=2)
        self.layer3 = self._stage(w2, w3, blocks_per_stage, stride=2)
        self.linear = nn.Linear(w3, num_classes)
        self.feature_info = [dict(num_chs=w, reduction=r, module=f"layer{i}")
                             for i, (w, r) in enumerate(((w1, 1), (w2, 2), (w3, 4)), start=1)]
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)  # He initialisation, as in the paper

    @staticmethod
    def _stage(in_channels: int, out_channels: int, blocks: int, *, stride: int) -> nn.Sequential:
        layers = [BasicBlock(in_channels, out_channels, stride)]
        layers += [BasicBlock(out_channels, out_channels, 1) for _ in range(blocks - 1)]
        return nn.Sequential(*layers)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Unpooled feature maps (N, 64, H/4, W/4)."""
        x = F.relu(self.bn1(self.conv1(x)))
        return self.layer3(self.layer2(self.layer1(x)))

    def init_head(self, linear: nn.Linear) -> None:
        """He initialisation of a new final layer, as for the rest of the network."""
        nn.init.kaiming_normal_(linear.weight)


def resnet20(num_classes: int = 10, **kwargs) -> CifarResNet:
    """ResNet-20 (n = 3, 0.27M parameters), loadable by import path ``training.models.cifar_resnet:resnet20``."""
    return CifarResNet(3, num_classes=num_classes, **kwargs)


def resnet32(num_classes: int = 10, **kwargs) -> CifarResNet:
    """ResNet-32 (n = 5)."""
    return CifarResNet(5, num_classes=num_classes, **kwargs)


def resnet44(num_classes: int = 10, **kwargs) -> CifarResNet:
    """ResNet-44 (n = 7)."""
    return CifarResNet(7, num_classes=num_classes, **kwargs)


def resnet56(num_classes: int = 10, **kwargs) -> CifarResNet:
    """ResNet-56 (n = 9)."""
    return CifarResNet(9, num_classes=num_classes, **kwargs)


def resnet110(num_classes: int = 10, **kwargs) -> CifarResNet:
    """ResNet-110 (n = 18)."""
    return CifarResNet(18, num_classes=num_classes, **kwargs)
