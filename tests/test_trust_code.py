"""No code named by a run directory runs unless the user passes --trust-code (issue 11, item 1).

A "vendor" trains a run whose ``model.arch`` is an import path to a payload module. The payload writes one
marker file when it is imported (its top level runs) and another when its factory is called. A reviewer then
audits the run directory: without ``--trust-code`` every auditing command exits 2 with one line naming the
field, the value and the flag, the payload is never imported (no marker, not in ``sys.modules``); with the flag
the command gets past model building (the factory ran) and the results record the trust.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from audit.cli import main
from training.config import ModelConfig
from foundation.errors import ConfigError, UntrustedCodeError
from training.models import build_model
from training.trust import code_in_run, require_code_trust

PAYLOAD = "dp_audit_trust_payload"
ARCH = f"{PAYLOAD}:factory"
ATTACK_NO_SHADOWS = ["--set", "attack.attacks=[loss,attack_p]", "--set", "attack.n_bootstrap=0",
                     "--set", "attack.population=0", "--no-progress"]

PAYLOAD_SOURCE = '''
import pathlib
_MARKERS = pathlib.Path({markers!r})
(_MARKERS / "imported").write_text("top-level code of the payload ran")


def factory(num_classes, **kwargs):
    (_MARKERS / "called").write_text("the payload factory ran")
    from training.models.small import SmallCNN
    return SmallCNN(num_classes=num_classes, channels=(4, 8))
'''


def _forget_payload(markers: Path) -> None:
    sys.modules.pop(PAYLOAD, None)
    for name in ("imported", "called"):
        (markers / name).unlink(missing_ok=True)


def _no_code_ran(markers: Path) -> bool:
    return not (markers / "imported").exists() and not (markers / "called").exists() and PAYLOAD not in sys.modules


@pytest.fixture(scope="module")
def vendor(tmp_path_factory):
    """(run directory trained with the payload arch by `audit train`, markers folder, payload folder)."""
    root = tmp_path_factory.mktemp("vendor")
    markers = root / "markers"
    markers.mkdir()
    code_dir = root / "code"
    code_dir.mkdir()
    (code_dir / f"{PAYLOAD}.py").write_text(PAYLOAD_SOURCE.format(markers=str(markers)))
    cfg = {"name": "vendor", "output_dir": str(root / "runs"),
           "data": {"dataset": "synthetic", "split": "train:n=48,classes=3,noise=60,size=8",
                    "test_split": "test:n=24,classes=3,noise=60,size=8"},
           "model": {"arch": ARCH}, "privacy": {"enabled": False}, "optim": {"name": "adam", "lr": 0.01},
           "training": {"steps": 3, "batch_size": 8, "progress": False, "log_every": 100, "checkpoint_every": 100,
                        "canaries": {"count": 8, "kind": "ood"}}}
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.MonkeyPatch.context() as mp:  # the user's code importable for this module's tests, then not
        mp.syspath_prepend(str(code_dir))
        try:
            res = CliRunner().invoke(main, ["train", str(root / "config.yaml"), "--no-progress"])
            assert res.exit_code == 0, res.output  # audit train: the user's own config is trusted
            assert (markers / "called").exists()
            _forget_payload(markers)
            yield root / "runs" / "vendor", markers
        finally:
            _forget_payload(markers)


@pytest.fixture
def run(vendor, tmp_path):
    """A fresh copy of the vendor's run; the payload forgotten before and after."""
    src, markers = vendor
    dst = tmp_path / "received"
    shutil.copytree(src, dst)
    _forget_payload(markers)
    yield dst, markers
    _forget_payload(markers)


def _suite(tmp_path: Path) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "device": "cpu", "datasets": [{"name": "digits"}],
                                    "budget": {"max_train_examples": 60, "max_test_examples": 30},
                                    "protocols": {"linear_probe": {"c_grid": [1.0]}, "knn": {"enabled": False},
                                                  "diagnostics": {"enabled": False}}}))
    return path


def _commands(run_dir: Path, tmp_path: Path) -> dict[str, list[str]]:
    return {"attack": ["attack", str(run_dir), *ATTACK_NO_SHADOWS],
            "epsilon": ["epsilon", str(run_dir), "--sources", "input_canaries"],
            "transfer": ["transfer", str(run_dir), "--suite", str(_suite(tmp_path)), "--quiet"]}


@pytest.mark.parametrize("command", ["attack", "epsilon", "transfer"])
def test_auditing_commands_refuse_code_without_the_flag(run, tmp_path, command) -> None:
    run_dir, markers = run
    res = CliRunner().invoke(main, _commands(run_dir, tmp_path)[command])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1, res.output
    assert lines[0].startswith(f"error: run dir {run_dir} names code to import (model.arch = '{ARCH}'"), lines[0]
    assert "--trust-code" in lines[0] and "refusing to run it" in lines[0]
    assert _no_code_ran(markers)
    assert not any((run_dir / f).exists() for f in ("attack.json", "epsilon.json", "transfer.json", "signals.npz"))


@pytest.mark.parametrize("command,result", [("attack", "attack.json"), ("epsilon", "epsilon.json"),
                                            ("transfer", "transfer.json")])
def test_trust_code_runs_the_named_code_and_is_recorded(run, tmp_path, command, result, monkeypatch) -> None:
    run_dir, markers = run
    monkeypatch.syspath_prepend(str(markers.parent / "code"))
    res = CliRunner().invoke(main, [*_commands(run_dir, tmp_path)[command], "--trust-code"])
    assert res.exit_code == 0, res.output
    assert (markers / "imported").exists() and (markers / "called").exists()
    code = json.loads((run_dir / result).read_text())["code"]
    assert code == {"trust_code": True, "names_code": [f"model.arch = '{ARCH}' in manifest.json",
                                                       f"model.arch = '{ARCH}' in config.yaml"]}


def test_reference_models_of_a_trusted_run_train_with_its_code(run, monkeypatch) -> None:
    """Shadow models go through the regular trainer (the recipe's import path); trust is passed on to it."""
    run_dir, markers = run
    monkeypatch.syspath_prepend(str(markers.parent / "code"))
    args = ["attack", str(run_dir), "--set", "attack.attacks=[lira_online]", "--set", "attack.n_reference=2",
            "--set", "attack.n_bootstrap=0", "--set", "attack.population=0", "--executor", "sequential",
            "--no-progress"]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and _no_code_ran(markers)
    ok = CliRunner().invoke(main, [*args, "--trust-code"])
    assert ok.exit_code == 0, ok.output
    assert [json.loads((run_dir / "shadows" / str(k) / "manifest.json").read_text())["model"]["arch"]
            for k in range(2)] == [ARCH, ARCH]
    # the shipped reference models name code too: a reviewer re-using them needs the flag again
    _forget_payload(markers)
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "and 5 more" in again.output and _no_code_ran(markers)


def test_report_and_gate_run_no_code_and_say_whether_it_was_trusted(run, tmp_path, monkeypatch) -> None:
    run_dir, markers = run
    res = CliRunner().invoke(main, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert _no_code_ran(markers)
    prov = dict(json.loads((run_dir / "report.json").read_text())["provenance"]["items"])
    assert prov["code named by the run"] == (f"model.arch = '{ARCH}' in manifest.json; "
                                             f"model.arch = '{ARCH}' in config.yaml")
    assert prov["code trusted"].startswith("no: the code it names was not run")
    assert "code trusted" in (run_dir / "report.md").read_text()
    policy = tmp_path / "policy.yaml"
    policy.write_text("rules:\n  - rule: max_claimed_epsilon\n    budget: 8.0\n")
    gate = CliRunner().invoke(main, ["gate", str(run_dir), str(run_dir), "--policy", str(policy),
                                     "--out", str(tmp_path / "gate.json")])
    assert gate.exit_code in (0, 1) and (tmp_path / "gate.json").is_file(), gate.output
    assert _no_code_ran(markers)
    # without attack.json the accuracy rule measures the model itself: refused, the run names untrusted code
    policy.write_text("rules:\n  - rule: min_accuracy_delta\n    tolerance: 0.01\n")
    gate = CliRunner().invoke(main, ["gate", str(run_dir), str(run_dir), "--policy", str(policy)])
    assert gate.exit_code == 2 and "names code to import" in gate.output, gate.output
    assert _no_code_ran(markers)
    monkeypatch.syspath_prepend(str(markers.parent / "code"))
    assert CliRunner().invoke(main, ["attack", str(run_dir), *ATTACK_NO_SHADOWS, "--trust-code"]).exit_code == 0
    CliRunner().invoke(main, ["report", str(run_dir)])
    prov = dict(json.loads((run_dir / "report.json").read_text())["provenance"]["items"])
    assert prov["code trusted"].startswith("yes: audit attack imported it (trusted with --trust-code")


def test_build_model_refuses_an_import_path_before_importing_it(run, monkeypatch) -> None:
    _, markers = run
    monkeypatch.syspath_prepend(str(markers.parent / "code"))
    with pytest.raises(UntrustedCodeError, match="model.arch = 'dp_audit_trust_payload:factory' names code"):
        build_model(ModelConfig(arch=ARCH), num_classes=3, input_shape=(3, 8, 8))
    with pytest.raises(UntrustedCodeError):
        build_model(ModelConfig(arch="os:system", kwargs={"command": "touch /tmp/x"}), num_classes=3,
                    input_shape=(3, 8, 8))
    assert _no_code_ran(markers)
    built = build_model(ModelConfig(arch=ARCH), num_classes=3, input_shape=(3, 8, 8), trust_code=True)
    assert (markers / "called").exists() and built.module.num_classes == 3


@pytest.mark.parametrize("arch", ["hf-hub:timm/resnet18.a1_in1k", "local-dir:/tmp/model", "hf_hub:timm/resnet18",
                                  "HF-HUB:timm/resnet18", " local_dir:/tmp/model"])
def test_timm_hub_and_folder_names_are_refused_even_when_trusted(arch) -> None:
    with pytest.raises(ConfigError, match="never downloads"):
        build_model(ModelConfig(arch=arch), num_classes=3, input_shape=(3, 8, 8), trust_code=True)


@pytest.mark.parametrize("arch,kwargs", [("small_cnn", {}), ("resnet20_cifar", {"blocks_per_stage": 1}),
                                         ("resnet18", {"layers": (1, 1, 1, 1)}),
                                         ("resnet18", {"layers": (1, 1, 1, 1), "act_layer": "gelu"})])
def test_registered_and_timm_architectures_need_no_trust(arch, kwargs) -> None:
    built = build_model(ModelConfig(arch=arch, kwargs=kwargs), num_classes=3, input_shape=(3, 8, 8))
    assert built.module.num_classes == 3


def test_timm_kwargs_cannot_name_code() -> None:
    """timm resolves string layer options through its own tables; an import path there is an error, not an import."""
    with pytest.raises(ConfigError):
        build_model(ModelConfig(arch="resnet18", kwargs={"layers": (1, 1, 1, 1), "act_layer": "os:system"}),
                    num_classes=3, input_shape=(3, 8, 8))
    with pytest.raises(ConfigError, match="may not set pretrained_cfg_overlay"):
        build_model(ModelConfig(arch="resnet18", kwargs={"pretrained_cfg_overlay": {"file": "/x"}}),
                    num_classes=3, input_shape=(3, 8, 8))


def _manifest(path: Path, arch: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps({"model": {"arch": arch}}))


def test_every_field_that_names_code_is_found(tmp_path) -> None:
    run_dir = tmp_path / "run"
    _manifest(run_dir, "small_cnn")
    assert code_in_run(run_dir) == [] and require_code_trust(run_dir, trust_code=False).code == ()
    _manifest(run_dir / "shadows" / "0", "evil.mod:ref")
    _manifest(tmp_path / "base", "evil.mod:base")
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "model": {"arch": "evil.mod:recipe"}, "training": {"finetune": {"checkpoint": str(tmp_path / "base")}}}))
    (run_dir / "manifest.json").write_text(json.dumps({"model": {"arch": "resnet18"},
                                                       "provenance": {"config_file": "exp.yaml"}}))
    (run_dir / "exp.yaml").write_text("model: {arch: 'evil.mod:exp'}\n")
    found = {(ref.file, ref.value) for ref in code_in_run(run_dir)}
    assert found == {("config.yaml", "evil.mod:recipe"),
                     (f"config.yaml -> training.finetune.checkpoint {tmp_path / 'base'}/manifest.json",
                      "evil.mod:base"),
                     ("exp.yaml", "evil.mod:exp"), ("shadows/0/manifest.json", "evil.mod:ref")}
    with pytest.raises(UntrustedCodeError, match=r"and 3 more\); refusing to run it\. Pass --trust-code"):
        require_code_trust(run_dir, trust_code=False)
    assert len(require_code_trust(run_dir, trust_code=True).code) == 4


def test_malformed_files_are_left_to_their_readers(tmp_path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    (tmp_path / "config.yaml").write_text("model: [unclosed")
    assert code_in_run(tmp_path) == []


def test_the_reported_os_system_manifest_is_refused_before_anything_runs(run, tmp_path) -> None:
    """The issue's case: manifest.json says model.arch 'os:system' with kwargs; auditing used to call it."""
    run_dir, _ = run
    marker = tmp_path / "os_system_ran"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["model"].update(arch="os:system", kwargs={"command": f"touch {marker}"})
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    res = CliRunner().invoke(main, ["attack", str(run_dir), *ATTACK_NO_SHADOWS])
    assert res.exit_code == 2 and not marker.exists()
    assert "(model.arch = 'os:system' in manifest.json and 1 more)" in res.output
    trusted = CliRunner().invoke(main, ["attack", str(run_dir), *ATTACK_NO_SHADOWS, "--trust-code"])
    assert trusted.exit_code == 2 and "returned int, not a torch.nn.Module" in trusted.output
    assert marker.exists()  # with the flag the named code does run: the flag is the only gate
