"""RMIA: ties broken by the likelihood ratio (hand-made vectors), offline ``a`` chosen on reference models only."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special

from attacks.metrics import roc_curve
from attacks.registry import AttackInputs
from attacks.rmia import (A_GRID, RmiaOffline, RmiaOnline, break_ties, log_mean_prob, pairwise_fraction_above,
                          tie_summary, tune_offline_a)
from foundation.errors import UserError


def test_ties_on_a_hand_made_vector():
    log_ratio_x = np.array([5.0, 3.0, 3.0, -1.0, 10.0])
    z = np.array([0.0, 1.0, 2.0])
    frac = pairwise_fraction_above(log_ratio_x, z, log_gamma=0.0)
    assert frac.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert tie_summary(frac) == {"tied": 4, "largest": 4, "top": 4}
    broken = break_ties(np.rint(frac * 3), log_ratio_x, 3)
    # different counts keep their order; the four tied at the top are ordered by their ratio; equal ratios stay tied
    assert np.argsort(-broken, kind="stable").tolist() == [4, 0, 1, 2, 3]
    assert broken[1] == broken[2] and tie_summary(broken) == {"tied": 2, "largest": 2, "top": 1}
    assert (0 < broken).all() and (broken < 1).all()


def _world(a_star: float, *, n=600, k=9, m=400, noise=0.3, seed=0):
    """Examples whose IN probability is exactly a_star * p_out + 1 - a_star: the paper's approximation of Pr(x)
    is exact at a = a_star (a planted optimum)."""
    rng = np.random.default_rng(seed)

    def logit(p, size):
        return np.log(p) - np.log1p(-np.minimum(p, 1 - 1e-12)) + noise * rng.normal(size=size)

    p_out = rng.uniform(0.02, 0.9, n)
    p_in = a_star * p_out + 1 - a_star
    keep = rng.random((k, n)) < 0.5
    z_out = rng.uniform(0.02, 0.9, m)
    member = rng.random(n) < 0.5
    inputs = AttackInputs(target=logit(np.where(member, p_in, p_out), n)[:, None],
                          reference=logit(np.where(keep, p_in, p_out), (k, n))[..., None], reference_in=keep,
                          pop_target=logit(z_out, m)[:, None],
                          pop_reference=logit(np.broadcast_to(z_out, (k, m)), (k, m))[..., None])
    return inputs, member


def test_tie_breaking_orders_like_the_ratio_and_keeps_the_paper_order():
    inputs, _ = _world(0.5, m=25, seed=3)
    for attack in (RmiaOnline, RmiaOffline):
        kw = {} if attack is RmiaOnline else {"a": 0.5}
        kept, info_kept = attack(ties="keep", **kw).score_with_info(inputs)
        broken, info = attack(**kw).score_with_info(inputs)
        assert info_kept["ties_before_breaking"] == info["ties_before_breaking"]
        assert info["ties_before_breaking"]["top"] > 1 and info["ties_after"]["top"] == 1
        hi, lo = np.nonzero(kept[:, None] > kept[None, :])
        assert (broken[hi] > broken[lo]).all()                      # the paper's order between counts is kept
    # the tie-broken online score ranks exactly as the target's likelihood ratio (the dense-population limit)
    broken = RmiaOnline().score(inputs)
    ref = log_mean_prob(inputs.reference)
    log_ratio = log_mean_prob(inputs.target) - (special.logsumexp(ref, axis=0) - np.log(len(ref)))
    assert np.array_equal(np.unique(broken, return_inverse=True)[1], np.unique(log_ratio, return_inverse=True)[1])


@pytest.mark.parametrize("a_star", [0.5, 0.8])
def test_tuned_a_recovers_a_planted_optimum(a_star):
    inputs, member = _world(a_star)
    best, aucs = tune_offline_a(inputs)
    assert best == a_star and list(aucs) == list(A_GRID)
    scores, info = RmiaOffline().score_with_info(inputs)
    assert info["a"] == a_star and info["a_tuning"]["grid"] == list(A_GRID)
    assert "pseudo-target" in info["a_tuning"]["chosen_on"]
    fpr, tpr, _ = roc_curve(scores, member)
    assert tpr[np.searchsorted(fpr, 0.1, side="right") - 1] > 0.5


def test_tuning_never_reads_the_target():
    inputs, _ = _world(0.5, seed=4)
    other = AttackInputs(target=-inputs.target, reference=inputs.reference, reference_in=inputs.reference_in,
                         pop_target=-inputs.pop_target, pop_reference=inputs.pop_reference)
    assert RmiaOffline().score_with_info(inputs)[1]["a_tuning"] == RmiaOffline().score_with_info(other)[1]["a_tuning"]


def test_auto_a_without_keep_masks_names_the_fix():
    inputs, _ = _world(0.5, n=50, m=20)
    no_masks = AttackInputs(target=inputs.target, reference=inputs.reference)
    with pytest.raises(UserError, match="rmia_offline_a"):
        RmiaOffline().score(no_masks)
    assert RmiaOffline(a=0.3).score_with_info(no_masks)[1]["a"] == 0.3
    with pytest.raises(ValueError, match="'auto'"):
        RmiaOffline(a=1.5)
