"""Training-pool images for the report's thumbnails of the most vulnerable examples.

The pool is the run's verified pool (:attr:`training.run.VerifiedRun.pool`: rebuilt once by the one pool builder,
input canaries included, and accepted only when its fingerprint equals the manifest's), so a thumbnail never
shows an image from a different pool. When it cannot be rebuilt the report lists pool indices instead, and says
why.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import numpy as np

from audit.reporting.inputs import RunFiles
from training.data import is_streamed
from foundation.errors import UserError
from foundation.files import has_recorded_pool
from training.models.build import USER_MODEL_PREFIX

__all__ = ["PoolImages", "load_pool_images", "thumbnail_uri"]


@dataclass(frozen=True, kw_only=True)
class PoolImages:
    """The training pool: ``x`` uint8 (N, H, W, 3) (a lazy :class:`~training.data.RowArray` for a streamed
    pool), ``y`` int (N,), class names."""

    x: np.ndarray
    y: np.ndarray
    classes: tuple[str, ...]


def load_pool_images(run: RunFiles) -> tuple[PoolImages | None, str]:
    """Load the run's training pool for thumbnails.

    Args:
        run: the parsed run directory.

    Returns:
        ``(images, "")`` on success, else ``(None, reason)`` with a one-line reason for the report.
    """
    if run.run is None:
        return None, "the run directory was not opened, so the pool cannot be re-loaded"
    if str(run.manifest.model.arch).startswith(USER_MODEL_PREFIX):
        return None, ("the pool holds your own input tensors (pool.npz), listed by index" if has_recorded_pool(
            run.manifest) else "the run records only the canaries, not your training data")
    try:
        pool = run.run.pool
    except (UserError, OSError) as exc:
        return None, f"the pool could not be re-loaded ({exc})"
    x = pool.x if is_streamed(pool) else np.asarray(pool.x)  # a streamed pool decodes only the thumbnails' rows
    return PoolImages(x=x, y=np.asarray(pool.y), classes=tuple(pool.classes)), ""


def thumbnail_uri(image: np.ndarray, *, size: int = 64) -> str:
    """A ``data:image/png;base64,...`` URI of one uint8 image, upscaled (nearest) to about ``size`` pixels.

    >>> thumbnail_uri(np.zeros((8, 8, 3), np.uint8))[:22]
    'data:image/png;base64,'
    """
    from PIL import Image

    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3):
        raise ValueError(f"image must be uint8 (H, W) or (H, W, C), got {arr.dtype} {arr.shape}")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    scale = max(1, round(size / max(arr.shape[0], arr.shape[1])))
    img = Image.fromarray(arr).resize((arr.shape[1] * scale, arr.shape[0] * scale), Image.Resampling.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
