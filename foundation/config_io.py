"""Reading configs: YAML without surprises (``yaml.safe_load``, duplicate keys refused), ``--set`` overrides, and
one-line messages for validation errors. :mod:`training.config` re-exports these names.

Overrides come in two forms: ``"key=value"`` text (the command line's ``--set``; the value is read as a YAML
scalar, so ``4`` is a number and ``false`` a bool) and a ``{key: value}`` mapping (the Python API), whose values are
applied as given, never re-parsed. :func:`to_overrides` turns either into typed ``(path, value)`` pairs.

>>> apply_overrides({"a": {"b": 1}}, ["a.c=2"])
{'a': {'b': 1, 'c': 2}}
>>> apply_overrides({}, {"data.root": "/data/set #2", "name": "no"})
{'data': {'root': '/data/set #2'}, 'name': 'no'}
"""

from __future__ import annotations

import copy
import difflib
import importlib.resources
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from foundation.errors import ConfigError

__all__ = ["safe_load_yaml", "load_yaml", "resolve_config_path", "SHIPPED_PACKAGE", "shipped_config", "Override",
           "Overrides", "parse_override", "to_overrides", "override_text", "apply_overrides", "format_validation_error"]

#: One parsed override: the dotted key's parts and the value to set there (typed).
Override = tuple[tuple[str, ...], Any]
#: What every function that takes overrides accepts: ``"key=value"`` strings, ``(parts, value)`` pairs (from
#: :func:`to_overrides`), a ``{key: value}`` mapping, or None.
Overrides = Sequence[str | Override] | Mapping[str, Any] | None


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping with the same key twice (YAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (YAML would silently keep the last value)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def safe_load_yaml(text: str | bytes) -> Any:
    """``yaml.safe_load`` of ``text`` (bytes must be UTF-8), refusing duplicate keys; builds no Python objects.

    >>> safe_load_yaml("{a: 1, b: [2, 3]}")
    {'a': 1, 'b': [2, 3]}
    >>> safe_load_yaml("{a: 1, a: 2}")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    yaml.constructor.ConstructorError: duplicate key 'a' (YAML would silently keep the last value)
    ...
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # "[[[[...]]]]" nested deeper than the parser's stack
        raise yaml.YAMLError("nested too deeply to be a config") from None


#: The data package that holds the configs shipped with this installation (``eval_configs/``: every ``*.yaml``
#: under it ships in the wheel; pyproject's ``packages.find`` and ``package-data``).
SHIPPED_PACKAGE = "eval_configs"


def shipped_config(*parts: str) -> Path:
    """A config shipped with this installation, found through :mod:`importlib.resources` (a checkout's
    ``eval_configs/`` or an installed wheel's alike, wherever the package was installed), not beside this file.

    Args:
        parts: the path inside ``eval_configs/`` (e.g. ``"transfer", "default.yaml"``); none gives the folder.

    Raises:
        ConfigError: the package cannot be imported (an editable install made before it was a package: re-run
            ``pip install -e .``) or is not a folder on disk (e.g. imported from a zip archive).

    >>> shipped_config("transfer", "default.yaml").is_file()
    True
    """
    try:
        root = importlib.resources.files(SHIPPED_PACKAGE)
    except ModuleNotFoundError:
        raise ConfigError(f"the shipped configs (package {SHIPPED_PACKAGE!r}) are not importable; reinstall "
                          f"dp-audit ('pip install .', or 'pip install -e .' in a checkout)") from None
    if not isinstance(root, Path):
        raise ConfigError(f"the shipped configs ({root}) are not a folder on disk; install dp-audit unpacked "
                          f"('pip install .')")
    return root.joinpath(*parts)


def resolve_config_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as given when it exists; else a relative ``eval_configs/...`` path names a shipped config
    (:func:`shipped_config`).

    So ``audit run eval_configs/quickstart.yaml`` works from any directory, while a file of that name in the
    current directory (the user's own copy) still wins.

    >>> resolve_config_path("eval_configs/quickstart.yaml").is_file()   # from whatever the current directory
    True
    >>> resolve_config_path("my.yaml")
    PosixPath('my.yaml')
    """
    path = Path(path)
    if path.is_file() or path.is_absolute() or not path.parts or path.parts[0] != SHIPPED_PACKAGE:
        return path
    shipped = shipped_config(*path.parts[1:])
    return shipped if shipped.is_file() else path


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML mapping with ``yaml.safe_load``; a missing or malformed file is a :class:`ConfigError`.

    A relative ``eval_configs/NAME.yaml`` not found in the current directory is read from the shipped configs
    (:func:`resolve_config_path`).
    """
    path = resolve_config_path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (pass a YAML file, e.g. eval_configs/quickstart.yaml)")
    try:
        data = safe_load_yaml(path.read_bytes())
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        raise ConfigError(f"config file {path} is not valid YAML{where}: {problem}") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty; it must hold a mapping of sections")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def _split_key(key: str, shown: str) -> tuple[str, ...]:
    raw = key.strip().split(".")
    parts = tuple(p.strip() for p in raw)
    if not any(parts):
        raise ConfigError(f"--set has an empty key in {shown!r}")
    if not all(parts):  # "privacy..enabled" or ".x": a typo that must not set some other key
        raise ConfigError(f"--set key {key.strip()!r} has an empty part (two dots, or a leading or trailing dot) "
                          f"in {shown!r}; write it as section.key=value")
    return parts


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value`` into (["a", "b", "c"], value); the value is read as YAML (numbers, lists, null).

    >>> parse_override("privacy.target_epsilon=4")
    (['privacy', 'target_epsilon'], 4)
    """
    if "=" not in text:
        raise ConfigError(f"--set expects KEY=VALUE (e.g. privacy.target_epsilon=4), got {text!r}")
    key, raw = text.split("=", 1)
    parts = list(_split_key(key, text))
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


def to_overrides(overrides: Overrides) -> tuple[Override, ...]:
    """Typed ``(parts, value)`` pairs from ``"key=value"`` strings (values read as YAML), ``(parts, value)``
    pairs (kept), or a ``{key: value}`` mapping (values kept as given: a string stays that string).

    >>> to_overrides({"data.root": "/data/set #2", "privacy.enabled": "no"})
    ((('data', 'root'), '/data/set #2'), (('privacy', 'enabled'), 'no'))
    >>> to_overrides(["privacy.enabled=no"])
    ((('privacy', 'enabled'), False),)

    Raises:
        TypeError: one bare string (wrap it in a list) or an item that is neither a string nor a pair.
        ConfigError: a string without ``=`` or an empty key.
    """
    if overrides is None:
        return ()
    if isinstance(overrides, Mapping):
        out: list[Override] = []
        for key, value in overrides.items():
            if not isinstance(key, str):
                raise TypeError(f"override keys must be dotted strings like 'privacy.target_epsilon', got {key!r}")
            out.append((_split_key(key, key), copy.deepcopy(value)))
        return tuple(out)
    if isinstance(overrides, (str, bytes)):
        raise TypeError("overrides must be a list of 'key=value' strings or a mapping, got one string; "
                        "wrap it in a list")
    out = []
    for item in overrides:
        if isinstance(item, str):
            parts, value = parse_override(item)
            out.append((tuple(parts), value))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], tuple):
            out.append((tuple(str(p) for p in item[0]), item[1]))
        else:
            raise TypeError(f"an override must be a 'key=value' string or a (parts, value) pair, got {item!r}")
    return tuple(out)


def override_text(override: Override) -> str:
    """The ``--set`` text of one override: ``parse_override`` of it gives the same value back.

    >>> override_text((("data", "root"), "/data/set #2"))
    "data.root='/data/set #2'"
    >>> override_text((("privacy", "enabled"), False))
    'privacy.enabled=false'
    """
    parts, value = override
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf"), allow_unicode=True)
    return f"{'.'.join(parts)}={text.removesuffix(chr(10)).removesuffix(chr(10) + '...').strip()}"


def apply_overrides(data: dict[str, Any], overrides: Overrides) -> dict[str, Any]:
    """Return a deep copy of ``data`` with dotted overrides applied (``["a.b=1"]``, ``{"a.b": 1}`` or the pairs of
    :func:`to_overrides`); a mapping's values are set as given."""
    out = copy.deepcopy(data)
    for parts, value in to_overrides(overrides):
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"cannot set {'.'.join(parts)}: {p} is a value, not a section")
            node = nxt
        node[parts[-1]] = copy.deepcopy(value)
    return out


def _unwrap_model(annotation: Any) -> Any:
    """The BaseModel class inside ``X``, ``X | None``, ``list[X]``, ``tuple[X, ...]`` or ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config class that owns the last element of ``loc`` (for listing valid keys)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):  # a list item: the owner is the list's element type, already unwrapped
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        current = _unwrap_model(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def format_validation_error(exc: ValidationError, model: type[BaseModel], source: str) -> str:
    """One line naming the first problem: the dotted key, what is allowed, and what was received."""
    msgs = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            owner = _model_at(model, loc)
            valid = sorted(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            msgs.append(f"unknown key '{key}' (valid keys here: {', '.join(valid)}){hint}")
        elif err["type"] == "value_error":
            msgs.append(str(err["msg"]).removeprefix("Value error, "))
        else:
            got = err.get("input")
            got_s = "" if isinstance(got, dict) else f", got {got!r}"
            msgs.append(f"{key}: {err['msg']}{got_s}")
    return f"{source}: " + "; ".join(msgs[:3]) + (f" (+{len(msgs) - 3} more)" if len(msgs) > 3 else "")
