"""Typed result files: one strict schema per JSON file, written and read through the same model.

Each result file of a run directory (``attack.json``, ``epsilon.json``, ``transfer.json``) has one pydantic
model, defined next to the code that writes it. The writer builds the model and :func:`write_result` writes
exactly ``model.model_dump(mode="json")``; every reader calls :func:`read_result`, which checks the ``format``
tag (running an explicit migration for an older tag the writer still reads) and validates strictly: unknown
keys, missing keys and wrong types are refused with one line that names the file, the key and the command that
re-makes the file. Non-finite floats are stored as the strings ``"inf"``, ``"-inf"`` and ``"nan"``
(:func:`foundation.io.write_json`); :data:`Real` parses them back.

>>> class Point(ResultModel):
...     format: str
...     x: Real
>>> Point.model_validate_json('{"format": "p/1", "x": "inf"}').x
inf
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_serializer

from foundation.errors import CheckpointError
from foundation.evidence import sign_json, verify_json
from foundation.io import json_ready, read_json, write_json

__all__ = ["Real", "ResultModel", "CodeRecord", "RunResult", "result_path", "read_named", "read_result", "write_result",
           "validation_message"]

_NON_FINITE = {"inf": float("inf"), "-inf": float("-inf"), "nan": float("nan")}


def _non_finite(value: Any) -> Any:
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value


#: A float that also accepts the strings "inf", "-inf" and "nan" (how non-finite floats are stored).
Real = Annotated[float, BeforeValidator(_non_finite)]


class ResultModel(BaseModel):
    """Base of every result-file schema: strict types, unknown keys refused, immutable.

    ``_omit_if_none`` names optional keys that the writer leaves out when they are ``None`` (a protocol that was
    not run), so the file holds exactly what the writer meant; every other key is always written.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, ser_json_inf_nan="constants")
    _omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if not (k in self._omit_if_none and v is None)}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Any:
        """Validate JSON-ready data (numpy scalars, tuples and non-finite floats allowed) exactly as a reader would
        see it after :func:`write_result`: the writer cannot write what its readers refuse."""
        from foundation.io import _finite, _json_default

        text = json.dumps(_finite(json.loads(json.dumps(data, default=_json_default, allow_nan=True))),
                          allow_nan=False)
        return cls.model_validate_json(text)


class CodeRecord(ResultModel):
    """``code`` in attack/epsilon/transfer results (:meth:`training.trust.CodeTrust.to_dict`): whether
    ``--trust-code`` was given and which fields of the run named code. Absent in files made before it existed."""

    trust_code: bool
    names_code: list[str]


class RunResult(ResultModel):
    """Base of the result files an audit stage computes from a run directory (``attack.json``, ``epsilon.json``):
    the ``format`` tag (each file narrows it to its own), the run's name, ``inputs`` (the freshness record: the
    sha256 of every file it was computed from) and ``code`` (which code the run named and whether it was
    trusted; absent in files made before it existed)."""

    _omit_if_none = frozenset({"code"})

    format: str
    run: str
    inputs: dict[str, str | None]
    code: CodeRecord | None = None


M = TypeVar("M", bound=ResultModel)


def validation_message(exc: ValidationError, *, limit: int = 3) -> str:
    """The first ``limit`` problems of a validation error as ``'key': message`` parts joined by '; '.

    A renamed key shows as both problems: the old name missing and the new name not permitted.
    """
    parts = []
    for err in exc.errors()[:limit]:
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"'{key}': {msg}")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def write_result(path: str | os.PathLike[str], model: ResultModel, *, identity: Mapping[str, Any]) -> Path:
    """Write a result model atomically as standard JSON (non-finite floats as strings), signed with this
    auditor's evidence key over its content and ``identity`` (the run it was made for:
    :func:`training.run.evidence_identity`; :mod:`foundation.evidence`)."""
    return write_json(path, sign_json(json_ready(model.model_dump(mode="json")), identity=identity))


def result_path(path: str | os.PathLike[str], name: str) -> Path:
    """``path/name`` when ``path`` is a (run) directory, else ``path`` itself.

    >>> result_path("/nonexistent/attack.json", "attack.json").name
    'attack.json'
    """
    path = Path(path)
    return path / name if path.is_dir() else path


def read_named(path: str | os.PathLike[str], name: str, model: type[M], *, fmt: str, command: str,
               identity: Mapping[str, Any] | None = None,
               migrations: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]] | None = None) -> M:
    """:func:`read_result` of the file ``name`` in a run directory ``path`` (or of ``path`` itself), whose errors
    name ``{command} RUN`` as the remedy."""
    path = result_path(path, name)
    return read_result(path, model, fmt=fmt, remake=f"{command} {path.parent}", migrations=migrations,
                       identity=identity)


def read_result(path: str | os.PathLike[str], model: type[M], *, fmt: str, remake: str,
                migrations: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]] | None = None,
                identity: Mapping[str, Any] | None = None) -> M:
    """Read and strictly validate one result file, once its evidence signature verifies.

    Args:
        path: the JSON file.
        model: its schema.
        fmt: the ``format`` tag the writer writes now (e.g. ``"dp-audit-epsilon/2"``).
        remake: the command that re-makes the file, quoted in every error (e.g. ``"audit epsilon RUN"``).
        migrations: older ``format`` tag -> function turning such a file's data into the current layout.
        identity: the run's identity now (:func:`training.run.evidence_identity`); when given, a file made for
            another identity (other weights, membership, pool or manifest claim) is refused as stale.

    Returns:
        The validated model.

    Raises:
        CheckpointError: the file is missing, not JSON, not signed by this auditor's key (edited, or made
            elsewhere), stale, of another format, or does not match the schema; the one-line message names the
            file and how to re-make it.
    """
    path = Path(path)
    data = read_json(path, what=path.name)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(data).__name__}; re-run '{remake}'")
    data = verify_json(data, path=path, remake=remake, identity=identity)
    tag = data.get("format")
    if tag != fmt:
        if tag not in (migrations or {}):
            known = ", ".join([repr(fmt), *map(repr, migrations or {})])
            raise CheckpointError(f"{path} has format {tag!r}; this version reads {known}: re-run '{remake}' to "
                                  f"re-make it")
        data = migrations[tag](data)
    try:
        return model.model_validate_json(json.dumps(data, allow_nan=False))
    except (ValidationError, ValueError) as exc:
        why = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
        raise CheckpointError(f"{path} does not match the {fmt} schema at {why}; re-run '{remake}' to re-make "
                              f"it") from None
