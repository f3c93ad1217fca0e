"""Representation diagnostics: scatter-based separation, least-squares residual, geometric decay, distortion."""

from __future__ import annotations

import numpy as np
import pytest

from audit.transfer import (feature_distortion, fisher_separability, fit_geometric_decay, least_squares_residual,
                            relative_feature_change, scatter_matrices, separation_fuzziness, separation_profile)


def _blobs(rng, n_per=30, k=4, d=6, spread=1.0):
    y = np.repeat(np.arange(k), n_per)
    centres = rng.normal(size=(k, d)) * 3.0
    return centres[y] + spread * rng.normal(size=(y.size, d)), y


def _naive_scatter(x, y):
    """He & Su's definitions written out with explicit loops over classes and examples."""
    n, d = x.shape
    mean = x.mean(axis=0)
    ss_w = np.zeros((d, d))
    ss_b = np.zeros((d, d))
    for c in np.unique(y):
        xc = x[y == c]
        mc = xc.mean(axis=0)
        ss_b += len(xc) * np.outer(mc - mean, mc - mean)
        for row in xc:
            ss_w += np.outer(row - mc, row - mc)
    return ss_w / n, ss_b / n


def test_scatter_matrices_match_loops_and_sum_to_total_covariance():
    x, y = _blobs(np.random.default_rng(0))
    ss_w, ss_b = scatter_matrices(x, y)
    ref_w, ref_b = _naive_scatter(x, y)
    np.testing.assert_allclose(ss_w, ref_w, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ss_b, ref_b, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ss_w + ss_b, np.cov(x.T, bias=True), rtol=1e-10, atol=1e-12)


def test_fuzziness_and_fisher_equal_direct_pinv_computation():
    x, y = _blobs(np.random.default_rng(1), k=5, d=8)
    ss_w, ss_b = _naive_scatter(x, y)
    direct_d = np.trace(ss_w @ np.linalg.pinv(ss_b, rcond=1e-10))
    direct_f = np.trace(ss_b @ np.linalg.pinv(ss_w, rcond=1e-10))
    assert separation_fuzziness(x, y) == pytest.approx(direct_d, rel=1e-8)
    assert fisher_separability(x, y) == pytest.approx(direct_f, rel=1e-8)


def test_fuzziness_handles_rank_deficient_within_scatter_like_pinv():
    # d > n: SS_w is singular; the pseudo-inverse only sees its range.
    x, y = _blobs(np.random.default_rng(2), n_per=4, k=3, d=20)
    ss_w, ss_b = _naive_scatter(x, y)
    assert fisher_separability(x, y) == pytest.approx(np.trace(ss_b @ np.linalg.pinv(ss_w, rcond=1e-10)),
                                                      rel=1e-7)
    assert separation_fuzziness(x, y) == pytest.approx(np.trace(ss_w @ np.linalg.pinv(ss_b, rcond=1e-10)),
                                                       rel=1e-7)


@pytest.mark.parametrize("scale", [1e-3, 7.0, 1e4])
def test_measures_are_invariant_to_scaling_rotation_and_shift(scale):
    rng = np.random.default_rng(3)
    x, y = _blobs(rng)
    q, _ = np.linalg.qr(rng.normal(size=(x.shape[1], x.shape[1])))
    moved = scale * x @ q + 5.0
    for fn in (separation_fuzziness, fisher_separability, least_squares_residual):
        assert fn(moved, y) == pytest.approx(fn(x, y), rel=1e-7), fn.__name__


def test_fuzziness_orders_tight_and_loose_clusters_and_fisher_the_reverse():
    rng = np.random.default_rng(4)
    tight, y = _blobs(rng, spread=0.2)
    loose = tight + rng.normal(size=tight.shape) * 3.0
    assert separation_fuzziness(tight, y) < separation_fuzziness(loose, y)
    assert fisher_separability(tight, y) > fisher_separability(loose, y)


def test_fuzziness_is_zero_when_classes_collapse_and_infinite_without_signal():
    y = np.repeat(np.arange(3), 5)
    collapsed = np.eye(3)[y] * 2.0
    assert separation_fuzziness(collapsed, y) == pytest.approx(0.0, abs=1e-12)
    same_means = np.tile(np.array([[1.0, -1.0], [-1.0, 1.0]]), (6, 1))
    y2 = np.repeat(np.arange(2), 6)            # both classes hold the same two points
    assert separation_fuzziness(same_means, y2) == float("inf")


def test_residual_sanity():
    rng = np.random.default_rng(5)
    y = np.repeat(np.arange(4), 50)
    # Labels an exact affine function of the features: residual 0.
    assert least_squares_residual(np.eye(4)[y] @ rng.normal(size=(4, 4)), y) == pytest.approx(0.0, abs=1e-10)
    # Features independent of labels: the residual is close to 1 - d/(n-1) (only chance fit).
    noise = rng.normal(size=(200, 3))
    assert least_squares_residual(noise, y) == pytest.approx(1 - 3 / 199, abs=0.04)
    # Equals 1 - R^2 of an explicit regression with an intercept column.
    x, yb = _blobs(rng)
    design = np.hstack([x, np.ones((x.shape[0], 1))])
    onehot = np.eye(yb.max() + 1)[yb]
    beta = np.linalg.solve(design.T @ design, design.T @ onehot)
    ref = np.sum((onehot - design @ beta) ** 2) / np.sum((onehot - onehot.mean(0)) ** 2)
    assert least_squares_residual(x, yb) == pytest.approx(ref, rel=1e-8)


def test_geometric_decay_recovers_rho():
    rho, d0 = 0.63, 40.0
    seq = d0 * rho ** np.arange(7)
    fit = fit_geometric_decay(seq)
    assert fit.rho == pytest.approx(rho, rel=1e-10)
    assert fit.intercept == pytest.approx(np.log(d0), rel=1e-10)
    assert fit.r_squared == pytest.approx(1.0)
    noisy = seq * np.exp(np.random.default_rng(6).normal(scale=0.05, size=seq.size))
    fit_noisy = fit_geometric_decay(noisy)
    assert fit_noisy.rho == pytest.approx(rho, rel=0.05)
    assert 0.9 < fit_noisy.r_squared < 1.0


@pytest.mark.parametrize("bad", [[1.0], [1.0, 0.0], [1.0, -2.0], [1.0, float("nan")]])
def test_geometric_decay_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="values"):
        fit_geometric_decay(bad)


def test_separation_profile_fits_decay_over_layers():
    rng = np.random.default_rng(7)
    x, y = _blobs(rng, spread=1.0)
    # Later "layers" shrink within-class spread: fuzziness must decrease layer by layer.
    layers = {f"block{i}": x + (0.5 ** i) * rng.normal(size=x.shape) for i in range(4)}
    rows, decay, note = separation_profile(layers, y)
    assert [r.layer for r in rows] == list(layers)
    assert note is None and decay is not None and decay.rho < 1.0
    fuzz = [r.fuzziness for r in rows]
    assert all(a > b for a, b in zip(fuzz, fuzz[1:]))
    _, none_decay, why = separation_profile({"only": x}, y)
    assert none_decay is None and "at least 2 layers" in why


@pytest.mark.parametrize("fn", [separation_fuzziness, fisher_separability, least_squares_residual])
def test_measures_reject_bad_input(fn):
    with pytest.raises(ValueError, match="at least 2 classes"):
        fn(np.ones((4, 2)), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="labels must be a 1-D array of length 4"):
        fn(np.ones((4, 2)), np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="NaN or inf"):
        fn(np.full((4, 2), np.nan), np.array([0, 0, 1, 1]))


def test_relative_feature_change_and_distortion():
    rng = np.random.default_rng(8)
    x_tr, y_tr = _blobs(rng, n_per=20)
    x_te, y_te = _blobs(np.random.default_rng(8), n_per=20)
    x_te = x_te + 0.1 * rng.normal(size=x_te.shape)
    assert relative_feature_change(x_tr, x_tr) == 0.0
    delta = rng.normal(size=x_tr.shape)
    assert relative_feature_change(x_tr, x_tr + delta) == pytest.approx(
        np.sqrt((delta ** 2).sum()) / np.sqrt((x_tr ** 2).sum()))
    scrambled_tr = rng.normal(size=x_tr.shape) * 3
    scrambled_te = rng.normal(size=x_te.shape) * 3
    res = feature_distortion(train_features=[x_tr, x_tr * 2.0, scrambled_tr], train_labels=y_tr,
                             test_features=[x_te, x_te * 2.0, scrambled_te], test_labels=y_te, k=5)
    assert res.relative_change_train[0] == 0.0 and res.relative_change_test[0] == 0.0
    assert res.relative_change_train[1] == pytest.approx(1.0)
    # Scaling leaves cosine k-NN unchanged; destroying the features drops accuracy to chance level.
    assert res.knn_accuracy[1].correct == res.knn_accuracy[0].correct
    assert res.knn_accuracy[0].accuracy > 0.9 > 0.5 > res.knn_accuracy[2].accuracy
    with pytest.raises(ValueError, match="same examples"):
        relative_feature_change(x_tr, x_tr[:-1])
    with pytest.raises(ValueError, match="equal length"):
        feature_distortion(train_features=[x_tr], train_labels=y_tr, test_features=[], test_labels=y_te)
