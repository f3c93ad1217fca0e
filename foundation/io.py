"""Atomic file writes, hashing and fingerprints.

Every file dp-audit writes goes to a temporary file in the same directory and is renamed into place, so an
interrupt never leaves a half-written output behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from foundation.errors import CheckpointError
from foundation.files import RUN_DIR_MARKERS

__all__ = [
    "atomic_path",
    "all_or_nothing",
    "waiting_lock",
    "write_text",
    "write_json",
    "json_ready",
    "read_json",
    "write_npy",
    "write_npz",
    "sha256_file",
    "copy_file",
    "sha256_bytes",
    "fingerprint_arrays",
    "ArrayFingerprint",
    "save_safetensors",
    "load_safetensors",
    "check_output_dir",
    "remove_run_dir",
]



def umask_mode() -> int:
    """The mode ``open()`` gives a new file under the process umask (0o666 minus the umask), e.g. 0o644.

    Temporary files are created private (``tempfile.mkstemp`` uses 0o600); a finished output gets this mode, as
    any file the user's shell would create.

    >>> old = os.umask(0o022); oct(umask_mode()); _ = os.umask(old)
    '0o644'
    """
    current = os.umask(0)
    os.umask(current)
    return 0o666 & ~current


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    The file ends with ``mode`` (default: what the umask gives a new file, :func:`umask_mode`); pass 0o600 for
    a secret.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, umask_mode() if mode is None else mode)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def all_or_nothing(directory: str | os.PathLike[str], *, files: tuple[str | os.PathLike[str], ...] = ()
                   ) -> Iterator[Path]:
    """Files written in the block form one unit: if it raises (a full disk, an interrupt), none of them is left.

    Everything the block added to ``directory`` is removed, and so are ``files`` (written in the block, possibly
    over older versions: a unit mixing old and new files is worse than none), and ``directory`` itself when the
    block created it. Removal is best effort (on a read-only file system nothing was written anyway). Each file is
    still written atomically (:func:`atomic_path`); this makes the set atomic for its readers: ``audit import``'s
    run directory, ``audit canaries make``'s kit.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()) / "run"
    >>> try:
    ...     with all_or_nothing(d):
    ...         _ = write_text(d / "weights", "x")
    ...         raise OSError(28, "No space left on device")
    ... except OSError:
    ...     pass
    >>> d.exists()
    False
    """
    directory = Path(directory)
    created = not directory.exists() and not directory.is_symlink()
    before = set() if created or not directory.is_dir() else set(os.listdir(directory))
    try:
        yield directory
    except BaseException:
        import shutil

        if directory.is_dir() and not directory.is_symlink():
            for name in set(os.listdir(directory)) - before:
                entry = directory / name
                with contextlib.suppress(OSError):
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
            for f in files:
                with contextlib.suppress(OSError):
                    Path(f).unlink(missing_ok=True)
            if created:
                with contextlib.suppress(OSError):
                    directory.rmdir()
        raise


@contextlib.contextmanager
def waiting_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created when missing) for the block; another process asking
    for the same lock waits until it is released. For caches that several processes fill at once (compute once,
    the others read the result). Where POSIX ``flock`` is missing the block runs unlocked: the callers' results
    are then merely computed more than once. Unlike :func:`foundation.lock.run_lock` it waits instead of
    refusing, and leaves the (empty) file behind.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, waiting_lock(Path(d) / "x.lock"):
    ...     pass
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` atomically (UTF-8)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def _finite(obj: Any) -> Any:
    """Replace non-finite floats with strings ('inf', '-inf', 'nan') so the JSON stays standard."""
    if isinstance(obj, float) and not np.isfinite(obj):
        return "nan" if np.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def json_ready(obj: Any) -> Any:
    """``obj`` as :func:`write_json` writes it and :func:`read_json` reads it back: plain JSON types, numpy
    values converted, non-finite floats as the strings 'inf', '-inf', 'nan' (what a signature covers).

    >>> json_ready({"x": float("inf"), "y": (1, 2)})
    {'x': 'inf', 'y': [1, 2]}
    """
    return _finite(json.loads(json.dumps(obj, default=_json_default, allow_nan=True)))


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented, standard JSON, atomically. Non-finite floats become strings."""
    text = json.dumps(_finite(json.loads(json.dumps(obj, default=_json_default, allow_nan=True))),
                      indent=2, sort_keys=False, allow_nan=False)
    return write_text(path, text + "\n")


def read_json(path: str | os.PathLike[str], *, what: str = "file") -> Any:
    """Read JSON, raising :class:`CheckpointError` with a clear message if missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{what} {path} is not valid JSON ({exc}); re-create it") from None
    except RecursionError:  # "[[[[...]]]]" nested deeper than the parser's stack
        raise CheckpointError(f"{what} {path} is nested too deeply to be a dp-audit file; re-create it") from None


def write_npy(path: str | os.PathLike[str], array: np.ndarray) -> Path:
    """Save one array with ``np.save`` (no pickle), atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, np.asarray(array), allow_pickle=False)
    return Path(path)


def write_npz(path: str | os.PathLike[str], **arrays: np.ndarray) -> Path:
    """Save arrays with ``np.savez_compressed`` (no pickle), atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **{k: np.asarray(v) for k, v in arrays.items()})
    return Path(path)


def copy_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> Path:
    """Copy ``src`` to ``dst`` atomically (temporary file, then rename)."""
    import shutil

    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
    return Path(dst)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str], *, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def fingerprint_arrays(*arrays: np.ndarray) -> str:
    """sha256 over the dtype, shape and bytes of each array, in order: identifies a data pool exactly."""
    fp = ArrayFingerprint()
    for a in arrays:
        a = np.ascontiguousarray(a)
        fp.begin(a.dtype, a.shape)
        fp.update(a)
    return fp.hexdigest()


class ArrayFingerprint:
    """:func:`fingerprint_arrays` fed in pieces: an array's header first, then its rows in chunks, in order.

    The digest equals ``fingerprint_arrays`` of the whole arrays, so a pool streamed from disk in chunks (never
    held in memory at once) gets the in-memory pool's fingerprint. ``update`` checks that each array receives
    exactly the bytes its header announced.

    >>> x = np.arange(24, dtype=np.uint8).reshape(4, 2, 3)
    >>> fp = ArrayFingerprint()
    >>> fp.begin(x.dtype, x.shape); fp.update(x[:1]); fp.update(x[1:])
    >>> fp.hexdigest() == fingerprint_arrays(x)
    True
    """

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._left = 0
        self._dtype: np.dtype | None = None

    def begin(self, dtype: np.dtype | str, shape: tuple[int, ...]) -> None:
        """Start the next array (its dtype and full shape); the previous one must be complete."""
        if self._left:
            raise ValueError(f"the previous array still lacks {self._left} bytes")
        self._dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        self._h.update(str(self._dtype).encode())
        self._h.update(str(shape).encode())
        self._left = int(np.prod(shape, dtype=np.int64)) * self._dtype.itemsize

    def update(self, chunk: np.ndarray) -> None:
        """The next rows of the current array (C order, the announced dtype)."""
        chunk = np.ascontiguousarray(chunk)
        if chunk.dtype != self._dtype:
            raise TypeError(f"chunk has dtype {chunk.dtype}, the array announced {self._dtype}")
        if chunk.nbytes > self._left:
            raise ValueError(f"chunk of {chunk.nbytes} bytes exceeds the {self._left} bytes left in the array")
        self._h.update(chunk.tobytes())
        self._left -= chunk.nbytes

    def hexdigest(self) -> str:
        """The fingerprint; every announced array must be complete."""
        if self._left:
            raise ValueError(f"the last array still lacks {self._left} bytes")
        return self._h.hexdigest()


def save_safetensors(path: str | os.PathLike[str], tensors: Mapping[str, Any],
                     metadata: Mapping[str, str] | None = None) -> Path:
    """Save a name->tensor map as safetensors, atomically (tensors are made contiguous and detached)."""
    from safetensors.torch import save_file

    clean = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(clean, str(tmp), metadata=dict(metadata or {}))
    return Path(path)


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a safetensors file to CPU tensors; a missing or corrupt file raises :class:`CheckpointError`."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"weights file {path} is corrupt or not safetensors ({exc})") from None


def check_output_dir(path: str | os.PathLike[str], *, what: str = "output directory") -> Path:
    """Fail early, with one line, when ``path`` cannot become a writable directory.

    Checks the first existing ancestor: it must be a directory, writable (``os.access``; note that root may write
    anywhere but on a read-only file system).

    Raises:
        CheckpointError: ``path`` or an ancestor is a file, or the nearest existing directory is not writable.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> check_output_dir(d / "a" / "b") == d / "a" / "b"
    True
    >>> (d / "f").write_text("x") and None
    >>> check_output_dir(d / "f" / "run")
    Traceback (most recent call last):
    ...
    foundation.errors.CheckpointError: cannot write the output directory .../f/run: .../f is a file, not a directory; choose another output_dir or name
    """
    path = Path(path)
    probe = path
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise CheckpointError(f"cannot write the {what} {path}: {probe} is a file, not a directory; "
                              "choose another output_dir or name")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write the {what} {path}: {probe} is not writable; choose a writable "
                              "output_dir (or fix its permissions)")
    return path


def remove_run_dir(path: str | os.PathLike[str], *, keep: tuple[str, ...] = ()) -> None:
    """Delete a run directory for ``--overwrite``, refusing anything that is not plainly one.

    Args:
        path: the run directory.
        keep: names of entries to leave in place (the caller's lock file); the directory itself then stays too.

    Raises:
        CheckpointError: ``path`` is a symbolic link (deleting would follow it or fail halfway), not a directory, or
            a non-empty directory holding none of :data:`RUN_DIR_MARKERS` (not a run directory: nothing is
            deleted).
    """
    import shutil

    path = Path(path)
    if path.is_symlink():
        raise CheckpointError(f"--overwrite refuses {path}: it is a symbolic link (to {os.readlink(path)}); delete "
                              "it yourself or choose another output_dir or name")
    if not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(f"--overwrite refuses {path}: it is a file, not a run directory")
    entries = [e for e in path.iterdir() if e.name not in keep]
    if entries and not any((path / m).exists() for m in RUN_DIR_MARKERS):
        raise CheckpointError(f"--overwrite refuses {path}: it holds none of {', '.join(RUN_DIR_MARKERS)}, so "
                              "it is not a run directory; choose another output_dir or name")
    if not keep:
        shutil.rmtree(path)
        return
    for e in entries:
        if e.is_dir() and not e.is_symlink():
            shutil.rmtree(e)
        else:
            e.unlink()
