"""Strict JSON (RFC 8259) checking for payload values."""

from __future__ import annotations

import math
from typing import Any

from events.errors import InvalidPayload

JSON = Any
"""A strict JSON value: None, bool, int, finite float, str, list, dict[str, JSON]."""

_SCALARS = (str, int, bool, type(None))


def strict_json(field: str, value: object) -> JSON:
    """Return a private copy of `value` as strict JSON, tuples turned into lists.

    Raises:
        InvalidPayload: naming the field and the path of the first bad value.
    """
    if type(value) in _SCALARS:
        return value
    return _copy(field, field, value)


def _copy(field: str, path: str, value: object) -> JSON:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        return _finite(field, path, value)  # type: ignore[arg-type]
    if kind is dict:
        return _copy_dict(field, path, value)  # type: ignore[arg-type]
    if kind is list or kind is tuple:
        items: list[object] | tuple[object, ...] = value  # type: ignore[assignment]
        return [_copy(field, f"{path}[{i}]", item) for i, item in enumerate(items)]
    raise InvalidPayload(field, path, f"is a {kind.__name__}, which is not JSON")


def _copy_dict(field: str, path: str, value: dict[object, object]) -> JSON:
    copied = {}
    for key, item in value.items():
        if type(key) is not str:
            raise InvalidPayload(
                field, path, f"has a {type(key).__name__} key {key!r}; JSON keys are str"
            )
        copied[key] = _copy(field, f"{path}[{key!r}]", item)
    return copied


def _finite(field: str, path: str, value: float) -> float:
    if math.isfinite(value):
        return value
    raise InvalidPayload(field, path, f"is {value}, which is not JSON")


def finite_number(field: str, value: object) -> float:
    """Return `value` as a float if it is a finite int or float (not a bool).

    Raises:
        InvalidPayload: if it is not a number, or is NaN or infinite.
    """
    if type(value) not in (int, float):
        raise InvalidPayload(field, field, f"is a {type(value).__name__}, not a number")
    return _finite(field, field, float(value))  # type: ignore[arg-type]
