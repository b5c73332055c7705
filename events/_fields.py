"""attrs field makers that check and normalise event payload values."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import attrs

from events._json import JSON, finite_number, strict_json
from events.errors import InvalidEvent, InvalidPayload


def checked(convert: Callable[[Any, attrs.Attribute[Any]], Any], **kwargs: Any) -> Any:
    """A field whose value `convert(value, field)` checks and normalises."""
    return attrs.field(converter=attrs.Converter(convert, takes_field=True), **kwargs)


def _json_converter(value: object, field: attrs.Attribute[Any]) -> JSON:
    return strict_json(field.name, value)


def json_value(default: JSON = None) -> Any:
    """A field holding any strict JSON value (copied, tuples become lists)."""
    return attrs.field(
        default=default, converter=attrs.Converter(_json_converter, takes_field=True)
    )


def _text_converter(value: object, field: attrs.Attribute[Any]) -> str:
    if type(value) is not str:
        raise InvalidPayload(field.name, field.name, f"is a {type(value).__name__}, not a str")
    return value


def _name_converter(value: object, field: attrs.Attribute[Any]) -> str:
    if type(value) is str and value:  # the hot path: one check, no further calls
        return value
    if not _text_converter(value, field):
        raise InvalidEvent(field.name, "must not be empty")
    return value  # type: ignore[return-value]


def text(default: str | None = None) -> Any:
    """A str field (may be empty)."""
    converter = attrs.Converter(_text_converter, takes_field=True)
    if default is None:
        return attrs.field(converter=converter)
    return attrs.field(default=default, converter=converter)


def name(default: str | None = None) -> Any:
    """A non-empty str field: a stage, outcome, task id, key or unit."""
    converter = attrs.Converter(_name_converter, takes_field=True)
    if default is None:
        return attrs.field(converter=converter)
    return attrs.field(default=default, converter=converter)


def _optional(convert: Callable[[object, attrs.Attribute[Any]], Any]) -> Any:
    def converter(value: object, field: attrs.Attribute[Any]) -> Any:
        return None if value is None else convert(value, field)

    return attrs.field(default=None, converter=attrs.Converter(converter, takes_field=True))


def optional_text() -> Any:
    """A str field that may be None."""
    return _optional(_text_converter)


def optional_name() -> Any:
    """A non-empty str field that may be None."""
    return _optional(_name_converter)


def _count_converter(minimum: int) -> Callable[[object, attrs.Attribute[Any]], int]:
    def converter(value: object, field: attrs.Attribute[Any]) -> int:
        if type(value) is not int:
            raise InvalidPayload(field.name, field.name, f"is a {type(value).__name__}, not an int")
        if value < minimum:
            raise InvalidEvent(field.name, f"must be at least {minimum}, got {value}")
        return value

    return converter


def count(minimum: int = 1, default: int | None = None) -> Any:
    """An int field (bools refused) of at least `minimum`."""
    converter = attrs.Converter(_count_converter(minimum), takes_field=True)
    if default is None:
        return attrs.field(converter=converter)
    return attrs.field(default=default, converter=converter)


def _seconds_converter(value: object, field: attrs.Attribute[Any]) -> float:
    if type(value) is float and 0.0 <= value < math.inf:  # the hot path
        return value
    number = finite_number(field.name, value)
    if number < 0:
        raise InvalidEvent(field.name, f"must not be negative, got {number}")
    return number


def seconds(default: float = 0.0) -> Any:
    """A finite, non-negative float field (a duration, a delay, an amount)."""
    return attrs.field(
        default=default, converter=attrs.Converter(_seconds_converter, takes_field=True)
    )


def _flag_converter(value: object, field: attrs.Attribute[Any]) -> bool:
    if type(value) is not bool:
        raise InvalidPayload(field.name, field.name, f"is a {type(value).__name__}, not a bool")
    return value


def flag(default: bool) -> Any:
    """A bool field."""
    return attrs.field(
        default=default, converter=attrs.Converter(_flag_converter, takes_field=True)
    )


def optional_flag() -> Any:
    """A bool field that may be None."""
    return _optional(_flag_converter)


def _uuid_converter(value: object, field: attrs.Attribute[Any]) -> UUID:
    if isinstance(value, UUID):
        return value
    raise InvalidPayload(field.name, field.name, f"is a {type(value).__name__}, not a UUID")


def run_id() -> Any:
    """The UUID of a run."""
    return attrs.field(converter=attrs.Converter(_uuid_converter, takes_field=True))


def optional_run_id() -> Any:
    """The UUID of another run, or None."""
    return _optional(_uuid_converter)


def _timestamp_converter(value: object, field: attrs.Attribute[Any]) -> datetime:
    if type(value) is datetime and value.tzinfo is UTC:  # the engine's own stamps
        return value
    if not isinstance(value, datetime):
        raise InvalidPayload(field.name, field.name, f"is a {type(value).__name__}, not a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidEvent(field.name, "must be timezone-aware (naive datetimes are ambiguous)")
    return value.astimezone(UTC)


def utc_now() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


def timestamp() -> Any:
    """A timezone-aware datetime, stored in UTC; defaults to now."""
    return attrs.field(
        factory=utc_now, converter=attrs.Converter(_timestamp_converter, takes_field=True)
    )


def one_of(choices: frozenset[str]) -> Any:
    """A str field whose value must be one of `choices`."""

    def converter(value: object, field: attrs.Attribute[Any]) -> str:
        chosen = _text_converter(value, field)
        if chosen not in choices:
            raise InvalidEvent(field.name, f"must be one of {sorted(choices)}, got {chosen!r}")
        return chosen

    return attrs.field(converter=attrs.Converter(converter, takes_field=True))
