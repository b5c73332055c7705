"""Events about stages: attempts, their outcomes, and the supervisor's decisions."""

from __future__ import annotations

from typing import Any

import attrs

from events import _fields
from events._json import JSON
from events.base import Event
from events.errors import InvalidEvent, InvalidPayload


@attrs.frozen(slots=False, kw_only=True)
class StageStarted(Event):
    """An attempt of the current stage began."""

    stage: str = _fields.name()
    attempt: int = _fields.count(minimum=1)


@attrs.frozen(slots=False, kw_only=True)
class StageCompleted(Event):
    """An attempt of a stage ended with a result; `outcome` moves the machine."""

    stage: str = _fields.name()
    attempt: int = _fields.count(minimum=1)
    outcome: str = _fields.name(default="completed")
    result: JSON = _fields.json_value()
    duration: float = _fields.seconds()


@attrs.frozen(slots=False, kw_only=True)
class StageFailed(Event):
    """An attempt of a stage ended with an error; `outcome` moves the machine."""

    stage: str = _fields.name()
    attempt: int = _fields.count(minimum=1)
    outcome: str = _fields.name(default="failed")
    error: str = _fields.text(default="")
    error_type: str = _fields.name(default="Error")
    retryable: bool = _fields.flag(default=True)
    duration: float = _fields.seconds()


@attrs.frozen(slots=False, kw_only=True)
class RetryScheduled(Event):
    """The supervisor decided to try a stage again after `delay` seconds."""

    stage: str = _fields.name()
    attempt: int = _fields.count(minimum=1)
    delay: float = _fields.seconds()
    reason: str = _fields.text(default="")
    policy: JSON = _fields.json_value()


@attrs.frozen(slots=False, kw_only=True)
class CircuitOpened(Event):
    """A stage's circuit breaker tripped: calls fail fast until it half-opens."""

    stage: str = _fields.name()
    reason: str = _fields.text(default="")


@attrs.frozen(slots=False, kw_only=True)
class CircuitHalfOpened(Event):
    """A stage's breaker lets one trial call through."""

    stage: str = _fields.name()
    reason: str = _fields.text(default="")


@attrs.frozen(slots=False, kw_only=True)
class CircuitClosed(Event):
    """A stage's breaker closed again after a successful trial."""

    stage: str = _fields.name()
    reason: str = _fields.text(default="")


def _changed_files(value: object, field: attrs.Attribute[Any]) -> int | list[str]:
    if type(value) is int:
        if value < 0:
            raise InvalidEvent(field.name, f"must not be negative, got {value}")
        return value
    if isinstance(value, list | tuple) and all(type(f) is str for f in value):
        return list(value)
    raise InvalidPayload(field.name, field.name, "must be a count or a list of file names")


@attrs.frozen(slots=False, kw_only=True)
class ProgressObserved(Event):
    """What changed during a step, so loops without progress can be detected."""

    changed_files: int | list[str] = _fields.checked(_changed_files, default=0)
    diagnostics_signature: str | None = _fields.optional_text()
    test_signature: str | None = _fields.optional_text()
    functional_ok: bool | None = _fields.optional_flag()
