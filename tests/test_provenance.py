"""A manifest's provenance says which code ran: the commit, and whether the checkout had edits beyond it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from audit.reporting import build_report, load_run
from fixtures_runs import make_run, update_json
from training.run.manifest import _device_name, _git_state

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_git_state_sees_edits_to_tracked_files_only(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("a = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert _git_state(tmp_path) == (head, False)
    (tmp_path / "scratch.txt").write_text("untracked output\n")  # a run's own files are not an edit of the code
    assert _git_state(tmp_path) == (head, False)
    (tmp_path / "code.py").write_text("a = 2\n")
    assert _git_state(tmp_path) == (head, True)


def test_git_state_outside_a_checkout_is_unknown(tmp_path: Path) -> None:
    assert _git_state(tmp_path) == (None, None)


def test_device_name_is_none_off_the_gpu() -> None:
    assert _device_name(None) is None and _device_name("cpu") is None


def test_report_flags_a_dirty_checkout_and_names_the_gpu(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    items = dict(build_report(load_run(run)).provenance.items)
    assert (items["git commit"], items["device"]) == ("abc1234", "—")  # a clean checkout, no device recorded

    def edit(m: dict) -> None:
        m["provenance"].update(git_dirty=True, device="cuda", device_name="NVIDIA H200")

    update_json(run, "manifest.json", edit)
    items = dict(build_report(load_run(run)).provenance.items)
    assert items["git commit"].startswith("abc1234 (tracked files modified")
    assert items["device"] == "cuda (NVIDIA H200)"
