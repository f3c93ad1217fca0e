"""The one contract every dataset implements, and the registry that holds them.

A :class:`DatasetSpec` names the splits a dataset has, the on-disk layout it expects (used verbatim in error
messages) and an ``open`` function that returns a :class:`~training.data.catalog.Catalog` for one split.
Everything else (split aliases, the missing-root and missing-files errors, downloading, ``limit``) is done
here once, so every entry behaves the same. Loaders signal absent data by raising :class:`MissingData`
with the path they tried; the spec turns it into one :class:`~foundation.errors.DataError` line that names the
dataset, the path and the expected layout.

>>> reg = Registry()
>>> reg.register(DatasetSpec(name="toy", splits=("train",), expected_layout="nothing", needs_root=False,
...     open=lambda root, split, size: None))
>>> reg.names()
('toy',)
>>> reg["nope"]
Traceback (most recent call last):
...
foundation.errors.DataError: unknown dataset 'nope'; valid names: toy
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from training.data.catalog import Catalog, limit_indices
from training.data.imageset import ImageSet
from foundation.errors import DataError

__all__ = ["DatasetSpec", "Registry", "MissingData"]


class MissingData(Exception):
    """Raised by a loader when the files it needs are absent; carries the path it looked for."""

    def __init__(self, path: Path | str, detail: str = "") -> None:
        super().__init__(str(path))
        self.path = Path(path)
        self.detail = detail


_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")

OpenFn = Callable[[Path | None, str, int | None], Catalog]
DownloadFn = Callable[[Path, str], None]


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """One registry entry.

    Attributes:
        name: registry name.
        splits: canonical split names.
        expected_layout: human description of the files expected under the root; ``{root}`` is replaced by
            the root given. Used in every missing-data error.
        open: ``open(root, split, image_size) -> Catalog`` for a canonical split; raises :class:`MissingData`
            when files are absent and :class:`DataError` when they are malformed.
        aliases: extra split names mapped to canonical ones (e.g. ``{"test": "val"}``).
        needs_root: False for datasets that need nothing on disk (digits, synthetic).
        download: ``download(root, split)`` fetches the files (needs internet), or None if not downloadable.
        split_options: whether a split may carry ``:key=value,...`` options (synthetic).
        free_splits: whether any split name made of letters, digits, ``_``, ``.`` and ``-`` is accepted
            (npz folders); ``splits`` then lists the usual ones.
        description: one line for listings.
    """

    name: str
    splits: tuple[str, ...]
    expected_layout: str
    open: OpenFn
    aliases: Mapping[str, str] = field(default_factory=dict)
    needs_root: bool = True
    download: DownloadFn | None = None
    split_options: bool = False
    free_splits: bool = False
    description: str = ""

    def layout(self, root: Path | str | None) -> str:
        """The expected layout with ``{root}`` filled in."""
        return self.expected_layout.replace("{root}", str(root) if root is not None else "<root>")

    def resolve_split(self, split: str) -> str:
        """Canonical split name for ``split`` (aliases applied, options kept).

        Raises:
            DataError: if the split is unknown, listing the valid ones.
        """
        if not isinstance(split, str) or not split:
            raise DataError(f"{self.name}: split must be a non-empty string, got {split!r}")
        base, sep, options = split.partition(":")
        if sep and not self.split_options:
            raise DataError(f"{self.name}: split {split!r} has options, but {self.name} takes none; "
                            f"valid splits: {', '.join(self.valid_splits())}")
        canonical = self.aliases.get(base, base)
        if self.free_splits and _SPLIT_NAME.fullmatch(canonical):
            return canonical
        if canonical not in self.splits:
            raise DataError(f"{self.name}: unknown split {base!r}; valid splits: {', '.join(self.valid_splits())}")
        return canonical + (sep + options if sep else "")

    def valid_splits(self) -> tuple[str, ...]:
        """Canonical splits followed by aliases, as ``alias (= canonical)``."""
        free = ("any file name <split>.npz",) if self.free_splits else ()
        return self.splits + tuple(f"{a} (= {c})" for a, c in self.aliases.items()) + free

    def _missing(self, root: Path | None, exc: MissingData | None, downloadable: bool) -> DataError:
        tried = exc.path if exc is not None else root
        detail = f" ({exc.detail})" if exc is not None and exc.detail else ""
        hint = "set data.root to the folder holding it" + (" or pass --download / data.download=true "
                                                           "(needs internet)" if downloadable else "")
        return DataError(f"{self.name}: no data at {tried}{detail}: expected {self.layout(root)}; {hint}")

    def catalog(self, root: str | Path | None, split: str, image_size: int | None = None,
                download: bool = False) -> Catalog:
        """Open one split as a :class:`Catalog` (nothing decoded yet).

        Raises:
            DataError: unknown split, missing root, missing or malformed files, or a failed download.
        """
        if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int)
                                       or image_size <= 0):
            raise DataError(f"{self.name}: image_size must be a positive integer, got {image_size!r}")
        canonical = self.resolve_split(split)
        path = Path(root).expanduser() if root is not None else None
        if download and self.download is None:
            raise DataError(f"{self.name}: cannot be downloaded; set data.download: false and "
                            f"put the files at {self.layout(path)}")
        if self.needs_root and path is None:
            raise DataError(f"{self.name}: no data root given; set data.root (--set data.root=PATH) to a folder "
                            f"holding {self.layout(None)}")
        try:
            return self.open(path, canonical, image_size)
        except MissingData as exc:
            if not download:
                raise self._missing(path, exc, self.download is not None) from None
        if self.download is None or path is None:
            raise self._missing(path, None, False)
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.download(path, canonical)
        except DataError:
            raise
        except Exception as exc:  # network and archive errors come in many types
            raise DataError(f"{self.name}: download into {path} failed ({type(exc).__name__}: {exc}); "
                            f"check the internet connection or put the files at {self.layout(path)}") from None
        try:
            return self.open(path, canonical, image_size)
        except MissingData as exc:
            raise self._missing(path, exc, False) from None

    def load(self, root: str | Path | None, split: str, image_size: int | None = None, download: bool = False,
             limit: int | None = None) -> ImageSet:
        """Load one split: :meth:`catalog`, keep ``limit`` rows (class-balanced, see
        :func:`~training.data.catalog.limit_indices`), decode and resize them.

        Raises:
            DataError: as :meth:`catalog`, or if ``limit`` is not a positive integer.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise DataError(f"{self.name}: limit must be a positive integer or None, got {limit!r}")
        cat = self.catalog(root, split, image_size, download)
        return cat.take(limit_indices(cat.y, limit))


class Registry:
    """Name -> :class:`DatasetSpec`. Duplicate registration is a ValueError; an unknown name a DataError."""

    def __init__(self, specs: tuple[DatasetSpec, ...] | list[DatasetSpec] = ()) -> None:
        self._specs: dict[str, DatasetSpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: DatasetSpec) -> None:
        """Add ``spec``.

        Raises:
            ValueError: if its name is already registered.
        """
        if spec.name in self._specs:
            raise ValueError(f"dataset {spec.name!r} is already registered (registered: {', '.join(self.names())})")
        self._specs[spec.name] = spec

    def names(self) -> tuple[str, ...]:
        """Registered names in registration order."""
        return tuple(self._specs)

    def __getitem__(self, name: str) -> DatasetSpec:
        spec = self._specs.get(name) if isinstance(name, str) else None
        if spec is None:
            close = difflib.get_close_matches(str(name), self.names(), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise DataError(f"unknown dataset {name!r}; valid names: {', '.join(self.names())}{hint}")
        return spec

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)
