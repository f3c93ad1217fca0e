"""Outputs follow the user's umask (not tempfile's private 0600); the canary secret alone stays owner-only.
Relative ``eval_configs/...`` paths name the shipped configs from any directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from foundation.config_io import load_yaml, resolve_config_path, shipped_config
from foundation.errors import ConfigError
from foundation.io import write_json, write_text


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_follow_umask(tmp_path: Path, umask: int, expected: int) -> None:
    old = os.umask(umask)
    try:
        a = write_json(tmp_path / "a.json", {"x": 1})
        b = write_text(tmp_path / "b.txt", "hi")
    finally:
        os.umask(old)
    assert stat.S_IMODE(a.stat().st_mode) == expected
    assert stat.S_IMODE(b.stat().st_mode) == expected


def test_canary_secret_is_owner_only(tmp_path: Path) -> None:
    from audit.canaries.secret import make_canaries, write_canaries

    old = os.umask(0o022)
    try:
        paths = write_canaries(tmp_path, make_canaries(count=8, num_classes=3, image_size=(4, 4), seed=1))
    finally:
        os.umask(old)
    assert stat.S_IMODE(paths["secret"].stat().st_mode) == 0o600
    assert stat.S_IMODE(paths["commitment"].stat().st_mode) == 0o644


def test_shipped_configs_resolve_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_yaml("eval_configs/quickstart_train.yaml")["name"] == "quickstart-train"
    assert resolve_config_path("eval_configs/gates/default.yaml") == shipped_config("gates", "default.yaml")
    own = tmp_path / "eval_configs" / "quickstart_train.yaml"   # the user's own copy wins
    own.parent.mkdir()
    own.write_text("name: mine\n")
    assert load_yaml("eval_configs/quickstart_train.yaml")["name"] == "mine"
    with pytest.raises(ConfigError, match="not found"):
        load_yaml("eval_configs/nope.yaml")
