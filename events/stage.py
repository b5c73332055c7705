"""Events about stages: attempts, their outcomes, and the supervisor's decisions."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from events import _validation as fields
from events._strict_json import JSON
from events.base import Event
from events.errors import InvalidEvent, InvalidPayload


@attrs.frozen(kw_only=True)
class StageStarted(Event):
    """An attempt of the current stage began.

    `committed_with` is the version of the first event of the transaction this
    start was written in, when earlier events shared it (a supervisor writes the
    start of the next attempt with the outcome and decision before it), else None:
    an audit sees exactly which records were committed together.

    `timeout` is the seconds the attempt may take (its retry policy's, recorded by
    the supervisor when the attempt starts), or None: no limit, or not said.
    """

    class_version: ClassVar[int] = 3

    stage: str = fields.name()
    attempt: int = fields.count(minimum=1)
    committed_with: int | None = fields.optional_count()
    timeout: float | None = fields.optional_seconds()

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """Version 1 was always written in a transaction of its own, or nobody recorded it."""
        state["committed_with"] = None

    @staticmethod
    def upcast_v2_v3(state: dict[str, Any]) -> None:
        """Version 2 did not say what timeout the attempt ran under."""
        state["timeout"] = None


@attrs.frozen(kw_only=True)
class StageCompleted(Event):
    """An attempt of a stage ended with a result; `outcome` moves the machine.

    `attempt` 0 marks an outcome no attempt produced: a verdict the supervisor
    routed through the table (a ``stuck``, ``partial`` or ``over_budget`` row) while
    the stage did not run. It moves the machine and goes on the stack (so a
    rollback undoes it), but it is no result, attempt or step of the stage
    (`DECIDED`).
    """

    stage: str = fields.name()
    attempt: int = fields.count(minimum=0)
    outcome: str = fields.name(default="completed")
    result: JSON = fields.json_value()
    duration: float = fields.seconds()


DECIDED = 0
"""`StageCompleted.attempt` of an outcome the supervisor decided without running the stage."""

INTERRUPTED = "Interrupted"
"""The `error_type` recorded for an attempt (or task) a crash cut short (`Engine.resume`)."""


@attrs.frozen(kw_only=True)
class StageFailed(Event):
    """An attempt of a stage ended with an error; `outcome` moves the machine.

    `details` is any strict JSON the caller adds to the message (the failing test
    names, a tool's response): from ``stage_failed(details=)``, or the `details`
    attribute of the exception a supervised stage function raised.
    """

    class_version: ClassVar[int] = 2

    stage: str = fields.name()
    attempt: int = fields.count(minimum=1)
    outcome: str = fields.name(default="failed")
    error: str = fields.text(default="")
    error_type: str = fields.name(default="Error")
    retryable: bool = fields.flag(default=True)
    duration: float = fields.seconds()
    details: JSON = fields.json_value()

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """Version 1 had no details."""
        state["details"] = None


@attrs.frozen(kw_only=True)
class RetryScheduled(Event):
    """The supervisor decided to try a stage again after `delay` seconds."""

    stage: str = fields.name()
    attempt: int = fields.count(minimum=1)
    delay: float = fields.seconds()
    reason: str = fields.text(default="")
    policy: JSON = fields.json_value()


@attrs.frozen(kw_only=True)
class CircuitOpened(Event):
    """A stage's circuit breaker tripped: calls fail fast until it half-opens."""

    stage: str = fields.name()
    reason: str = fields.text(default="")


@attrs.frozen(kw_only=True)
class CircuitHalfOpened(Event):
    """A stage's breaker lets one trial call through."""

    stage: str = fields.name()
    reason: str = fields.text(default="")


@attrs.frozen(kw_only=True)
class CircuitClosed(Event):
    """A stage's breaker closed again after a successful trial."""

    stage: str = fields.name()
    reason: str = fields.text(default="")


def _changed_files(value: object, field: attrs.Attribute[Any]) -> int | list[str] | None:
    if value is None:
        return None
    if type(value) is int:
        if value < 0:
            raise InvalidEvent(field.name, f"must not be negative, got {value}")
        return value
    if isinstance(value, list | tuple) and all(type(f) is str for f in value):
        return list(value)
    raise InvalidPayload(field.name, field.name, "must be a count or a list of file names")


@attrs.frozen(kw_only=True)
class ProgressObserved(Event):
    """What one observer saw during a step, so loops without progress can be detected.

    Each signal is optional: None means "not observed here", and the progress fold
    keeps the signal's previous value, so a coder reporting its changed files and a
    verifier reporting its failing test may record separate observations. A test or
    diagnostics signature of ``""`` reports that nothing fails.
    """

    class_version: ClassVar[int] = 2

    changed_files: int | list[str] | None = fields.checked(_changed_files, default=None)
    diagnostics_signature: str | None = fields.optional_text()
    test_signature: str | None = fields.optional_text()
    functional_ok: bool | None = fields.optional_flag()

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        """Version 1 observed every signal in each event: None meant "none" (not functional)."""
        for name in ("diagnostics_signature", "test_signature"):
            if state.get(name) is None:
                state[name] = ""
        if state.get("functional_ok") is None:
            state["functional_ok"] = False
