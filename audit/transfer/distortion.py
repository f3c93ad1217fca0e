"""Feature distortion along a sequence of checkpoints.

Kumar et al., "Fine-Tuning can Distort Pretrained Features and Underperform Out-of-Distribution"
(ICLR 2022) show that full fine-tuning (FT) with a randomly initialised head moves the pretrained features
more than linear probing then fine-tuning (LP-FT); Ke et al. study the same question under DP
(DP-FFT vs DP-LP-FFT). Given features of the *same* examples extracted from checkpoints ``t = 0, 1, ...``
(``t = 0`` the starting point), this module reports, per checkpoint, the k-NN accuracy of the features
(:mod:`audit.transfer.knn`) and the relative feature change ``||F_t - F_0||_F / ||F_0||_F``.

>>> f0 = np.ones((4, 2))
>>> relative_feature_change(f0, 1.5 * f0)
0.5
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from audit.transfer.knn import knn_classify
from audit.transfer.metrics import AccuracyEstimate, check_features

__all__ = ["relative_feature_change", "DistortionResult", "feature_distortion"]


def relative_feature_change(reference: np.ndarray, features: np.ndarray) -> float:
    """``||features - reference||_F / ||reference||_F`` for features of the same examples.

    Args:
        reference: (n, d) features at the starting checkpoint (``F_0``), not all zero.
        features: (n, d) features of the same examples at a later checkpoint (``F_t``).

    Returns:
        The relative Frobenius change (0 = unchanged).

    Raises:
        ValueError: on shape mismatch or an all-zero reference.
    """
    f0 = check_features(reference, name="reference").astype(np.float64)
    ft = check_features(features, name="features").astype(np.float64)
    if f0.shape != ft.shape:
        raise ValueError(f"features has shape {ft.shape} but reference has shape {f0.shape}: "
                         "both must hold the same examples in the same feature space")
    norm0 = float(np.linalg.norm(f0))
    if norm0 == 0.0:
        raise ValueError("reference features are all zero: the relative change is undefined")
    return float(np.linalg.norm(ft - f0)) / norm0


@dataclass(frozen=True, kw_only=True)
class DistortionResult:
    """Per-checkpoint k-NN accuracy and relative feature change (index 0 = the reference checkpoint).

    Attributes:
        knn_accuracy: k-NN test accuracy of each checkpoint's features.
        relative_change_train: ``||F_t - F_0|| / ||F_0||`` on the training examples.
        relative_change_test: the same on the test examples.
    """

    knn_accuracy: tuple[AccuracyEstimate, ...]
    relative_change_train: tuple[float, ...]
    relative_change_test: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"knn_accuracy": [a.to_dict() for a in self.knn_accuracy],
                "relative_change_train": list(self.relative_change_train),
                "relative_change_test": list(self.relative_change_test)}


def feature_distortion(*, train_features: Sequence[np.ndarray], train_labels: np.ndarray,
                       test_features: Sequence[np.ndarray], test_labels: np.ndarray, k: int = 20,
                       temperature: float = 0.07) -> DistortionResult:
    """k-NN accuracy and relative feature change for each checkpoint in a sequence.

    Args:
        train_features: one (n_train, d) array per checkpoint, same examples in the same order.
        train_labels: (n_train,) labels.
        test_features: one (n_test, d) array per checkpoint, same examples in the same order.
        test_labels: (n_test,) labels.
        k, temperature: k-NN parameters (see :func:`audit.transfer.knn.knn_predict`).

    Returns:
        :class:`DistortionResult` (the first checkpoint is the reference: its change is 0).

    Raises:
        ValueError: if the sequences are empty or of different lengths, or shapes differ across checkpoints.
    """
    if len(train_features) == 0 or len(train_features) != len(test_features):
        raise ValueError(f"train_features and test_features must be non-empty sequences of equal length, "
                         f"got {len(train_features)} and {len(test_features)}")
    accs, ch_tr, ch_te = [], [], []
    for f_tr, f_te in zip(train_features, test_features, strict=True):
        accs.append(knn_classify(train_features=f_tr, train_labels=train_labels, test_features=f_te,
                                 test_labels=test_labels, k=k, temperature=temperature).accuracy)
        ch_tr.append(relative_feature_change(train_features[0], f_tr))
        ch_te.append(relative_feature_change(test_features[0], f_te))
    return DistortionResult(knn_accuracy=tuple(accs), relative_change_train=tuple(ch_tr),
                            relative_change_test=tuple(ch_te))
