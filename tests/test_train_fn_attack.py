"""``audit.attack(run, train_fn=...)`` (issue 34, "attacks for code we did not write"): an ``OpacusAuditor`` run over
an ``audit.AuditPool`` gets LiRA and RMIA with reference models trained by the user's own function.

- the README's Opacus flow end to end at toy size: every attack scored; on a deliberately overfitting MLP, LiRA and
  RMIA beat chance (the lower end of their AUC interval > 0.5); ``audit epsilon`` uses the pool's scores; the
  report names the training function and holds no command that would refuse the run;
- the ``member_indices`` and ``seed`` handed to ``train_fn`` are the recorded ones (a naive loop over the same
  streams), and the target's signals equal a by-hand scaled logit of its verified weights;
- the evidence is signed and re-used (a second call does not call ``train_fn``);
- a wrong return value, a run without a pool, a batched executor: one line each, nothing left half-made.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

import audit
from attacks.shadows import balanced_keep_masks, shadow_seeds
from foundation.errors import UserError
from foundation.evidence import read_signed_npz, verify_json
from foundation.files import ATTACK_FILE, SHADOW_DIR, SIGNALS_FILE

pytest.importorskip("opacus")

K = 8


def _data(n: int = 200) -> TensorDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[:n], dtype=torch.float32).unsqueeze(1) / 16
    return TensorDataset(x, torch.tensor(d.target[:n]))


def _net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def fit(data, seed: int, run_dir=None, *, epochs: int = 25, canaries=None):
    """The user's own Opacus training (tiny σ, many epochs on ~100 examples: it overfits); with ``run_dir`` the
    auditor is attached and the run written, else the trained model is returned."""
    from opacus import PrivacyEngine

    torch.manual_seed(seed)
    model = _net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="rdp")  # cheap at the tiny σ of this overfitting toy
        model, opt, loader = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
            data_loader=DataLoader(data, batch_size=25), noise_multiplier=0.1, max_grad_norm=5.0)
        auditor = (audit.OpacusAuditor(opt, engine, loader, run_dir=run_dir, gradient_canaries=64, delta=1e-5, seed=0,
                                       input_canaries=canaries)
                   if run_dir is not None else None)
        for _ in range(epochs):
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
    return auditor.finish(model) if auditor is not None else model


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """(run directory, the train_fn's calls, the attack result, the dataset) after one attack."""
    train = _data()
    run = fit(audit.AuditPool(train, seed=3), seed=1, run_dir=tmp_path_factory.mktemp("t") / "my-run")
    calls = []

    def train_fn(member_indices, seed):
        calls.append((np.array(member_indices), seed))
        return fit(Subset(train, member_indices), seed)

    res = audit.attack(run.run_dir, train_fn=train_fn, overrides={"attack.n_reference": K})
    return run.run_dir, calls, res, train


def test_every_attack_scored_and_lira_rmia_beat_chance(attacked):
    run_dir, calls, res, _ = attacked
    assert len(calls) == K
    names = set(res.scores)
    assert {"lira_online", "lira_offline", "rmia_online", "rmia_offline", "loss"} <= names
    for name in ("lira_offline", "lira_offline_fixed_var", "rmia_online", "rmia_offline"):
        m = res.report.attacks[name].metrics
        assert m.auc_ci[0] > 0.5, (name, m.auc, m.auc_ci)   # fails when the attack sees nothing
    assert res.report.setup.reference_training.startswith("train_fn ")
    assert res.report.setup.n_reference == K and res.report.setup.executor == "sequential"
    u = res.report.utility
    assert u.train_accuracy > u.test_accuracy  # the toy overfits, measured by the auditor on the pool


def test_epsilon_uses_the_pool_and_the_report_has_no_dead_hints(attacked):
    run_dir, *_ = attacked
    eps = audit.epsilon(run_dir)
    assert {"pool", "gradient_canaries"} <= {e.source for e in eps.estimates}
    paths = audit.report(run_dir)
    for path in (paths.markdown, paths.html):
        text = path.read_text()
        for dead in ("audit attack ", "audit transfer ", "audit train "):
            assert dead not in text, (path.name, dead)
    md = paths.markdown.read_text()
    assert "your own training code" in md and "reference models" in md
    assert paths.report.attacks.ran and paths.report.attacks.strongest
    from pathlib import Path

    policy = Path(__file__).resolve().parents[1] / "eval_configs" / "gates" / "default.yaml"
    gate = audit.gate(run_dir, run_dir, policy=policy)    # every rule decided on the auditor's attack results
    by_rule = {r.rule: r for r in gate.rules}
    assert by_rule["max_auc"].passed is not None and by_rule["max_claimed_epsilon"].passed is False  # ε ≈ 4000
    assert gate.strongest_attack["candidate"] == paths.report.attacks.strongest


def test_a_pooled_run_is_hinted_to_the_api_before_its_attack(tmp_path):
    run_dir, _ = _small_run(tmp_path)
    audit.epsilon(run_dir)
    paths = audit.report(run_dir)
    for text in (paths.markdown.read_text(), paths.html.read_text()):
        assert "train_fn=train_fn)" in text and "audit attack " not in text and "audit transfer " not in text


def test_train_fn_gets_the_recorded_members_and_seeds(attacked):
    """Against a naive loop over the same streams as attacks.shadows, and the files written."""
    run_dir, calls, _, train = attacked
    n = len(train)
    keep = balanced_keep_masks(K, n, rng=[0, 0x4B454550])
    seeds = shadow_seeds(K, 0)
    for k, (members, seed) in enumerate(calls):
        assert members.dtype == np.int64 and np.array_equal(members, np.flatnonzero(keep[k]))
        assert seed == seeds[k]
    assert np.array_equal(np.load(run_dir / SHADOW_DIR / "keep.npy"), keep)
    index = json.loads((run_dir / SHADOW_DIR / "index.json").read_text())
    index = verify_json(index, path=run_dir / SHADOW_DIR / "index.json", remake="",
                        identity={"pool_fingerprint": index["pool_fingerprint"]})   # signed by this auditor
    assert index["seeds"] == seeds and index["complete"] and len(index["models"]) == K


def test_target_signals_equal_a_by_hand_scaled_logit(attacked):
    run_dir, _, _, train = attacked
    from safetensors.torch import load_file

    sig = read_signed_npz(run_dir / SIGNALS_FILE, remake="")
    model = _net()
    model.load_state_dict(load_file(str(run_dir / "model.safetensors")))
    model.eval()
    x = torch.stack([train[i][0] for i in range(len(train))])
    y = torch.stack([train[i][1] for i in range(len(train))])
    with torch.no_grad():
        logp = torch.log_softmax(model(x).double(), dim=1)
    by_hand = [float(logp[i, y[i]] - torch.logsumexp(torch.cat([logp[i, :y[i]], logp[i, y[i] + 1:]]), 0))
               for i in range(len(y))]
    assert sig["pool"].shape == (K + 1, len(train), 1)
    np.testing.assert_allclose(sig["pool"][0, :, 0], by_hand, atol=2e-4)
    membership = np.load(run_dir / "membership.npy")
    assert np.array_equal(membership[:len(train)], audit.AuditPool(train, seed=3).membership)


def test_second_call_reuses_the_signed_evidence(attacked):
    run_dir, _, res, train = attacked
    calls = []

    def train_fn(member_indices, seed):  # same qualified name as the fixture's: its models are re-used
        calls.append(seed)
        return fit(Subset(train, member_indices), seed)

    train_fn.__qualname__ = "attacked.<locals>.train_fn"
    again = audit.attack(run_dir, train_fn=train_fn, overrides={"attack.n_reference": K})
    assert calls == [] and again.shadows_trained == 0
    np.testing.assert_array_equal(again.scores["lira_online"], res.scores["lira_online"])


def _small_run(tmp_path, *, pooled: bool = True):
    train = _data(60)
    data = audit.AuditPool(train, seed=0) if pooled else train
    return fit(data, seed=0, run_dir=tmp_path / "run", epochs=1).run_dir, train


@pytest.mark.parametrize("returned, words", [
    (lambda m, opt: None, "returned None for reference model 0"),
    (lambda m, opt: (m, opt), "returned a tuple"),
    (lambda m, opt: m.state_dict(), "a mapping (a state_dict?)"),
    (lambda m, opt: nn.Linear(64, 10), "whose weights do not match the target's"),
    (lambda m, opt: opt, "returned a SGD"),
])
def test_wrong_return_is_one_line_and_nothing_is_left(tmp_path, returned, words):
    run_dir, train = _small_run(tmp_path)

    def train_fn(member_indices, seed):
        model = _net()
        return returned(model, torch.optim.SGD(model.parameters(), lr=0.1))

    with pytest.raises(UserError) as err:
        audit.attack(run_dir, train_fn=train_fn, overrides={"attack.n_reference": 2})
    assert words in str(err.value) and "\n" not in str(err.value)
    assert not (run_dir / ATTACK_FILE).exists() and not (run_dir / SIGNALS_FILE).exists()
    assert not (run_dir / SHADOW_DIR / "0").exists()   # no model half-kept; the index says incomplete
    assert json.loads((run_dir / SHADOW_DIR / "index.json").read_text())["complete"] is False


def test_wrong_output_shape_and_refusals(tmp_path):
    run_dir, train = _small_run(tmp_path)

    def five_outputs(member_indices, seed):  # the target's class and weights, but 5 logits per input
        net = _net()
        net.forward = lambda x: nn.Sequential.forward(net, x)[:, :5]
        return net

    with pytest.raises(UserError, match=r"gives \(60, 5\) for a batch of 60 pool inputs; it must return \(60, 10\)"):
        audit.attack(run_dir, train_fn=five_outputs, overrides={"attack.n_reference": 2})
    with pytest.raises(UserError, match="executor 'batched' cannot run a train_fn"):
        audit.attack(run_dir, train_fn=five_outputs, executor="batched", overrides={"attack.n_reference": 2})
    with pytest.raises(UserError, match="must be a function"):
        audit.attack(run_dir, train_fn="fit", overrides={"attack.n_reference": 2})
    with pytest.raises(UserError, match=r"audit\.attack\(.*train_fn=train_fn\)"):   # the command points to the API
        audit.attack(run_dir)
    assert not (run_dir / SHADOW_DIR / "0").exists()


def test_a_run_without_a_pool_is_refused_and_never_hinted(tmp_path):
    run_dir, train = _small_run(tmp_path, pooled=False)
    with pytest.raises(UserError, match="records no pool: its training set was not an audit.AuditPool"):
        audit.attack(run_dir, train_fn=lambda idx, seed: fit(Subset(train, idx), seed, epochs=1),
                     overrides={"attack.n_reference": 2})
    audit.epsilon(run_dir)
    text = audit.report(run_dir).markdown.read_text()
    assert "train_fn=" not in text and "audit.attack(" not in text and "audit attack " not in text


def test_input_canaries_follow_the_pool_and_the_command_points_to_the_api(tmp_path):
    """CanaryDataset over an AuditPool: membership = the pool's draw, then each canary's inclusion; both the pool's
    attack scores and the input canaries reach audit epsilon; the audit attack command exits 2 in one line naming
    the Python call."""
    from click.testing import CliRunner

    from audit.cli import main

    train = _data(60)
    pool = audit.AuditPool(train, seed=0)
    data = audit.CanaryDataset(pool, count=20, kind="ood", num_classes=10, seed=1)
    run = fit(data, seed=0, run_dir=tmp_path / "run", epochs=2, canaries=data)
    membership = np.load(run.run_dir / "membership.npy")
    assert np.array_equal(membership, np.concatenate([pool.membership, data.included]))
    assert run.manifest.data.canaries["first_index"] == 60 and run.manifest.data.membership.scheme == "bernoulli"
    res = audit.attack(run.run_dir, train_fn=lambda idx, seed: fit(Subset(train, idx), seed, epochs=2),
                       overrides={"attack.n_reference": 2})
    assert res.membership.shape == (60,) and np.array_equal(res.membership, pool.membership)
    sources = {e.source for e in audit.epsilon(run.run_dir).estimates}
    assert {"pool", "input_canaries", "gradient_canaries"} <= sources
    out = CliRunner().invoke(main, ["attack", str(run.run_dir)])
    assert out.exit_code == 2 and "audit.attack(" in out.output and "train_fn=train_fn" in out.output
    assert out.output.strip().count("\n") == 0, out.output


def test_audit_pool_queries_and_an_edited_pool(tmp_path):
    """A randomly augmenting dataset is refused before training (naming queries=); queries= records the clean
    view; a pool.npz edited after training is refused in one line."""
    from opacus import PrivacyEngine

    from foundation.errors import CheckpointError

    train = _data(40)

    class Jitter(torch.utils.data.Dataset):
        def __len__(self):
            return len(train)

        def __getitem__(self, i):
            x, y = train[i]
            return x + 0.01 * torch.randn_like(x), y

    model = _net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = PrivacyEngine().make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(audit.AuditPool(Jitter(), seed=0), batch_size=10), noise_multiplier=1.0,
            max_grad_norm=1.0)
    with pytest.raises(ValueError, match="queries=dataset_with_the_test_transform"):
        audit.OpacusAuditor(opt, PrivacyEngine(), loader, run_dir=tmp_path / "x")
    pool = audit.AuditPool(Jitter(), seed=0, queries=train)
    x, _ = pool.arrays()
    assert np.array_equal(x, torch.stack([train[i][0] for i in range(len(train))]).numpy())
    with pytest.raises(ValueError, match="same order"):
        audit.AuditPool(Jitter(), queries=_data(10))

    run_dir, small = _small_run(tmp_path)
    with np.load(run_dir / "pool.npz") as z:
        x, y = z["x"].copy(), z["y"].copy()
    x[0] += 1.0
    np.savez(run_dir / "pool.npz", x=x, y=y)
    with pytest.raises(CheckpointError, match="pool.npz is missing or does not match the sha256"):
        audit.attack(run_dir, train_fn=lambda idx, seed: fit(Subset(small, idx), seed, epochs=1),
                     overrides={"attack.n_reference": 2})


def test_an_interrupted_call_resumes_with_the_missing_models(tmp_path):
    """A train_fn that fails at model 2 of 4: the next call trains only models 2 and 3, and its signals equal those
    of all four trained afresh (retrain_shadows=True)."""
    run_dir, train = _small_run(tmp_path)
    calls, fail = [], {"at": 2}

    def train_fn(member_indices, seed):
        if len(calls) == fail["at"]:
            fail["at"] = -1
            raise RuntimeError("interrupted")
        calls.append(seed)
        return fit(Subset(train, member_indices), seed, epochs=1)

    with pytest.raises(RuntimeError, match="interrupted"):
        audit.attack(run_dir, train_fn=train_fn, overrides={"attack.n_reference": 4})
    resumed = audit.attack(run_dir, train_fn=train_fn, overrides={"attack.n_reference": 4})
    assert resumed.shadows_trained == 2 and len(calls) == 4
    phi = read_signed_npz(run_dir / SIGNALS_FILE, remake="")["pool"]
    fresh = audit.attack(run_dir, train_fn=train_fn, retrain_shadows=True, overrides={"attack.n_reference": 4})
    assert fresh.shadows_trained == 4 and len(calls) == 8
    np.testing.assert_allclose(read_signed_npz(run_dir / SIGNALS_FILE, remake="")["pool"], phi, atol=1e-5)
