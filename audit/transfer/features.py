"""Frozen-feature extraction from a model, pooled per layer, with an on-disk cache.

Layers are named ``"features"`` (the model's ``forward_features`` output, the pre-logit representation the
probes use) and the qualified module names of ``feature_blocks()`` (what the separation diagnostics read).
Each layer's output is pooled to one vector per example (:func:`pool_output`):

* (N, D) vectors are kept as they are;
* (N, C, H, W) convolutional maps (and any (N, C, ...) map with more than one spatial axis) are averaged
  over the spatial axes (global average pooling);
* (N, T, D) token maps (Vision Transformers) give the class token when the model pools with it
  (timm ``global_pool == "token"``), otherwise the mean of the non-prefix tokens.

Features are cached as ``.npz`` files, one per (model, data, image size, layer), named by a sha256 over the
checkpoint's identity (weights sha256 plus architecture), the data fingerprint, the image size, the layer
and the pooling rule; a file is used only if its stored key matches, so a changed checkpoint or dataset can
never be served stale features. The key can be computed by anyone, so each file is also signed with this
auditor's evidence key (:mod:`foundation.evidence`): features shipped in a received run directory (fabricated
to flatter the model's transfer) or a symbolic link in place of a file are never used, only recomputed.

>>> import torch
>>> pool_output(torch.ones(2, 5, 3, 3)).shape, pool_output(torch.arange(12.).reshape(1, 3, 4), cls=True).tolist()
(torch.Size([2, 5]), [[0.0, 1.0, 2.0, 3.0]])
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from foundation.errors import UserError
from foundation.evidence import read_signed_npz, write_signed_npz

__all__ = [
    "FINAL_LAYER",
    "POOLING_VERSION",
    "pool_output",
    "token_pooling",
    "block_names",
    "extract_features",
    "feature_cache_key",
    "cached_features",
]

FINAL_LAYER = "features"
POOLING_VERSION = "gap-nchw/cls-or-mean-tokens/v1"


def pool_output(out: torch.Tensor, *, cls: bool = False, prefix_tokens: int = 0) -> torch.Tensor:
    """Pool one layer's output to (N, D) (rules in the module docstring).

    Args:
        out: the layer output, (N, D), (N, T, D) or (N, C, *spatial).
        cls: for token maps, take token 0 (the class token).
        prefix_tokens: for token maps pooled by the mean, how many leading (class/register) tokens to skip.

    Raises:
        ValueError: if ``out`` has fewer than 2 dimensions.
    """
    if out.ndim < 2:
        raise ValueError(f"cannot pool a layer output of shape {tuple(out.shape)}: expected (N, ...)")
    if out.ndim == 2:
        return out
    if out.ndim == 3:
        if cls:
            return out[:, 0]
        tokens = out[:, prefix_tokens:] if out.shape[1] > prefix_tokens else out
        return tokens.mean(dim=1)
    return out.mean(dim=tuple(range(2, out.ndim)))


def token_pooling(model: nn.Module) -> tuple[bool, int]:
    """``(cls, prefix_tokens)`` for token maps of ``model``, read from timm-style attributes.

    The first module (``model`` itself first) with a ``num_prefix_tokens`` attribute decides: class token if
    its ``global_pool`` is ``"token"``, else the mean over tokens after the prefix. Models without token
    attributes get ``(False, 0)``.
    """
    for module in model.modules():
        if hasattr(module, "num_prefix_tokens"):
            prefix = int(getattr(module, "num_prefix_tokens") or 0)
            return getattr(module, "global_pool", None) == "token" and prefix > 0, prefix
    return False, 0


def block_names(model: nn.Module) -> list[str]:
    """Qualified names of ``model.feature_blocks()`` in order; ``[]`` if the model has no such method."""
    blocks_fn = getattr(model, "feature_blocks", None)
    if blocks_fn is None:
        return []
    names = {id(m): name for name, m in model.named_modules()}
    out = []
    for i, block in enumerate(blocks_fn()):
        name = names.get(id(block)) or f"block{i}"
        out.append(name if name != FINAL_LAYER else f"block.{name}")
    return out


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"a feature block returned {type(out).__name__}; expected a tensor")


@torch.no_grad()
def extract_features(model: nn.Module, images: np.ndarray, *, layers: Sequence[str], batch_size: int = 256,
                     device: torch.device | str = "cpu") -> dict[str, np.ndarray]:
    """Pooled float32 features of ``images`` at each requested layer, in one pass over the data.

    Args:
        model: a module with ``forward_features`` taking float (N, 3, H, W) in [0, 1]; it is put in eval mode.
        images: uint8 (N, H, W, 3) images.
        layers: ``"features"`` and/or names from :func:`block_names`.
        batch_size: images per forward pass.
        device: where to run the model (the model must already be there).

    Returns:
        layer name -> (N, D_layer) float32 array.

    Raises:
        ValueError: if a layer name is unknown, or a block never ran during ``forward_features``.
    """
    from training.data import to_float_tensor

    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    names = block_names(model)
    unknown = [layer for layer in layers if layer != FINAL_LAYER and layer not in names]
    if unknown:
        raise ValueError(f"unknown layer(s) {unknown}; valid: {[FINAL_LAYER, *names]}")
    cls, prefix = token_pooling(model)
    blocks = dict(zip(names, model.feature_blocks())) if names else {}
    captured: dict[str, torch.Tensor] = {}
    hooks = []
    for layer in layers:
        if layer != FINAL_LAYER:
            def hook(_m, _inp, out, layer=layer):
                captured[layer] = pool_output(_first_tensor(out), cls=cls, prefix_tokens=prefix)
            hooks.append(blocks[layer].register_forward_hook(hook))
    parts: dict[str, list[np.ndarray]] = {layer: [] for layer in layers}
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(images), int(batch_size)):
            captured.clear()
            x = to_float_tensor(np.asarray(images[start:start + int(batch_size)])).to(device)
            final = pool_output(model.forward_features(x), cls=cls, prefix_tokens=prefix)
            for layer in layers:
                t = final if layer == FINAL_LAYER else captured.get(layer)
                if t is None:
                    raise ValueError(f"feature block {layer!r} did not run during forward_features")
                parts[layer].append(t.detach().float().cpu().numpy())
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return {layer: np.concatenate(chunks) if chunks else np.zeros((0, 0), np.float32)
            for layer, chunks in parts.items()}


def feature_cache_key(*, model_id: str, data_fingerprint: str, image_size: int, layer: str) -> str:
    """sha256 naming the cache entry of one (checkpoint, data, image size, layer, pooling rule)."""
    blob = json.dumps({"model": model_id, "data": data_fingerprint, "image_size": int(image_size),
                       "layer": layer, "pooling": POOLING_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _read_cached(path: Path, key: str, n: int) -> np.ndarray | None:
    """The cached array if ``path`` holds a well-formed entry for ``key`` with ``n`` rows, signed by this auditor
    for that key, else None (a link, an unsigned or foreign file: recompute and overwrite)."""
    if path.is_symlink() or not path.is_file():
        return None
    try:
        arrays = read_signed_npz(path, remake="audit transfer", identity={"feature_key": key})
        if str(arrays["key"]) != key:
            return None
        feats = np.asarray(arrays["features"])
    except (UserError, OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if feats.ndim != 2 or feats.shape[0] != n or feats.dtype != np.float32:
        return None
    return feats


def cached_features(model: nn.Module, images: np.ndarray, *, layers: Sequence[str], model_id: str,
                    data_fingerprint: str, image_size: int, cache_dir: str | Path | None,
                    batch_size: int = 256, device: torch.device | str = "cpu",
                    ) -> tuple[dict[str, np.ndarray], dict[str, bool]]:
    """Features of ``layers`` from the cache where present, extracting the missing ones in one pass.

    Args:
        model, images, layers, batch_size, device: as :func:`extract_features`.
        model_id: identity of the checkpoint (e.g. weights sha256 + architecture hash).
        data_fingerprint: identity of ``images`` and their labels (``ImageSet.fingerprint()``).
        image_size: side length the images were resized to.
        cache_dir: folder of ``<key>.npz`` files; None disables caching.

    Returns:
        ``(features, hits)``: layer -> (N, D) float32, and layer -> whether it came from the cache.
    """
    keys = {layer: feature_cache_key(model_id=model_id, data_fingerprint=data_fingerprint,
                                     image_size=image_size, layer=layer) for layer in layers}
    out: dict[str, np.ndarray] = {}
    if cache_dir is not None:
        for layer, key in keys.items():
            hit = _read_cached(Path(cache_dir) / f"{key[:32]}.npz", key, len(images))
            if hit is not None:
                out[layer] = hit
    hits = {layer: layer in out for layer in layers}
    missing = [layer for layer in layers if layer not in out]
    if missing:
        fresh = extract_features(model, images, layers=missing, batch_size=batch_size, device=device)
        for layer, feats in fresh.items():
            out[layer] = feats.astype(np.float32, copy=False)
            if cache_dir is not None:
                write_signed_npz(Path(cache_dir) / f"{keys[layer][:32]}.npz", identity={"feature_key": keys[layer]},
                                 arrays={"features": out[layer], "key": np.array(keys[layer]),
                                         "layer": np.array(layer)})
    return {layer: out[layer] for layer in layers}, hits
