"""Hostile inputs, part 3: nothing a received run directory or checkpoint names is executed or fetched.

* Every field that names code (an import-path ``model.arch`` in the manifest, ``config.yaml``, the file
  ``provenance.config_file`` names, a fine-tuning checkpoint's manifest, shipped reference models) is refused
  without ``--trust-code`` before anything is read: the payload module is importable, yet never imported.
* Every other string field of a run (kwargs, dataset and accountant names, phase descriptions, import records)
  is resolved through a registry or only displayed: the payload is never imported whatever the outcome.
* The product's dynamic imports are a short reviewed list (:data:`DYNAMIC_IMPORTS`): a new one fails here.
* A received config with ``download: true`` never downloads: the audit reads the data on disk or says it is
  missing (torchvision's downloader is replaced by one that records calls).
* Checkpoints given to ``audit import`` are never unpickled.
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hostile_common import ATTACK_ARGS, Payload, assert_error, cli, edit_json, rehash, write_cfg

from foundation.io import save_safetensors

MODULE = "dp_audit_hostile_payload"
ARCH = f"{MODULE}:factory"
SOURCE = '''
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("the payload's top level ran")


def factory(**kwargs):
    pathlib.Path(__file__).with_name("CALLED").write_text("the payload factory ran")
'''


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny honest run (registered architecture, no code named), trained and attacked once."""
    root = tmp_path_factory.mktemp("code")
    assert cli("train", write_cfg(root / "cfg.yaml", root / "runs"), "--no-progress").exit_code == 0
    assert cli("attack", root / "runs" / "tiny", *ATTACK_ARGS).exit_code == 0
    return root / "runs" / "tiny"


@pytest.fixture
def payload(tmp_path, monkeypatch) -> Path:
    """A folder on sys.path holding the payload module; yields the folder (markers appear in it)."""
    folder = tmp_path / "payload"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop(MODULE, None)
    yield folder
    sys.modules.pop(MODULE, None)


@pytest.fixture
def run(base, tmp_path) -> Path:
    dst = tmp_path / "received"
    shutil.copytree(base, dst)
    return dst


def _suite(tmp_path: Path) -> Path:
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "device": "cpu", "datasets": [{"name": "digits"}],
                                    "protocols": {"knn": {"enabled": False}, "diagnostics": {"enabled": False}}}))
    return path


def _no_code_ran(folder: Path) -> bool:
    return not (folder / "IMPORTED").exists() and not (folder / "CALLED").exists() and MODULE not in sys.modules


def _yaml_edit(path: Path, fn) -> None:
    data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    fn(data)
    path.write_text(yaml.safe_dump(data))


def _in_finetune_source(run: Path) -> None:
    source = run.parent / "base"
    source.mkdir()
    (source / "manifest.json").write_text(json.dumps({"model": {"arch": ARCH}}))
    _yaml_edit(run / "config.yaml", lambda c: c["training"]["finetune"].__setitem__("checkpoint", str(source)))


def _in_shadow(file: str):
    def plant(run: Path) -> None:
        (run / "shadows" / "0").mkdir(parents=True)
        if file == "manifest.json":
            (run / "shadows" / "0" / file).write_text(json.dumps({"model": {"arch": ARCH}}))
        else:
            (run / "shadows" / "0" / file).write_text(yaml.safe_dump({"model": {"arch": ARCH}}))
    return plant


def _in_config_file(run: Path) -> None:
    edit_json(run / "manifest.json", lambda m: m["provenance"].__setitem__("config_file", "exp.yaml"))
    (run / "exp.yaml").write_text(yaml.safe_dump({"model": {"arch": ARCH}}))


WHERE = {
    "manifest": (lambda r: edit_json(r / "manifest.json", lambda m: m["model"].__setitem__("arch", ARCH)),
                 "in manifest.json"),
    "config": (lambda r: _yaml_edit(r / "config.yaml", lambda c: c["model"].__setitem__("arch", ARCH)),
               "in config.yaml"),
    "finetune-source": (_in_finetune_source, r"in config\.yaml -> training\.finetune\.checkpoint .*manifest\.json"),
    "shadow-manifest": (_in_shadow("manifest.json"), r"in shadows/0/manifest\.json"),
    "shadow-config": (_in_shadow("config.yaml"), r"in shadows/0/config\.yaml"),
    "config-file": (_in_config_file, r"in exp\.yaml"),
}


@pytest.mark.parametrize("command", ["attack", "epsilon", "transfer"])
@pytest.mark.parametrize("where", list(WHERE))
def test_code_named_anywhere_in_a_run_is_refused_without_trust(run, payload, tmp_path, where, command):
    plant, place = WHERE[where]
    plant(run)
    before = sorted(p.name for p in run.iterdir())
    args = {"attack": ["attack", run, *ATTACK_ARGS], "epsilon": ["epsilon", run, "--sources", "pool"],
            "transfer": ["transfer", run, "--suite", _suite(tmp_path)]}[command]
    line = assert_error(cli(*args), rf"names code to import \(model\.arch = '{ARCH}' {place}")
    assert "--trust-code" in line and _no_code_ran(payload)
    assert sorted(p.name for p in run.iterdir()) == before


OTHER_FIELDS = {
    "model.kwargs": lambda r: edit_json(r / "manifest.json", lambda m: m["model"]["kwargs"].__setitem__("act", ARCH)),
    "data.dataset": lambda r: (edit_json(r / "manifest.json", lambda m: m["data"].__setitem__("dataset", ARCH)),
                               _yaml_edit(r / "config.yaml", lambda c: c["data"].__setitem__("dataset", ARCH))),
    "privacy.accountant": lambda r: edit_json(r / "manifest.json",
                                              lambda m: m["privacy"].__setitem__("accountant", ARCH)),
    "phase fields": lambda r: edit_json(r / "manifest.json", lambda m: m["privacy"]["phases"][0].update(
        optimizer=ARCH, grad_sample_mode=ARCH, name=ARCH)),
    "config optim.name": lambda r: _yaml_edit(r / "config.yaml", lambda c: c["optim"].__setitem__("name", ARCH)),
    "config accountant": lambda r: _yaml_edit(r / "config.yaml",
                                              lambda c: c["privacy"].__setitem__("accountant", ARCH)),
    "timm kwargs": lambda r: _yaml_edit(r / "config.yaml", lambda c: c["model"].update(
        arch="resnet18", kwargs={"act_layer": ARCH, "norm_layer": ARCH, "block": ARCH})),
    "import record": lambda r: ((r / "config.yaml").unlink(), (r / "import.json").write_text(json.dumps(
        {"format": "dp-audit-import/1", "members": {"dataset": ARCH, "split": "train"},
         "nonmembers": {"dataset": ARCH, "split": "test"}}))),
}


@pytest.mark.parametrize("command", ["attack", "epsilon", "report"])
@pytest.mark.parametrize("field", list(OTHER_FIELDS))
def test_other_fields_never_import_what_they_name(run, payload, field, command):
    """A registry look-up or a displayed string: the command may refuse the run or audit it, never import."""
    OTHER_FIELDS[field](run)
    args = {"attack": ["attack", run, *ATTACK_ARGS], "epsilon": ["epsilon", run, "--sources", "pool"],
            "report": ["report", run]}[command]
    r = cli(*args)
    assert r.exit_code in (0, 2) and "Traceback" not in r.output, r.output
    if r.exit_code == 2:
        assert_error(r, ".")
    assert _no_code_ran(payload)


#: Every dynamic import in the product, reviewed: (file, what it imports). Only build.py imports a name that comes
#: from input, and only with trust_code (tests/test_trust_code.py).
DYNAMIC_IMPORTS = {
    ("training/models/build.py", "importlib.import_module(module_name)"),
    ("attacks/registry.py", "importlib.import_module(module)"),
    ("audit/__init__.py", "importlib.import_module(module)"),  # a value of the fixed table audit._PUBLIC
    ("audit/cli.py", 'importlib.import_module(f"audit.commands.{entry[0]}")'),
    ("training/run/manifest.py", "__import__(mod)"),
}


def test_the_product_imports_dynamically_only_where_reviewed():
    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"(importlib\.import_module\([^)]*\)|__import__\([^)]*\)|(?<![.\w])eval\(|(?<![.\w])exec\(|"
                         r"pickle\.loads?\(|allow_pickle=True|weights_only=False)")
    found = set()
    for package in ("foundation", "training", "attacks", "audit"):
        for path in sorted((root / package).rglob("*.py")):
            for line in path.read_text().splitlines():
                code = line.split("#")[0]
                for match in pattern.findall(code):
                    found.add((str(path.relative_to(root)), match))
    assert found == DYNAMIC_IMPORTS, found ^ DYNAMIC_IMPORTS


# ------------------------------------------------------------------------------------------------ downloads


def _cifar10(root: Path, rng: np.random.Generator) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch"]:
        batch = {b"data": rng.integers(0, 256, (6, 3072), dtype=np.uint8), b"labels": [0, 1, 2, 0, 1, 2]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [f"c{i}" for i in range(10)]}, protocol=2))


@pytest.fixture
def downloads(monkeypatch) -> list:
    """torchvision's downloaders, replaced (importing the real one costs seconds, and nothing may fetch)."""
    calls: list = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        raise AssertionError("a download was attempted")

    tv, tvd, tvu = (types.ModuleType(n) for n in ("torchvision", "torchvision.datasets", "torchvision.datasets.utils"))
    tvd.CIFAR10 = types.SimpleNamespace(url="https://example/c10.tgz", filename="c10.tgz", tgz_md5="x")
    tvu.download_and_extract_archive = tvu.download_url = record
    tv.datasets, tvd.utils = tvd, tvu
    for mod in (tv, tvd, tvu):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return calls


@pytest.mark.parametrize("command", ["attack", "report"])
def test_a_received_config_asking_to_download_never_downloads(tmp_path, downloads, command):
    data = tmp_path / "vendor-data"
    _cifar10(data, np.random.default_rng(0))
    cfg = write_cfg(tmp_path / "cfg.yaml", tmp_path / "runs", **{
        "data.dataset": "cifar10", "data.root": str(data), "data.download": True, "data.pool_size": None,
        "data.test_size": None, "training.batch_size": 8, "training.physical_batch_size": 8, "training.steps": 2})
    assert cli("train", cfg, "--no-progress").exit_code == 0  # the data is there: nothing to fetch
    run = tmp_path / "runs" / "tiny"
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["download"] is True
    if command == "report":  # the report rebuilds the pool for thumbnails of the most vulnerable examples
        assert cli("attack", run, *ATTACK_ARGS).exit_code == 0
    shutil.rmtree(data)  # the auditor does not have the vendor's data
    if command == "attack":
        assert_error(cli("attack", run, *ATTACK_ARGS), r"cifar10: no data at .*vendor-data")
    else:
        r = cli("report", run)
        assert r.exit_code == 0 and "could not be re-loaded" in (run / "report.html").read_text(), r.output
    assert downloads == [] and not data.exists()  # nothing fetched, not even the folder re-created


@pytest.mark.parametrize("command", ["attack", "transfer"])
def test_a_hub_architecture_is_refused_even_with_trust_code(run, downloads, tmp_path, command):
    """--trust-code trusts code the run names, never a download (issue 37: hf-hub: was accepted with it)."""
    arch = "hf-hub:timm/resnet18.a1_in1k"
    edit_json(run / "manifest.json", lambda m: m["model"].__setitem__("arch", arch))
    _yaml_edit(run / "config.yaml", lambda c: c["model"].__setitem__("arch", arch))
    rehash(run, "config.yaml")  # a consistent forgery: only the architecture check can stop it
    before = sorted(p.name for p in run.iterdir())
    args = {"attack": ["attack", run, *ATTACK_ARGS],
            "transfer": ["transfer", run, "--suite", _suite(tmp_path)]}[command]
    assert_error(cli(*args, "--trust-code"), r"model\.arch 'hf-hub:timm/resnet18\.a1_in1k' asks timm to fetch a "
                                             r"model from hf-hub; dp-audit never downloads")
    assert downloads == [] and sorted(p.name for p in run.iterdir()) == before


# ------------------------------------------------------------------------------------------ audit import


def _state():
    from training.config import ModelConfig
    from training.models import build_model

    return build_model(ModelConfig(arch="mlp"), num_classes=10, input_shape=(3, 8, 8)).module.net.state_dict()


CHECKPOINTS = [
    ("payload.pt", lambda p, m: torch.save({"state_dict": {"w": Payload(m)}}, p), r"never unpickles .*posix\.system"),
    ("raw-pickle.pth", lambda p, m: p.write_bytes(pickle.dumps(Payload(m))), "never unpickles"),
    ("payload.bin", lambda p, m: p.write_bytes(pickle.dumps({"w": Payload(m)}, protocol=2)), "never unpickles"),
    ("module.pt", lambda p, m: torch.save(torch.nn.Linear(2, 2), p), r"never unpickles .*Linear"),
    ("payload.safetensors", lambda p, m: p.write_bytes(pickle.dumps(Payload(m))), "corrupt or not safetensors"),
    ("truncated.safetensors", lambda p, m: (save_safetensors(p, _state()), p.write_bytes(p.read_bytes()[:-9])),
     "corrupt or not safetensors"),
    ("mixed.pt", lambda p, m: torch.save({"w": torch.ones(1), "step": 3}, p), "non-tensor entries"),
    ("missing.pt", lambda p, m: None, "weights file not found"),
]


@pytest.mark.parametrize("name, make, pattern", CHECKPOINTS, ids=[n for n, _, _ in CHECKPOINTS])
def test_audit_import_never_unpickles_a_checkpoint(tmp_path, name, make, pattern):
    marker = tmp_path / "PWNED"
    make(tmp_path / name, marker)
    assert_error(cli("import", "--weights", tmp_path / name, "--arch", "mlp", "--members", "digits:train",
                     "--nonmembers", "digits:test", "--limit", "20", "--out", tmp_path / "out"), pattern)
    assert not marker.exists() and not (tmp_path / "out").exists()
