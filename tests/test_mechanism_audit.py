"""The mechanism audit end to end on the project's DP engine and on Opacus optimizers, with planted bugs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from audit.mechanism.api import audit_mechanism, audit_opacus_mechanism
from audit.mechanism.engine_target import EngineSpec, engine_observations
from audit.mechanism.result import read_mechanism
from foundation.errors import UserError

warnings.filterwarnings("ignore", category=UserWarning)
FULL = dict(noise_multiplier=2.0, sample_rate=1.0, steps=4, delta=1e-5, max_grad_norm=2.0, trials=8000)
POISSON = dict(noise_multiplier=1.0, sample_rate=0.1, steps=20, delta=1e-5, trials=8000)


@pytest.mark.parametrize("mode", ["hooks", "bk"])
@pytest.mark.parametrize("clipping", ["flat", "per_layer", "automatic"])
def test_honest_engine_is_consistent_and_tight(clipping, mode):
    r = audit_mechanism(**FULL, clipping=clipping, grad_sample_mode=mode, seed=3)
    assert str(r.verdict.status) == "CONSISTENT" and not r.claim_refuted
    assert 0.75 < r.tightness <= 1.0


def test_observations_are_the_noisy_sums_along_each_canary():
    spec = EngineSpec(noise_multiplier=1e-4, sample_rate=1.0, steps=3, canaries=20)
    o = engine_observations(spec, seed=0)
    np.testing.assert_allclose(o.x, o.members[:, None] * np.ones((20, 3)), atol=1e-2)  # ≈ no noise: x = b


@pytest.mark.parametrize("mutant", ["noise_0.8", "noise_without_C", "unclipped_group", "reused_noise"])
@pytest.mark.parametrize("mode", ["hooks", "bk"])
def test_planted_bugs_are_violations(mutant, mode):
    r = audit_mechanism(**FULL, grad_sample_mode=mode, mutant=mutant, seed=1)
    assert str(r.verdict.status) == "VIOLATION" and r.claim_refuted and r.epsilon_lb > r.claimed_epsilon


def test_poisson_engine_honest_and_double_rate(tmp_path):
    ok = audit_mechanism(**POISSON, seed=2, run_dir=tmp_path)
    assert str(ok.verdict.status) == "CONSISTENT" and ok.tightness > 0.5
    assert read_mechanism(tmp_path) == ok
    bad = audit_mechanism(**POISSON, seed=2, mutant="double_rate")
    assert str(bad.verdict.status) == "VIOLATION"


def _opacus(sigma: float, C: float = 1.0, per_layer: bool = False):
    from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer

    def factory(params):
        if per_layer:
            return DPPerLayerOptimizer(torch.optim.SGD(params, lr=0.1), noise_multiplier=sigma,
                                       max_grad_norm=[C / 2 ** 0.5] * 2, expected_batch_size=1000)
        return DPOptimizer(torch.optim.Adam(params, lr=0.1), noise_multiplier=sigma, max_grad_norm=C,
                           expected_batch_size=1000)
    return factory


@pytest.mark.parametrize("per_layer", [False, True])
def test_opacus_optimizer_honest_and_with_a_smaller_noise_than_claimed(per_layer):
    ok = audit_opacus_mechanism(optimizer_factory=_opacus(2.0, per_layer=per_layer), sample_rate=1.0, steps=4,
                                delta=1e-5, trials=8000)
    assert str(ok.verdict.status) == "CONSISTENT" and ok.tightness > 0.75
    bad = audit_opacus_mechanism(optimizer_factory=_opacus(1.6, per_layer=per_layer), sample_rate=1.0, steps=4,
                                 delta=1e-5, trials=8000, claimed_epsilon=ok.claimed_epsilon)
    assert str(bad.verdict.status) == "VIOLATION"


def test_bad_arguments_are_one_line_user_errors():
    with pytest.raises(UserError, match="whole number"):
        audit_mechanism(noise_multiplier=1.0, sample_rate=0.003, steps=2, delta=1e-5, trials=100,
                        canaries_per_run=100)
    with pytest.raises(UserError, match="DPOptimizer"):
        audit_opacus_mechanism(optimizer_factory=lambda ps: torch.optim.SGD(ps, lr=1), sample_rate=1.0, steps=2,
                               delta=1e-5, trials=100, canaries_per_run=100)


def test_opacus_optimizer_with_opacus_poisson_sampler_is_consistent():
    from opacus.optimizers import DPOptimizer

    def factory(params):
        return DPOptimizer(torch.optim.SGD(params, lr=0.5), noise_multiplier=1.0, max_grad_norm=1.0,
                           expected_batch_size=100)  # q · m/2 = 0.1 · 1000
    r = audit_opacus_mechanism(optimizer_factory=factory, sample_rate=0.1, steps=20, delta=1e-5, trials=8000,
                               seed=5)
    assert str(r.verdict.status) == "CONSISTENT" and 0.4 < r.tightness <= 1.0
