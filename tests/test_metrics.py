"""Tests for attacks.metrics: hand-made ROCs, brute-force references, bootstrap behaviour, slices."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from attacks.metrics import (
    AttackMetrics,
    auc,
    average_metrics,
    best_balanced_accuracy,
    bootstrap_ci,
    compute_metrics,
    membership_advantage,
    roc_curve,
    tpr_at_fpr,
    weighted_roc_metrics,
)
from attacks.slices import most_vulnerable, per_class_metrics

# Hand-made: scores 0.9 (member), 0.8 (member), 0.8 (non), 0.3 (non), 0.1 (non): P = 2, N = 3.
# Thresholds inf, .9, .8, .3, .1 -> (FPR, TPR) = (0,0), (0,1/2), (1/3,1), (2/3,1), (1,1).
# AUC: trapezoids 0 + (1/3)(1/2 + 1)/2 + 1/3 + 1/3 = 11/12; Mann-Whitney: (3 + 2 + 1/2) / 6 = 11/12.
HAND_S = np.array([0.9, 0.8, 0.8, 0.3, 0.1])
HAND_Y = np.array([True, True, False, False, False])


def _brute(scores, labels):
    """(fpr, tpr) at every threshold in {+inf} U scores, by counting."""
    s, y = np.asarray(scores, float), np.asarray(labels, bool)
    pts = []
    for t in np.r_[np.inf, np.unique(s)[::-1]]:
        pred = s >= t
        pts.append(((pred & ~y).sum() / (~y).sum(), (pred & y).sum() / y.sum()))
    return np.array(pts)


def _mann_whitney(scores, labels):
    s, y = np.asarray(scores, float), np.asarray(labels, bool)
    pos, neg = s[y], s[~y]
    return sum((p > q) + 0.5 * (p == q) for p in pos for q in neg) / (len(pos) * len(neg))


def test_hand_made_roc_with_ties():
    fpr, tpr, thr = roc_curve(HAND_S, HAND_Y)
    np.testing.assert_allclose(fpr, [0, 0, 1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(tpr, [0, 0.5, 1, 1, 1])
    np.testing.assert_allclose(thr, [np.inf, 0.9, 0.8, 0.3, 0.1])
    assert auc(HAND_S, HAND_Y) == pytest.approx(11 / 12)
    assert tpr_at_fpr(HAND_S, HAND_Y, fpr_targets=(0.0, 0.2, 1 / 3, 0.5, 1.0)) == {
        0.0: 0.5, 0.2: 0.5, 1 / 3: 1.0, 0.5: 1.0, 1.0: 1.0}
    # best (TPR + TNR)/2: at threshold .9 -> (0.5 + 1)/2 = .75; at .8 -> (1 + 2/3)/2 = 5/6
    assert best_balanced_accuracy(HAND_S, HAND_Y) == pytest.approx(5 / 6)
    assert membership_advantage(HAND_S, HAND_Y) == pytest.approx(2 / 3)


def test_hand_made_extremes():
    assert auc([0.5] * 4, [1, 0, 1, 0]) == 0.5                       # all tied: the diagonal
    assert tpr_at_fpr([0.5] * 4, [1, 0, 1, 0], fpr_targets=(0.01, 0.99)) == {0.01: 0.0, 0.99: 0.0}
    assert auc([4, 3, 2, 1], [1, 1, 0, 0]) == 1.0
    assert tpr_at_fpr([4, 3, 2, 1], [1, 1, 0, 0], fpr_targets=(0.0,)) == {0.0: 1.0}
    assert auc([4, 3, 2, 1], [0, 0, 1, 1]) == 0.0
    assert best_balanced_accuracy([4, 3, 2, 1], [0, 0, 1, 1]) == 0.5  # trivial thresholds are allowed
    # 1000 non-members: FPR 0.1% allows exactly one false positive
    s = np.r_[np.arange(1000.0), [999.5, 998.5]]
    y = np.r_[np.zeros(1000, bool), [True, True]]
    assert tpr_at_fpr(s, y, fpr_targets=(0.001, 0.0001)) == {0.001: 1.0, 0.0001: 0.5}


@pytest.mark.parametrize("seed", range(4))
def test_metrics_equal_brute_force_on_random_tied_data(seed):
    rng = np.random.default_rng(seed)
    y = rng.random(60) < 0.4
    s = rng.integers(0, 8, size=60) + 1.5 * y        # many ties
    pts = _brute(s, y)
    fpr, tpr, _ = roc_curve(s, y)
    np.testing.assert_allclose(np.c_[fpr, tpr], pts)
    assert auc(s, y) == pytest.approx(_mann_whitney(s, y), abs=1e-12)
    u = stats.mannwhitneyu(s[y], s[~y]).statistic
    assert auc(s, y) == pytest.approx(u / (y.sum() * (~y).sum()), abs=1e-12)
    for t in (0.0, 0.05, 0.1, 0.3, 1.0):
        want = max(tp for fp, tp in pts if fp <= t + 1e-12)
        assert tpr_at_fpr(s, y, fpr_targets=(t,))[t] == want
    assert best_balanced_accuracy(s, y) == pytest.approx(max((tp + 1 - fp) / 2 for fp, tp in pts))
    assert membership_advantage(s, y) == pytest.approx(2 * best_balanced_accuracy(s, y) - 1)


def test_roc_agrees_with_scikit_learn():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(5)
    y = rng.random(500) < 0.5
    s = np.round(rng.normal(size=500) + y, 1)
    fpr, tpr, thr = roc_curve(s, y)
    sk_fpr, sk_tpr, sk_thr = sk.roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr)
    np.testing.assert_allclose(tpr, sk_tpr)
    np.testing.assert_allclose(thr[1:], sk_thr[1:])
    assert auc(s, y) == pytest.approx(sk.roc_auc_score(y, s), abs=1e-12)


def test_input_validation():
    with pytest.raises(ValueError, match="both members and non-members"):
        auc([1, 2], [1, 1])
    with pytest.raises(ValueError, match="NaN"):
        auc([1, np.nan], [1, 0])
    with pytest.raises(ValueError, match="boolean or 0/1"):
        auc([1, 2], [1, 2])
    with pytest.raises(ValueError, match="shape of scores"):
        auc([1, 2, 3], [1, 0])
    with pytest.raises(ValueError, match=r"fpr_targets must be .* in \[0, 1\]"):
        tpr_at_fpr([1, 2], [1, 0], fpr_targets=(1.5,))
    with pytest.raises(ValueError, match="n_boot must be an integer >= 1"):
        bootstrap_ci([1, 2], [1, 0], metric_fn=auc, n_boot=0)
    with pytest.raises(ValueError, match=r"level must be in \(0, 1\)"):
        compute_metrics([1, 2], [1, 0], level=1.0)
    with pytest.raises(ValueError, match="metric_fn name"):
        bootstrap_ci([1, 2], [1, 0], metric_fn="accuracy")


def test_weighted_metrics_equal_metrics_on_expanded_data():
    rng = np.random.default_rng(6)
    y = rng.random(40) < 0.5
    s = rng.integers(0, 6, size=40).astype(float) + y
    w = rng.integers(0, 4, size=(5, 40))
    w[:, np.flatnonzero(y)[0]] += 1
    w[:, np.flatnonzero(~y)[0]] += 1
    targets = (0.0, 0.1, 0.25)
    got = weighted_roc_metrics(s, y, w, fpr_targets=targets)
    for b in range(5):
        se, ye = np.repeat(s, w[b]), np.repeat(y, w[b])
        assert got["auc"][b] == pytest.approx(auc(se, ye), abs=1e-12)
        assert got["balanced_accuracy"][b] == pytest.approx(best_balanced_accuracy(se, ye), abs=1e-12)
        want = tpr_at_fpr(se, ye, fpr_targets=targets)
        np.testing.assert_allclose(got["tpr_at"][b], [want[t] for t in targets], atol=1e-12)


@pytest.mark.parametrize("name, fn", [("auc", auc), ("balanced_accuracy", best_balanced_accuracy),
                                      ("tpr@0.1", lambda s, y: tpr_at_fpr(s, y, fpr_targets=(0.1,))[0.1])])
def test_vectorised_bootstrap_equals_the_loop(name, fn):
    rng = np.random.default_rng(7)
    y = rng.random(300) < 0.5
    s = rng.normal(size=300) + y
    assert bootstrap_ci(s, y, metric_fn=name, n_boot=60, rng=3) == pytest.approx(
        bootstrap_ci(s, y, metric_fn=fn, n_boot=60, rng=3), abs=1e-12)


def test_bootstrap_contains_estimate_narrows_and_covers_null():
    rng = np.random.default_rng(8)

    def data(n):
        y = rng.random(n) < 0.5
        return rng.normal(size=n) + 1.0 * y, y

    s_small, y_small = data(200)
    s_big, y_big = data(5000)
    lo_s, hi_s = bootstrap_ci(s_small, y_small, metric_fn="auc", n_boot=200, rng=1)
    lo_b, hi_b = bootstrap_ci(s_big, y_big, metric_fn="auc", n_boot=200, rng=1)
    assert lo_s <= auc(s_small, y_small) <= hi_s
    assert lo_b <= auc(s_big, y_big) <= hi_b
    assert (hi_b - lo_b) < 0.4 * (hi_s - lo_s)          # width ~ 1/sqrt(n): ratio ~ 0.2
    # no signal: the interval covers 0.5 (and the true AUC 0.76 of the signal data is excluded from it)
    y_null = rng.random(2000) < 0.5
    lo, hi = bootstrap_ci(rng.normal(size=2000), y_null, metric_fn="auc", n_boot=200, rng=2)
    assert lo < 0.5 < hi and hi < 0.6
    m = compute_metrics(s_big, y_big, rng=4, n_boot=100)
    assert m.auc_ci[0] <= m.auc <= m.auc_ci[1]
    assert m.balanced_accuracy_ci[0] <= m.balanced_accuracy <= m.balanced_accuracy_ci[1]


def test_compute_metrics_json_roundtrip_and_consistency():
    rng = np.random.default_rng(9)
    y = rng.random(3000) < 0.5
    s = rng.normal(size=3000) + 1.5 * y
    m = compute_metrics(s, y, rng=0, n_boot=50)
    assert m.auc == pytest.approx(auc(s, y))
    assert m.tpr_at == tpr_at_fpr(s, y)
    assert m.balanced_accuracy == pytest.approx(best_balanced_accuracy(s, y))
    assert (m.n_members, m.n_nonmembers) == (int(y.sum()), int((~y).sum()))
    d = m.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert set(d["tpr_at_fpr"]) == {"0.01", "0.001", "0.0001"}
    back = AttackMetrics.from_dict(json.loads(text))
    assert back == m
    assert compute_metrics(s, y, n_boot=0).auc_ci is None
    assert compute_metrics(s, y, rng=5, n_boot=30) == compute_metrics(s, y, rng=5, n_boot=30)


def test_average_metrics():
    rng = np.random.default_rng(10)
    runs = []
    for _ in range(3):
        y = rng.random(400) < 0.5
        runs.append(compute_metrics(rng.normal(size=400) + y, y, n_boot=0))
    avg = average_metrics(runs)
    aucs = [r.auc for r in runs]
    assert avg.n_runs == 3
    assert avg.auc == pytest.approx((np.mean(aucs), np.std(aucs, ddof=1)))
    assert avg.tpr_at[0.01][0] == pytest.approx(np.mean([r.tpr_at[0.01] for r in runs]))
    json.dumps(avg.to_dict(), allow_nan=False)
    assert average_metrics(runs[:1]).auc == (runs[0].auc, 0.0)
    with pytest.raises(ValueError, match="at least one"):
        average_metrics([])


def test_per_class_metrics_and_most_vulnerable():
    s = np.array([0.9, 0.1, 0.8, 0.7, 0.2, 0.6, 0.95])
    member = np.array([1, 0, 1, 0, 1, 1, 1], bool)
    cls = np.array([0, 0, 1, 1, 1, 2, 2])
    out = per_class_metrics(s, member, cls)
    assert out[0] == {"auc": 1.0, "n": 2, "n_members": 1, "n_nonmembers": 1}
    assert out[1]["auc"] == pytest.approx(auc(s[2:5], member[2:5])) and out[1]["n"] == 3
    assert out[2] == {"auc": None, "n": 2, "n_members": 2, "n_nonmembers": 0}
    json.dumps(out)
    assert most_vulnerable(s, member, 3) == [6, 0, 2]
    assert most_vulnerable(s, member, 10, pool_indices=np.arange(100, 107)) == [106, 100, 102, 105, 104]
    assert most_vulnerable(s, member, 0) == []
