"""Each result file (attack.json, epsilon.json, transfer.json): what its writer writes, its reader reads back equal;
a renamed or missing key, another format or an old layout is refused with one line naming the key and the remedy."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from attacks.attack_file import AttackEntry, AttackFile, AttackSetup, Utility, read_attack_file, write_attack_file
from attacks.results import evaluate_scores, loo_summary
from audit.bounds.epsilon_file import read_epsilon_file, write_epsilon_file
from audit.bounds.estimate import EpsilonEstimate
from audit.bounds.runner import EpsilonReport, SourcedEstimate, judge_estimates
from audit.bounds.sources import Skipped
from audit.bounds.verdict import Finding
from audit.transfer.transfer_file import read_transfer_file, write_transfer_file
from fixtures_runs import make_run, transfer_result, update_json
from foundation.errors import CheckpointError
from foundation.io import read_json
from training.run.manifest import read_manifest

#: The run identity the result files here are signed for (a stand-in; no run directory is involved).
ID = {"weights_sha256": "w" * 64, "membership_sha256": "m" * 64, "pool_fingerprint": "p" * 64}


def _attack_file(rng: np.random.Generator) -> AttackFile:
    y = rng.random(120) < 0.5
    labels = rng.integers(0, 3, 120)
    scores = rng.normal(size=120) + y
    scores[0] = np.inf  # non-finite scores and metrics survive the trip
    entry = AttackEntry.from_data({"params": {"attack": "loss"}, **evaluate_scores(
        scores, y, labels, n_boot=10, seed=0, top_k=3)})
    loo = AttackEntry.from_data({"params": {"attack": "lira_online", "fix_variance": False},
                                 **evaluate_scores(scores, y, labels, n_boot=0, seed=1, top_k=2),
                                 "leave_one_out": loo_summary([(scores, y), (-scores, y)])})
    return AttackFile(run="r", inputs={"weights_sha256": "a" * 64, "config_sha256": None},
                      setup=AttackSetup(n_reference=2, augmentations=["identity"], pool_size=120, n_members=int(y.sum()),
                                        n_population=0, evaluation="both", recipe_hash=None, executor=None,
                                        shadow_train_seconds=0.0),
                      attacks={"loss": entry, "lira_online": loo},
                      utility=Utility(test_accuracy=float("nan"), train_accuracy=None))


def _epsilon_report() -> EpsilonReport:
    est = EpsilonEstimate(method="one_run", epsilon_lb=2.5, alpha=0.05, delta=1e-5, counts={"m": 100, "r": 20, "v": 19},
                          ceiling=math.inf, extra={"k_pos": 10})
    info = EpsilonEstimate(method="gdp", epsilon_lb=0.5, alpha=0.05, delta=1e-5, counts={"n": 100}, ceiling=3.0,
                           assumptions="Gaussian trade-off curve")
    ests = (SourcedEstimate(source="pool", estimate=est, in_verdict=True, provenance={"attack": "loss"}),
            SourcedEstimate(source="pool", estimate=info, in_verdict=False))
    verdict = judge_estimates(claimed_epsilon=2.0, delta=1e-5, estimates=ests).with_findings(
        Finding(kind="claim_not_from_mechanism", severity="error", message="ε(PLD) = 3.1 > claimed ε = 2"))
    return EpsilonReport(run="r", inputs={"weights_sha256": "a" * 64, "scores_sha256": None}, claimed_epsilon=2.0,
                         delta=1e-5, alpha=0.05, estimates=ests, skipped=(Skipped("input_canaries", "none planted"),),
                         verdict=verdict)


def test_attack_json_round_trips(tmp_path: Path) -> None:
    data = _attack_file(np.random.default_rng(0))
    path = write_attack_file(tmp_path, data, identity=ID)
    back = read_attack_file(tmp_path)
    assert back.model_dump_json() == data.model_dump_json()  # equal, NaN included
    assert back.attacks["lira_online"].leave_one_out is not None and back.attacks["loss"].leave_one_out is None
    assert "leave_one_out" not in read_json(path)["attacks"]["loss"]  # absent, not null: the layout is unchanged
    assert read_json(path)["attacks"]["loss"]["roc"]["tpr"][-1] == 1.0


def test_epsilon_json_round_trips(tmp_path: Path) -> None:
    data = _epsilon_report().to_file()
    write_epsilon_file(tmp_path, data, identity=ID)
    back = read_epsilon_file(tmp_path)
    assert back == data
    assert back.verdict.status == "VIOLATION" and back.verdict.violating == ("one_run",)
    assert back.verdict.errors[0].kind == "claim_not_from_mechanism"
    assert [e.in_verdict for e in back.estimates] == [True, False] and math.isinf(back.estimates[0].ceiling)


def test_transfer_json_round_trips(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", with_transfer=False)
    data = transfer_result(run, read_manifest(run))
    write_transfer_file(run / "transfer.json", data, identity=ID)
    back = read_transfer_file(run)
    assert back == data
    assert set(read_json(run / "transfer.json")["datasets"][1]) == {"dataset", "name", "root", "status", "reason"}


def test_epsilon_format_1_is_migrated(tmp_path: Path) -> None:
    data = _epsilon_report().to_file().model_copy(update={"verdict": _epsilon_report().verdict.model_copy(
        update={"findings": ()})})
    write_epsilon_file(tmp_path, data, identity=ID)

    def to_v1(d: dict) -> None:
        d["format"] = "dp-audit-epsilon/1"
        for key in ("claimed_epsilon", "claimed_delta", "violating", "findings"):
            d["verdict"].pop(key)

    update_json(tmp_path, "epsilon.json", to_v1)
    assert read_epsilon_file(tmp_path) == data


_RENAMES: dict[str, tuple[Callable[[dict], None], str, str]] = {
    "attack.json": (lambda d: d["setup"].__setitem__("n_refs", d["setup"].pop("n_reference")), "setup.n_reference",
                    "audit attack"),
    "epsilon.json": (lambda d: d["verdict"].__setitem__("best_lb", d["verdict"].pop("best_epsilon_lb")),
                     "verdict.best_epsilon_lb", "audit epsilon"),
    "transfer.json": (lambda d: d["datasets"][0].__setitem__("state", d["datasets"][0].pop("status")),
                      "datasets.0.status", "audit transfer"),
}
_MISSING = {"attack.json": "utility", "epsilon.json": "skipped", "transfer.json": "created"}
_READERS = {"attack.json": read_attack_file, "epsilon.json": read_epsilon_file, "transfer.json": read_transfer_file}


@pytest.mark.parametrize("name", list(_READERS))
def test_a_renamed_or_missing_key_is_refused_in_one_line(tmp_path: Path, name: str) -> None:
    rename, key, command = _RENAMES[name]
    run = make_run(tmp_path / "renamed")
    update_json(run, name, rename)
    with pytest.raises(CheckpointError) as err:
        _READERS[name](run)
    msg = str(err.value)
    assert "\n" not in msg and name in msg and f"'{key}'" in msg and "unknown key" in msg
    assert f"re-run '{command} {run}'" in msg

    run = make_run(tmp_path / "missing")
    update_json(run, name, lambda d: d.pop(_MISSING[name]))
    with pytest.raises(CheckpointError, match=rf"'{_MISSING[name]}': Field required.*re-run '{command} "):
        _READERS[name](run)


@pytest.mark.parametrize("name", list(_READERS))
def test_another_format_is_refused_with_the_remake_command(tmp_path: Path, name: str) -> None:
    run = make_run(tmp_path / "r")
    update_json(run, name, lambda d: d.__setitem__("format", "dp-audit-other/9"))
    with pytest.raises(CheckpointError, match=r"has format 'dp-audit-other/9'; this version reads .*re-run"):
        _READERS[name](run)


def test_a_wrong_type_is_refused_not_coerced(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r")
    update_json(run, "attack.json", lambda d: d["setup"].__setitem__("n_reference", "8"))
    with pytest.raises(CheckpointError, match=r"'setup.n_reference': Input should be a valid integer"):
        read_attack_file(run)


def test_attack_json_before_tuned_a_and_population_rule_still_reads(tmp_path: Path) -> None:
    data = _attack_file(np.random.default_rng(2))
    path = write_attack_file(tmp_path, data, identity=ID)
    old = read_json(path)
    assert "info" not in old["attacks"]["loss"]              # absent when an attack reports nothing
    update_json(tmp_path, "attack.json", lambda d: d["setup"].pop("population_rule"))  # as files made before it
    back = read_attack_file(tmp_path)
    assert back.setup.population_rule is None and back.attacks["loss"].info is None
    rmia = data.attacks["loss"].model_copy(update={"params": {"attack": "rmia_offline", "a": "auto"},
                                                   "info": {"a": 0.6, "a_tuning": {"chosen_on": "reference model 1"}}})
    write_attack_file(tmp_path, data.model_copy(update={"attacks": {"rmia_offline": rmia}}), identity=ID)
    assert read_attack_file(tmp_path).attacks["rmia_offline"].info["a"] == 0.6
