"""One writer per run directory: a lock file naming its holder.

``audit train``, ``audit attack``, ``audit epsilon`` and ``audit run`` write into a run directory; two of them at
once would train reference models twice, or one's ``--retrain-shadows`` would delete the other's models mid-run.
:func:`run_lock` creates ``<run>/.lock`` exclusively (``O_CREAT | O_EXCL``) holding the holder's pid, host, command
and start time, and removes it on exit. A second writer fails fast with a one-line
:class:`~foundation.errors.CheckpointError` naming the lock file and its holder. A lock left by a process that is
gone (same host, pid not running) is stale and taken over; a lock from another host is never presumed stale.
A lock the auditor did not take never blocks it: the record is signed with this auditor's evidence key
(:mod:`foundation.evidence`), and a lock without a valid signature (shipped inside a received run directory,
naming pid 1 or another host) is foreign and taken over like a stale one.
The same process may nest locks on one directory (``audit run`` holds it while its steps take it again).
Taking over a stale lock renames it aside first, so of two processes that find the same stale lock one wins;
the remaining window (a third process creating a fresh lock between the check and the rename) is accepted.

>>> import tempfile
>>> d = Path(tempfile.mkdtemp())
>>> with run_lock(d, command="demo"):
...     (d / LOCK_FILE).is_file()
True
>>> (d / LOCK_FILE).exists()
False
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from foundation.errors import CheckpointError
from foundation.evidence import sign_json, verify_json
from foundation.files import LOCK_FILE

__all__ = ["LOCK_FILE", "run_lock", "read_lock", "pid_alive"]

_HELD: dict[Path, int] = {}  # run directories this process holds, with nesting depth


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host.

    >>> pid_alive(os.getpid())
    True
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def read_lock(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The holder record of ``<run_dir>/.lock`` ({} when unreadable), or None when there is no lock."""
    path = Path(run_dir) / LOCK_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _foreign(holder: dict[str, Any]) -> bool:
    """Whether the lock was not taken by an auditor holding this evidence key (unsigned or forged)."""
    try:
        verify_json(dict(holder), path=LOCK_FILE, remake="", identity=None)
    except CheckpointError:
        return True
    return False


def _stale(holder: dict[str, Any]) -> bool:
    if _foreign(holder):
        return True  # shipped with the run directory, or written by someone without this auditor's key
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return True  # unreadable or foreign lock content: nobody can be holding it meaningfully
    if holder.get("host") not in (None, socket.gethostname()):
        return False
    return not pid_alive(pid)


def _try_create(path: Path, record: dict[str, Any]) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
    except BaseException:  # a full disk: no half-written lock left to block or confuse the next writer
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return True


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike[str], *, command: str | None = None) -> Iterator[Path]:
    """Hold ``<run_dir>/.lock`` for the duration of the block (the directory is created when missing).

    Args:
        run_dir: the run directory.
        command: what the holder is doing (shown to a second writer); default: this process's command line.

    Yields:
        The lock file's path.

    Raises:
        CheckpointError: another live process holds the lock (the message names the lock file, pid, host, command
            and start time).
    """
    run_dir = Path(run_dir)
    key = run_dir.resolve()
    if _HELD.get(key):
        _HELD[key] += 1
        try:
            yield run_dir / LOCK_FILE
        finally:
            _HELD[key] -= 1
        return
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    record = sign_json({"pid": os.getpid(), "host": socket.gethostname(),
                        "command": command if command is not None else " ".join(["audit", *sys.argv[1:]]),
                        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, identity={})
    for _ in range(3):
        if _try_create(path, record):
            break
        holder = read_lock(run_dir)
        if holder is None:
            continue  # released in between: try again
        if not _stale(holder):
            raise CheckpointError(
                f"{run_dir} is in use: lock {path} is held by pid {holder.get('pid')} on {holder.get('host')} "
                f"({holder.get('command') or 'unknown command'}, since {holder.get('started')}); wait for it to "
                "finish (delete the lock only if that process is gone)")
        # stale: move it aside under a unique name (only one taker wins the rename), then create ours
        aside = path.with_name(f"{LOCK_FILE}.stale.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, aside)
            aside.unlink()
    else:
        raise CheckpointError(f"could not take the lock {path}: other processes keep taking it; try again")
    _HELD[key] = 1
    try:
        yield path
    finally:
        _HELD.pop(key, None)
        if (read_lock(run_dir) or {}).get("pid") == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if created:
            with contextlib.suppress(OSError):
                run_dir.rmdir()  # only when empty: a run that wrote nothing leaves nothing
