"""Hostile inputs: where the auditor writes. A lock shipped with a run never blocks the auditor, a lock it took
does, and a symbolic link it did not create (shadows/, features/) is never written through. See
tests/test_hostile_runs.py for the suite's index.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from hostile_common import ATTACK_ARGS, assert_error, cli
from hostile_runs_common import run_fixtures

from foundation.evidence import sign_json

base, run = run_fixtures()


def test_a_second_writer_fails_fast_naming_the_lock_and_holder(run):
    from foundation.lock import LOCK_FILE

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / LOCK_FILE).write_text(json.dumps(sign_json({"pid": proc.pid, "host": socket.gethostname(),
                                                           "command": "audit attack tiny", "started": "now"},
                                                          identity={})))  # taken by this auditor
        shadows = run / "shadows"
        shadows.mkdir()
        (shadows / "keep.npy").write_bytes(b"theirs")
        line = assert_error(cli("attack", run, "--retrain-shadows", *ATTACK_ARGS),
                            rf"is in use: lock .*\.lock is held by pid {proc.pid}")
        assert "audit attack tiny" in line
        assert (shadows / "keep.npy").read_bytes() == b"theirs"  # --retrain-shadows deleted nothing
        assert_error(cli("epsilon", run), f"held by pid {proc.pid}")
    finally:
        proc.kill()
        proc.wait()
    # the holder is gone: its lock is stale and taken over
    assert cli("attack", run, *ATTACK_ARGS).exit_code == 0
    assert not (run / LOCK_FILE).exists()


@pytest.mark.parametrize("holder", [{"pid": 1, "host": "this-host"}, {"pid": 1, "host": "vendor-build-07"},
                                    {"pid": 1, "host": "x", "evidence": {"identity": {}, "mac": "0" * 64}}])
def test_a_lock_shipped_with_the_run_never_blocks_the_auditor(run, holder):
    """A .lock received inside the run directory (pid 1 is always alive; another host is never presumed gone)
    was not taken by this auditor: unsigned or forged, it is taken over."""
    from foundation.lock import LOCK_FILE

    holder = {**holder, "host": socket.gethostname() if holder["host"] == "this-host" else holder["host"]}
    (run / LOCK_FILE).write_text(json.dumps({**holder, "command": "audit attack", "started": "2026-01-01"}))
    r = cli("epsilon", run, "--sources", "pool", "--attack", "loss")
    assert r.exit_code == 0, r.output
    assert not (run / LOCK_FILE).exists()


def test_symlinked_shadows_are_never_written_through(run, tmp_path):
    """A shadows/ folder shipped as a symbolic link (to a path the vendor chose) is refused, and with
    --retrain-shadows the link is removed, never followed: the vendor's target is left as it was."""
    target = tmp_path / "vendor_chosen"
    target.mkdir()
    (target / "index.json").write_text("{}")
    (run / "shadows").symlink_to(target, target_is_directory=True)
    args = ["--set", "attack.n_reference=2", "--set", "attack.attacks=[lira_offline]", "--set",
            "attack.population=20", "--set", "attack.n_bootstrap=5", "--set", "attack.device=cpu", "--no-progress"]
    assert_error(cli("attack", run, *args), "symbolic link")
    assert sorted(p.name for p in target.iterdir()) == ["index.json"]


def test_a_symlinked_feature_cache_is_removed_never_written_through(run, tmp_path):
    """A features/ folder received as a symbolic link (to a path the vendor chose): audit transfer removes the
    link, extracts afresh into a folder of its own, and leaves the vendor's target as it was."""
    target = tmp_path / "vendor_features"
    target.mkdir()
    (target / "keep.txt").write_text("theirs")
    (run / "features").symlink_to(target, target_is_directory=True)
    (tmp_path / "suite.yaml").write_text("name: t\ndevice: cpu\ndatasets: [{name: digits, train_limit: 60, "
                                         "test_limit: 30}]\nprotocols: {knn: {enabled: false}, "
                                         "diagnostics: {enabled: false}}\n")
    r = cli("transfer", run, "--suite", tmp_path / "suite.yaml")
    assert r.exit_code == 0 and "symbolic link received with the run" in r.output, r.output
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    assert not (run / "features").is_symlink() and any((run / "features").glob("*.npz"))
