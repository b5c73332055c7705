"""Circuit breakers: their settings, and their state derived from events.

A breaker's state is never held in memory alone: `CircuitStates` folds stage
outcomes and the `CircuitOpened` / `CircuitHalfOpened` / `CircuitClosed`
decisions, so a restarted process sees an open breaker as it was left. Over
one run it folds that run's events; registered as a persistent projection
(``scope="pipeline"``) it folds every run of a pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from events import (
    JSON,
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    StageCompleted,
    StageFailed,
)
from projections import Projection, on

MAX_WINDOW = 100
"""The most recent attempts a circuit remembers for its failure rate."""

SCOPES = ("run", "pipeline")
"""Where a breaker counts failures: in one run, or across a pipeline's runs."""


@attrs.frozen
class Circuit:
    """One stage's breaker: its status and the recent attempts it judges by."""

    status: str = "closed"
    opened_at: datetime | None = None  # when it opened, or half-opened
    consecutive: int = 0
    recent: tuple[bool, ...] = ()  # newest last; True is a failure
    reason: str = ""  # why it last opened

    def outcome(self, failed: bool) -> Circuit:
        """The circuit after one more attempt ended."""
        return Circuit(  # not attrs.evolve: this runs for every outcome a supervisor records
            self.status,
            self.opened_at,
            self.consecutive + 1 if failed else 0,
            (*self.recent[-(MAX_WINDOW - 1) :], failed),
            self.reason,
        )

    def failure_rate(self, window: int) -> float | None:
        """The share of failures among the last `window` attempts (None until there are so many)."""
        if len(self.recent) < window:
            return None
        return sum(self.recent[-window:]) / window


Circuits = Mapping[str, Circuit]
"""Each stage's circuit, by stage name (stages never judged are closed)."""


class CircuitStates(Projection[Circuits]):
    """Each stage's breaker, folded from outcomes and breaker decisions."""

    scope = "pipeline"

    def initial(self) -> Circuits:
        """Every circuit closed."""
        return {}

    @on(StageCompleted, StageFailed)
    def ended(self, state: Circuits, event: StageCompleted | StageFailed) -> Circuits:
        """Count an attempt's outcome; a half-open circuit's trial closes or re-opens it.

        The trial's outcome decides even without the `CircuitClosed`/`CircuitOpened`
        the supervisor records with it: a success recorded by hand closes the circuit,
        and an interrupted trial (`engine.resume`) re-opens it.
        """
        failed = type(event) is StageFailed
        circuit = state.get(event.stage, _CLOSED)
        if circuit.status != "half_open":
            return {**state, event.stage: circuit.outcome(failed)}
        if not failed:
            return {**state, event.stage: _CLOSED}
        reopened = attrs.evolve(
            circuit.outcome(True),
            status="open",
            opened_at=event.timestamp,
            reason="the trial attempt failed",
        )
        return {**state, event.stage: reopened}

    @on(CircuitOpened)
    def opened(self, state: Circuits, event: CircuitOpened) -> Circuits:
        """The breaker tripped: open from the event's time."""
        circuit = state.get(event.stage, _CLOSED)
        return {
            **state,
            event.stage: attrs.evolve(
                circuit, status="open", opened_at=event.timestamp, reason=event.reason
            ),
        }

    @on(CircuitHalfOpened)
    def half_opened(self, state: Circuits, event: CircuitHalfOpened) -> Circuits:
        """One trial call may go through."""
        circuit = state.get(event.stage, _CLOSED)
        return {
            **state,
            event.stage: attrs.evolve(circuit, status="half_open", opened_at=event.timestamp),
        }

    @on(CircuitClosed)
    def closed(self, state: Circuits, event: CircuitClosed) -> Circuits:
        """The trial succeeded: the circuit starts afresh."""
        return {**state, event.stage: _CLOSED}

    def encode(self, state: Circuits) -> JSON:
        """Circuits as JSON objects."""
        return {stage: _encode(circuit) for stage, circuit in state.items()}

    def decode(self, data: JSON) -> Circuits:
        """The circuits `encode` turned into `data`."""
        assert isinstance(data, dict)
        return {stage: _decode(row) for stage, row in data.items()}


_CLOSED = Circuit()


def _encode(circuit: Circuit) -> JSON:
    opened = None if circuit.opened_at is None else circuit.opened_at.isoformat()
    recent = "".join("x" if failed else "." for failed in circuit.recent)
    return {
        "status": circuit.status,
        "opened_at": opened,
        "consecutive": circuit.consecutive,
        "recent": recent,
        "reason": circuit.reason,
    }


def _decode(row: Any) -> Circuit:
    opened = row["opened_at"]
    return Circuit(
        status=row["status"],
        opened_at=None if opened is None else datetime.fromisoformat(opened),
        consecutive=row["consecutive"],
        recent=tuple(mark == "x" for mark in row["recent"]),
        reason=row["reason"],
    )


def _optional_count(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(f"{field.name} must be an int >= 1 or None, got {value!r}")


def _optional_rate(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (type(value) not in (int, float) or not 0 < value <= 1):  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a number in (0, 1] or None, got {value!r}")


def _window(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or not 1 <= value <= MAX_WINDOW:
        raise ValueError(f"{field.name} must be an int from 1 to {MAX_WINDOW}, got {value!r}")


def _seconds(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) not in (int, float) or not 0 <= value < math.inf:  # type: ignore[operator]
        raise ValueError(f"{field.name} must be a finite number >= 0, got {value!r}")


def _scope(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if value not in SCOPES:
        raise ValueError(f"{field.name} must be one of {SCOPES}, got {value!r}")


@attrs.frozen(kw_only=True)
class CircuitBreaker:
    """When a stage's calls should fail fast, and for how long.

    Attributes:
        fail_max: consecutive failures that trip the breaker (None: off).
        failure_rate: trip when this share of the last `window` attempts failed (None: off).
        window: how many recent attempts the failure rate looks at.
        reset_timeout: seconds an open breaker waits before letting one trial through.
        scope: ``"run"`` (default) or ``"pipeline"`` (across all runs of the pipeline).
    """

    fail_max: int | None = attrs.field(default=5, validator=_optional_count)
    failure_rate: float | None = attrs.field(default=None, validator=_optional_rate)
    window: int = attrs.field(default=10, validator=_window)
    reset_timeout: float = attrs.field(default=60.0, validator=_seconds)
    scope: str = attrs.field(default="run", validator=_scope)

    def waits(self, circuit: Circuit, now: datetime) -> float:
        """Seconds before `circuit` lets a trial through (0 when it may now).

        An open circuit waits `reset_timeout` from its opening. Across a pipeline, a
        half-open circuit has a trial under way in some run: others wait for its end,
        or for `reset_timeout` after it began if that trial was cut short.
        """
        waiting = circuit.status == "open" or (
            circuit.status == "half_open" and self.scope == "pipeline"
        )
        if not waiting or circuit.opened_at is None:
            return 0.0
        return max(0.0, self.reset_timeout - (now - circuit.opened_at).total_seconds())

    def trips(self, circuit: Circuit) -> str | None:
        """Why `circuit`, which has just counted a failure, should open; None if it should not."""
        if circuit.status == "half_open":
            return "the trial attempt failed"
        if self.fail_max is not None and circuit.consecutive >= self.fail_max:
            return f"{circuit.consecutive} consecutive failures (fail_max={self.fail_max})"
        rate = circuit.failure_rate(self.window)
        if self.failure_rate is not None and rate is not None and rate >= self.failure_rate:
            return (
                f"{rate:.0%} of the last {self.window} attempts failed "
                f"(failure_rate={self.failure_rate})"
            )
        return None

    def to_json(self) -> dict[str, JSON]:
        """The settings as JSON, for the record of a decision."""
        return attrs.asdict(self)
