"""Evidence the auditor made is signed by the auditor: an HMAC-SHA256 under a key kept outside every run directory.

Every derived file of a run directory (``signals.npz``, ``scores.npz``, ``attack.json``, ``epsilon.json``,
``transfer.json``, ``gate.json``) carries a MAC over its content and the identity of the run it was made for (the
weights and membership sha256s, the pool fingerprint and the sha256 of the manifest's privacy claim). A reader
accepts the file only when the MAC verifies under this auditor's key (so an edited file, or one made by anyone
else, is refused: a received run directory cannot ship evidence the auditor will trust) and, where it knows the
run, when the recorded identity is the run's identity now (a claim edited after the file was written makes it
stale).

The key, in order of precedence:

* ``DP_AUDIT_EVIDENCE_KEY``: the key itself (at least 32 characters; for CI, from a secret store);
* ``DP_AUDIT_EVIDENCE_KEY_FILE``: a file holding it;
* ``$XDG_CONFIG_HOME/dp-audit/evidence.key`` (default ``~/.config/dp-audit/evidence.key``): created on first use
  with 32 random bytes (hex), mode 0600. A key file readable by group or others is refused.

JSON files hold the MAC under the top-level key ``evidence`` (``{"identity": {...}, "key_id": ..., "mac": ...}``);
``.npz`` files under the arrays ``evidence_identity`` (JSON text) and ``evidence_mac``.

>>> import os
>>> os.environ.setdefault("DP_AUDIT_EVIDENCE_KEY", "doctest-key-" + "0" * 32) and None
>>> data = sign_json({"format": "x/1", "auc": 0.5}, identity={"weights_sha256": "w"})
>>> verify_json(dict(data), path="x.json", remake="audit x", identity={"weights_sha256": "w"})["auc"]
0.5
>>> data["auc"] = 0.9
>>> verify_json(data, path="x.json", remake="audit x")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
foundation.errors.CheckpointError: x.json is not signed by this auditor's evidence key ...: re-run 'audit x' ...
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from foundation.errors import CheckpointError, ConfigError

__all__ = ["KEY_ENV", "KEY_FILE_ENV", "EVIDENCE_KEY", "default_key_path", "evidence_key", "key_id", "sign_json",
           "verify_json", "write_signed_npz", "read_signed_npz", "npz_digest", "EVIDENCE_ARRAYS"]

KEY_ENV = "DP_AUDIT_EVIDENCE_KEY"
KEY_FILE_ENV = "DP_AUDIT_EVIDENCE_KEY_FILE"
#: The key of the MAC record in a signed JSON file.
EVIDENCE_KEY = "evidence"
#: The arrays of the MAC record in a signed ``.npz`` file.
EVIDENCE_ARRAYS = ("evidence_identity", "evidence_mac")
_MIN_KEY_CHARS = 32


def default_key_path() -> Path:
    """``$XDG_CONFIG_HOME/dp-audit/evidence.key`` (``~/.config/dp-audit/evidence.key`` by default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dp-audit" / "evidence.key"


def _read_key_file(path: Path) -> bytes:
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"evidence key file {path} cannot be read ({exc.strerror}); set {KEY_FILE_ENV} to a "
                          f"readable file or unset it to use {default_key_path()}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"evidence key file {path} is not a regular file; point {KEY_FILE_ENV} at a file")
    if os.name == "posix" and st.st_mode & 0o077:
        raise ConfigError(f"evidence key file {path} is readable by other users (mode {st.st_mode & 0o777:o}); "
                          f"run 'chmod 600 {path}'")
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    if len(text) < _MIN_KEY_CHARS:
        raise ConfigError(f"evidence key file {path} holds {len(text)} characters, at least {_MIN_KEY_CHARS} are "
                          f"needed; delete it to have a new one made")
    return text.encode("utf-8")


def _create_key(path: Path) -> None:
    """Write a new key to a private temporary file beside ``path`` and hard-link it into place: a reader never sees
    a half-written key (a full disk leaves none; two first uses at once agree on the first one linked)."""
    import tempfile

    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(secrets.token_hex(32) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic and never replaces a key another process made first
        except FileExistsError:
            pass
        except OSError as exc:  # a file system without hard links: rename, unless a key appeared meanwhile
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if not path.exists():
                os.rename(tmp, path)
                tmp = None
    except OSError as exc:
        raise ConfigError(f"cannot create the evidence key {path} ({exc.strerror}); free space there, or set "
                          f"{KEY_ENV} or {KEY_FILE_ENV}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def evidence_key() -> bytes:
    """This auditor's evidence key (see the module docstring for where it comes from).

    Raises:
        ConfigError: the key is too short, or its file is unreadable or readable by others.
    """
    value = os.environ.get(KEY_ENV)
    if value:
        if len(value.strip()) < _MIN_KEY_CHARS:
            raise ConfigError(f"{KEY_ENV} holds {len(value.strip())} characters, at least {_MIN_KEY_CHARS} are "
                              f"needed (e.g. the output of 'openssl rand -hex 32')")
        return value.strip().encode("utf-8")
    file = os.environ.get(KEY_FILE_ENV)
    if file:
        return _read_key_file(Path(file).expanduser())
    path = default_key_path()
    if not path.exists():
        _create_key(path)
    return _read_key_file(path)


def key_id(key: bytes | None = None) -> str:
    """A short public name of the key (the first 16 hex digits of its sha256), recorded beside each MAC."""
    return hashlib.sha256(b"dp-audit key id\0" + (evidence_key() if key is None else key)).hexdigest()[:16]


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True).encode()


def _mac(kind: bytes, content: bytes, identity: Mapping[str, Any], key: bytes) -> str:
    msg = b"dp-audit evidence/1\0" + kind + b"\0" + _canonical(dict(identity)) + b"\0" + content
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def _check_fresh(recorded: Mapping[str, Any], identity: Mapping[str, Any] | None, path: Any, remake: str) -> None:
    if identity is None:
        return
    differ = sorted(k for k in set(identity) | set(recorded) if recorded.get(k) != identity.get(k))
    if differ:
        raise CheckpointError(f"{path} is stale: it was made for another {', '.join(differ)} than the run has now "
                              f"(weights, membership, pool or manifest claim changed since); re-run '{remake}'")


def sign_json(data: Mapping[str, Any], *, identity: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (JSON-ready: plain types, finite floats) with the ``evidence`` record added."""
    body = {k: v for k, v in data.items() if k != EVIDENCE_KEY}
    key = evidence_key()
    ident = json.loads(_canonical(dict(identity)))
    return {**body, EVIDENCE_KEY: {"identity": ident, "key_id": key_id(key),
                                   "mac": _mac(b"json", _canonical(body), ident, key)}}


def verify_json(data: dict[str, Any], *, path: Any, remake: str,
                identity: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``data`` without its ``evidence`` record, once the MAC verifies (and, given ``identity``, is fresh).

    Raises:
        CheckpointError: unsigned, signed with another key, edited, or (given ``identity``) stale.
    """
    record = data.pop(EVIDENCE_KEY, None) if isinstance(data, dict) else None
    if not isinstance(record, dict) or not isinstance(record.get("mac"), str) \
            or not isinstance(record.get("identity"), dict):
        raise CheckpointError(f"{path} carries no evidence signature (made by another tool or an older version, "
                              f"or received with the run): re-run '{remake}' to re-make it")
    key = evidence_key()
    try:
        want = _mac(b"json", _canonical(data), record["identity"], key)
    except ValueError:  # a non-finite float cannot have been signed
        want = ""
    if not hmac.compare_digest(want, record["mac"]):
        raise CheckpointError(f"{path} is not signed by this auditor's evidence key (edited, or made by another "
                              f"auditor or tool): re-run '{remake}' to re-make it")
    _check_fresh(record["identity"], identity, path, remake)
    return data


def npz_digest(arrays: Mapping[str, np.ndarray]) -> bytes:
    """sha256 over every array (name, dtype, shape, bytes), names sorted; object arrays are refused."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        if a.dtype.hasobject:
            raise ValueError(f"array {name!r} has dtype object")
        h.update(_canonical([name, a.dtype.str, list(a.shape)]))
        h.update(a.tobytes())
    return h.digest()


def write_signed_npz(path: str | os.PathLike[str], *, identity: Mapping[str, Any],
                     arrays: Mapping[str, np.ndarray]) -> Path:
    """Write ``arrays`` with :func:`foundation.io.write_npz` (atomic, no pickle) plus the evidence arrays."""
    from foundation.io import write_npz

    clash = set(arrays) & set(EVIDENCE_ARRAYS)
    if clash:
        raise ValueError(f"array names {sorted(clash)} are reserved for the evidence record")
    plain = {k: np.asarray(v) for k, v in arrays.items()}
    ident = json.loads(_canonical(dict(identity)))
    key = evidence_key()
    mac = _mac(b"npz", npz_digest(plain), ident, key)
    return write_npz(path, **plain, evidence_identity=np.array(json.dumps(ident, sort_keys=True)),
                     evidence_mac=np.array(mac))


def read_signed_npz(path: str | os.PathLike[str], *, remake: str,
                    identity: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The arrays of a signed ``.npz`` (evidence arrays removed), once its MAC verifies (and, given ``identity``,
    it is fresh). Never unpickles.

    Raises:
        CheckpointError: missing, unreadable, unsigned, signed with another key, edited, or stale.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} not found: run '{remake}'")
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise CheckpointError(f"{path} is not a readable .npz file ({exc}); re-run '{remake}'") from None
    ident_text, mac = arrays.pop(EVIDENCE_ARRAYS[0], None), arrays.pop(EVIDENCE_ARRAYS[1], None)
    if ident_text is None or mac is None or ident_text.shape != () or mac.shape != ():
        raise CheckpointError(f"{path} carries no evidence signature (made by another tool or an older version, "
                              f"or received with the run): re-run '{remake}' to re-make it")
    try:
        recorded = json.loads(str(ident_text))
        want = _mac(b"npz", npz_digest(arrays), recorded, evidence_key())
    except ValueError:
        recorded, want = {}, ""
    if not isinstance(recorded, dict) or not hmac.compare_digest(want, str(mac)):
        raise CheckpointError(f"{path} is not signed by this auditor's evidence key (edited, or made by another "
                              f"auditor or tool): re-run '{remake}' to re-make it")
    _check_fresh(recorded, identity, path, remake)
    return arrays
