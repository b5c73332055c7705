"""Checking query arguments and finding versions by time, for the engine's read methods."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from engine.errors import InvalidArgument
from engine.store import Store
from events import RUN_STATUSES
from events.storable import unstorable_text
from projections import PAUSED_STATUSES, RUNNING


def version_at(store: Store, run_id: UUID, at: int | datetime, last: int, name: str) -> int:
    """The version `at` names: a version (capped at the newest), or the last one by a time.

    Raises:
        InvalidArgument: a negative or non-int version, or a naive datetime.
    """
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise InvalidArgument(name, "must be timezone-aware (naive datetimes are ambiguous)")
        return _last_before(store, run_id, in_utc(at, name), last)
    if type(at) is not int or at < 0:
        raise InvalidArgument(name, f"must be a version (int >= 0) or a datetime, got {at!r}")
    return min(at, last)


def _last_before(store: Store, run_id: UUID, moment: datetime, last: int) -> int:
    # Timestamps never go backwards within a run, so a binary search over versions
    # reads about 17 single events for a 100,000-event run instead of all of them.
    low, high = 0, last
    while low < high:
        middle = (low + high + 1) // 2
        event = store.read(run_id, gt=middle - 1, lte=middle)[0]
        if event.timestamp <= moment:
            low = middle
        else:
            high = middle - 1
    return low


def labels(label: str | Mapping[str, str] | Iterable[str] | None) -> dict[str, str]:
    """Label filters from ``"k=v"``, several such strings, or a mapping.

    Raises:
        InvalidArgument: a filter without ``=`` or with an empty key.
    """
    if label is None:
        return {}
    if isinstance(label, Mapping):
        pairs = {str(k): str(v) for k, v in label.items()}
    else:
        pairs = {}
        for item in [label] if isinstance(label, str) else list(label):
            key, equals, value = str(item).partition("=")
            if not equals or not key:
                raise InvalidArgument("label", f"{item!r} must look like key=value")
            pairs[key] = value
    for key, value in pairs.items():
        text(f"label {key!r}", key)
        text(f"label {key!r}", value)
    return pairs


def text(name: str, value: Any) -> Any:
    """`value` if it is not a str, or a str a store can hold (no NUL, no lone surrogate).

    Raises:
        InvalidArgument: a str no store can hold, so nothing can match it.
    """
    if isinstance(value, str):
        problem = unstorable_text(value)
        if problem is not None:
            raise InvalidArgument(name, f"{value!r} {problem}, so no run can match it")
    return value


def status(value: Any) -> str | None:
    """A run status to filter by: ``running``, a paused status or a finish status.

    Raises:
        InvalidArgument: any other value.
    """
    allowed = sorted({RUNNING, *PAUSED_STATUSES, *RUN_STATUSES})
    if value is not None and value not in allowed:
        raise InvalidArgument("status", f"must be one of {allowed}, got {value!r}")
    return value  # type: ignore[no-any-return]


def run_id(value: Any, name: str) -> UUID:
    """A run id given as a UUID or its text.

    Raises:
        InvalidArgument: anything else.
    """
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise InvalidArgument(name, f"{value!r} is not a run id") from None


MAX_INT = 2**63 - 1
"""The largest number a store's queries take (a signed 64-bit integer)."""


def limit(value: Any) -> int:
    """A positive row limit that fits a 64-bit integer.

    Raises:
        InvalidArgument: not an int from 1 to `MAX_INT`.
    """
    if type(value) is not int or value < 1:
        raise InvalidArgument("limit", f"must be an int >= 1, got {value!r}")
    if value > MAX_INT:
        given = str(value) if value.bit_length() < 1000 else f"a {value.bit_length()}-bit number"
        raise InvalidArgument("limit", f"must be at most {MAX_INT} (64 bits), got {given}")
    return value


def offset(value: Any) -> int:
    """How many matching rows to pass over: an int from 0 that fits a 64-bit integer.

    Raises:
        InvalidArgument: not an int from 0 to `MAX_INT`.
    """
    if type(value) is not int or value < 0:
        raise InvalidArgument("offset", f"must be an int >= 0, got {value!r}")
    if value > MAX_INT:
        raise InvalidArgument("offset", f"must be at most {MAX_INT} (64 bits)")
    return value


def since(value: datetime | None) -> datetime | None:
    """A timezone-aware lower bound on start times, in UTC.

    Raises:
        InvalidArgument: a naive datetime, not a datetime, or one outside years 1 to 9999 in UTC.
    """
    if value is not None and (not isinstance(value, datetime) or value.tzinfo is None):
        raise InvalidArgument("since", f"must be a timezone-aware datetime, got {value!r}")
    return None if value is None else in_utc(value, "since")


def in_utc(moment: datetime, name: str) -> datetime:
    """`moment` (timezone-aware) in UTC.

    Raises:
        InvalidArgument: it falls outside the years 1 to 9999 once in UTC.
    """
    try:
        return moment.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidArgument(
            name, f"{moment.isoformat()} is outside the years 1 to 9999 in UTC"
        ) from None


def max_event_bytes(value: Any) -> int:
    """A limit on one event's serialised size, in bytes.

    Raises:
        InvalidArgument: not an int >= 1.
    """
    if type(value) is not int or value < 1:
        raise InvalidArgument("max_event_bytes", f"must be an int >= 1, got {value!r}")
    return value
