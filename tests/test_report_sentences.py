"""What the report says is what the run did: each sentence checked on a run that produced it.

- every deciding ceiling below the claim: "could not have detected a violation of this claim", never "supports";
- an import with no estimate: no "at least ε" sentence;
- TPR at or below its FPR: "no better than random guessing", never "recognises ... while wrongly flagging only";
- a non-DP target: reference models "without DP", never "DP included"; queries counted as recorded;
- "code trusted" says no code ran when the run names none (audit run trusts your own config);
- a vendor run with an auditor's canary package: its canaries were all members, and the share is the real one;
- `audit run`'s summary names the strongest attack by the report's definition.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import audit
from audit.canaries.secret import make_canaries, write_canaries
from audit.config import load_run_config
from audit.pipeline import run_pipeline
from audit.reporting import build_report, load_run
from fixtures_runs import make_run, update_json
from test_auditor_canaries import _cfg as vendor_config
from training.trainer import train

TINY = {
    "name": "said",
    "data": {"dataset": "digits", "pool_size": 200, "test_size": 120},
    "model": {"arch": "mlp"},
    "privacy": {"noise_multiplier": 0.3, "delta": 1e-4},   # a large claimed ε: 200 examples cannot reach it
    "optim": {"name": "sgd", "lr": 0.5, "momentum": 0.9},
    "training": {"steps": 6, "batch_size": 32, "progress": False},
    "attack": {"n_reference": 2, "attacks": ["loss", "lira_online", "rmia_offline"], "population": 50,
               "n_bootstrap": 20, "executor": "sequential", "flip": False},
    "epsilon": {"sources": ["pool"], "attack": "lira_online"},
    "variants": {"dp": {}, "nondp": {"privacy.enabled": False, "privacy.noise_multiplier": None}},
}


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("said")
    data = json.loads(json.dumps(TINY))
    data["output_dir"] = str(tmp / "results")
    (tmp / "cfg.yaml").write_text(yaml.safe_dump(data))
    results = run_pipeline(config=load_run_config(tmp / "cfg.yaml"), progress=False, log=lambda m: None)
    return {r.run_dir.name.split("-")[-1]: r for r in results}


def _report(run_dir: Path):
    return build_report(load_run(run_dir))


def test_ceiling_below_the_claim_reads_inconclusive(tiny_runs) -> None:
    run_dir = tiny_runs["dp"].run_dir
    verdict = json.loads((run_dir / "epsilon.json").read_text())["verdict"]
    assert verdict["status"] == "CONSISTENT" and verdict["inconclusive_above"] is not None   # the case itself
    assert verdict["max_ceiling"] < verdict["claimed_epsilon"]
    g = _report(run_dir).glance
    assert "could not have detected a violation of this claim" in g.summary
    assert "supports the claim" not in g.summary and "proves" not in g.summary
    assert g.headline.startswith("Inconclusive")
    md = audit.report(run_dir).markdown.read_text()
    assert "could not have detected a violation of this claim" in md
    s = tiny_runs["dp"].summary
    assert s["inconclusive_above"] == pytest.approx(verdict["inconclusive_above"])


def test_non_dp_threat_model_and_queries_say_what_ran(tiny_runs) -> None:
    run_dir = tiny_runs["nondp"].run_dir
    report = _report(run_dir)
    text = " ".join(report.threat.paragraphs)
    assert "without DP, as the target was trained" in text and "DP included" not in text
    augs = json.loads((run_dir / "attack.json").read_text())["setup"]["augmentations"]
    assert augs == ["identity"] and "each queried once (as it is)" in text and "several" not in text
    dp_text = " ".join(_report(tiny_runs["dp"].run_dir).threat.paragraphs)
    assert "DP-SGD included, with the target's noise" in dp_text


def test_code_trusted_says_no_code_ran_when_the_run_names_none(tiny_runs) -> None:
    items = dict(_report(tiny_runs["dp"].run_dir).provenance.items)
    attack_code = json.loads((tiny_runs["dp"].run_dir / "attack.json").read_text())["code"]
    assert attack_code["trust_code"] is True and attack_code["names_code"] == []   # audit run trusts its config
    assert items["code trusted"].startswith("no (not needed")
    assert "--trust-code" not in items["code trusted"]


def test_summary_names_the_strongest_attack_as_the_report_does(tiny_runs) -> None:
    for r in tiny_runs.values():
        assert r.summary["strongest_attack"] == _report(r.run_dir).attacks.strongest


def test_import_with_no_estimate_states_no_lower_bound(tmp_path) -> None:
    from audit.importer import import_checkpoint, parse_source
    from foundation.io import save_safetensors
    from training.config import ModelConfig
    from training.models import build_model

    net = build_model(ModelConfig(arch="mlp"), num_classes=10, input_shape=(3, 8, 8)).module
    weights = save_safetensors(tmp_path / "w.safetensors", net.state_dict())
    out = tmp_path / "ext"
    import_checkpoint(weights=weights, arch="mlp", members=parse_source("digits:train", limit=40),
                      nonmembers=parse_source("digits:test", limit=40), out=out, device="cpu")
    eps = audit.epsilon(out)                               # no scores.npz: the pool source is skipped
    assert eps.verdict.best_method is None and eps.estimates == ()
    g = _report(out).glance
    assert "at least" not in g.summary and "0.000" not in g.summary
    assert "no differential-privacy claim" in g.summary


@pytest.mark.parametrize("ratio, chance", [(0.97, True), (1.0, True), (5.0, False)])
def test_tpr_at_or_below_its_fpr_is_chance_not_success(tmp_path, ratio, chance) -> None:
    run = make_run(tmp_path / "r", attacks=("loss",), pool_size=4000)
    level = _report(run).glance.glance_fpr
    tpr = ratio * level        # 0.97 x FPR: the "recognises 0.97 % while wrongly flagging only 1 %"
    key = next(k for k in json.loads((run / "attack.json").read_text())["attacks"]["loss"]["metrics"]["tpr_at_fpr"]
               if float(k) == level)
    update_json(run, "attack.json", lambda d: d["attacks"]["loss"]["metrics"]["tpr_at_fpr"].update({key: tpr}))
    summary = _report(run).glance.summary
    assert "wrongly flagging only" not in summary
    assert ("no better than random guessing" in summary) is chance
    assert ("recognises" in summary) is (not chance)


def test_vendor_membership_counts_the_package_canaries_as_members(tmp_path) -> None:
    secret = make_canaries(count=40, num_classes=4, image_size=(8, 8), seed=3, salt="5a" * 32)
    paths = write_canaries(tmp_path / "kit", secret)
    result = train(vendor_config(tmp_path, paths["package"]))  # the vendor flow's tiny config
    membership = np.load(result.run_dir / "membership.npy")
    n_pkg = int(secret.included.sum())
    assert membership[-n_pkg:].all() or membership.sum() >= n_pkg      # the package is trained on whole
    text = _report(result.run_dir).claim.membership
    assert f"all {n_pkg:,} canaries of the auditor's package were included" in text
    assert f"{membership.sum() / membership.size * 100:.2f}% of the pool" in text
    assert f"each of the {membership.size - n_pkg:,} images of its own data" in text


def test_opacus_auditor_run_report_has_no_dead_hints(tmp_path) -> None:
    """An OpacusAuditor run (the user's own model class) cannot be attacked or transferred by auditors, so its report
    never tells the user to run `audit attack RUN` / `audit transfer RUN` (both exit 2 on it)."""
    import torch
    from opacus import PrivacyEngine
    from sklearn.datasets import load_digits
    from torch import nn

    d = load_digits()
    x = torch.tensor(d.images[:200], dtype=torch.float32).unsqueeze(1) / 16
    y = torch.tensor(d.target[:200])
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=50),
        noise_multiplier=1.0, max_grad_norm=1.0)
    auditor = audit.OpacusAuditor(optimizer, engine, loader, run_dir=tmp_path / "run", gradient_canaries=50,
                                  delta=1e-5)
    for xb, yb in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        optimizer.step()
    run = auditor.finish(model, test_accuracy=0.5)
    paths = audit.report(run.run_dir)
    for text in (paths.markdown.read_text(), paths.html.read_text()):
        assert "audit attack" not in text and "audit transfer" not in text
        assert "your own class" in text
    from click.testing import CliRunner

    from audit.cli import main

    for args in (["attack", str(run.run_dir)], ["transfer", str(run.run_dir), "--suite",
                                                 "eval_configs/transfer/digits.yaml"]):
        res = CliRunner().invoke(main, args)   # both refuse, saying why in one line (no dead hint)
        assert res.exit_code == 2 and "is your own model class" in res.output, res.output
        assert "create the run with" not in res.output and "use one of" not in res.output
