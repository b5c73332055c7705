"""The root of stagetrail's error hierarchy and the event vocabulary's own errors.

`StagetrailError` lives here because `events` may import nothing else from the
project. Users import these from `engine.errors`, which re-exports every error of
every layer (and `StagetrailError` also from `engine`).
"""

from __future__ import annotations

from typing import Any


class StagetrailError(Exception):
    """Base class of every error stagetrail raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take their facts, not the message, as arguments: pickle the
        # message and the attributes instead, so errors cross process boundaries.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[StagetrailError], args: tuple[Any, ...], facts: dict[str, Any]
) -> StagetrailError:
    error = cls.__new__(cls, *args)
    BaseException.__init__(error, *args)
    error.__dict__.update(facts)
    return error


class InvalidPayload(StagetrailError, TypeError):
    """A payload value is not strict JSON (RFC 8259) or has the wrong type.

    Attributes:
        field: the event field that holds the bad value.
        path: where inside the field, e.g. ``result['files'][2]``.
        reason: what is wrong with it.
    """

    def __init__(self, field: str, path: str, reason: str) -> None:
        self.field = field
        self.path = path
        self.reason = reason
        super().__init__(f"field {field!r}: {path} {reason}")


class PayloadTooLarge(InvalidPayload):
    """An event is larger, serialised, than the store's `max_event_bytes`.

    Attributes:
        size: the event's serialised size in bytes.
        limit: the store's limit in bytes.
        field_size: the serialised size of `field`, the largest field.
    """

    def __init__(self, field: str, field_size: int, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        self.field_size = field_size
        super().__init__(
            field,
            field,
            f"is {field_size:,} bytes serialised: the event would be {size:,} bytes, over "
            f"the store's limit of {limit:,} bytes (max_event_bytes); store large data "
            "elsewhere and record a reference to it, or raise the limit",
        )


class InvalidEvent(StagetrailError, ValueError):
    """A field value is of the right type but outside its allowed range.

    Attributes:
        field: the event field that holds the bad value.
        reason: what is wrong with it.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"field {field!r}: {reason}")


class EventFormatError(StagetrailError, ValueError):
    """A stored event cannot be turned back into an event object.

    Attributes:
        topic: the stored event's topic.
        reason: why it cannot be decoded.
    """

    def __init__(self, topic: str, reason: str) -> None:
        self.topic = topic
        self.reason = reason
        super().__init__(f"cannot decode stored event {topic!r}: {reason}")


class PipelineError(StagetrailError, ValueError):
    """A pipeline definition is invalid; `problem` says what and where."""

    def __init__(self, pipeline: str, problem: str) -> None:
        self.pipeline = pipeline
        self.problem = problem
        super().__init__(f"pipeline {pipeline!r}: {problem}")
