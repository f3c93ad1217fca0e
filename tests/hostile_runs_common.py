"""The tiny DP run the run-directory hostile suites attack, and the edits a dishonest vendor makes to it.

:func:`run_fixtures` gives a test module the fixtures ``base`` (it trained and attacked once per module: digits,
an MLP, 6 steps; seconds) and ``run`` (a copy of it per test). The ``*_edit`` helpers return a function that
damages a run directory the way a vendor would (usually re-recording the edited file's sha256 in the manifest, so
only content checks can catch it). Used by
tests/test_hostile_runs.py, test_hostile_claims.py, test_hostile_reports.py and test_hostile_writes.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hostile_common import ATTACK_ARGS, cli, edit_json, rehash, write_cfg

from foundation.io import load_safetensors, save_safetensors

__all__ = ["run_fixtures", "put_key", "manifest_edit", "weights_edit", "raw_edit", "membership_edit", "config_edit",
           "first_float", "as_dir"]


def run_fixtures():
    """The fixtures ``(base, run)`` for a test module (``base, run = run_fixtures()``): ``base`` is the tiny DP run,
    trained and attacked with the reference-free attacks once per module (so epsilon's pool source has scores);
    ``run`` is a copy of it per test."""

    @pytest.fixture(scope="module")
    def base(tmp_path_factory) -> Path:
        root = tmp_path_factory.mktemp("hostile")
        r = cli("train", write_cfg(root / "cfg.yaml", root / "runs"), "--no-progress")
        assert r.exit_code == 0, r.output
        run = root / "runs" / "tiny"
        r = cli("attack", run, *ATTACK_ARGS)
        assert r.exit_code == 0, r.output
        return run

    @pytest.fixture
    def run(base: Path, tmp_path: Path) -> Path:
        dst = tmp_path / "tiny"
        shutil.copytree(base, dst)
        return dst

    return base, run


def put_key(data, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        data = data[p]
    data[last] = value


def manifest_edit(key: str, value) -> callable:
    def edit(run: Path) -> None:
        edit_json(run / "manifest.json", lambda m: put_key(m, key, value))
    return edit


def weights_edit(fn) -> callable:
    def edit(run: Path) -> None:
        state = load_safetensors(run / "model.safetensors")
        save_safetensors(run / "model.safetensors", fn(state))
        rehash(run)
    return edit


def raw_edit(file: str, data, *, keep_hash: bool = False) -> callable:
    def edit(run: Path) -> None:
        path = run / file
        path.write_bytes(data(run) if callable(data) else data)
        if not keep_hash:
            rehash(run, file)
    return edit


def membership_edit(fn) -> callable:
    def edit(run: Path) -> None:
        np.save(run / "membership.npy", fn(np.load(run / "membership.npy")), allow_pickle=True)
        rehash(run, "membership.npy")
    return edit


def config_edit(old: str, new: str) -> callable:
    return raw_edit("config.yaml", lambda r: (r / "config.yaml").read_text().replace(old, new, 1).encode())


def first_float(state, value):
    key = next(k for k, v in state.items() if v.is_floating_point())
    return {**state, key: value(state[key])}


def as_dir(file: str) -> callable:
    def edit(run: Path) -> None:
        (run / file).unlink()
        (run / file).mkdir()
    return edit
