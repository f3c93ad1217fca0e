"""Weighted k-nearest-neighbour classification on frozen features (cosine similarity).

The protocol of Wu et al., "Unsupervised Feature Learning via Non-Parametric Instance Discrimination"
(CVPR 2018) as used by DINO (Caron et al., ICCV 2021): features are L2-normalised, the ``k`` training
examples with the highest cosine similarity ``s`` to a query vote for their class with weight
``exp(s / tau)``, and the class with the largest total weight wins (ties go to the lowest class index).
Defaults ``k = 20`` and ``tau = 0.07`` follow DINO.

>>> train = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
>>> knn_predict(train_features=train, train_labels=np.array([0, 0, 1, 1]),
...             query_features=np.array([[1.0, 0.2], [0.2, 1.0]]), k=2).tolist()
[0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from audit.transfer.metrics import AccuracyEstimate, CIMethod, accuracy_estimate, check_features, check_labels

__all__ = ["KnnResult", "l2_normalize", "knn_predict", "knn_classify"]

_EPS = 1e-12


@dataclass(frozen=True, kw_only=True)
class KnnResult:
    """Outcome of :func:`knn_classify`: test accuracy (with CI), ``k`` actually used and ``tau``."""

    accuracy: AccuracyEstimate
    k: int
    temperature: float
    n_train: int
    n_test: int

    def to_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy.to_dict(), "k": self.k, "temperature": self.temperature,
                "n_train": self.n_train, "n_test": self.n_test}


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm; an all-zero row stays zero (cosine similarity 0 to everything)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, _EPS)


def knn_predict(*, train_features: np.ndarray, train_labels: np.ndarray, query_features: np.ndarray,
                k: int = 20, temperature: float = 0.07, num_classes: int | None = None,
                chunk_size: int = 256) -> np.ndarray:
    """Predicted class of each query by temperature-weighted cosine k-NN voting.

    Args:
        train_features: (n_train, d) reference features.
        train_labels: (n_train,) integer labels.
        query_features: (n_query, d) features to classify.
        k: neighbours per query (clipped to ``n_train``), >= 1.
        temperature: ``tau`` > 0 in the vote weight ``exp(similarity / tau)``.
        num_classes: number of classes (default: ``max(train_labels) + 1``).
        chunk_size: queries processed per block (bounds memory at ``chunk_size * n_train`` floats).

    Returns:
        (n_query,) int64 predicted labels.

    Raises:
        ValueError: on malformed arrays, mismatched dimensions or out-of-range parameters.
    """
    x_tr = check_features(train_features, name="train_features")
    y_tr = check_labels(train_labels, n=x_tr.shape[0], name="train_labels")
    x_q = check_features(query_features, name="query_features")
    if x_q.shape[1] != x_tr.shape[1]:
        raise ValueError(f"query_features has {x_q.shape[1]} columns but train_features has {x_tr.shape[1]}")
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if not (temperature > 0 and np.isfinite(temperature)):
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n_classes = int(y_tr.max()) + 1 if num_classes is None else int(num_classes)
    if n_classes <= int(y_tr.max()):
        raise ValueError(f"num_classes must exceed the largest train label {int(y_tr.max())}, got {num_classes}")

    k_eff = min(int(k), x_tr.shape[0])
    ref = l2_normalize(x_tr.astype(np.float64, copy=False))
    out = np.empty(x_q.shape[0], dtype=np.int64)
    for start in range(0, x_q.shape[0], int(chunk_size)):
        q = l2_normalize(x_q[start:start + int(chunk_size)].astype(np.float64, copy=False))
        sims = q @ ref.T                                               # (m, n_train)
        if k_eff < sims.shape[1]:
            top = np.argpartition(-sims, k_eff - 1, axis=1)[:, :k_eff]
        else:
            top = np.broadcast_to(np.arange(sims.shape[1]), sims.shape)
        top_sims = np.take_along_axis(sims, top, axis=1)
        # Shifting by the row maximum leaves the argmax unchanged and keeps exp() finite.
        weights = np.exp((top_sims - top_sims.max(axis=1, keepdims=True)) / temperature)
        rows = np.repeat(np.arange(q.shape[0]), k_eff)
        flat = rows * n_classes + y_tr[top].ravel()
        votes = np.bincount(flat, weights=weights.ravel(), minlength=q.shape[0] * n_classes)
        out[start:start + q.shape[0]] = votes.reshape(q.shape[0], n_classes).argmax(axis=1)
    return out


def knn_classify(*, train_features: np.ndarray, train_labels: np.ndarray, test_features: np.ndarray,
                 test_labels: np.ndarray, k: int = 20, temperature: float = 0.07, chunk_size: int = 256,
                 confidence: float = 0.95, ci_method: CIMethod = "wilson") -> KnnResult:
    """Test accuracy of :func:`knn_predict` with a binomial confidence interval.

    Args:
        train_features, train_labels: the reference set.
        test_features, test_labels: the examples scored.
        k, temperature, chunk_size: see :func:`knn_predict`.
        confidence, ci_method: see :func:`audit.transfer.metrics.binomial_ci`.

    Returns:
        :class:`KnnResult`.
    """
    x_te = check_features(test_features, name="test_features")
    y_te = check_labels(test_labels, n=x_te.shape[0], name="test_labels")
    y_tr = check_labels(train_labels, n=np.asarray(train_features).shape[0], name="train_labels")
    n_classes = int(max(y_tr.max(), y_te.max() if y_te.size else 0)) + 1
    pred = knn_predict(train_features=train_features, train_labels=y_tr, query_features=x_te, k=k,
                       temperature=temperature, num_classes=n_classes, chunk_size=chunk_size)
    acc = accuracy_estimate(correct=int(np.sum(pred == y_te)), total=int(y_te.size), confidence=confidence,
                            method=ci_method)
    return KnnResult(accuracy=acc, k=min(int(k), int(y_tr.size)), temperature=float(temperature),
                     n_train=int(y_tr.size), n_test=int(y_te.size))
