"""Tests for the attack registry, LiRA, RMIA and the baselines, against closed forms and naive loops."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from attacks import registry
from attacks.baselines import AttackP, CalibratedLoss, LossAttack
from attacks.lira import LiraOffline, LiraOnline
from attacks.metrics import auc, roc_curve
from attacks.registry import (
    Attack,
    AttackInputs,
    available_attacks,
    build_attack,
    get_attack_class,
    leave_one_out,
    register_attack,
)
from attacks.rmia import RmiaOffline, RmiaOnline
from foundation.errors import UserError

ALL_ATTACKS = ("loss", "attack_p", "calibrated_loss", "lira_online", "lira_offline", "rmia_online",
               "rmia_offline")


def gaussian_world(*, n, k, a=1, d=2.0, m=0, seed=0, sigma=1.0, spread=2.0):
    """Per-example Gaussian signals: OUT ~ N(mu_i, sigma^2), IN ~ N(mu_i + d * sigma, sigma^2)."""
    rng = np.random.default_rng(seed)
    mu_out = rng.normal(0.0, spread, size=(n, 1))
    keep = rng.random((k, n)) < 0.5
    ref = mu_out + d * sigma * keep[..., None] + sigma * rng.normal(size=(k, n, a))
    member = rng.random(n) < 0.5
    target = mu_out + d * sigma * member[:, None] + sigma * rng.normal(size=(n, a))
    kw = {}
    if m:
        mu_z = rng.normal(0.0, spread, size=(m, 1))
        kw = {"pop_target": mu_z + sigma * rng.normal(size=(m, a)),
              "pop_reference": mu_z + sigma * rng.normal(size=(k, m, a))}
    return AttackInputs(target=target, reference=ref, reference_in=keep, **kw), member


# ------------------------------------------------------------------------------------------------ registry


def test_registry_lists_every_attack_with_one_contract():
    assert set(ALL_ATTACKS) <= set(available_attacks())
    for name in ALL_ATTACKS:
        cls = get_attack_class(name)
        assert issubclass(cls, Attack) and cls.name == name
        assert isinstance(cls.needs_reference, bool) and isinstance(cls.online, bool)
        attack = build_attack(name)
        assert dataclasses.is_dataclass(attack)
        with pytest.raises(dataclasses.FrozenInstanceError):
            attack.seed = 3  # type: ignore[misc]
    assert get_attack_class("lira_online").online and not get_attack_class("lira_offline").online
    assert get_attack_class("rmia_online").online and not get_attack_class("rmia_offline").online
    assert not get_attack_class("loss").needs_reference and get_attack_class("lira_offline").needs_reference


def test_registry_rejects_unknown_and_duplicate_names():
    with pytest.raises(ValueError, match="unknown attack 'lira'.*lira_offline, lira_online"):
        get_attack_class("lira")
    with pytest.raises(ValueError, match="no parameter.*variance.*valid: fix_variance"):
        build_attack("lira_online", variance=True)
    with pytest.raises(ValueError, match="already registered"):
        register_attack("loss")(LossAttack)
    with pytest.raises(ValueError, match="only Attack subclasses"):
        register_attack("not_an_attack")(int)
    with pytest.raises(ValueError, match="non-empty string"):
        register_attack("")
    assert "not_an_attack" not in available_attacks()

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Twice(LossAttack):
        pass

    try:
        register_attack("_test_twice")(Twice)
        with pytest.raises(ValueError, match="'_test_twice' is already registered"):
            register_attack("_test_twice")(Twice)
    finally:
        registry._REGISTRY.pop("_test_twice", None)


def test_parameters_are_validated():
    with pytest.raises(ValueError, match="min_refs must be an integer >= 2"):
        LiraOnline(min_refs=1)
    with pytest.raises(ValueError, match="location must be"):
        LiraOffline(location="mode")
    with pytest.raises(ValueError, match="statistic must be"):
        LiraOffline(statistic="pvalue")
    with pytest.raises(ValueError, match=r"a must be a number in \[0, 1\]"):
        RmiaOffline(a=1.5)
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):
        RmiaOnline(gamma=0.0)
    with pytest.raises(ValueError, match="n_population must be None or an integer >= 1"):
        RmiaOnline(n_population=0)


def test_inputs_are_validated():
    with pytest.raises(ValueError, match=r"reference must have shape \(K, 3, 2\)"):
        AttackInputs(target=np.zeros((3, 2)), reference=np.zeros((4, 3, 1)))
    with pytest.raises(ValueError, match="NaN"):
        AttackInputs(target=np.array([[np.nan]]))
    with pytest.raises(ValueError, match="reference_in must be boolean"):
        AttackInputs(target=np.zeros((3, 1)), reference=np.zeros((2, 3, 1)), reference_in=np.full((2, 3), 2))
    with pytest.raises(ValueError, match=r"reference_in must have shape \(2, 3\)"):
        AttackInputs(target=np.zeros((3, 1)), reference=np.zeros((2, 3, 1)), reference_in=np.ones((3, 2), bool))
    with pytest.raises(ValueError, match="pop_reference must have shape"):
        AttackInputs(target=np.zeros((3, 1)), reference=np.zeros((2, 3, 1)), pop_target=np.zeros((5, 1)),
                     pop_reference=np.zeros((2, 4, 1)))
    inputs = AttackInputs(target=np.zeros(3))          # 1-D target is read as A = 1
    assert inputs.target.shape == (3, 1) and inputs.n_reference == 0
    for name in ALL_ATTACKS:
        if get_attack_class(name).needs_reference:
            with pytest.raises(UserError, match="needs reference models"):
                build_attack(name).score(inputs)
    no_masks = AttackInputs(target=np.zeros((3, 1)), reference=np.zeros((4, 3, 1)))
    with pytest.raises(UserError, match="keep masks"):
        LiraOnline().score(no_masks)


# ---------------------------------------------------------------------------------- sign conventions


@pytest.mark.parametrize("name", ALL_ATTACKS)
def test_every_attack_scores_members_higher(name):
    inputs, member = gaussian_world(n=600, k=16, a=2, d=3.0, m=300, seed=1, spread=0.5)
    scores = build_attack(name).score(inputs)
    assert scores.shape == (600,) and np.isfinite(scores).all()
    assert auc(scores, member) > 0.85, name
    scores2, info = build_attack(name).score_with_info(inputs)
    np.testing.assert_array_equal(scores, scores2)
    assert isinstance(info, dict)


# ------------------------------------------------------------------- LiRA vs the Neyman-Pearson optimum


@pytest.mark.parametrize(("attack", "a", "k"), [
    (LiraOnline(), 1, 64), (LiraOnline(fix_variance=True), 1, 64), (LiraOffline(), 1, 64),
    (LiraOffline(fix_variance=True), 1, 64), (LiraOnline(fix_variance=True), 2, 256)],
    ids=["online", "online-fixvar", "offline", "offline-fixvar", "online-fixvar-2aug"])
def test_lira_attains_the_neyman_pearson_roc(attack, a, k):
    # Equal variances, per-example means: the optimal test thresholds the likelihood ratio, linear in
    # sum_a (phi_a - mu_out_i); its ROC is TPR = Phi(Phi^-1(FPR) + d_eff), AUC = Phi(d_eff / sqrt(2)) with
    # d_eff = d sqrt(A) for A independent queries. Online LiRA averages per-query log ratios, which is that
    # statistic; offline LiRA is optimal for one query (a monotone function of phi - mu_out). Estimating the
    # means from k references costs a little power, less with more references.
    d_eff = 1.75
    inputs, member = gaussian_world(n=10000, k=k, a=a, d=d_eff / math.sqrt(a), seed=2)
    scores = attack.score(inputs)
    assert auc(scores, member) == pytest.approx(stats.norm.cdf(d_eff / math.sqrt(2)), abs=0.01)
    fpr, tpr, _ = roc_curve(scores, member)
    for t in (0.01, 0.05, 0.2):
        optimum = stats.norm.cdf(stats.norm.ppf(t) + d_eff)
        assert tpr[fpr <= t].max() == pytest.approx(optimum, abs=0.04), t
    # a signal that ignores per-example difficulty is far from optimal here
    assert auc(LossAttack().score(inputs), member) < stats.norm.cdf(d_eff / math.sqrt(2)) - 0.1


# ------------------------------------------------------------------------------ naive reference loops


def _naive_side(ref, mask, i, aug, *, fix_variance, location, min_refs):
    """(mu, var) of one example, one augmentation, one side, by plain Python loops."""
    k, n, _ = ref.shape
    vals = [ref[j, i, aug] for j in range(k) if mask[j, i]]
    if len(vals) < min_refs:
        allv = [ref[j, e, aug] for e in range(n) for j in range(k) if mask[j, e]]
        g = sum(allv) / len(allv)
        return g, max(sum((v - g) ** 2 for v in allv) / (len(allv) - 1), 1e-12)
    mu = sum(vals) / len(vals) if location == "mean" else float(np.median(vals))
    if fix_variance:
        num = den = 0.0
        for e in range(n):
            ve = [ref[j, e, aug] for j in range(k) if mask[j, e]]
            if len(ve) >= 2:
                me = sum(ve) / len(ve)
                num += sum((v - me) ** 2 for v in ve)
                den += len(ve) - 1
        var = num / den
    else:
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return mu, max(var, 1e-12)


def _small_world(seed=3, n=30, k=10, a=3, m=25):
    rng = np.random.default_rng(seed)
    keep = rng.random((k, n)) < 0.5
    keep[:, 0] = False            # example 0: no IN reference  -> IN fallback
    keep[:, 1] = False
    keep[0, 1] = True             # example 1: one IN reference -> IN fallback
    keep[:, 2] = True             # example 2: no OUT reference -> OUT fallback
    ref = rng.normal(0, 2, size=(k, n, a)) + 1.5 * keep[..., None]
    target = rng.normal(0, 2, size=(n, a))
    pop_t = rng.normal(0, 2, size=(m, a))
    pop_r = rng.normal(0, 2, size=(k, m, a))
    pop_keep = rng.random((k, m)) < 0.3
    return AttackInputs(target=target, reference=ref, reference_in=keep, pop_target=pop_t,
                        pop_reference=pop_r, pop_reference_in=pop_keep)


@pytest.mark.parametrize("fix_variance", [False, True])
@pytest.mark.parametrize("location", ["mean", "median"])
@pytest.mark.parametrize("min_refs", [2, 4])
def test_lira_online_equals_naive_loop(fix_variance, location, min_refs):
    inp = _small_world()
    ref, keep = inp.reference, inp.reference_in
    scores, info = LiraOnline(fix_variance=fix_variance, location=location, min_refs=min_refs
                              ).score_with_info(inp)
    want = []
    for i in range(inp.n):
        per_aug = []
        for aug in range(inp.n_augmentations):
            kw = dict(fix_variance=fix_variance, location=location, min_refs=min_refs)
            mi, vi = _naive_side(ref, keep, i, aug, **kw)
            mo, vo = _naive_side(ref, ~keep, i, aug, **kw)
            x = inp.target[i, aug]
            per_aug.append(stats.norm.logpdf(x, mi, math.sqrt(vi)) - stats.norm.logpdf(x, mo, math.sqrt(vo)))
        want.append(sum(per_aug) / len(per_aug))
    np.testing.assert_allclose(scores, want, rtol=1e-9, atol=1e-9)
    assert info["n_fallback_in"] == int((keep.sum(0) < min_refs).sum()) >= 2
    assert info["n_fallback_out"] == int(((~keep).sum(0) < min_refs).sum()) >= 1


@pytest.mark.parametrize("fix_variance", [False, True])
@pytest.mark.parametrize("statistic", ["neg_log_pvalue", "log_cdf"])
@pytest.mark.parametrize("with_masks", [True, False])
@pytest.mark.parametrize("location", ["median", "mean"])
def test_lira_offline_equals_naive_loop(fix_variance, statistic, with_masks, location):
    inp = _small_world(seed=4)
    if not with_masks:
        inp = dataclasses.replace(inp, reference_in=None, pop_reference=None, pop_reference_in=None,
                                  pop_target=None)
    out = ~inp.reference_in if with_masks else np.ones(inp.reference.shape[:2], bool)
    kw = {} if location == "median" else {"location": "mean"}     # the default is the LiRA code's median
    scores = LiraOffline(fix_variance=fix_variance, statistic=statistic, **kw).score(inp)
    want = []
    for i in range(inp.n):
        per_aug = []
        for aug in range(inp.n_augmentations):
            mo, vo = _naive_side(inp.reference, out, i, aug, fix_variance=fix_variance, location=location,
                                 min_refs=2)
            x = inp.target[i, aug]
            if statistic == "neg_log_pvalue":
                per_aug.append(-stats.norm.logsf(x, mo, math.sqrt(vo)))
            else:
                per_aug.append(stats.norm.logcdf(x, mo, math.sqrt(vo)))
        want.append(sum(per_aug) / len(per_aug))
    np.testing.assert_allclose(scores, want, rtol=1e-9, atol=1e-9)


def _sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v))


def _naive_rmia(inp, *, online, a, gamma, use_pop, n_population=None, seed=0):
    k = inp.n_reference

    def pr_theta(row):
        return sum(_sigmoid(v) for v in row) / len(row)

    def pr(ref, keep, i):
        per_model = [pr_theta(ref[j, i]) for j in range(k)]
        if online:
            return sum(per_model) / k
        outs = [p for j, p in enumerate(per_model) if keep is None or not keep[j, i]]
        if not outs:
            return sum(per_model) / k
        return ((1 + a) * (sum(outs) / len(outs)) + (1 - a)) / 2

    rx = [pr_theta(inp.target[i]) / pr(inp.reference, inp.reference_in, i) for i in range(inp.n)]
    if use_pop:
        m = inp.pop_target.shape[0]
        rz = [pr_theta(inp.pop_target[i]) / pr(inp.pop_reference, inp.pop_reference_in, i) for i in range(m)]
    else:
        rz = list(rx)
    if n_population is not None and len(rz) > n_population:
        pick = np.sort(np.random.default_rng(seed).choice(len(rz), n_population, replace=False))
        rz = [rz[j] for j in pick]
    return np.array([sum(1 for z in rz if x / z > gamma) / len(rz) for x in rx])


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("gamma", [1.0, 2.0])
@pytest.mark.parametrize("use_pop", [True, False])
def test_rmia_equals_naive_loop(online, gamma, use_pop):
    inp = _small_world(seed=5)
    if not use_pop:
        inp = dataclasses.replace(inp, pop_target=None, pop_reference=None, pop_reference_in=None)
    attack = RmiaOnline(gamma=gamma, ties="keep") if online else RmiaOffline(gamma=gamma, a=0.4, ties="keep")
    scores, info = attack.score_with_info(inp)
    want = _naive_rmia(inp, online=online, a=0.4, gamma=gamma, use_pop=use_pop)
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-12)
    assert info["population"] == ("pop_target" if use_pop else "queried")
    if not online:
        assert info["n_fallback"] == 1          # example 2 has no OUT reference


@pytest.mark.parametrize("a", [0.0, 1.0])
def test_rmia_offline_subsampled_population_and_edge_a(a):
    inp = _small_world(seed=6, m=40)
    scores = RmiaOffline(a=a, n_population=17, seed=9, ties="keep").score(inp)
    want = _naive_rmia(inp, online=False, a=a, gamma=1.0, use_pop=True, n_population=17, seed=9)
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-12)


def test_rmia_is_finite_and_monotone_when_probabilities_underflow():
    # p_y = sigmoid(phi) ~ e^-800 underflows in float64; log-space keeps the ratios.
    rng = np.random.default_rng(7)
    target = np.linspace(-900.0, -700.0, 50)[:, None]
    ref = np.full((8, 50, 1), -800.0)
    inp = AttackInputs(target=target, reference=ref, reference_in=rng.random((8, 50)) < 0.5,
                       pop_target=rng.uniform(-900, -700, size=(30, 1)), pop_reference=np.full((8, 30, 1), -800.0))
    for attack in (RmiaOnline(), RmiaOffline(a=1.0)):
        s = attack.score(inp)
        assert np.isfinite(s).all() and (np.diff(s) >= 0).all() and s[-1] > s[0]


def test_baselines_equal_naive_loops():
    inp = _small_world(seed=8)
    n, a = inp.target.shape

    def loss(row):
        return sum(math.log1p(math.exp(-v)) for v in row) / len(row)

    np.testing.assert_allclose(LossAttack().score(inp), [-loss(inp.target[i]) for i in range(n)], rtol=1e-12)
    pop = [loss(r) for r in inp.pop_target]
    want_p = [(sum(1 for q in pop if q > loss(inp.target[i])) + 0.5 * sum(1 for q in pop if q == loss(inp.target[i])))
              / len(pop) for i in range(n)]
    np.testing.assert_allclose(AttackP().score(inp), want_p, rtol=0, atol=1e-12)
    keep, ref = inp.reference_in, inp.reference
    out_losses = [loss(ref[j, i]) for i in range(n) for j in range(ref.shape[0]) if not keep[j, i]]
    want_c = []
    for i in range(n):
        outs = [loss(ref[j, i]) for j in range(ref.shape[0]) if not keep[j, i]]
        base = sum(outs) / len(outs) if outs else sum(out_losses) / len(out_losses)
        want_c.append(base - loss(inp.target[i]))
    scores, info = CalibratedLoss().score_with_info(inp)
    np.testing.assert_allclose(scores, want_c, rtol=1e-10, atol=1e-12)
    assert info["n_fallback"] == 1


def test_attack_p_ties_and_queried_population():
    inp = AttackInputs(target=np.array([[1.0], [1.0], [0.0], [-1.0]]))
    s, info = AttackP().score_with_info(inp)
    assert info == {"population": "queried", "n_population": 4}
    # losses rank: phi=1 (tied pair) are lowest; each sees the other 2 above and itself+twin tied
    np.testing.assert_allclose(s, [0.75, 0.75, 0.375, 0.125])


# -------------------------------------------------------------------------------------- leave-one-out


def test_leave_one_out_matches_manual_rounds():
    rng = np.random.default_rng(10)
    m_models, n = 6, 80
    keep = rng.random((m_models, n)) < 0.5
    phi = rng.normal(size=(m_models, n, 2)) + 2.0 * keep[..., None]
    pop = rng.normal(size=(m_models, 20, 2))
    results = leave_one_out(RmiaOffline(), phi, keep, pop_phi=pop, targets=[1, 4])
    assert len(results) == 2
    for (scores, membership), t in zip(results, [1, 4]):
        others = [j for j in range(m_models) if j != t]
        manual = RmiaOffline().score(AttackInputs(target=phi[t], reference=phi[others], reference_in=keep[others],
                                                  pop_target=pop[t], pop_reference=pop[others]))
        np.testing.assert_array_equal(scores, manual)
        np.testing.assert_array_equal(membership, keep[t])
    all_rounds = leave_one_out(LiraOnline(), phi, keep)
    assert len(all_rounds) == m_models
    assert np.mean([auc(r.scores, r.membership) for r in all_rounds]) > 0.8
    with pytest.raises(ValueError, match="at least 2 models"):
        leave_one_out(LossAttack(), phi[:1], keep[:1])
    with pytest.raises(ValueError, match=r"targets must be model indices in \[0, 6\)"):
        leave_one_out(LossAttack(), phi, keep, targets=[6])


@pytest.mark.parametrize("name", ALL_ATTACKS)
def test_float32_signals_give_the_float64_scores(name):
    inp = _small_world(seed=12)
    f32 = {f.name: (getattr(inp, f.name).astype(np.float32) if f.name in ("target", "reference", "pop_target",
                                                                         "pop_reference") else getattr(inp, f.name))
           for f in dataclasses.fields(inp)}
    inp32 = AttackInputs(**f32)
    assert inp32.reference.dtype == np.float32
    inp64 = AttackInputs(**{k: (v.astype(np.float64) if k in ("target", "reference", "pop_target", "pop_reference")
                                else v) for k, v in f32.items()})
    np.testing.assert_allclose(build_attack(name).score(inp32), build_attack(name).score(inp64), rtol=1e-12,
                               atol=1e-12)
