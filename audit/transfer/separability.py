"""Class separation of features, layer by layer: scatter matrices, fuzziness, residuals, geometric decay.

He & Su, "A Law of Data Separation in Deep Learning" (PNAS 2023) define, for features ``x_ki`` of class
``k`` (``n_k`` examples, class mean ``m_k``, global mean ``m``, ``n = sum n_k``)::

    SS_b = (1/n) sum_k n_k (m_k - m)(m_k - m)^T          between-class scatter (rank <= K - 1)
    SS_w = (1/n) sum_k sum_i (x_ki - m_k)(x_ki - m_k)^T   within-class scatter

and the *separation fuzziness* ``D = Tr(SS_w SS_b^+)`` (``^+``: Moore-Penrose pseudo-inverse). Lower D =
better separated. Their law: in a well-trained network ``D_l ~ rho^l D_0`` across layers ``l`` with one
decay ratio ``rho < 1``; :func:`fit_geometric_decay` estimates ``rho`` by least squares on ``log D_l``.

:func:`fisher_separability` is the reciprocal-style measure ``Tr(SS_b SS_w^+)`` (multi-class Fisher
criterion; higher = better separated). Both are invariant to scaling and rotating the features.

:func:`least_squares_residual` is the normalised residual of the least-squares fit (with intercept) of
one-hot labels on the features, ``||Y - Yhat||_F^2 / ||Y - mean(Y)||_F^2 = 1 - R^2`` in [0, 1]; 0 means
the labels are an exact affine function of the features (always the case once ``d >= n - 1``).

>>> rng = np.random.default_rng(0)
>>> y = np.repeat(np.arange(3), 50)
>>> near = np.eye(3)[y] + 0.1 * rng.normal(size=(150, 3))
>>> far = np.eye(3)[y] + 1.0 * rng.normal(size=(150, 3))
>>> bool(separation_fuzziness(near, y) < separation_fuzziness(far, y))
True
>>> fit = fit_geometric_decay([8.0, 4.0, 2.0, 1.0])
>>> round(fit.rho, 6), round(fit.r_squared, 6), fit.dof
(0.5, 1.0, 2)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from audit.transfer.metrics import Record, check_features, check_labels

__all__ = [
    "scatter_matrices",
    "separation_fuzziness",
    "fisher_separability",
    "least_squares_residual",
    "GeometricDecay",
    "fit_geometric_decay",
    "LayerSeparation",
    "separation_profile",
]


def _prepare(features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float64 features, dense class indices 0..K-1, and class counts; at least two classes."""
    x = check_features(features, name="features").astype(np.float64)
    y = check_labels(labels, n=x.shape[0], name="labels")
    classes, dense = np.unique(y, return_inverse=True)
    if classes.size < 2:
        raise ValueError(f"labels must contain at least 2 classes, got {classes.tolist()}")
    return x, dense, np.bincount(dense)


def _class_means(x: np.ndarray, dense: np.ndarray, counts: np.ndarray) -> np.ndarray:
    sums = np.zeros((counts.size, x.shape[1]))
    np.add.at(sums, dense, x)
    return sums / counts[:, None]


def _between_factor(x: np.ndarray, dense: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``B`` with ``SS_b = B^T B`` (rows ``sqrt(n_k/n) (m_k - m)``) and the within-class centred features."""
    # Centre first, so rounding errors scale with the spread of the data, not with its offset.
    x = x - x.mean(axis=0)
    means = _class_means(x, dense, counts)
    centred_means = means - x.mean(axis=0)
    b = np.sqrt(counts / x.shape[0])[:, None] * centred_means
    return b, x - means[dense]


def _rank_cut(s: np.ndarray, shape: tuple[int, int], max_rank: int) -> np.ndarray:
    """Mask of singular values treated as non-zero: at most ``max_rank`` (the rank the matrix has by
    construction) and above NumPy's ``matrix_rank`` threshold relative to the largest (scale-free)."""
    keep = np.zeros(s.shape, dtype=bool)
    if s.size == 0 or s[0] <= 0:
        return keep
    keep[:max(0, max_rank)] = True
    return keep & (s > s[0] * max(shape) * np.finfo(np.float64).eps)


def scatter_matrices(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Within- and between-class scatter ``(SS_w, SS_b)``, both (d, d), with He & Su's 1/n scaling.

    Args:
        features: (n, d) features.
        labels: (n,) integer labels, at least two distinct classes.

    Returns:
        ``(ss_w, ss_b)``; ``ss_w + ss_b`` equals the (biased) total covariance of the features.
    """
    x, dense, counts = _prepare(features, labels)
    b, xw = _between_factor(x, dense, counts)
    return xw.T @ xw / x.shape[0], b.T @ b


def separation_fuzziness(features: np.ndarray, labels: np.ndarray) -> float:
    """He & Su's separation fuzziness ``D = Tr(SS_w SS_b^+)``; lower = classes better separated.

    Computed without forming ``SS_b^+``: with ``SS_b = B^T B`` and the SVD ``B = U S V^T``,
    ``D = sum_j v_j^T SS_w v_j / s_j^2`` over the non-zero singular values.

    Args:
        features: (n, d) features.
        labels: (n,) integer labels, at least two classes.

    Returns:
        ``D >= 0``: 0 when every class collapses onto its mean; ``inf`` (not the pseudo-inverse's 0) when
        all class means coincide, i.e. there is no between-class signal at all.
    """
    x, dense, counts = _prepare(features, labels)
    b, xw = _between_factor(x, dense, counts)
    _, s, vt = np.linalg.svd(b, full_matrices=False)
    keep = _rank_cut(s, b.shape, counts.size - 1)          # rank(SS_b) <= K - 1
    if not keep.any():
        return float("inf")
    proj = xw @ vt[keep].T                                     # (n, r)
    return float(np.sum(np.sum(proj * proj, axis=0) / x.shape[0] / s[keep] ** 2))


def fisher_separability(features: np.ndarray, labels: np.ndarray) -> float:
    """Multi-class Fisher criterion ``Tr(SS_b SS_w^+)``; higher = classes better separated.

    With ``SS_w = (X_w^T X_w) / n`` and the SVD ``X_w / sqrt(n) = U S V^T``,
    ``Tr(SS_b SS_w^+) = ||B V S^-1||_F^2`` over the non-zero singular values. When ``d >= n - K`` the
    within-class scatter is singular and the pseudo-inverse only looks inside its range.

    Args:
        features: (n, d) features.
        labels: (n,) integer labels, at least two classes.

    Returns:
        A non-negative float; ``inf`` when the within-class scatter is exactly zero (every class collapsed
        onto its mean).
    """
    x, dense, counts = _prepare(features, labels)
    b, xw = _between_factor(x, dense, counts)
    xw = xw / np.sqrt(x.shape[0])
    _, s, vt = np.linalg.svd(xw, full_matrices=False)
    keep = _rank_cut(s, xw.shape, x.shape[0] - counts.size)  # rank(SS_w) <= n - K
    if not keep.any():
        return float("inf")
    proj = (b @ vt[keep].T) / s[keep]
    return float(np.sum(proj * proj))


def least_squares_residual(features: np.ndarray, labels: np.ndarray) -> float:
    """Normalised residual ``||Y - Yhat||^2 / ||Y - mean(Y)||^2`` of regressing one-hot labels on features.

    The fit has an intercept (both sides are centred) and uses the minimum-norm least-squares solution.

    Args:
        features: (n, d) features.
        labels: (n,) integer labels, at least two classes.

    Returns:
        ``1 - R^2`` of the multi-output fit, in [0, 1]; lower = labels more linearly predictable.
    """
    x, dense, counts = _prepare(features, labels)
    y = np.eye(counts.size)[dense]
    xc, yc = x - x.mean(axis=0), y - y.mean(axis=0)
    beta, *_ = np.linalg.lstsq(xc, yc, rcond=None)
    resid = yc - xc @ beta
    return float(np.clip(np.sum(resid * resid) / np.sum(yc * yc), 0.0, 1.0))


@dataclass(frozen=True, kw_only=True)
class GeometricDecay(Record):
    """Fit of ``log v_l = intercept + l * log(rho)`` over layers ``l = 0, 1, ..., n_layers - 1``.

    Attributes:
        rho: per-layer ratio ``exp(slope)``; ``< 1`` = the quantity shrinks geometrically.
        intercept: fitted ``log v_0``.
        r_squared: coefficient of determination of the log-linear fit (1 = exactly geometric).
        n_layers: number of values fitted.
    """

    rho: float
    intercept: float
    r_squared: float
    n_layers: int

    @property
    def dof(self) -> int:
        """Residual degrees of freedom of the fit (n_layers − 2): with 3 layers, 1, and every monotone sequence has
        R² ≥ 0.75, so a high R² says little; report it with the dof."""
        return self.n_layers - 2


def fit_geometric_decay(values: Sequence[float]) -> GeometricDecay:
    """Least-squares fit of a geometric sequence ``v_l ~ exp(a) * rho^l`` to per-layer values.

    Args:
        values: per-layer values in layer order, at least two, all positive and finite.

    Returns:
        :class:`GeometricDecay`.

    Raises:
        ValueError: if fewer than two values are given or any is not positive and finite.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size < 2:
        raise ValueError(f"values must be a 1-D sequence of at least 2 per-layer values, got shape {v.shape}")
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ValueError(f"values must be positive and finite to fit a geometric decay, got {v.tolist()}")
    layers = np.arange(v.size, dtype=np.float64)
    logs = np.log(v)
    slope, intercept = np.polyfit(layers, logs, 1)
    ss_res = float(np.sum((logs - (intercept + slope * layers)) ** 2))
    ss_tot = float(np.sum((logs - logs.mean()) ** 2))
    if ss_tot > 0:
        r2 = 1.0 - ss_res / ss_tot
    else:
        r2 = 1.0 if ss_res <= 1e-24 else float("nan")
    return GeometricDecay(rho=float(np.exp(slope)), intercept=float(intercept), r_squared=float(r2),
                          n_layers=int(v.size))


@dataclass(frozen=True, kw_only=True)
class LayerSeparation(Record):
    """Separation measures of one layer's pooled features."""

    layer: str
    dim: int
    fuzziness: float
    fisher: float
    residual: float


def separation_profile(features_by_layer: Mapping[str, np.ndarray], labels: np.ndarray,
                       ) -> tuple[list[LayerSeparation], GeometricDecay | None, str | None]:
    """Per-layer fuzziness, Fisher separability and residual, and the geometric decay of the fuzziness.

    Args:
        features_by_layer: layer name -> (n, d_l) pooled features of the same n examples, in layer order.
        labels: (n,) integer labels.

    Returns:
        ``(layers, decay, note)``: ``decay`` is None (and ``note`` says why) when fewer than two layers
        are given or some fuzziness is zero or infinite.
    """
    rows = [LayerSeparation(layer=name, dim=int(np.asarray(f).shape[1]),
                            fuzziness=separation_fuzziness(f, labels), fisher=fisher_separability(f, labels),
                            residual=least_squares_residual(f, labels))
            for name, f in features_by_layer.items()]
    if len(rows) < 2:
        return rows, None, f"geometric decay needs at least 2 layers, got {len(rows)}"
    d = [r.fuzziness for r in rows]
    if not all(np.isfinite(v) and v > 0 for v in d):
        return rows, None, f"geometric decay needs positive finite fuzziness at every layer, got {d}"
    return rows, fit_geometric_decay(d), None
