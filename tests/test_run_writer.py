"""One writer of run directories: ``audit train``, reference models, ``audit import`` and OpacusAuditor all finish
their run directory through :func:`training.run.writer.write_run` (manifest, hashes, privacy block)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fixtures_runs import TINY_TRAIN
from foundation.files import MANIFEST_FILE, MEMBERSHIP_FILE, WEIGHTS_FILE
from foundation.io import sha256_file
from training.run import writer

ROOT = Path(__file__).resolve().parents[1]
#: what only the writer (and the manifest module that defines them) may call
WRITER_ONLY = {"build_manifest", "write_manifest", "write_weights", "write_membership", "PrivacyInfo",
               "MembershipInfo", "PhaseInfo"}
HOMES = {"training/run/writer.py", "training/run/manifest.py"}

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _called_names(source: str) -> set[str]:
    tree = ast.parse(source)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def test_no_product_module_builds_a_manifest_or_privacy_block_itself():
    offenders = []
    for package in ("foundation", "training", "attacks", "audit"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in HOMES and (hit := _called_names(path.read_text()) & WRITER_ONLY):
                offenders.append(f"{rel}: {sorted(hit)}")
    assert not offenders, "use training.run.writer (write_run, privacy_record, phase_record):\n" + "\n".join(offenders)


def _keys(obj, prefix=""):
    """Dotted key paths of a manifest, free-form sections (training, data.canaries, threads) left out."""
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}{k}"
            out.add(path)
            if path not in ("training", "data.canaries", "provenance.threads", "privacy.epsilon_cross_check",
                            "privacy.phases"):
                out |= _keys(v, path + ".")
    return out


def test_the_four_producers_write_through_the_one_writer(tmp_path, monkeypatch):
    from attacks.recipe import shadow_config, shadow_recipe
    from attacks.shadow_train import write_batched_run
    from audit.importer import import_checkpoint, parse_source
    from test_opacus_integration import user_script
    from training.config import TrainConfig, apply_overrides
    from training.run import open_run
    from training.trainer import train

    written = []
    real = writer.write_manifest
    monkeypatch.setattr(writer, "write_manifest", lambda d, m: (written.append(Path(d).name), real(d, m))[1])

    target = train(TrainConfig.model_validate(apply_overrides(TINY_TRAIN, {"output_dir": str(tmp_path),
                                                                            "name": "trained"})))
    run = open_run(target.run_dir)
    recipe = shadow_recipe(config=run.config, manifest=run.manifest)
    write_batched_run(tmp_path / "shadow", cfg=shadow_config(recipe, name="ref0", seed=1, output_dir=str(tmp_path)),
                      recipe=recipe, state=run.state_dict, mask=np.arange(len(run.pool)) % 2 == 0, pool=run.pool,
                      test=None, target_name="trained", wall_seconds=0.0, device=torch.device("cpu"))
    import_checkpoint(weights=target.run_dir / WEIGHTS_FILE, arch="mlp", members=parse_source("digits:train", limit=40),
                      nonmembers=parse_source("digits:test", limit=40), out=tmp_path / "imported", device="cpu",
                      claimed_epsilon=3.0, delta=1e-5)
    user_script(tmp_path / "opacus", steps=3, canaries=20)
    names = ["trained", "shadow", "imported", "opacus"]
    assert written == names

    manifests = {n: json.loads((tmp_path / n / MANIFEST_FILE).read_text()) for n in names}
    assert len({frozenset(_keys(m)) for m in manifests.values()}) == 1  # one structure
    assert len({frozenset(ph) for m in manifests.values() for ph in m["privacy"]["phases"]}) == 1
    for n, m in manifests.items():  # hashes are those of the files written; the privacy rule is the writer's
        assert m["model"]["weights_sha256"] == sha256_file(tmp_path / n / WEIGHTS_FILE)
        mask = np.load(tmp_path / n / MEMBERSHIP_FILE)
        assert m["data"]["membership_sha256"] == sha256_file(tmp_path / n / MEMBERSHIP_FILE)
        assert (m["data"]["membership"]["n_members"], m["data"]["pool_size"]) == (int(mask.sum()), mask.size)
        p = m["privacy"]
        assert p["dp"] == (any(ph["dp"] for ph in p["phases"]) or p["epsilon"] is not None)
    assert [manifests[n]["privacy"]["epsilon"] is not None for n in names] == [True, False, True, True]
