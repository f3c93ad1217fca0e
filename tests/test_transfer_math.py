"""Transfer evaluation's pure math: confidence intervals, the linear probe and k-NN, against references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from audit.transfer.knn import knn_classify, knn_predict
from audit.transfer.metrics import accuracy_estimate, binomial_ci
from audit.transfer.probes import linear_probe, stratified_split

# ---------------------------------------------------------------------------------------------- intervals


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (512, 1000), (1, 1)])
@pytest.mark.parametrize("method", ["wilson", "clopper_pearson"])
def test_binomial_ci_contains_estimate_and_orders(k, n, method):
    low, high = binomial_ci(k, n, method=method)
    assert 0.0 <= low <= k / n <= high <= 1.0
    wider_low, wider_high = binomial_ci(k, n, confidence=0.99, method=method)
    assert wider_low <= low and wider_high >= high


def test_binomial_ci_reference_values():
    # Wilson by its closed form; Clopper-Pearson k=0 upper end is 1 - (alpha/2)^(1/n).
    low, high = binomial_ci(90, 100)
    z = 1.959963984540054
    centre = (0.9 + z * z / 200) / (1 + z * z / 100)
    half = z * math.sqrt(0.9 * 0.1 / 100 + z * z / 40000) / (1 + z * z / 100)
    assert (low, high) == pytest.approx((centre - half, centre + half))
    assert binomial_ci(0, 20, method="clopper_pearson")[1] == pytest.approx(1 - 0.025 ** (1 / 20))
    assert binomial_ci(20, 20, method="clopper_pearson")[0] == pytest.approx(0.025 ** (1 / 20))


def test_binomial_ci_coverage_by_simulation():
    rng = np.random.default_rng(0)
    n, p = 60, 0.83
    hits = sum(lo <= p <= hi for lo, hi in (binomial_ci(int(k), n, method="clopper_pearson")
                                            for k in rng.binomial(n, p, size=2000)))
    assert hits / 2000 >= 0.94


@pytest.mark.parametrize("kwargs,match", [({"successes": 5, "trials": 4}, "successes"),
                                          ({"successes": 1, "trials": 4, "confidence": 1.0}, "confidence"),
                                          ({"successes": 1, "trials": 4, "method": "exact"}, "method")])
def test_binomial_ci_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        binomial_ci(**kwargs)


def test_accuracy_estimate_empty_is_nan_with_full_interval():
    est = accuracy_estimate(correct=0, total=0)
    assert math.isnan(est.accuracy) and (est.ci_low, est.ci_high) == (0.0, 1.0)


# ---------------------------------------------------------------------------------------------- probes


def _separable(rng, n_per=40, k=4, d=10, margin=6.0, noise=1.0):
    y = np.repeat(np.arange(k), n_per)
    centres = rng.normal(size=(k, d))
    centres *= margin / np.linalg.norm(centres, axis=1, keepdims=True)
    return centres[y] + noise * rng.normal(size=(y.size, d)) / np.sqrt(d), y


def test_linear_probe_reaches_full_accuracy_on_separable_features():
    rng = np.random.default_rng(0)
    x_tr, y_tr = _separable(rng)
    x_te, y_te = _separable(np.random.default_rng(0), n_per=25)  # same centres, new noise below
    x_te = x_te + 0.05 * rng.normal(size=x_te.shape)
    res = linear_probe(train_features=x_tr, train_labels=y_tr, test_features=x_te, test_labels=y_te, rng=0)
    assert res.accuracy.accuracy == 1.0 and res.accuracy.correct == y_te.size
    assert res.accuracy.ci_low > 0.95
    assert res.c in res.val_accuracy and res.val_accuracy[res.c] == max(res.val_accuracy.values())
    assert res.n_train == y_tr.size and res.n_val == 32 and res.n_test == y_te.size


def test_linear_probe_is_chance_on_random_labels_and_deterministic():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 8))
    y = rng.integers(0, 3, size=300)
    kw = dict(train_features=x[:200], train_labels=y[:200], test_features=x[200:], test_labels=y[200:])
    a, b = linear_probe(**kw, rng=5), linear_probe(**kw, rng=5)
    assert a.to_dict() == b.to_dict()
    assert a.accuracy.ci_low < 1 / 3 + 0.1 and a.accuracy.accuracy < 0.55


def test_linear_probe_is_invariant_to_feature_scaling():
    rng = np.random.default_rng(2)
    x, y = _separable(rng, margin=1.5, noise=2.0)
    kw = dict(train_labels=y[::2], test_labels=y[1::2], rng=3, c_grid=(0.01, 1.0))
    a = linear_probe(train_features=x[::2], test_features=x[1::2], **kw)
    b = linear_probe(train_features=1e3 * x[::2], test_features=1e3 * x[1::2], **kw)
    assert a.accuracy.correct == b.accuracy.correct and a.c == b.c


def test_stratified_split_keeps_every_class_in_fit_part():
    y = np.array([0] * 10 + [1] * 5 + [2])
    fit, val = stratified_split(y, val_fraction=0.4, rng=0)
    assert np.intersect1d(fit, val).size == 0 and np.union1d(fit, val).size == y.size
    assert set(y[fit]) == {0, 1, 2} and np.sum(y[val] == 0) == 4 and np.sum(y[val] == 1) == 2
    assert np.array_equal(stratified_split(y, val_fraction=0.4, rng=0)[1], val)


def test_linear_probe_rejects_bad_input():
    x = np.ones((6, 2))
    with pytest.raises(ValueError, match="at least 2 classes"):
        linear_probe(train_features=x, train_labels=np.zeros(6, int), test_features=x, test_labels=np.zeros(6, int))
    with pytest.raises(ValueError, match="columns"):
        linear_probe(train_features=x, train_labels=[0, 1] * 3, test_features=np.ones((2, 3)), test_labels=[0, 1])
    with pytest.raises(ValueError, match="c_grid"):
        linear_probe(train_features=x, train_labels=[0, 1] * 3, test_features=x, test_labels=[0, 1] * 3,
                     c_grid=[0.0])


# ---------------------------------------------------------------------------------------------- k-NN


def _naive_knn(train, labels, query, k, tau, n_classes):
    """One query at a time, Python loops, written from the definition."""
    preds = []
    for q in query:
        sims = []
        for i, t in enumerate(train):
            sims.append((float(np.dot(q, t) / (np.linalg.norm(q) * np.linalg.norm(t))), i))
        sims.sort(key=lambda s: -s[0])
        votes = [0.0] * n_classes
        for s, i in sims[:k]:
            votes[labels[i]] += math.exp(s / tau)
        preds.append(max(range(n_classes), key=lambda c: (votes[c], -c)))
    return np.array(preds)


@pytest.mark.parametrize("k,tau,chunk", [(20, 0.07, 7), (1, 0.07, 64), (5, 1.0, 3), (500, 0.5, 16)])
def test_knn_equals_naive_loop(k, tau, chunk):
    rng = np.random.default_rng(3)
    train = rng.normal(size=(120, 6)) + np.repeat(rng.normal(size=(4, 6)), 30, axis=0)
    labels = np.repeat(np.arange(4), 30)
    query = rng.normal(size=(40, 6)) * 1.5
    fast = knn_predict(train_features=train, train_labels=labels, query_features=query, k=k, temperature=tau,
                       chunk_size=chunk)
    assert np.array_equal(fast, _naive_knn(train, labels, query, min(k, 120), tau, 4))


def test_knn_accuracy_and_scale_invariance():
    rng = np.random.default_rng(4)
    x_tr, y_tr = _separable(rng)
    x_te, y_te = _separable(np.random.default_rng(4), n_per=10)
    res = knn_classify(train_features=x_tr, train_labels=y_tr, test_features=x_te, test_labels=y_te)
    assert res.accuracy.accuracy == 1.0 and res.k == 20
    scaled = knn_classify(train_features=x_tr * 50, train_labels=y_tr, test_features=x_te * 0.01, test_labels=y_te)
    assert scaled.accuracy.correct == res.accuracy.correct


def test_knn_rejects_bad_input():
    x = np.ones((4, 2))
    with pytest.raises(ValueError, match="k must be"):
        knn_predict(train_features=x, train_labels=[0, 1, 0, 1], query_features=x, k=0)
    with pytest.raises(ValueError, match="temperature"):
        knn_predict(train_features=x, train_labels=[0, 1, 0, 1], query_features=x, temperature=0.0)
    with pytest.raises(ValueError, match="train_labels must be a 1-D array of length 4"):
        knn_predict(train_features=x, train_labels=[0, 1], query_features=x)
