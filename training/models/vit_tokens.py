"""Give a timm Vision Transformer's token parameters per-sample gradients under Opacus.

timm's ``VisionTransformer`` owns ``cls_token``, ``reg_token`` and ``pos_embed`` directly, on a module that
also has children. Opacus computes per-sample gradients module by module: a module with its own trainable
parameters but no registered grad sampler is handed whole to functorch (``GradSampleHooks.iterate_submodules``
in ``opacus/grad_sample/grad_sample_module.py`` stops recursing there), which for a ViT means re-running the
entire network per example and no hooks for any of its Linear/LayerNorm layers. :func:`patch_vit_tokens`
moves the token parameters into :class:`TokenEmbedding`, a leaf module that does exactly timm's
``VisionTransformer._pos_embed`` computation (concatenate class/register tokens, add position embeddings).
Opacus then hooks every Linear/LayerNorm as usual and uses functorch only for this small leaf, in the
``hooks``, ``functorch`` and ``ghost`` modes alike. The patched network computes the same function with the
same values; only the parameter names change (``cls_token`` → ``token_embed.cls_token``).

>>> import timm, torch
>>> vit = timm.create_model("vit_tiny_patch16_224", num_classes=3, img_size=8, patch_size=2, embed_dim=16,
...                         depth=1, num_heads=2)
>>> x = torch.randn(2, 3, 8, 8)
>>> with torch.no_grad():
...     before = vit.eval()(x)
>>> print(patch_vit_tokens(vit)[0].split(" so Opacus")[0])
cls_token, pos_embed moved into token_embed (TokenEmbedding leaf module)
>>> with torch.no_grad():
...     torch.equal(before, vit(x))
True
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:  # timm (and the torchvision it loads) is imported only where a timm model is built or patched
    from timm.models.vision_transformer import VisionTransformer

__all__ = ["TokenEmbedding", "patch_vit_tokens", "can_patch_vit_tokens"]

_TOKEN_NAMES = ("cls_token", "reg_token", "pos_embed")


class TokenEmbedding(nn.Module):
    """Prepend class/register tokens and add absolute position embeddings, as timm's ViT does.

    Args:
        cls_token: (1, 1, D) parameter or None.
        reg_token: (1, R, D) parameter or None.
        pos_embed: (1, L, D) parameter or None (no position embedding).
        no_embed_class: position embeddings cover only the patch tokens (added before the concatenation).
        num_prefix_tokens: class + register tokens (for resampling with ``dynamic_img_size``).
        grid_size: the patch grid the position embeddings were made for (``dynamic_img_size`` only).
        dynamic_img_size: the input is (N, H, W, D) patch maps of any size; resample ``pos_embed`` to fit.
    """

    def __init__(self, *, cls_token: nn.Parameter | None, reg_token: nn.Parameter | None,
                 pos_embed: nn.Parameter | None, no_embed_class: bool, num_prefix_tokens: int,
                 grid_size: tuple[int, int], dynamic_img_size: bool) -> None:
        super().__init__()
        self.cls_token = cls_token
        self.reg_token = reg_token
        self.pos_embed = pos_embed
        self.no_embed_class = bool(no_embed_class)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.dynamic_img_size = bool(dynamic_img_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, L, D) patch tokens (or (N, H, W, D) with ``dynamic_img_size``) → (N, prefix + L, D)."""
        n = x.shape[0]
        prefix = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(n, -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(n, -1, -1))
        if self.pos_embed is None:
            return torch.cat(prefix + [x.reshape(n, -1, x.shape[-1])], dim=1)
        if self.dynamic_img_size:
            from timm.layers import resample_abs_pos_embed

            _, h, w, d = x.shape
            pos_embed = resample_abs_pos_embed(
                self.pos_embed, new_size=(h, w), old_size=self.grid_size,
                num_prefix_tokens=0 if self.no_embed_class else self.num_prefix_tokens)
            x = x.reshape(n, -1, d)
        else:
            pos_embed = self.pos_embed
        if self.no_embed_class:
            x = x + pos_embed
            return torch.cat(prefix + [x], dim=1) if prefix else x
        if prefix:
            x = torch.cat(prefix + [x], dim=1)
        return x + pos_embed

    def extra_repr(self) -> str:
        names = [k for k in _TOKEN_NAMES if getattr(self, k) is not None]
        return f"params={names}, no_embed_class={self.no_embed_class}, dynamic_img_size={self.dynamic_img_size}"


def _token_pos_embed(self: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    """Replacement for ``VisionTransformer._pos_embed``: the leaf module, then timm's ``pos_drop``."""
    return self.pos_drop(self.token_embed(x))


def can_patch_vit_tokens(net: nn.Module) -> bool:
    """True for a timm ``VisionTransformer`` (or subclass) that uses the stock ``_pos_embed`` and is unpatched.

    Subclasses with their own token logic (e.g. DeiT's distillation token) return False. A timm ViT exists only
    once timm's vision_transformer module is loaded, so without it the answer is False without importing timm.
    """
    module = sys.modules.get("timm.models.vision_transformer")
    if module is None:
        return False
    vit = module.VisionTransformer
    return (isinstance(net, vit)
            and type(net)._pos_embed is vit._pos_embed
            and not isinstance(getattr(net, "token_embed", None), TokenEmbedding))


def patch_vit_tokens(net: nn.Module) -> list[str]:
    """Move ``cls_token``/``reg_token``/``pos_embed`` of a timm ViT into a :class:`TokenEmbedding` leaf.

    The module is changed in place; the forward computation is unchanged.

    Args:
        net: a timm ``VisionTransformer`` for which :func:`can_patch_vit_tokens` is True.

    Returns:
        One note describing what moved (empty when the model has no token parameters).

    Raises:
        TypeError: if ``net`` cannot be patched.
    """
    if not can_patch_vit_tokens(net):
        raise TypeError(f"net must be an unpatched timm VisionTransformer with the stock _pos_embed, "
                        f"got {type(net).__name__}")
    params = {}
    for name in _TOKEN_NAMES:
        p = getattr(net, name)
        params[name] = p
        if p is not None:
            delattr(net, name)  # unregister from the ViT ...
            setattr(net, name, None)  # ... and leave timm's attribute checks a None
    moved = [k for k, p in params.items() if p is not None]
    if not moved:
        return []
    net.token_embed = TokenEmbedding(
        **params, no_embed_class=net.no_embed_class, num_prefix_tokens=net.num_prefix_tokens,
        grid_size=tuple(net.patch_embed.grid_size), dynamic_img_size=net.dynamic_img_size)
    net.token_embed.train(net.training)
    net._pos_embed = types.MethodType(_token_pos_embed, net)
    return [f"{', '.join(moved)} moved into token_embed (TokenEmbedding leaf module) "
            f"so Opacus computes their per-sample gradients"]
