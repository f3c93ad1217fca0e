"""audit.OpacusAuditor on a plain Opacus script (digits): the claim it records, the verdicts, what it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import audit
from audit.bounds.runner import run_epsilon
from audit.config import EpsilonConfig

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(d.target)


def user_script(run_dir, *, sigma=1.0, steps=40, canaries=500, claimed_epsilon=None, input_canaries=0,
                ghost=False, bmm=False, seed=0, n=240, mode=None):
    """A plain Opacus training script of the kind users write, plus the auditor lines (marked)."""
    from opacus import PrivacyEngine
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    torch.manual_seed(seed)
    x, y = _digits()
    train = torch.utils.data.TensorDataset(x[:n], y[:n])
    test = torch.utils.data.TensorDataset(x[1200:], y[1200:])
    if input_canaries:  # auditor line: wrap the dataset before the DataLoader
        train = audit.CanaryDataset(train, count=input_canaries, kind="mislabel", source=test, num_classes=10, seed=seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loader = torch.utils.data.DataLoader(train, batch_size=120)
    engine = PrivacyEngine(accountant="rdp")
    kw = dict(grad_sample_mode="ghost", criterion=nn.CrossEntropyLoss()) if ghost else {}
    if mode is not None:
        kw = dict(grad_sample_mode=mode)
    out = engine.make_private(module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=sigma,
                              max_grad_norm=1.0, noise_generator=torch.Generator().manual_seed(seed), **kw)
    if ghost:  # ghost clipping also returns the criterion that runs the second backward pass
        model, optimizer, criterion, loader = out
    else:
        (model, optimizer, loader), criterion = out, nn.CrossEntropyLoss()
    auditor = None
    if canaries or input_canaries:  # auditor line
        auditor = audit.OpacusAuditor(optimizer, engine, loader, run_dir=run_dir, gradient_canaries=canaries,
                                      input_canaries=train if input_canaries else None, seed=seed, delta=1e-5,
                                      claimed_epsilon=claimed_epsilon)
    step = 0
    while step < steps:
        batches = BatchMemoryManager(data_loader=loader, max_physical_batch_size=32, optimizer=optimizer) if bmm \
            else None
        with (batches if bmm else _null(loader)) as it:
            for xb, yb in it:
                optimizer.zero_grad()
                loss = criterion(model(xb), yb)
                loss.backward()
                optimizer.step()
                if not bmm or not optimizer._is_last_step_skipped:
                    step += 1
                if step >= steps:
                    break
    with torch.no_grad():
        acc = float((model(x[1200:]).argmax(1) == y[1200:]).float().mean())
    result = auditor.finish(model, test_accuracy=acc) if auditor is not None else None
    return result, engine, acc


class _null:
    def __init__(self, it):
        self.it = it

    def __enter__(self):
        return self.it

    def __exit__(self, *a):
        return False


def _gradient_bounds(report):
    return {e.estimate.method: e.estimate.epsilon_lb for e in report.estimates if e.source == "gradient_canaries"}


def test_claim_equals_engine_epsilon_and_pld(tmp_path):
    result, engine, _ = user_script(tmp_path / "run", sigma=1.0, steps=30, canaries=50, n=1200)
    p = result.manifest.privacy
    assert p.epsilon == engine.get_epsilon(1e-5)  # the engine's own accountant, same number
    assert p.accountant == "rdp" and p.phases[0].steps == 30 and math.isclose(p.phases[0].sample_rate, 0.1)
    pld = p.epsilon_cross_check["epsilon"]
    assert pld <= p.epsilon and (p.epsilon - pld) / pld < 0.25  # RDP is a valid, looser upper bound than PLD
    rec = result.manifest.training["gradient_canaries"]
    assert rec["count"] == 50 and rec["steps"] == 30 and rec["added"] > 0


def test_noise_off_is_a_violation_and_honest_noise_is_consistent(tmp_path):
    broken, _, _ = user_script(tmp_path / "broken", sigma=0.0, steps=40, claimed_epsilon=1.0)
    rep = run_epsilon(run_dir=broken.run_dir, config=EpsilonConfig(sources=("gradient_canaries",)))
    assert str(rep.verdict.status) == "VIOLATION"
    assert _gradient_bounds(rep)["one_run"] > 1.0  # the canaries alone refute ε = 1, not only the claim check
    honest, engine, _ = user_script(tmp_path / "honest", sigma=1.0, steps=40)
    rep = run_epsilon(run_dir=honest.run_dir, config=EpsilonConfig(sources=("gradient_canaries",)))
    assert str(rep.verdict.status) == "CONSISTENT", rep.verdict.notes
    assert 0.0 <= _gradient_bounds(rep)["one_run"] <= engine.get_epsilon(1e-5)


def test_canaries_cost_little_accuracy(tmp_path):
    accs = {}
    for m in (0, 1000):
        _, _, accs[m] = user_script(tmp_path / f"m{m}", sigma=1.0, steps=40, canaries=m, n=1200)
    assert accs[0] > 0.6  # the script learns
    assert abs(accs[1000] - accs[0]) < 0.05, accs


def test_canary_sum_is_what_opacus_noises(tmp_path):
    """With σ = 0 the update is exactly lr·(clipped sum + sampled canaries)/B: the canaries enter the sum once."""
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    x, y = _digits()
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:100], y[:100]), batch_size=100)
    engine = PrivacyEngine()
    model, opt, loader = engine.make_private(module=model, optimizer=opt, data_loader=loader, noise_multiplier=0.0,
                                             max_grad_norm=1.0, poisson_sampling=False)
    auditor = audit.OpacusAuditor(opt, engine, loader, run_dir=tmp_path / "r", gradient_canaries=4, seed=3,
                                  delta=1e-5, claimed_epsilon=1.0)
    auditor.canaries.included[:] = True
    before = [p.detach().clone() for p in opt.params]
    xb, yb = next(iter(loader))
    clipped = []
    for i in range(len(xb)):  # the obviously correct reference: one example at a time, clipped to C = 1
        model._module.zero_grad()
        nn.functional.cross_entropy(model._module(xb[i:i + 1]), yb[i:i + 1]).backward()
        g = [p.grad.detach().clone() for p in model._module.parameters()]
        norm = torch.sqrt(sum((t ** 2).sum() for t in g))
        clipped.append([t * min(1.0, 1.0 / (float(norm) + 1e-6)) for t in g])
    opt.zero_grad()
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
    idx = auditor.canaries.sampled(0, sample_rate=1.0)
    extra = auditor.canaries.gradient(idx, scale=1.0, device="cpu")
    for k, p in enumerate(opt.params):
        want = before[k] - (sum(c[k] for c in clipped) + extra[k]) / 100
        torch.testing.assert_close(p.detach(), want, atol=1e-5, rtol=1e-4)
    assert idx.size == 4 and auditor.canaries_added == 4


def test_ghost_clipping_and_batch_memory_manager(tmp_path):
    ghost, _, _ = user_script(tmp_path / "ghost", sigma=0.0, steps=20, canaries=100, claimed_epsilon=1.0, ghost=True)
    bmm, engine, _ = user_script(tmp_path / "bmm", sigma=1.0, steps=10, canaries=100, bmm=True)
    assert ghost.manifest.privacy.phases[0].grad_sample_mode == "ghost"
    rep = run_epsilon(run_dir=ghost.run_dir, config=EpsilonConfig(sources=("gradient_canaries",)))
    assert _gradient_bounds(rep)["one_run"] > 1.0  # canaries reach the ghost-clipped sum
    assert bmm.manifest.privacy.phases[0].steps == 10  # one canary draw per logical step, not per physical batch
    assert bmm.manifest.privacy.epsilon == engine.get_epsilon(1e-5)


@pytest.mark.parametrize("mode", ["hooks", "functorch"])
def test_manifest_records_the_grad_sample_mode_used(tmp_path, mode):
    run, _, _ = user_script(tmp_path / mode, steps=2, canaries=10, mode=mode)
    assert run.manifest.privacy.phases[0].grad_sample_mode == mode


def test_input_canaries_recorded_scores_and_report(tmp_path):
    from safetensors.torch import load_file

    result, _, _ = user_script(tmp_path / "run", sigma=1.0, steps=20, canaries=100, input_canaries=40)
    run = result.run_dir
    rep = run_epsilon(run_dir=run, config=EpsilonConfig(sources=("pool", "input_canaries", "gradient_canaries")))
    assert {s.source for s in rep.skipped} == {"pool"}  # every real example is a member: no pool audit
    assert {e.source for e in rep.estimates} == {"input_canaries", "gradient_canaries"}
    assert str(rep.verdict.status) == "CONSISTENT"
    # the recorded scores are the scaled logits of the saved weights (the test rebuilds the user's class)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    model.load_state_dict(load_file(run / "model.safetensors"))
    z = np.load(run / "input_canaries.npz")
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.from_numpy(z["x"])).double(), 1)
    y = torch.from_numpy(z["y"])
    mine = logp[torch.arange(len(y)), y] - torch.logsumexp(logp.scatter(1, y[:, None], -np.inf), 1)
    np.testing.assert_allclose(z["phi"], mine.numpy(), rtol=1e-4, atol=1e-4)
    assert np.load(run / "membership.npy").sum() == 240 + z["included"].sum()
    paths = audit.report(run)
    assert "CONSISTENT" in paths.html.read_text()
    np.savez(run / "input_canaries.npz", **{**dict(z), "phi": -z["phi"]})  # tampered: refused
    with pytest.raises(audit_errors().CheckpointError, match="does not match the sha256"):
        run_epsilon(run_dir=run, config=EpsilonConfig(sources=("input_canaries",)))


def audit_errors():
    import foundation.errors

    return foundation.errors


def test_refusals(tmp_path):
    from opacus import PrivacyEngine

    x, y = _digits()
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    plain = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:100], y[:100]), batch_size=10)
    engine = PrivacyEngine()
    with pytest.raises(TypeError, match="DPOptimizer returned by PrivacyEngine.make_private"):
        audit.OpacusAuditor(plain, engine, loader, run_dir=tmp_path / "r")
    model, opt, dp_loader = engine.make_private(module=model, optimizer=plain, data_loader=loader,
                                                noise_multiplier=1.0, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="engine accounts q"):
        audit.OpacusAuditor(opt, engine, torch.utils.data.DataLoader(loader.dataset, batch_size=50), run_dir=tmp_path)
    with pytest.raises(ValueError, match="gradient_canaries must be"):
        audit.OpacusAuditor(opt, engine, dp_loader, run_dir=tmp_path / "r", gradient_canaries=1)
    xb, yb = next(iter(dp_loader))
    nn.functional.cross_entropy(model(xb), yb).backward()
    opt.step()
    with pytest.raises(ValueError, match="before the first optimizer.step"):
        audit.OpacusAuditor(opt, engine, dp_loader, run_dir=tmp_path / "r")


def test_dpddp_single_process(tmp_path):
    """DPDDP (gloo, world size 1): canaries join on rank 0, where Opacus adds the noise; rank 0 writes the run."""
    import torch.distributed as dist
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        x, y = _digits()
        model = DPDDP(nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:240], y[:240]), batch_size=120)
        engine = PrivacyEngine(accountant="rdp")
        model, opt, loader = engine.make_private(module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
                                                 data_loader=loader, noise_multiplier=0.0, max_grad_norm=1.0)
        assert type(opt).__name__ == "DistributedDPOptimizer"
        auditor = audit.OpacusAuditor(opt, engine, loader, run_dir=tmp_path / "run", gradient_canaries=500, seed=0,
                                      delta=1e-5, claimed_epsilon=1.0)
        for _ in range(20):
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
        run = auditor.finish(model)
    finally:
        dist.destroy_process_group()
    assert run.manifest.training["world_size"] == 1 and run.manifest.privacy.phases[0].steps == 40
    rep = run_epsilon(run_dir=run.run_dir, config=EpsilonConfig(sources=("gradient_canaries",)))
    assert _gradient_bounds(rep)["one_run"] > 1.0 and str(rep.verdict.status) == "VIOLATION"
