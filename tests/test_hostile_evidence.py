"""Hostile inputs, part 3: evidence the auditor did not make (foundation.evidence).

Every derived file is signed with this auditor's key over its content and the run's identity; anything else is
refused in one line (naming the file and the command that re-makes it) or recomputed. Here: the key itself
(created 0600, refused when others can read it or it is short), and the signature against every edit a vendor
can make to a JSON or ``.npz`` evidence file (content, identity, signature record, another key). The run-level
cases (tampered ``scores.npz``, edited ``attack.json``/``epsilon.json``, a stale claim, vendor shadows and
signals, symbolic links) are in ``test_hostile_claims.py``, ``test_hostile_writes.py``, ``test_gate.py`` and
``test_shadows.py``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from foundation.errors import CheckpointError, ConfigError
from foundation.evidence import (KEY_ENV, KEY_FILE_ENV, default_key_path, evidence_key, read_signed_npz, sign_json,
                                 verify_json, write_signed_npz)

ID = {"weights_sha256": "a" * 64, "membership_sha256": "b" * 64, "pool_fingerprint": "c" * 64}


@pytest.fixture
def own_key(monkeypatch, tmp_path: Path) -> Path:
    """No key in the environment: the per-user key file under a temporary XDG_CONFIG_HOME."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "config" / "dp-audit" / "evidence.key"


def test_the_key_is_created_once_private_and_outside_the_run(own_key: Path) -> None:
    assert default_key_path() == own_key and not own_key.exists()
    key = evidence_key()
    assert own_key.is_file() and stat.S_IMODE(own_key.stat().st_mode) == 0o600 and len(key) == 64
    assert evidence_key() == key  # created on first use only


def test_a_full_disk_never_leaves_a_half_written_key(own_key: Path, monkeypatch) -> None:
    """The key is written to a temporary file and linked into place: a failed write leaves no key (a truncated
    one would refuse every later run, or sign with a short key) and no temporary file; the next use makes it."""
    import errno

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", full)
        with pytest.raises(ConfigError, match=r"cannot create the evidence key .*No space left on device"):
            evidence_key()
    assert not own_key.exists() and list(own_key.parent.iterdir()) == []
    key = evidence_key()
    assert len(key) == 64 and own_key.read_bytes().strip() == key and list(own_key.parent.iterdir()) == [own_key]
    own_key.unlink()  # a file system without hard links: renamed into place instead

    def no_links(*_a, **_k):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    assert len(evidence_key()) == 64 and list(own_key.parent.iterdir()) == [own_key]


def test_a_key_others_can_read_or_a_short_key_is_refused(own_key: Path, monkeypatch) -> None:
    evidence_key()
    own_key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"readable by other users .*chmod 600"):
        evidence_key()
    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(ConfigError, match="at least 32 are needed"):
        evidence_key()
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.setenv(KEY_FILE_ENV, str(own_key.parent / "absent.key"))
    with pytest.raises(ConfigError, match="cannot be read"):
        evidence_key()


def _signed(tmp_path: Path) -> dict:
    return sign_json({"format": "x/1", "auc": 0.91, "rows": [1, 2]}, identity=ID)


@pytest.mark.parametrize("edit, pattern", [
    (lambda d: d.__setitem__("auc", 0.5), "not signed by this auditor"),                        # AUC edited down
    (lambda d: d["evidence"]["identity"].__setitem__("weights_sha256", "f" * 64), "not signed"),  # identity forged
    (lambda d: d["evidence"].__setitem__("mac", "0" * 64), "not signed"),                      # MAC forged
    (lambda d: d.pop("evidence"), "carries no evidence signature"),                           # unsigned
    (lambda d: d.__setitem__("evidence", "yes"), "carries no evidence signature"),
])
def test_any_edit_of_a_signed_json_is_refused(tmp_path: Path, edit, pattern) -> None:
    data = _signed(tmp_path)
    edit(data)
    with pytest.raises(CheckpointError, match=f"{pattern}.*re-run 'audit attack RUN'"):
        verify_json(json.loads(json.dumps(data)), path="attack.json", remake="audit attack RUN", identity=ID)


def test_another_auditors_key_and_a_stale_identity_are_refused(tmp_path: Path, monkeypatch) -> None:
    data = _signed(tmp_path)
    assert verify_json(dict(data), path="a.json", remake="r", identity=ID)["auc"] == 0.91
    with pytest.raises(CheckpointError, match=r"stale: it was made for another claim_sha256"):
        verify_json(dict(data), path="a.json", remake="r", identity={**ID, "claim_sha256": "d" * 64})
    monkeypatch.setenv(KEY_ENV, "another-auditor-entirely-" + "9" * 32)
    with pytest.raises(CheckpointError, match="not signed by this auditor's evidence key"):
        verify_json(dict(data), path="a.json", remake="r")


@pytest.mark.parametrize("forge, pattern", [
    (lambda a: a | {"score": a["score"][::-1].copy()}, "not signed"),                          # scores permuted
    (lambda a: a | {"score": np.full_like(a["score"], np.inf)}, "not signed"),                 # ±inf fabricated
    (lambda a: {k: np.concatenate([v, v[:3]]) if v.ndim else v for k, v in a.items()}, "not signed"),  # rows dup.
    (lambda a: {k: v for k, v in a.items() if not k.startswith("evidence_")}, "carries no evidence signature"),
    (lambda a: a | {"evidence_identity": np.array("{]")}, "not signed"),                        # garbage identity
])
def test_any_edit_of_a_signed_npz_is_refused(tmp_path: Path, forge, pattern) -> None:
    path = write_signed_npz(tmp_path / "scores.npz", identity=ID,
                            arrays={"pool_index": np.arange(6), "score": np.linspace(0, 1, 6)})
    assert read_signed_npz(path, remake="r", identity=ID)["score"].size == 6
    with np.load(path) as z:
        arrays = dict(z)
    np.savez(path, **forge(arrays))
    with pytest.raises(CheckpointError, match=pattern):
        read_signed_npz(path, remake="audit attack RUN", identity=ID)


def test_a_pickled_npz_is_never_loaded(tmp_path: Path) -> None:
    path = tmp_path / "gradient_scores.npz"
    np.savez(path, evidence_mac=np.array([object()], dtype=object))
    with pytest.raises(CheckpointError, match="not a readable .npz"):
        read_signed_npz(path, remake="r")


def test_signing_never_writes_through_a_link(tmp_path: Path) -> None:
    """The atomic writer renames a new file onto the name: a symbolic link there is replaced, its target kept."""
    outside = tmp_path / "vendor_target"
    outside.write_text("vendor's file")
    link = tmp_path / "run" / "scores.npz"
    link.parent.mkdir()
    os.symlink(outside, link)
    write_signed_npz(link, identity=ID, arrays={"x": np.zeros(2)})
    assert not link.is_symlink() and outside.read_text() == "vendor's file"


@pytest.mark.parametrize("change, problem", [
    (lambda a: a | {"pool": np.full_like(a["pool"], np.inf)}, "non-finite"),
    (lambda a: a | {"population_index": np.array([4, 4])}, "not unique"),
    (lambda a: a | {"keep": a["keep"].astype(np.int8)}, "not bool"),
    (lambda a: a | {"pool": a["pool"][:, :2]}, "not bool over the pool"),
    (lambda a: a | {"population": a["population"][:1]}, "population signals do not match"),
])
def test_structurally_wrong_signals_are_never_reused(change, problem) -> None:
    """Even signed arrays are checked for shapes, finiteness and unique indices before any reuse."""
    from attacks.signal_cache import structure_problem

    ok = {"pool": np.zeros((3, 5, 2), np.float32), "population": np.zeros((3, 2, 2), np.float32),
          "population_index": np.array([1, 4]), "keep": np.zeros((2, 5), bool)}
    assert structure_problem(ok) is None
    assert problem in structure_problem(change(ok))
