"""``fastnet``: a fast CIFAR convnet with a data-whitened first layer, for audits that need many models quickly.

The class of network the fast CIFAR-10 training work uses (Page's ResNet-9 DAWNBench entry; Jordan's airbench,
"94% on CIFAR-10 in 3.29 seconds on a single GPU", 2024): a fixed first convolution whose filters whiten 2×2
image patches (the eigenvectors of the patch covariance, each scaled by 1/√eigenvalue, and their negatives, so
a following GELU keeps both signs), then three blocks of ``conv3×3 → max-pool 2 → norm → GELU → conv3×3 → norm →
GELU``, a global max-pool and a bias-free linear head whose logits are multiplied by a small constant. Written for this
project from that description; no code was copied.

The whitening is a data-dependent initialisation: :meth:`FastNet.init_from_data` computes it from images as the
network sees them. The ``standard`` recipe calls it on a seeded sample of the run's own members
(:func:`training.recipes.common.init_from_members`), so a reference model of an audit is whitened on its own
members, as the target was. Without it the first layer keeps its random initialisation (still frozen).

Under DP the builder replaces BatchNorm by GroupNorm (``model.fix_batchnorm``), as for every network here.

>>> import torch
>>> net = FastNet(num_classes=10, widths=(8, 16, 16))
>>> net.init_from_data(torch.rand(64, 3, 32, 32))
>>> net(torch.rand(2, 3, 32, 32)).shape
torch.Size([2, 10])
>>> net.whiten.weight.requires_grad
False
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from training.models.head import LinearHeadMixin

__all__ = ["FastNet", "patch_whitening"]


def patch_whitening(x: torch.Tensor, *, kernel: int, eps: float = 5e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Filters that whiten the ``kernel``×``kernel`` patches of ``x``, and the patch mean.

    Args:
        x: images (N, C, H, W), as the first layer sees them.
        kernel: patch side.
        eps: added to each eigenvalue before the 1/√λ scaling (keeps near-constant directions bounded).

    Returns:
        ``(filters, mean)``: filters (2·C·k², C, k, k), the whitening directions then their negatives, ordered by
        decreasing eigenvalue; mean (C·k²,), the mean patch.

    Raises:
        ValueError: ``x`` is not 4-D or smaller than one patch.

    >>> f, m = patch_whitening(torch.rand(16, 3, 8, 8), kernel=2)
    >>> tuple(f.shape), tuple(m.shape)
    ((24, 3, 2, 2), (12,))
    """
    if x.ndim != 4 or x.shape[2] < kernel or x.shape[3] < kernel:
        raise ValueError(f"x must be (N, C, H, W) images of side >= kernel={kernel}, got shape {tuple(x.shape)}")
    c = x.shape[1]
    patches = torch.nn.functional.unfold(x.double(), kernel).transpose(1, 2).reshape(-1, c * kernel * kernel)
    mean = patches.mean(0)
    centred = patches - mean
    cov = centred.T @ centred / max(len(centred) - 1, 1)
    eigval, eigvec = torch.linalg.eigh(cov)  # ascending
    eigval, eigvec = eigval.flip(0), eigvec.flip(1)
    filters = (eigvec / (eigval.clamp(min=0) + eps).sqrt()).T.reshape(-1, c, kernel, kernel)
    return torch.cat([filters, -filters]).float(), mean.float()


class _Block(nn.Module):
    """conv3×3 → max-pool 2 → BatchNorm → GELU → conv3×3 → BatchNorm → GELU."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(c_out)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.pool(self.conv1(x))))
        return self.act(self.norm2(self.conv2(x)))


class FastNet(LinearHeadMixin, nn.Module):
    """Whitening layer, three conv blocks, global max-pool, scaled linear head (see the module docstring).

    Args:
        num_classes: outputs of the head.
        widths: output channels of the three blocks (airbench's class: 64, 256, 256).
        whiten_kernel: side of the whitened patches (2).
        logit_scale: the head's logits are multiplied by this (1/9: small initial logits, as in the fast recipes).
        whiten_images: images of the members :func:`training.recipes.common.init_from_members` passes to
            :meth:`init_from_data` (0: none, the first layer keeps its random initialisation).
        in_chans: input channels.

    Raises:
        ValueError: an argument out of range.
    """

    def __init__(self, *, num_classes: int, widths: Sequence[int] = (64, 256, 256), whiten_kernel: int = 2,
                 logit_scale: float = 1 / 9, whiten_images: int = 5000, in_chans: int = 3) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if len(widths) < 1 or any(int(w) < 1 for w in widths):
            raise ValueError(f"widths must be a non-empty sequence of positive ints, got {widths}")
        if whiten_kernel < 1 or whiten_images < 0 or not logit_scale > 0:
            raise ValueError(f"whiten_kernel must be >= 1, whiten_images >= 0 and logit_scale > 0; got "
                             f"{whiten_kernel}, {whiten_images}, {logit_scale}")
        self.whiten_kernel, self.logit_scale, self.data_init_size = int(whiten_kernel), float(logit_scale), int(
            whiten_images)
        c_w = 2 * in_chans * whiten_kernel ** 2
        self.whiten = nn.Conv2d(in_chans, c_w, whiten_kernel, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)  # fixed whitening; its bias trains
        self.act = nn.GELU()
        blocks, prev = [], c_w
        for w in (int(w) for w in widths):
            blocks.append(_Block(prev, w))
            prev = w
        self.blocks = nn.Sequential(*blocks)
        self.num_features = prev
        self.num_classes = num_classes
        self.head = nn.Linear(prev, num_classes, bias=False)
        self.feature_info = [dict(num_chs=int(w), reduction=2 ** (i + 1), module=f"blocks.{i}")
                             for i, w in enumerate(widths)]

    @torch.no_grad()
    def init_from_data(self, x: torch.Tensor) -> None:
        """Set the first layer to whiten the patches of ``x`` (N, C, H, W images as this network receives them):
        filters from :func:`patch_whitening`, bias centring the mean patch."""
        filters, mean = patch_whitening(x.float().cpu(), kernel=self.whiten_kernel)
        w = self.whiten.weight
        w.copy_(filters.to(w.device, w.dtype))
        self.whiten.bias.copy_(-(filters.flatten(1) @ mean).to(w.device, w.dtype))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Globally max-pooled features (N, widths[-1]) times ``logit_scale``: with the bias-free head this is the
        same function, and the same gradients, as scaling the logits, while the head stays a plain final linear
        layer on pooled features (the classifier protocol every transfer and audit tool here relies on)."""
        return self.blocks(self.act(self.whiten(x))).amax(dim=(2, 3)) * self.logit_scale

    def init_head(self, linear: nn.Linear) -> None:
        """A new head has no bias term, like the original (see :meth:`reset_classifier`)."""

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head by a freshly initialised bias-free ``Linear(num_features, num_classes)``."""
        super().reset_classifier(num_classes, global_pool)
        old = self.head
        self.head = nn.Linear(old.in_features, num_classes, bias=False, device=old.weight.device,
                              dtype=old.weight.dtype)
