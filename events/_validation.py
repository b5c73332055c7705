"""Event validation: attrs field makers that check and normalise payload values.

Each converter takes the value and the attrs field, so its error names the
field. Converters run on every append: each starts with a one-check fast path.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import attrs

from events._strict_json import _SCALARS, JSON, finite_number, strict_json
from events.errors import InvalidEvent, InvalidPayload

Converter = Callable[[Any, "attrs.Attribute[Any]"], Any]
REQUIRED: Any = attrs.NOTHING
"""The default of a field that has none: the caller must give it."""


def checked(convert: Converter, default: Any = REQUIRED, **kwargs: Any) -> Any:
    """A field whose value `convert(value, field)` checks and normalises."""
    converter = attrs.Converter(convert, takes_field=True)
    return attrs.field(default=default, converter=converter, **kwargs)


def _wrong_type(field: attrs.Attribute[Any], value: object, expected: str) -> InvalidPayload:
    return InvalidPayload(field.name, field.name, f"is a {type(value).__name__}, not {expected}")


def _json(value: object, field: attrs.Attribute[Any]) -> JSON:
    if type(value) in _SCALARS:  # most payload fields: None, a str, a number
        return value
    return strict_json(field.name, value)


def _text(value: object, field: attrs.Attribute[Any]) -> str:
    if type(value) is not str:
        raise _wrong_type(field, value, "a str")
    return value


def _name(value: object, field: attrs.Attribute[Any]) -> str:
    if type(value) is str and value:
        return value
    if not _text(value, field):
        raise InvalidEvent(field.name, "must not be empty")
    return value  # type: ignore[return-value]


def _flag(value: object, field: attrs.Attribute[Any]) -> bool:
    if type(value) is not bool:
        raise _wrong_type(field, value, "a bool")
    return value


def _uuid(value: object, field: attrs.Attribute[Any]) -> UUID:
    if isinstance(value, UUID):
        return value
    raise _wrong_type(field, value, "a UUID")


def _seconds(value: object, field: attrs.Attribute[Any]) -> float:
    if type(value) is float and 0.0 <= value < math.inf:
        return value
    number = finite_number(field.name, value)
    if number < 0:
        raise InvalidEvent(field.name, f"must not be negative, got {number}")
    return number


def _at_least(minimum: int) -> Converter:
    def converter(value: object, field: attrs.Attribute[Any]) -> int:
        if type(value) is not int:
            raise _wrong_type(field, value, "an int")
        if value < minimum:
            raise InvalidEvent(field.name, f"must be at least {minimum}, got {value}")
        return value

    return converter


def _or_none(convert: Converter) -> Converter:
    def converter(value: object, field: attrs.Attribute[Any]) -> Any:
        return None if value is None else convert(value, field)

    return converter


def json_value(default: JSON = None) -> Any:
    """A field holding any strict JSON value (copied, tuples become lists)."""
    return checked(_json, default)


def text(default: str = REQUIRED) -> Any:
    """A str field (may be empty)."""
    return checked(_text, default)


def name(default: str = REQUIRED) -> Any:
    """A non-empty str field: a stage, outcome, task id, key or unit."""
    return checked(_name, default)


def count(minimum: int = 1, default: int = REQUIRED) -> Any:
    """An int field (bools refused) of at least `minimum`."""
    return checked(_at_least(minimum), default)


def seconds(default: float = 0.0) -> Any:
    """A finite, non-negative float field (a duration, a delay, an amount)."""
    return checked(_seconds, default)


def flag(default: bool) -> Any:
    """A bool field."""
    return checked(_flag, default)


def run_id() -> Any:
    """The UUID of a run."""
    return checked(_uuid)


def optional_text() -> Any:
    """A str field that may be None."""
    return checked(_or_none(_text), None)


def optional_name() -> Any:
    """A non-empty str field that may be None."""
    return checked(_or_none(_name), None)


def optional_flag() -> Any:
    """A bool field that may be None."""
    return checked(_or_none(_flag), None)


def optional_count(minimum: int = 1) -> Any:
    """An int field (bools refused) of at least `minimum`, or None."""
    return checked(_or_none(_at_least(minimum)), None)


def optional_seconds() -> Any:
    """A finite, non-negative float field (seconds), or None."""
    return checked(_or_none(_seconds), None)


def optional_run_id() -> Any:
    """The UUID of another run, or None."""
    return checked(_or_none(_uuid), None)


def _timestamp(value: object, field: attrs.Attribute[Any]) -> datetime:
    if type(value) is datetime and value.tzinfo is UTC:
        return value
    if not isinstance(value, datetime):
        raise _wrong_type(field, value, "a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidEvent(field.name, "must be timezone-aware (naive datetimes are ambiguous)")
    return value.astimezone(UTC)


def utc_now() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


def timestamp() -> Any:
    """A timezone-aware datetime, stored in UTC; defaults to now."""
    return checked(_timestamp, attrs.Factory(utc_now))


def one_of(choices: frozenset[str]) -> Any:
    """A str field whose value must be one of `choices`."""

    def converter(value: object, field: attrs.Attribute[Any]) -> str:
        if _text(value, field) not in choices:
            raise InvalidEvent(field.name, f"must be one of {sorted(choices)}, got {value!r}")
        return value  # type: ignore[return-value]

    return checked(converter)
