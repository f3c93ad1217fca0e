"""Resolution and ties on hand-made score vectors: what a ROC over N non-members can say at low FPR."""

from __future__ import annotations

import numpy as np
import pytest

from attacks.metrics import tpr_at_fpr
from attacks.resolution import format_tpr, min_resolvable_fpr, not_resolvable, resolvable
from attacks.rmia import break_ties, pairwise_fraction_above


@pytest.mark.parametrize("fpr,n,ok", [(0.001, 1000, True), (0.001, 999, False), (0.0001, 690, False),
                                      (0.01, 100, True), (0.01, 99, False), (1.0, 1, True), (0.5, 0, False)])
def test_resolvable_is_fpr_times_n_at_least_one(fpr, n, ok):
    assert resolvable(fpr, n) is ok
    text = format_tpr(0.123, fpr, n)
    assert text == ("12.3%" if ok else f"not resolvable with {n:,} non-members")


def test_the_issue_case_690_non_members():
    assert not_resolvable(690) == "not resolvable with 690 non-members"
    assert min_resolvable_fpr(690) == pytest.approx(1 / 690) and min_resolvable_fpr(0) == float("inf")
    assert format_tpr(0.5, 0.01, 690, digits=2, interval=(0.25, 0.75)) == "50.00% [25.00%, 75.00%]"


def test_a_top_tie_group_hides_the_low_fpr_levels_and_breaking_it_restores_them():
    # 100 non-members, 10 members. A population of 3 gives every example above all z the same fraction 1.0:
    # 6 members and 2 non-members tie at the top, so TPR at 1 % FPR (1 false positive allowed) is 0.
    log_ratio = np.r_[np.linspace(10, 5, 6), np.linspace(-1, -2, 4), [4.0, 3.5], np.linspace(-3, -10, 98)]
    member = np.r_[np.ones(10, bool), np.zeros(100, bool)]
    z = np.array([0.0, 1.0, 2.0])
    frac = pairwise_fraction_above(log_ratio, z, log_gamma=0.0)
    assert (frac == 1.0).sum() == 8
    assert tpr_at_fpr(frac, member, (0.01,))[0.01] == 0.0
    broken = break_ties(np.rint(frac * 3), log_ratio, 3)
    assert tpr_at_fpr(broken, member, (0.01,))[0.01] == 0.6           # the 6 members above every non-member
    assert tpr_at_fpr(broken, member, (0.01,)) == tpr_at_fpr(log_ratio, member, (0.01,))
