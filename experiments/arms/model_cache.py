"""The arms' cache of shared trained models: a seed's pre-trained ViT or the Ke et al. source, trained once by the
first part job that asks and loaded by the others (:func:`cached_fit`), keyed by everything that determines the
weights (:func:`fit_key`); a model a GPU lease trained can be adopted on another machine (:func:`adopt_cached`) and
says where it was trained (:func:`cached_origin`). Safetensors only: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from experiments.arms.common import AFTER_FIT_FIELDS, PART_FIELDS, ArmScale
from training.data import ImageSet

__all__ = ["fit_key", "cached_fit", "cache_path", "adopt_cached", "cached_origin", "PORTABLE_KEY_FIELDS"]


def fit_key(scale: ArmScale, images: ImageSet, *, seed: int, lr: float, device) -> dict[str, Any]:
    """Everything that determines a shared model's weights: the scale's settings (less :data:`PART_FIELDS` and
    :data:`AFTER_FIT_FIELDS`), the training images' fingerprint, the seed, the learning rate, the device type and
    torch's version."""
    fields = {k: v for k, v in vars(scale).items() if k not in PART_FIELDS + AFTER_FIT_FIELDS}
    return {"format": 2, "scale": json.loads(json.dumps(fields, sort_keys=True, default=str)),
            "images": images.fingerprint(), "seed": int(seed), "lr": float(lr),
            "device": torch.device(device).type, "torch": torch.__version__}


#: the :func:`fit_key` fields that name where a model was trained rather than what it was trained on: a model
#: trained elsewhere may be adopted (:func:`adopt_cached`) across them, never across any other field
PORTABLE_KEY_FIELDS = ("device", "torch")


def cache_path(cache: str | Path, key: dict[str, Any], *, prefix: str = "model") -> Path:
    """The file :func:`cached_fit` keeps ``key``'s model in."""
    text = json.dumps(key, sort_keys=True)
    return Path(cache) / f"{prefix}-{hashlib.sha256(text.encode()).hexdigest()[:24]}.safetensors"


def _stored_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def adopt_cached(src: str | Path, cache: str | Path, key: dict[str, Any], *, prefix: str = "model") -> Path:
    """Make ``src``, a :func:`cached_fit` file written on another device or torch build (a GPU lease's), the cached
    model for ``key`` here, so that part jobs on this machine fine-tune the very weights the lease trained instead
    of training their own. Only :data:`PORTABLE_KEY_FIELDS` may differ between the two keys; the new file keeps
    the original key as ``adopted_from`` (see :func:`cached_origin`). Returns the new file's path.

    Raises:
        ValueError: ``src`` holds no cache key, or was trained with other settings, images, seed or rate (the
            fields that differ are named).
    """
    from foundation.io import load_safetensors, save_safetensors, waiting_lock

    src = Path(src)
    try:
        stored = _stored_metadata(src).get("key")
    except Exception as e:  # noqa: BLE001 - safetensors' own error types: missing, truncated or not safetensors
        raise ValueError(f"{src} is not a readable safetensors file ({e}): re-assemble it from the lease's parts"
                         ) from None
    if stored is None:
        raise ValueError(f"{src} carries no cache key: it was not written by cached_fit, so what it was trained "
                         "on is unknown")
    theirs = json.loads(stored)
    differ = sorted(k for k in set(theirs) | set(key)
                    if k not in PORTABLE_KEY_FIELDS and theirs.get(k) != key.get(k))
    if differ:
        detail = [k + (": " + ", ".join(sorted(f for f in set(theirs[k]) | set(key[k])
                                               if theirs[k].get(f) != key[k].get(f)))
                       if k == "scale" and k in theirs and k in key else "") for k in differ]
        raise ValueError(f"{src} is another model: its {'; '.join(detail)} differ from this run's")
    path = cache_path(cache, key, prefix=prefix)
    with waiting_lock(path.with_suffix(".lock")):
        save_safetensors(path, load_safetensors(src), metadata={"key": json.dumps(key, sort_keys=True),
                                                                "adopted_from": stored})
    return path


def cached_origin(cache: str | Path | None, key: dict[str, Any], *, prefix: str = "model") -> dict[str, str] | None:
    """Where ``key``'s cached model was trained (``device``, ``torch``; ``adopted`` True when it came from another
    machine through :func:`adopt_cached`); None without a cache or a file."""
    if cache is None or not (path := cache_path(cache, key, prefix=prefix)).is_file():
        return None
    meta = _stored_metadata(path)
    adopted = "adopted_from" in meta
    trained = json.loads(meta["adopted_from"] if adopted else meta.get("key", "{}"))
    return {"device": trained.get("device"), "torch": trained.get("torch"), "adopted": adopted}


def cached_fit(cache: str | Path | None, key: dict[str, Any], make: Callable[[], nn.Module],
               fit: Callable[[nn.Module], nn.Module], *, device="cpu", prefix: str = "model") -> nn.Module:
    """``fit(make())``, kept in ``cache`` under ``key`` and loaded from there when present: the part jobs of one
    run share a model they would each train alike (a seed's pre-trained ViT, the Ke et al. source), trained once
    and identical in every part even where GPU kernels are not bit-reproducible. Jobs asking for the same key at
    once wait on a file lock; a file whose stored key differs, or that does not load, is trained again and
    replaced. No cache: plain training. Safetensors only: nothing is unpickled."""
    if cache is None:
        return fit(make())
    from foundation.io import load_safetensors, save_safetensors, waiting_lock

    text = json.dumps(key, sort_keys=True)
    path = cache_path(cache, key, prefix=prefix)
    with waiting_lock(path.with_suffix(".lock")):
        if path.is_file():
            try:
                stored = _stored_metadata(path).get("key")
                if stored == text:
                    model = make()
                    model.load_state_dict(load_safetensors(path))
                    return model.to(device)
            except Exception:  # noqa: BLE001 - safetensors' own error types for a corrupt file; a strict load of
                pass           # another model's weights: either way the file is not these weights, train again
        model = fit(make())
        save_safetensors(path, model.state_dict(), metadata={"key": text})
        return model
