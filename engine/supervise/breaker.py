"""Circuit breaker state, derived from events (the settings are `CircuitBreaker`, in policies).

A breaker's state is never held in memory alone: `CircuitStates` folds stage
outcomes and the `CircuitOpened` / `CircuitHalfOpened` / `CircuitClosed`
decisions, so a restarted process sees an open breaker as it was left. Over
one run it folds that run's events; registered as a persistent projection
(``scope="pipeline"``) it folds every run of a pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from events import (
    JSON,
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    Event,
    StageCompleted,
    StageFailed,
    StateRolledBack,
)
from projections import Projection, on
from projections.immutable import PList

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
        if not event.attempt:  # a routed verdict: no call was made
            return state
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
_STATES = CircuitStates()


@attrs.frozen
class Unrolled:
    """One run's circuits without the failures rollbacks took off its stack.

    Attributes:
        circuits: each stage's circuit.
        kept: the run's outcomes and breaker decisions, to refold after a rollback.
        stack: each outcome on the run's stack: (version, whether it is a failure).
        popped: the versions of the failures rollbacks took off the stack.
    """

    circuits: Circuits = attrs.field(factory=dict)
    kept: PList[Event] = attrs.field(factory=PList)
    stack: PList[tuple[int, bool]] = attrs.field(factory=PList)
    popped: frozenset[int] = frozenset()


class UnrolledCircuits(Projection[Unrolled]):
    """`CircuitStates` over one run, leaving out failures a rollback took off the stack.

    A rollback is rare and pops few outcomes, so refolding the run's breaker
    events then costs less than an undo log for every circuit.
    """

    scope = "run"

    def initial(self) -> Unrolled:
        """Every circuit closed, nothing kept."""
        return Unrolled()

    @on(StageCompleted, StageFailed)
    def ended(self, state: Unrolled, event: StageCompleted | StageFailed) -> Unrolled:
        """An outcome: it counts, and goes on the stack."""
        return Unrolled(
            _STATES.apply(state.circuits, event),
            state.kept.push(event),
            state.stack.push((event.version, type(event) is StageFailed)),
            state.popped,
        )

    @on(CircuitOpened, CircuitHalfOpened, CircuitClosed)
    def decided(
        self, state: Unrolled, event: CircuitOpened | CircuitHalfOpened | CircuitClosed
    ) -> Unrolled:
        """A breaker decision."""
        circuits = _STATES.apply(state.circuits, event)
        return attrs.evolve(state, circuits=circuits, kept=state.kept.push(event))

    @on(StateRolledBack)
    def rolled_back(self, state: Unrolled, event: StateRolledBack) -> Unrolled:
        """Refold the kept events without the failures the rollback popped."""
        popped = {version for version, failed in _newest(state.stack, event.steps) if failed}
        gone = state.popped | popped
        circuits = _STATES.fold([e for e in state.kept.to_tuple() if e.version not in gone])
        return attrs.evolve(
            state, circuits=circuits, stack=state.stack.pop(event.steps), popped=gone
        )


def _newest(stack: PList[tuple[int, bool]], count: int) -> list[tuple[int, bool]]:
    entries: list[tuple[int, bool]] = []
    for entry in stack.newest_first():
        if len(entries) == count:
            break
        entries.append(entry)
    return entries


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
