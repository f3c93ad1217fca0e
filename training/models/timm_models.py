"""Create timm models offline, with small-image (CIFAR-sized) defaults.

``timm.create_model(name, pretrained=False, ...)`` is always called with ``pretrained=False``: nothing is
downloaded; pretrained weights come only from a local file (``model.pretrained``). With ``cifar_stem`` and
inputs of at most 64 pixels a side, the ImageNet designs are adapted the usual way for 32×32 images:

* ResNet family (timm ``ResNet``: resnet*, resnext*, seresnet*, wide_resnet*, ...): the 7×7 stride-2 stem
  convolution becomes 3×3 stride 1 (a deep stem's first convolution gets stride 1) and the stem max-pool is
  removed, as in He et al. (2016) §4.2 and common CIFAR practice; a 32×32 input then reaches the last stage
  at 4×4 instead of 1×1.
* ViT family (``vision_transformer``, ``deit`` modules): ``img_size`` is always the input size; with
  ``cifar_stem`` and small inputs ``patch_size`` is 4 (2 below 16 pixels), i.e. 8×8 = 64 tokens at 32×32
  (Dosovitskiy et al. 2021 use 16×16 patches of 224×224 images; 4×4 patches of 32×32 images keep the
  token count comparable).
* Other families are built as timm defines them. Networks that downsample by 32 (ConvNeXt, EfficientNet,
  ...) run on 32×32 inputs with 1×1 final maps; families with a fixed input size need ``img_size`` in
  ``model.kwargs``. :func:`training.models.build.build_model` checks by running the network once.

Explicit ``model.kwargs`` always win over these defaults.

>>> net, notes = create_timm_model("resnet18", num_classes=10, input_shape=(3, 32, 32),
...                                kwargs={"layers": (1, 1, 1, 1)}, cifar_stem=True)
>>> notes
['cifar_stem: conv1 7x7/2 -> 3x3/1 and stem max-pool removed (input 32x32 <= 64 px)']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from typing import TYPE_CHECKING

from torch import nn

from foundation.errors import ConfigError

if TYPE_CHECKING:  # timm (~2 s with the torchvision it loads) is imported when a timm name is looked up or built
    from timm.models.resnet import ResNet

__all__ = ["is_timm_model", "create_timm_model", "SMALL_INPUT_MAX", "VIT_MODULES", "FORBIDDEN_KWARGS"]

SMALL_INPUT_MAX = 64
VIT_MODULES = ("vision_transformer", "deit")
# timm arguments that would fetch or read weights behind our back; weights come only from model.pretrained
FORBIDDEN_KWARGS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir")


def is_timm_model(name: str) -> bool:
    """True when ``name`` (optionally with a ``.tag``) is a registered timm architecture."""
    from timm.models import is_model

    try:
        return bool(is_model(name))
    except Exception:  # timm raises on malformed names
        return False


def _cifar_resnet_stem(net: ResNet) -> str:
    if isinstance(net.conv1, nn.Conv2d):
        old = net.conv1
        net.conv1 = nn.Conv2d(old.in_channels, old.out_channels, 3, stride=1, padding=1, bias=old.bias is not None,
                              device=old.weight.device, dtype=old.weight.dtype)
        stem = f"conv1 {old.kernel_size[0]}x{old.kernel_size[1]}/{old.stride[0]} -> 3x3/1"
    else:  # deep stem: a Sequential whose first layer is a 3x3 stride-2 convolution
        first = net.conv1[0]
        first.stride = (1, 1)
        stem = "deep stem conv1.0 stride 2 -> 1"
    net.maxpool = nn.Identity()
    for info in getattr(net, "feature_info", []):  # the stem no longer downsamples by 4
        if isinstance(info, dict) and "reduction" in info:
            info["reduction"] = max(1, int(info["reduction"]) // (4 if info.get("module") != "act1" else 2))
    return f"{stem} and stem max-pool removed"


def create_timm_model(name: str, *, num_classes: int, input_shape: tuple[int, int, int],
                      kwargs: Mapping[str, Any], cifar_stem: bool) -> tuple[nn.Module, list[str]]:
    """Build timm architecture ``name`` with random weights and small-image defaults.

    Args:
        name: a timm model name (see :func:`is_timm_model`).
        num_classes: classifier outputs.
        input_shape: (C, H, W) of the network input.
        kwargs: extra keyword arguments for ``timm.create_model`` (they override our defaults).
        cifar_stem: apply the small-image adaptations described in the module docstring when H, W <= 64.

    Returns:
        (network, notes describing every change from timm's defaults).

    Raises:
        ConfigError: if kwargs ask timm to load weights, or timm rejects the arguments.
    """
    import timm
    from timm.models import is_model_in_modules
    from timm.models.resnet import ResNet

    bad = [k for k in kwargs if k in FORBIDDEN_KWARGS]
    if bad:
        raise ConfigError(f"model.kwargs may not set {', '.join(bad)}: dp-audit never downloads weights; put a "
                          f"local .safetensors/.pt file in model.pretrained instead")
    c, h, w = input_shape
    small = cifar_stem and max(h, w) <= SMALL_INPUT_MAX
    args: dict[str, Any] = {}
    notes: list[str] = []
    if c != 3 and "in_chans" not in kwargs:
        args["in_chans"] = c
    vit = is_model_in_modules(name, VIT_MODULES)
    if vit:
        if "img_size" not in kwargs:
            args["img_size"] = (h, w) if h != w else h
            notes.append(f"img_size={h if h == w else (h, w)} (the input size)")
        if small and "patch_size" not in kwargs:
            args["patch_size"] = 4 if min(h, w) >= 16 else 2
            notes.append(f"cifar_stem: patch_size={args['patch_size']} for {h}x{w} input "
                         f"({(h // args['patch_size']) * (w // args['patch_size'])} patch tokens)")
    args.update(kwargs)
    try:
        net = timm.create_model(name, pretrained=False, num_classes=num_classes, **args)
    except (TypeError, ValueError, AssertionError, RuntimeError, KeyError) as exc:
        # a string layer option (act_layer, norm_layer, ...) that is not in timm's name tables is a KeyError
        reason = f"unknown name {exc}" if isinstance(exc, KeyError) else (" ".join(str(exc).split())[:300]
                                                                          or type(exc).__name__)
        raise ConfigError(f"timm could not build {name!r} with kwargs {dict(kwargs)} ({reason}); "
                          f"check model.kwargs") from None
    if small and isinstance(net, ResNet):
        notes.append(f"cifar_stem: {_cifar_resnet_stem(net)} (input {h}x{w} <= {SMALL_INPUT_MAX} px)")
    return net, notes
