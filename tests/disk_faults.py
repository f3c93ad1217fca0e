"""Fault injection for the disk-fault hostile suite (tests/test_hostile_disk.py): a full disk, a read-only output
directory and a rename that fails, under one directory only.

:class:`DiskFaults` patches the process's ``os`` functions (so every writer is caught, whichever module imported
it) and acts only on paths under ``root``:

* ``stage="write"``: ``os.fsync`` of a file under ``root`` fails (what a full disk reports once the data reaches it;
  every atomic write of dp-audit syncs its temporary file before the rename: :func:`foundation.io.atomic_path`).
* ``stage="create"``: creating a file or directory under ``root`` fails (``os.open`` with ``O_CREAT``, which
  ``tempfile.mkstemp`` and the run lock use, and ``os.mkdir``), as on a read-only directory or file system.
* ``stage="rename"``: ``os.replace`` onto a path under ``root`` fails.

The ``at``-th such operation fails with ``code`` and so does every later one (a full disk stays full); ``at=None``
only counts. ``targets`` lists the final path of every operation seen, in order (a temporary file's final name is
``.NAME.XXXX.tmp`` -> ``NAME``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DiskFaults", "final_name", "leftovers"]


def final_name(path: Path) -> Path:
    """The file an atomic write's temporary file becomes: ``dir/.model.safetensors.ab12cd.tmp`` ->
    ``dir/model.safetensors``; any other path as it is.

    >>> final_name(Path("/r/.model.safetensors.ab_12cd.tmp")).name
    'model.safetensors'
    """
    name = path.name
    if name.startswith(".") and name.endswith(".tmp") and name.count(".") >= 3:
        return path.with_name(name[1:-len(".tmp")].rsplit(".", 1)[0])
    return path


def leftovers(root: Path) -> list[Path]:
    """Temporary files of atomic writes and lock files left anywhere under ``root``."""
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".lock"))


class DiskFaults:
    """Fail the ``at``-th write (``stage``) under ``root`` with ``code``, and every later one (module notes)."""

    def __init__(self, monkeypatch, root: Path, *, stage: str, code: int, at: int | None) -> None:
        if stage not in ("write", "create", "rename"):
            raise ValueError(f"unknown stage {stage!r}")
        self.root, self.stage, self.code, self.at = Path(os.path.abspath(root)), stage, code, at
        self.targets: list[Path] = []
        self.failed: Path | None = None
        real = {"fsync": os.fsync, "open": os.open, "mkdir": os.mkdir, "replace": os.replace}

        def fsync(fd: int) -> None:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            self._op(path, "write")
            real["fsync"](fd)

        def open_(path, flags, *args, **kwargs):
            if flags & os.O_CREAT:
                self._op(Path(os.path.abspath(os.fspath(path))), "create")
            return real["open"](path, flags, *args, **kwargs)

        def mkdir(path, *args, **kwargs):
            if not os.path.lexists(path):  # an existing name is EEXIST, read-only or not
                self._op(Path(os.path.abspath(os.fspath(path))), "create")
            return real["mkdir"](path, *args, **kwargs)

        def replace(src, dst, *args, **kwargs):
            self._op(Path(os.path.abspath(os.fspath(dst))), "rename")
            return real["replace"](src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "fsync", fsync)
        if stage == "create":
            monkeypatch.setattr(os, "open", open_)
            monkeypatch.setattr(os, "mkdir", mkdir)
        if stage == "rename":
            monkeypatch.setattr(os, "replace", replace)

    def _op(self, path: Path, stage: str) -> None:
        if stage != self.stage or not (path == self.root or self.root in path.parents):
            return
        self.targets.append(final_name(path))
        if self.at is not None and len(self.targets) >= self.at:
            if self.failed is None:
                self.failed = final_name(path)
            raise OSError(self.code, os.strerror(self.code), str(final_name(path)))
