"""The mechanism audit of a user's Opacus set-up: honest ones CONSISTENT, each planted user bug a VIOLATION, through
audit.audit_opacus_mechanism and through OpacusAuditor.audit_mechanism on a script's finished run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import audit
from audit.mechanism.opacus_mutants import OPACUS_BUGS, opacus_setup
from audit.mechanism.opacus_target import audit_opacus_mechanism, opacus_sampler, shuffle_sampler
from audit.mechanism.result import read_mechanism
from foundation.errors import UserError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
FULL = dict(sigma=2.0, max_grad_norm=2.0, expected_batch_size=1000, sample_rate=1.0)  # C = 2: σ·C ≠ σ
POISSON = dict(sigma=1.0, max_grad_norm=1.0, expected_batch_size=100, sample_rate=0.1)


def _audit(setting: dict, bug: str | None, *, seed: int):
    s = opacus_setup(**setting, bug=bug)
    return audit_opacus_mechanism(optimizer_factory=s.optimizer_factory, sampler_factory=s.sampler_factory,
                                  noise_multiplier=s.noise_multiplier, sample_rate=setting["sample_rate"],
                                  steps=4 if setting["sample_rate"] == 1.0 else 20, delta=1e-5, trials=8000, seed=seed)


@pytest.mark.parametrize("bug", OPACUS_BUGS)
def test_each_planted_opacus_bug_is_a_violation(bug):
    r = _audit(POISSON if bug == "double_rate" else FULL, bug, seed=11)
    assert str(r.verdict.status) == "VIOLATION" and r.claim_refuted and r.epsilon_lb > r.claimed_epsilon, r


@pytest.mark.parametrize("setting", [FULL, POISSON], ids=["full", "poisson"])
def test_the_honest_opacus_setup_is_consistent(setting):
    r = _audit(setting, None, seed=11)
    assert str(r.verdict.status) == "CONSISTENT" and r.target == "opacus DPOptimizer" and r.tightness > 0.5, r


def test_a_sampler_that_misbehaves_is_a_one_line_error():
    s = opacus_setup(**FULL)
    with pytest.raises(UserError, match="outside"):
        audit_opacus_mechanism(optimizer_factory=s.optimizer_factory, sampler_factory=lambda n, g: [[n + 5]],
                               sample_rate=1.0, steps=2, delta=1e-5, trials=100, canaries_per_run=100)
    with pytest.raises(UserError, match="no batch"):
        audit_opacus_mechanism(optimizer_factory=s.optimizer_factory, sampler_factory=lambda n, g: [],
                               sample_rate=1.0, steps=2, delta=1e-5, trials=100, canaries_per_run=100)
    batches = list(shuffle_sampler(0.25)(8, torch.Generator().manual_seed(0)))
    assert [len(b) for b in batches] == [2] * 4 and sorted(sum(batches, [])) == list(range(8))


def _script(run_dir, *, sigma: float, batch_size: int, steps: int, claimed_epsilon: float | None = None):
    """A plain Opacus script (digits, an MLP, make_private, PRV accountant) with the auditor lines."""
    from opacus import PrivacyEngine
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    d = load_digits()
    x = torch.tensor(d.images[:240], dtype=torch.float32).reshape(240, 64) / 16.0
    data = torch.utils.data.TensorDataset(x, torch.tensor(d.target[:240]))
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    engine = PrivacyEngine(accountant="prv")
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=torch.utils.data.DataLoader(data, batch_size=batch_size), noise_multiplier=sigma,
        max_grad_norm=2.0, noise_generator=torch.Generator().manual_seed(0))
    auditor = audit.OpacusAuditor(optimizer, engine, loader, run_dir=run_dir, gradient_canaries=100, seed=0,
                                  delta=1e-5, claimed_epsilon=claimed_epsilon)
    done = 0
    while done < steps:
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    auditor.finish(model)
    return auditor


def test_opacus_auditor_run_is_consistent_and_recorded_in_the_run_directory_and_the_report(tmp_path):
    from audit.reporting import write_report

    auditor = _script(tmp_path / "run", sigma=2.0, batch_size=240, steps=4)  # q = 1: one batch per epoch
    r = auditor.audit_mechanism(trials=8000, seed=3)
    assert str(r.verdict.status) == "CONSISTENT" and r.target == "opacus DPOptimizer" and r.tightness > 0.75
    assert (r.noise_multiplier, r.sample_rate, r.steps, r.max_grad_norm) == (2.0, 1.0, 4, 2.0)
    assert read_mechanism(tmp_path / "run") == r  # signed, bound to the run's claim
    md = write_report(run_dir=tmp_path / "run", load_images=False,
                      generated="2025-01-02T03:04:05+00:00").markdown.read_text()
    assert "Mechanism audit (`audit mechanism`, opacus DPOptimizer, 8,000 Dirac-canary trials): **CONSISTENT**" in md


def test_opacus_auditor_catches_the_script_bugs(tmp_path):
    """Through the integration: the run's recorded claim, the script's optimizer or sampler broken as a user would."""
    from training.accounting import DPPhase, epsilon_for

    eps_sigma = epsilon_for(phases=[DPPhase(2.0, 1.0, 4)], delta=1e-5, accountant="prv")
    # σ × 0.8 given to make_private while the ε reported is the one computed for σ
    low = _script(tmp_path / "low", sigma=1.6, batch_size=240, steps=4, claimed_epsilon=eps_sigma)
    assert str(low.audit_mechanism(trials=8000, seed=3).verdict.status) == "VIOLATION"
    auditor = _script(tmp_path / "run", sigma=2.0, batch_size=240, steps=4)
    for bug in ("noise_without_C", "unclipped_group", "reused_noise"):
        s = opacus_setup(**FULL, bug=bug)
        r = auditor.audit_mechanism(s.optimizer_factory, trials=8000, seed=3)
        assert str(r.verdict.status) == "VIOLATION", bug
    poisson = _script(tmp_path / "poisson", sigma=1.0, batch_size=24, steps=20)  # q = 1/10
    assert str(poisson.audit_mechanism(trials=8000, seed=3).verdict.status) == "CONSISTENT"
    r = poisson.audit_mechanism(sampler_factory=opacus_sampler(0.2), trials=8000, seed=3)  # the loader at 2q
    assert str(r.verdict.status) == "VIOLATION" and read_mechanism(tmp_path / "poisson") == r


def test_opacus_auditor_mechanism_needs_a_finished_run(tmp_path):
    from opacus import PrivacyEngine

    model = nn.Linear(4, 2)
    engine = PrivacyEngine()
    data = torch.utils.data.TensorDataset(torch.zeros(8, 4), torch.zeros(8, dtype=torch.long))
    model, opt, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                             data_loader=torch.utils.data.DataLoader(data, batch_size=4),
                                             noise_multiplier=1.0, max_grad_norm=1.0)
    auditor = audit.OpacusAuditor(opt, engine, loader, run_dir=tmp_path / "r", gradient_canaries=10, seed=0)
    with pytest.raises(ValueError, match="finish"):
        auditor.audit_mechanism()
