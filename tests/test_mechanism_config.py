"""`audit mechanism CONFIG`: the mechanism a training config describes, audited without a finished run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from audit.cli import main
from audit.mechanism.config_target import config_claim
from audit.mechanism.result import read_mechanism
from fixtures_runs import TINY_TRAIN, make_run, update_json
from training.config import apply_overrides, validate_config

BASE = apply_overrides(TINY_TRAIN, {"privacy.noise_multiplier": None, "privacy.target_epsilon": 4.0,
                                    "privacy.delta": None, "data.audit_split": True})


def _write(tmp_path: Path, data: dict, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**data, "output_dir": str(tmp_path / "results")}))
    return path


def test_the_config_claim_is_the_claim_training_writes(tmp_path):
    from training.trainer import train

    data = apply_overrides(BASE, {"training.steps": None, "training.epochs": 1.5})
    cfg = validate_config({**data, "output_dir": str(tmp_path)})
    claim = config_claim(cfg)
    p = train(cfg).manifest.privacy
    (ph,) = [ph for ph in p.phases if ph.dp]
    assert (ph.steps, ph.batch_size, ph.sampling, ph.clipping) == (claim.steps, claim.batch_size, claim.sampling,
                                                                    claim.clipping)
    assert math.isclose(ph.sample_rate, claim.sample_rate) and math.isclose(ph.noise_multiplier,
                                                                            claim.noise_multiplier)
    assert math.isclose(p.delta, claim.delta) and math.isclose(p.epsilon, claim.epsilon, rel_tol=1e-9)
    assert claim.steps == math.ceil(1.5 * claim.n / 32) and claim.members_per_run == min(1000, claim.n)


@pytest.mark.parametrize("engine,clipping", [("hooks", "flat"), ("bk", "per_layer")])
def test_command_on_a_config_writes_mechanism_json_with_the_verdict(tmp_path, engine, clipping):
    path = _write(tmp_path, apply_overrides(BASE, {"privacy.grad_sample_mode": engine, "privacy.clipping": clipping}))
    res = CliRunner().invoke(main, ["mechanism", str(path), "--trials", "2000"])
    assert res.exit_code == 0, res.output
    assert f"engine {engine}/{clipping}" in res.output and "verdict: CONSISTENT" in res.output
    out = tmp_path / "results" / "tiny-mechanism"
    m = read_mechanism(out)
    claim = config_claim(validate_config({**BASE, "privacy": {**BASE["privacy"], "grad_sample_mode": engine,
                                                              "clipping": clipping}}))
    assert m is not None and math.isclose(m.claimed_epsilon, claim.epsilon) and m.steps == claim.steps
    assert math.isclose(m.sample_rate, claim.sample_rate) and str(m.verdict.status) == "CONSISTENT"
    assert not (tmp_path / "results" / "tiny").exists()  # the run directory audit train will fill stays untouched
    js = CliRunner().invoke(main, ["mechanism", str(path), "--trials", "2000", "--json", "--out",
                                   str(tmp_path / "o"), "--set", "training.steps=4"])
    assert js.exit_code == 0, js.output
    assert json.loads(js.output)["steps"] == 4 and read_mechanism(tmp_path / "o") is not None


@pytest.mark.parametrize("change,words", [
    ({"privacy.enabled": False, "privacy.target_epsilon": None}, "makes no DP claim"),
    ({"training.recipe": "finetune"}, "audit mechanism RUN"),
    ({"training.batch_size": 100000, "training.physical_batch_size": 16}, "larger than the"),
    ({"privacy.grad_sample_mode": "ghost", "privacy.clipping": "per_layer"}, "ghost clipping supports"),
    ({"privacy.clippin": "flat"}, "clippin"),
])
def test_bad_configs_are_one_line_errors_and_write_nothing(tmp_path, change, words):
    path = _write(tmp_path, apply_overrides(BASE, change))
    res = CliRunner().invoke(main, ["mechanism", str(path), "--trials", "2000"])
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists()


def test_options_that_do_not_apply_are_refused(tmp_path):
    path = _write(tmp_path, BASE)
    for args in (["--canaries-per-run", "100"], ["--sigma", "1"]):
        res = CliRunner().invoke(main, ["mechanism", str(path), *args])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(main, ["mechanism", "--sigma", "2", "--sample-rate", "1", "--steps", "2", "--delta",
                                    "1e-5", "--set", "a=1"])
    assert res.exit_code == 2 and "CONFIG file only" in res.output


@pytest.mark.parametrize("recipe,words", [("opacus", "auditor.audit_mechanism()"), ("external", "imported")])
def test_runs_not_trained_by_the_engine_are_refused(tmp_path, recipe, words):
    run = make_run(tmp_path / "run", epsilon=4.5, with_epsilon=False, with_transfer=False)
    update_json(run, "manifest.json", lambda d: d["training"].update(recipe=recipe), resign=False)
    res = CliRunner().invoke(main, ["mechanism", str(run), "--trials", "2000"])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output, res.output
    assert read_mechanism(run) is None


def test_public_api_takes_the_config_path_as_the_command_does(tmp_path):
    """``audit.audit_config_mechanism(path, overrides=...)`` is ``audit mechanism CONFIG --set ...`` in Python: the
    same config read the same way, the same seeded audit."""
    import audit
    from audit.mechanism.config_target import load_train_config
    from foundation.errors import UserError

    assert "audit_config_mechanism" in audit.__all__
    path = _write(tmp_path, BASE)
    claim, r = audit.audit_config_mechanism(path, trials=2000, overrides=["training.steps=4"], out=tmp_path / "o")
    cfg = load_train_config(path, overrides=["training.steps=4"])
    claim2, r2 = audit.audit_config_mechanism(cfg, trials=2000)
    assert claim == claim2 and claim.steps == 4 and r.epsilon_lb == r2.epsilon_lb
    assert read_mechanism(tmp_path / "o").epsilon_lb == r.epsilon_lb
    with pytest.raises(UserError, match="overrides and variant apply to a config file path"):
        audit.audit_config_mechanism(cfg, overrides=["training.steps=4"])
