"""Linear probe: multinomial logistic regression on frozen features.

The standard protocol for measuring how linearly useful a representation is (e.g. Kornblith, Shlens & Le,
"Do Better ImageNet Models Transfer Better?", CVPR 2019; Chen et al., SimCLR, ICML 2020): features are
standardised with statistics of the training features, the L2 regularisation strength ``C`` is chosen on a
seeded, class-stratified validation split carved out of the training features, and the model is refit on
all training features with the chosen ``C`` and scored once on the test features.

>>> rng = np.random.default_rng(0)
>>> y = np.repeat(np.arange(3), 40)
>>> x = np.eye(3)[y] * 4 + rng.normal(size=(120, 3))
>>> res = linear_probe(train_features=x[::2], train_labels=y[::2], test_features=x[1::2],
...                    test_labels=y[1::2], rng=0)
>>> res.accuracy.accuracy > 0.9
True
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from audit.transfer.metrics import AccuracyEstimate, CIMethod, accuracy_estimate, check_features, check_labels

__all__ = ["DEFAULT_C_GRID", "LinearProbeResult", "stratified_split", "linear_probe"]

DEFAULT_C_GRID: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


@dataclass(frozen=True, kw_only=True)
class LinearProbeResult:
    """Outcome of :func:`linear_probe`.

    Attributes:
        accuracy: test accuracy with its confidence interval.
        c: the inverse regularisation strength chosen on the validation split.
        val_accuracy: validation accuracy for each ``C`` tried (empty if no validation split was possible).
        n_train, n_val, n_test: examples used to fit (all training features), validate, and test.
        converged: whether the final lbfgs fit converged within ``max_iter``.
    """

    accuracy: AccuracyEstimate
    c: float
    val_accuracy: dict[float, float]
    n_train: int
    n_val: int
    n_test: int
    converged: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy.to_dict(),
            "C": self.c,
            "val_accuracy": {f"{c:g}": a for c, a in self.val_accuracy.items()},
            "n_train": self.n_train,
            "n_val": self.n_val,
            "n_test": self.n_test,
            "converged": self.converged,
        }


def stratified_split(labels: np.ndarray, *, val_fraction: float,
                     rng: np.random.Generator | int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Seeded class-stratified split of ``range(len(labels))`` into (fit, validation) index arrays.

    Each class with ``m`` examples gives ``round(val_fraction * m)`` to validation but always keeps at least
    one example for fitting (so a class with one example goes entirely to fitting).

    Args:
        labels: 1-D integer class labels.
        val_fraction: share of each class put in the validation split, in (0, 1).
        rng: seed or generator.

    Returns:
        Sorted ``(fit_idx, val_idx)``.

    >>> fit, val = stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1]), val_fraction=0.5, rng=0)
    >>> len(fit), len(val)
    (4, 4)
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    gen = np.random.default_rng(rng)
    labels = np.asarray(labels)
    fit_parts, val_parts = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[gen.permutation(idx.size)]
        n_val = min(int(round(val_fraction * idx.size)), idx.size - 1)
        val_parts.append(idx[:n_val])
        fit_parts.append(idx[n_val:])
    fit = np.sort(np.concatenate(fit_parts)) if fit_parts else np.zeros(0, np.int64)
    val = np.sort(np.concatenate(val_parts)) if val_parts else np.zeros(0, np.int64)
    return fit.astype(np.int64), val.astype(np.int64)


def _fit(x: np.ndarray, y: np.ndarray, c_values: Sequence[float], max_iter: int,
         ) -> list[tuple[float, LogisticRegression, StandardScaler, bool]]:
    """Fit one standardised lbfgs logistic regression per C, warm-starting along increasing C."""
    scaler = StandardScaler().fit(x)
    xs = scaler.transform(x)
    clf = LogisticRegression(solver="lbfgs", max_iter=max_iter, warm_start=True)
    fits = []
    for c in sorted(c_values):
        clf.set_params(C=float(c))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            clf.fit(xs, y)
        converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
        fits.append((float(c), copy.deepcopy(clf), scaler, converged))
    return fits


def _predict(clf: LogisticRegression, scaler: StandardScaler, x: np.ndarray) -> np.ndarray:
    return clf.predict(scaler.transform(x))


def linear_probe(*, train_features: np.ndarray, train_labels: np.ndarray, test_features: np.ndarray,
                 test_labels: np.ndarray, c_grid: Sequence[float] = DEFAULT_C_GRID, val_fraction: float = 0.2,
                 max_iter: int = 1000, rng: np.random.Generator | int | None = None,
                 confidence: float = 0.95, ci_method: CIMethod = "wilson") -> LinearProbeResult:
    """Multinomial logistic-regression probe on frozen features, C chosen on a validation split.

    Args:
        train_features: (n_train, d) features of the training examples.
        train_labels: (n_train,) integer labels.
        test_features: (n_test, d) features of the test examples.
        test_labels: (n_test,) integer labels (classes unseen in training simply count as errors).
        c_grid: candidate inverse regularisation strengths (sklearn's ``C``), all > 0.
        val_fraction: share of each training class held out to choose ``C``.
        max_iter: lbfgs iteration cap per fit.
        rng: seed or generator for the validation split.
        confidence: coverage of the accuracy interval.
        ci_method: ``"wilson"`` or ``"clopper_pearson"``.

    Returns:
        :class:`LinearProbeResult`; ties in validation accuracy go to the smallest ``C`` (strongest
        regularisation). If the split leaves fewer than two classes to fit or no validation examples,
        the middle of the grid is used and ``val_accuracy`` is empty.

    Raises:
        ValueError: on malformed arrays, mismatched feature dimensions, an empty or non-positive grid,
            or fewer than two classes in the training labels.
    """
    x_tr = check_features(train_features, name="train_features")
    y_tr = check_labels(train_labels, n=x_tr.shape[0], name="train_labels")
    x_te = check_features(test_features, name="test_features")
    y_te = check_labels(test_labels, n=x_te.shape[0], name="test_labels")
    if x_te.shape[1] != x_tr.shape[1]:
        raise ValueError(f"test_features has {x_te.shape[1]} columns but train_features has {x_tr.shape[1]}")
    grid = [float(c) for c in c_grid]
    if not grid or any(not (c > 0 and np.isfinite(c)) for c in grid):
        raise ValueError(f"c_grid must be a non-empty list of positive finite numbers, got {list(c_grid)}")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if np.unique(y_tr).size < 2:
        raise ValueError(f"train_labels must contain at least 2 classes, got {np.unique(y_tr).tolist()}")

    fit_idx, val_idx = stratified_split(y_tr, val_fraction=val_fraction, rng=rng)
    val_acc: dict[float, float] = {}
    if val_idx.size > 0 and np.unique(y_tr[fit_idx]).size >= 2:
        for c, clf, scaler, _ in _fit(x_tr[fit_idx], y_tr[fit_idx], grid, max_iter):
            val_acc[c] = float(np.mean(_predict(clf, scaler, x_tr[val_idx]) == y_tr[val_idx]))
        best = max(val_acc.values())
        chosen = min(c for c, a in val_acc.items() if a == best)
    else:
        chosen = sorted(grid)[len(grid) // 2]
        val_idx = np.zeros(0, np.int64)

    ((c, clf, scaler, converged),) = _fit(x_tr, y_tr, [chosen], max_iter)
    correct = int(np.sum(_predict(clf, scaler, x_te) == y_te))
    acc = accuracy_estimate(correct=correct, total=int(y_te.size), confidence=confidence, method=ci_method)
    return LinearProbeResult(accuracy=acc, c=c, val_accuracy=dict(sorted(val_acc.items())),
                             n_train=int(y_tr.size), n_val=int(val_idx.size), n_test=int(y_te.size),
                             converged=converged)
