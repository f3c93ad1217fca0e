"""Read the CIFAR pickles without trusting them.

The CIFAR-10/100 "python version" files are pickles, and ``pickle.load`` on a pickle runs whatever callable
it names (``os.system`` included). :class:`RestrictedUnpickler` resolves only the few globals that a pickled
numpy array needs and refuses every other one with a :class:`~foundation.errors.DataError`:

* ``numpy.core.multiarray._reconstruct`` / ``numpy._core.multiarray._reconstruct`` (the array constructor),
* ``numpy.ndarray`` (passed to it), ``numpy.dtype`` (object dtypes refused),
* ``_codecs.encode`` with the latin-1 codec only (how Python 3 writes ``bytes`` at protocol 2).

Python 2 pickles (the original CIFAR files) are read with ``encoding="latin1"``, as numpy requires for their
array payloads; keys come back as ``str`` for those files and ``bytes`` for Python 3 ones, and
:func:`load_restricted` normalises dict keys to ``str``.

>>> import io, pickle
>>> load_restricted(io.BytesIO(pickle.dumps({b"labels": [1, 2]}, protocol=2)), source="demo")
{'labels': [1, 2]}
>>> load_restricted(io.BytesIO(pickle.dumps(print)), source="demo")
Traceback (most recent call last):
...
foundation.errors.DataError: refusing to unpickle demo: it references builtins.print, which is not part of a numpy array; the file is corrupt or malicious (re-download it)
"""

from __future__ import annotations

import codecs
import pickle
from typing import IO, Any

import numpy as np

from foundation.errors import DataError

__all__ = ["RestrictedUnpickler", "load_restricted"]

_RECONSTRUCT = np.ndarray((0,), np.uint8).__reduce__()[0]  # numpy's own array reconstructor, any version


def _safe_dtype(*args: Any) -> np.dtype:
    dt = np.dtype(*args)
    if dt.hasobject:
        raise DataError(f"refusing to unpickle an object dtype {dt!r}; only plain numeric arrays are allowed")
    return dt


def _latin1_encode(obj: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    if codecs.lookup(encoding).name != "iso8859-1":
        raise DataError(f"refusing to unpickle: _codecs.encode with codec {encoding!r} (only latin-1 is allowed)")
    return codecs.encode(obj, "latin1", errors)


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _safe_dtype,
    ("_codecs", "encode"): _latin1_encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds only plain containers, strings, numbers and numeric numpy arrays.

    Args:
        file: binary file object.
        source: name of the file, for error messages.
    """

    def __init__(self, file: IO[bytes], *, source: str) -> None:
        super().__init__(file, encoding="latin1")
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise DataError(f"refusing to unpickle {self.source}: it references {module}.{name}, which is not part "
                            "of a numpy array; the file is corrupt or malicious (re-download it)")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise DataError(f"refusing to unpickle {self.source}: it uses persistent ids; the file is not a CIFAR batch")


def _str_keys(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}
    return obj


def load_restricted(file: IO[bytes], *, source: str) -> Any:
    """Unpickle ``file`` with :class:`RestrictedUnpickler`; a top-level dict gets ``str`` keys.

    Raises:
        DataError: if the pickle references anything but numpy array parts, or is truncated/corrupt.
    """
    try:
        return _str_keys(RestrictedUnpickler(file, source=source).load())
    except DataError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, MemoryError) as exc:
        raise DataError(f"cannot read {source}: truncated or corrupt pickle ({type(exc).__name__}: {exc}); "
                        "re-download it") from None
