"""Strict JSON (RFC 8259) checking for payload values."""

from __future__ import annotations

import math
from typing import Any

from events.errors import InvalidPayload

JSON = Any
"""A strict JSON value: None, bool, int, finite float, str, list, dict[str, JSON]."""

_SCALARS = frozenset({str, int, bool, type(None)})


class _NotJSON(Exception):
    """A bad value met deep in a payload; each container on the way out adds its step."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.steps: list[str] = []  # innermost first


def strict_json(field: str, value: object) -> JSON:
    """Return a private copy of `value` as strict JSON, tuples turned into lists.

    Raises:
        InvalidPayload: naming the field and the path of the first bad value.
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    try:
        return _copy_dict(value) if kind is dict else _copy(value)
    except _NotJSON as bad:
        raise InvalidPayload(field, field + "".join(reversed(bad.steps)), bad.problem) from None
    except RecursionError:
        raise InvalidPayload(field, field, "is nested too deeply (or contains itself)") from None


def _copy(value: Any) -> JSON:
    # The path to a bad value is built only once one is found (`_NotJSON.steps`):
    # every payload of every append walks through here.
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        # x - x is 0.0 for finite floats and NaN for NaN and the infinities.
        if value - value == 0.0:
            return value
        raise _NotJSON(f"is {value}, which is not JSON")
    if kind is dict:
        return _copy_dict(value)
    if kind is list or kind is tuple:
        return _copy_list(value)
    return _subclass(value)


def _copy_list(items: list[Any] | tuple[Any, ...]) -> JSON:
    copied: list[Any] = []
    append = copied.append
    for item in items:
        kind = type(item)
        if kind in _SCALARS or (kind is float and item - item == 0.0):
            append(item)
            continue
        try:
            append(_copy(item))
        except _NotJSON as bad:
            bad.steps.append(f"[{len(copied)}]")  # the index of the item that failed
            raise
    return copied


def _subclass(value: object) -> JSON:
    """Subclasses of JSON types (str/int enums, numpy.float64, Counter) become plain values.

    The base type's own conversion is used, so a ``(str, Enum)`` member gives its
    value, as `json.dumps` would, not its ``str()``.
    """
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return _copy(float.__float__(value))
    if isinstance(value, dict):
        return _rekeyed(value)  # through its own items(), as json.dumps reads it
    if isinstance(value, list | tuple):
        return _copy(list(value))
    raise _NotJSON(f"is a {type(value).__name__}, which is not JSON")


def _copy_dict(value: Any) -> JSON:
    # Copied whole in C, then only a container value is replaced by its own copy (a
    # key's value replaced while its dict is walked: the dict keeps its size). Each level
    # of nesting costs two frames (here and `_copy`), as in `_copy_list`: the depth
    # refused as too deep is the same for both, within what the JSON encoder takes.
    copied = value.copy()
    for key, item in copied.items():
        if type(key) is not str:
            return _rekeyed(value)
        kind = type(item)
        if kind in _SCALARS or (kind is float and item - item == 0.0):
            continue
        try:
            copied[key] = _copy(item)
        except _NotJSON as bad:
            bad.steps.append(f"[{key!r}]")
            raise
    return copied


def _rekeyed(value: dict[Any, Any]) -> JSON:
    """`_copy_dict` key by key, in order, through `value.items()`: a dict with a key that
    is not exactly a str, or a dict subclass (its items() may not be its storage)."""
    copied = {}
    for key, item in value.items():
        if type(key) is not str:
            key = _key(key)
        try:
            copied[key] = _copy(item)
        except _NotJSON as bad:
            bad.steps.append(f"[{key!r}]")
            raise
    return copied


def _key(key: object) -> str:
    if isinstance(key, str):
        return str.__str__(key)
    raise _NotJSON(f"has a {type(key).__name__} key {key!r}; JSON keys are str")


def finite_number(field: str, value: object) -> float:
    """Return `value` as a float if it is a finite int or float (not a bool).

    Raises:
        InvalidPayload: if it is not a number, or is NaN or infinite.
    """
    if type(value) not in (int, float):
        raise InvalidPayload(field, field, f"is a {type(value).__name__}, not a number")
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number):
        raise InvalidPayload(field, field, f"is {number}, which is not JSON")
    return number
