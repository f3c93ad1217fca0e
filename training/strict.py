"""The strict base of every config section (:class:`Strict`): unknown keys, non-finite floats, booleans given for
numbers and numbers given for switches are errors, and instances are immutable.

>>> class Demo(Strict):
...     steps: int = 1
>>> Demo.model_validate({"steps": True})
Traceback (most recent call last):
...
pydantic_core._pydantic_core.ValidationError: 1 validation error for Demo
steps
  Input should not be a boolean (true/false) [type=bool_not_allowed, input_value=True, input_type=bool]
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

__all__ = ["Strict"]


def _admits_bool(annotation: Any) -> bool:
    """Whether a field annotation accepts ``True``/``False`` as such (``bool``, ``Any``, a union holding them)."""
    if annotation is bool or annotation is Any:
        return True
    if typing.get_origin(annotation) is Literal:
        return any(isinstance(a, bool) for a in typing.get_args(annotation))
    return any(_admits_bool(a) for a in typing.get_args(annotation))


@functools.lru_cache(maxsize=None)
def _besides_bool(annotation: Any) -> TypeAdapter[Any] | None:
    """For a switch (``bool``, or a union holding ``bool`` such as ``bool | Literal["auto"]``): a strict validator of
    the values it takes besides true/false (None: a plain ``bool`` takes nothing else). Raises LookupError for an
    annotation that is no switch."""
    if annotation is bool:
        return None
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and bool in typing.get_args(annotation):
        others = tuple(a for a in typing.get_args(annotation) if a is not bool)
        return TypeAdapter(typing.Union[others] if len(others) > 1 else others[0])  # type: ignore[arg-type]
    raise LookupError(annotation)


def _describe(annotation: Any) -> str:
    """The values of a switch besides true/false, for its error message (``'auto'``, ``null``)."""
    words = []
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is Literal:
            words += [repr(a) for a in typing.get_args(arg)]
        elif arg is type(None):
            words.append("null")
        elif arg is not bool:
            words.append(getattr(arg, "__name__", str(arg)))
    return ", ".join(words)


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors; floats are finite (``.inf`` and ``.nan`` are errors:
    an infinite learning rate or clipping norm trains an all-NaN model); ``true``/``false`` are not numbers
    (YAML reads ``steps: yes`` as True, which pydantic would take for 1 step) and switches take only
    ``true``/``false`` (pydantic would read ``enabled: 1``, ``0`` or ``"no"`` as a boolean); instances are
    immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _admits_bool(field.annotation):
                raise PydanticCustomError("bool_not_allowed", "Input should not be a boolean (true/false)")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _only_bool_for_switches(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name) if info.field_name is not None else None
        if field is None or isinstance(value, bool):
            return value
        try:
            others = _besides_bool(field.annotation)
        except LookupError:
            return value
        if others is not None:
            try:
                others.validate_python(value, strict=True)
                return value
            except ValidationError:
                pass
        also = "" if others is None else f" or {_describe(field.annotation)}"
        raise PydanticCustomError("bool_expected", f"Input should be true or false (a YAML boolean){also}")
