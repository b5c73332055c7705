"""The pure core of a run: its machine state and the fold that checks every event.

`start(pipeline, RunStarted)` gives the first state; `apply(pipeline, state,
event)` returns the next one or raises, naming the rule broken; `replay` folds a
whole history with both. Appending and loading share this one path, so a stored
history always obeys the rules.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import json
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from sys import intern
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

import attrs

from engine.errors import (
    AttemptError,
    InvalidRollback,
    InvalidTransition,
    RuleViolation,
    RunAlreadyFinished,
    TaskError,
)
from engine.pipeline import Pipeline
from events import (
    DECIDED,
    JSON,
    Event,
    RunDeleted,
    RunFinished,
    RunStarted,
    StageCompleted,
    StageFailed,
    StageStarted,
    StagetrailError,
    StateRolledBack,
    TaskAdded,
    TaskCompleted,
    TaskFailed,
    TaskStarted,
)
from events.values import evolve, maker
from projections.base import EventSource, Projection
from projections.errors import ProjectionStateError
from projections.immutable import Cons, Deferred, PList, PMap, newest_items, runs_deferred


@attrs.frozen
class RunState:
    """Everything the engine needs to check the next event of a run (not its history)."""

    run_id: UUID
    pipeline: str
    state: str
    version: int
    last_timestamp: datetime
    stack: PList[str] = attrs.field(factory=PList)
    """The states each outcome on the stack left, newest last."""
    attempts: Mapping[str, int] = attrs.field(factory=dict)
    open_attempt: int | None = None
    opened_at: datetime | None = None
    tasks: PMap[str, str] = attrs.field(factory=PMap)
    """Task id → status (pending, active, completed, failed)."""
    status: str | None = None

    @property
    def depth(self) -> int:
        """How many outcomes are on the stack."""
        return len(self.stack)

    def next_attempt(self, stage: str) -> int:
        """The attempt number an outcome of `stage` recorded now would carry."""
        if self.open_attempt is not None and stage == self.state:
            return self.open_attempt
        return self.attempts.get(stage, 0) + 1


_new_state: Callable[..., RunState] = maker(RunState)
"""A `RunState` of the values given, unchecked (they are: each comes from a checked state
or event)."""


def start(pipeline: Pipeline, event: RunStarted) -> RunState:
    """The state of a run right after its `RunStarted` event."""
    if event.version != 1:
        raise RuleViolation(event.run_id, "version", "RunStarted must be event 1 of its run")
    return RunState(
        run_id=event.run_id,
        pipeline=pipeline.name,
        state=pipeline.initial,
        version=1,
        last_timestamp=event.timestamp,
    )


def apply(pipeline: Pipeline, state: RunState, event: Event) -> RunState:
    """Return the run's state after `event`, or raise if the event breaks a rule.

    Raises:
        InvalidTransition: the outcome is not a row of the table in this state.
        RuleViolation: (or a subclass) any other rule of the engine is broken.
    """
    if state.status is not None and (type(event) is not RunDeleted or state.status == "deleted"):
        raise RunAlreadyFinished(state.run_id, state.status)  # only a deletion follows a finish
    if event.version != state.version + 1:
        raise RuleViolation(
            state.run_id,
            "version",
            f"event version {event.version} does not follow version {state.version}",
        )
    return _FOLDS.get(type(event), _unchanged)(pipeline, state, event)


Refused = Callable[[Event, StagetrailError], None]
"""Told of an event that breaks a rule, which the fold then passes over (`replay`)."""


def replay(
    first: RunStarted,
    rest: Iterable[Event] = (),
    *,
    pipeline: Pipeline | None = None,
    refused: Refused | None = None,
) -> tuple[Pipeline, RunState]:
    """Fold a run's history, `first` then `rest`, through every rule: its pipeline and last state.

    Loading a run, starting or forking one, a LangGraph thread and `verify` all
    replay through here.

    Args:
        first: the run's `RunStarted`.
        rest: the events after it, in version order.
        pipeline: the run's pipeline when the caller holds it; by default the one
            built from the table `first` stores.
        refused: when given, an event that breaks a rule is handed to it and passed
            over (the fold goes on at the next version), instead of raising.

    Raises:
        PipelineError: the stored table is not a valid pipeline.
        InvalidTransition, RuleViolation: an event breaks a rule (unless `refused`).
    """
    if pipeline is None:
        pipeline = Pipeline.from_dict(first.table)
    state = start(pipeline, first)
    if refused is None:
        for event in rest:
            state = apply(pipeline, state, event)
        return pipeline, state
    for event in rest:
        try:
            state = apply(pipeline, state, event)
        except StagetrailError as error:
            refused(event, error)
            state = evolve(state, version=event.version)
    return pipeline, state


def _stamp(current: RunState, event: Event, /, **changes: Any) -> RunState:
    return evolve(current, version=event.version, last_timestamp=event.timestamp, **changes)


def _unchanged(pipeline: Pipeline, state: RunState, event: Event) -> RunState:
    """The state stamped with `event`'s version and time. Made by field, not by `_stamp`'s
    evolve (as `_attempt_ended`): every event the rules leave be (a checkpoint, a retry's
    decision, a note) comes through here, a saver's checkpoint on every step."""
    return _new_state(
        run_id=state.run_id,
        pipeline=state.pipeline,
        state=state.state,
        version=event.version,
        last_timestamp=event.timestamp,
        stack=state.stack,
        attempts=state.attempts,
        open_attempt=state.open_attempt,
        opened_at=state.opened_at,
        tasks=state.tasks,
        status=state.status,
    )


def _second_start(pipeline: Pipeline, state: RunState, event: Event) -> RunState:
    raise RuleViolation(state.run_id, "started", f"run {state.run_id} has already started")


def _stage_started(pipeline: Pipeline, state: RunState, event: StageStarted) -> RunState:
    if event.stage != state.state:
        raise AttemptError(
            state.run_id,
            event.stage,
            f"cannot start stage {event.stage!r}: the current state is {state.state!r}",
        )
    if pipeline.is_final(state.state):
        raise AttemptError(
            state.run_id, event.stage, f"{state.state!r} is a final state; no stage runs there"
        )
    if state.open_attempt is not None:
        raise AttemptError(
            state.run_id,
            event.stage,
            f"attempt {state.open_attempt} of {event.stage!r} is still open; "
            "record its outcome first",
        )
    _check_attempt(state, event.stage, event.attempt)
    return _stamp(state, event, open_attempt=event.attempt, opened_at=event.timestamp)


def _check_attempt(state: RunState, stage: str, attempt: int) -> None:
    expected = state.next_attempt(stage)
    if attempt != expected:
        raise AttemptError(
            state.run_id, stage, f"stage {stage!r} attempt {attempt} should be {expected}"
        )


def _outcome(pipeline: Pipeline, state: RunState, event: StageCompleted | StageFailed) -> RunState:
    dest = pipeline.next_state(state.state, event.outcome)
    if event.stage != state.state or dest is None:
        if not pipeline.routes_implicitly(state.state, event.stage):
            raise InvalidTransition(
                state.state, event.outcome, pipeline.allowed(state.state), event.stage
            )
        return _routed_outcome(pipeline, state, event)
    if event.attempt == DECIDED and type(event) is StageCompleted:
        return _decided(state, event, event.stage, dest)
    _check_attempt(state, event.stage, event.attempt)
    return _attempt_ended(state, event, event.stage, dest, state.stack.push(state.state))


def _attempt_ended(
    state: RunState, event: StageCompleted | StageFailed, stage: str, dest: str, stack: PList[str]
) -> RunState:
    """The state after an attempt of `stage` ended in `dest`, `stack` its new stack (no
    attempt open). Made by field, not by `_stamp`'s evolve (a dict of changes looked up per
    field): every outcome recorded or loaded comes through here."""
    return _new_state(
        run_id=state.run_id,
        pipeline=state.pipeline,
        state=dest,
        version=event.version,
        last_timestamp=event.timestamp,
        stack=stack,
        attempts={**state.attempts, stage: event.attempt},
        open_attempt=None,
        opened_at=None,
        tasks=state.tasks,
        status=state.status,
    )


def _routed_outcome(
    pipeline: Pipeline, state: RunState, event: StageCompleted | StageFailed
) -> RunState:
    """An outcome of `event.stage` recorded in the hub: the hub's implicit route to the stage
    (a decided outcome of the hub), then the stage's own outcome, checked as two recorded
    ones would be and built as one state (not the route's state, then the outcome's)."""
    hub, stage = state.state, event.stage
    if state.open_attempt is not None:  # what `_decided` refuses for the route
        raise AttemptError(
            state.run_id,
            hub,
            f"attempt {state.open_attempt} of {hub!r} is open; a decided outcome "
            "(attempt 0) is recorded between attempts",
        )
    dest = pipeline.next_state(stage, event.outcome)
    if dest is None:
        raise InvalidTransition(stage, event.outcome, pipeline.allowed(stage), stage)
    stack = state.stack.push(hub).push(stage)
    if event.attempt == DECIDED and type(event) is StageCompleted:
        return _stamp(state, event, state=dest, stack=stack)
    # After the route, the stage's next attempt is the one it has here: no attempt is open.
    _check_attempt(state, stage, event.attempt)
    return _attempt_ended(state, event, stage, dest, stack)


def _decided(state: RunState, event: Event, stage: str, dest: str) -> RunState:
    """An outcome of `stage` no attempt produced (a routed verdict, a hub's route): it moves
    the machine to `dest`, no attempt."""
    if state.open_attempt is not None:
        raise AttemptError(
            state.run_id,
            stage,
            f"attempt {state.open_attempt} of {stage!r} is open; a decided outcome "
            "(attempt 0) is recorded between attempts",
        )
    return _stamp(state, event, state=dest, stack=state.stack.push(state.state))


def _rolled_back(pipeline: Pipeline, state: RunState, event: StateRolledBack) -> RunState:
    if event.steps > state.depth:
        raise InvalidRollback(
            state.run_id,
            event.steps,
            state.depth,
            f"only {state.depth} outcome(s) are on the stack",
        )
    if state.open_attempt is not None:
        raise InvalidRollback(
            state.run_id,
            event.steps,
            state.depth,
            f"attempt {state.open_attempt} of {state.state!r} is open; record its outcome first",
        )
    back_to = state.state
    if event.steps:
        back_to = state.stack.nth_newest(event.steps - 1)
    return _stamp(state, event, state=back_to, stack=state.stack.pop(event.steps))


_TASK_MOVES: dict[type[Event], tuple[frozenset[str | None], str]] = {
    TaskAdded: (frozenset({None}), "pending"),
    TaskStarted: (frozenset({"pending", "failed"}), "active"),
    TaskCompleted: (frozenset({"pending", "active", "failed"}), "completed"),
    TaskFailed: (frozenset({"pending", "active", "failed"}), "failed"),
}


def _task(
    pipeline: Pipeline,
    state: RunState,
    event: TaskAdded | TaskStarted | TaskCompleted | TaskFailed,
) -> RunState:
    sources, dest = _TASK_MOVES[type(event)]
    current = state.tasks.get(event.task_id)
    if current not in sources:
        raise TaskError(state.run_id, event.task_id, _task_problem(current, type(event)))
    return _stamp(state, event, tasks=state.tasks.set(event.task_id, dest))


def _task_problem(current: str | None, kind: type[Event]) -> str:
    if current is None:
        return "no such task in this run; add it first"
    if kind is TaskAdded:
        return f"already added (it is {current})"
    return f"cannot record {kind.__name__} for a task that is {current}"


def _finished(pipeline: Pipeline, state: RunState, event: RunFinished) -> RunState:
    return _stamp(state, event, status=event.status, open_attempt=None, opened_at=None)


def _deleted(pipeline: Pipeline, state: RunState, event: RunDeleted) -> RunState:
    return _stamp(state, event, status="deleted", open_attempt=None, opened_at=None)


_FOLDS: dict[type[Event], Callable[[Pipeline, RunState, Any], RunState]] = {
    RunStarted: _second_start,
    StageStarted: _stage_started,
    StageCompleted: _outcome,
    StageFailed: _outcome,
    StateRolledBack: _rolled_back,
    TaskAdded: _task,
    TaskStarted: _task,
    TaskCompleted: _task,
    TaskFailed: _task,
    RunFinished: _finished,
    RunDeleted: _deleted,
}


@runtime_checkable
class EarlierStates(Protocol):
    """Gives a projection's states at other versions of the run a snapshot is of (time
    travel's `EventSource` does: from its memory or stored snapshots, a short fold after)."""

    def __call__(self, gt: int, lte: int) -> Iterable[Event]:
        """The run's events with `gt < version <= lte` (an `EventSource`)."""

    def held(self, projection: Projection[Any], version: int) -> Any:
        """The state after event `version` if held in memory now (no read), else None."""

    def state_at(self, projection: Projection[Any], version: int) -> Any:
        """The state after event `version`, read in the snapshot's erasure generation; None
        if runs were erased since (the run may not be the one the snapshot is of)."""

    def state_now(self, projection: Projection[Any], version: int) -> Any:
        """The state after event `version` of the run the store holds now."""


@attrs.frozen
class StackBelow:
    """What a deferred tail of a restored machine stack stands for: the oldest `depth` items
    of the stack after event `version` (so a snapshot names it, never walks it)."""

    version: int
    depth: int


class MachineFold(Projection["tuple[Pipeline, RunState] | None"]):
    """`replay` as a projection: time travel's snapshots then serve `Engine.load`.

    Its state is the run's pipeline (from `RunStarted`'s table) and machine state;
    every event goes through `apply`, so each rule is checked as `replay` checks it.
    Its snapshots hold the stack's newest states as runs of equal states, on top of the
    stack an earlier snapshot was of (`StackBelow`): a stack whose states alternate
    (runs of one) then costs each snapshot what changed since the one before, not its
    depth. The older part is made when first walked (a deep rollback), from that
    earlier state (`EarlierStates`), else from the run's events.
    """

    name = "run_machine"
    scope = "run"

    def initial(self) -> tuple[Pipeline, RunState] | None:
        """No run yet."""
        return None

    def apply(
        self, state: tuple[Pipeline, RunState] | None, event: Event
    ) -> tuple[Pipeline, RunState] | None:
        """The pipeline and machine state after `event` (raises as `replay` does)."""
        if state is None:
            if not isinstance(event, RunStarted):
                return None  # not a run's history: the caller says so
            pipeline = Pipeline.from_dict(event.table)
            return pipeline, start(pipeline, event)
        return state[0], apply(state[0], state[1], event)

    def identity(self) -> str:
        """The fingerprint, and the rules' code (`RULE_MODULES`)."""
        return _rules_identity(self.fingerprint())

    def encode(self, state: tuple[Pipeline, RunState] | None) -> JSON:
        """The table and the machine state as strict JSON (the stack as runs of states)."""
        if state is None:
            return None
        _, below, _ = newest_items(state[1].stack.cells)
        if below is not None and isinstance(below.about, StackBelow):  # type: ignore[union-attr]
            runs = [(item, len(list(same))) for item, same in itertools.groupby(state[1].stack)]
        else:
            runs = state[1].stack.runs()
        return self._json(state, [[item, count] for item, count in runs])

    def _json(self, state: tuple[Pipeline, RunState], stack: JSON) -> dict[str, JSON]:
        pipeline, machine = state
        return {
            "table": pipeline.to_dict(),
            "run_id": str(machine.run_id),
            "pipeline": machine.pipeline,
            "state": machine.state,
            "version": machine.version,
            "last_timestamp": machine.last_timestamp.isoformat(),
            "stack": stack,
            "attempts": dict(machine.attempts),
            "open_attempt": machine.open_attempt,
            "opened_at": None if machine.opened_at is None else machine.opened_at.isoformat(),
            "tasks": dict(machine.tasks),
            "status": machine.status,
        }

    def decode(self, data: JSON) -> tuple[Pipeline, RunState] | None:
        """The state `encode` turned into `data`."""
        if data is None:
            return None
        return self._state(data, PList.of_runs([(item, count) for item, count in data["stack"]]))

    def _state(self, data: JSON, stack: PList[str]) -> tuple[Pipeline, RunState]:
        opened = data["opened_at"]
        machine = RunState(
            run_id=UUID(data["run_id"]),
            pipeline=data["pipeline"],
            state=data["state"],
            version=data["version"],
            last_timestamp=datetime.fromisoformat(data["last_timestamp"]),
            stack=stack,
            attempts=data["attempts"],
            open_attempt=data["open_attempt"],
            opened_at=None if opened is None else datetime.fromisoformat(opened),
            tasks=PMap(data["tasks"]),
            status=data["status"],
        )
        return Pipeline.from_dict(data["table"]), machine

    def snapshot(self, state: tuple[Pipeline, RunState] | None) -> JSON:
        """`encode`, but the stack's part an earlier snapshot holds (a restored state's
        deferred tail, unwalked) is named by that snapshot's version and depth (``below``),
        and only the states above it are written, as runs."""
        if state is None:
            return None
        newest, below, _ = newest_items(state[1].stack.cells)
        base: JSON = None
        if below is not None:
            about = below.about  # type: ignore[union-attr]
            if isinstance(about, StackBelow):
                base = [about.version, about.depth]
            else:  # a decoded stack's runs (`PList.of_runs`): walked, once
                newest += list(PList(below, below.size).newest_first())  # type: ignore[union-attr]
        runs = [[item, len(list(same))] for item, same in itertools.groupby(reversed(newest))]
        return {**self._json(state, runs), "below": base}

    def restore(self, data: JSON, events: EventSource) -> tuple[Pipeline, RunState] | None:
        """The state `snapshot` wrote; its stack's states are made when first walked, the
        part below (``below``) from the earlier state it names (shared, when that state is
        held: a writer's previous snapshot).

        Raises (when the older part is walked):
            ProjectionStateError: the earlier state is not there, or is not the one named;
                or runs were erased since and the run read now is not this one.
        """
        if data is None:
            return None
        base = data["below"]
        items = [intern(item) for item, _ in data["stack"]]
        counts = array("q", [count for _, count in data["stack"]])
        above = sum(counts)
        tail = None
        if base is not None:  # the fields it is checked by, once runs were erased: not the stack
            digest = (data["version"], _digest(data))
            tail = self._below(StackBelow(*base), digest, above, events)
        size = above + (0 if tail is None else tail.size)
        cells: Cons[str] = tail
        if items:  # each part: the oldest `depth` states of the stack after this version
            version = data["version"]
            cells = runs_deferred(
                items,
                counts,
                len(items),
                counts[-1],
                size,
                lambda _end, _left, depth: StackBelow(version, depth),
                tail,
            )
        return self._state(data, PList(cells, size))

    def _below(
        self, below: StackBelow, digest: tuple[int, bytes], above: int, events: EventSource
    ) -> Deferred[str] | None:
        """The oldest `below.depth` states of the stack after event `below.version`, made
        from that state's stack when first walked (`digest`: the version and a digest of the
        fields of the snapshot they are the stack's base of, `above` states on them). Until
        then only a held state's stack is kept, not the state (its tasks: a writer's chain)."""
        if below.depth == 0:
            return None
        held = events.held(self, below.version) if isinstance(events, EarlierStates) else None
        held_stack = None if held is None else held[1].stack

        def load() -> Cons[str]:
            stack = held_stack
            if stack is None:
                stack = self._earlier_stack(below, digest, above, events)
            if stack is None or len(stack) < below.depth:
                raise ProjectionStateError(
                    self.name,
                    f"the stack below a snapshot is not that after event {below.version} "
                    "(its snapshot is missing, another version's, or of an erased run)",
                )
            return stack.pop(len(stack) - below.depth).cells

        return Deferred(load, below.depth, about=below)

    def _earlier_stack(
        self, below: StackBelow, digest: tuple[int, bytes], above: int, events: EventSource
    ) -> PList[str] | None:
        """The stack after `below.version` (or, once runs were erased, the stack of the run
        the store holds now at the version of the snapshot `digest` is of, checked to have
        its fields: its stack has the same base); None if not there."""
        at, fields = digest
        if not isinstance(events, EarlierStates):
            return _stack_at(self.fold(events(0, below.version)), below.version)  # bare
        earlier = events.state_at(self, below.version)
        if earlier is not None:  # exactly that version: never another snapshot's stack
            return _stack_at(earlier, below.version)
        now: tuple[Pipeline, RunState] | None = events.state_now(self, at)
        if now is None or len(now[1].stack) != below.depth + above:
            return None
        return now[1].stack if _digest(self._json(now, None)) == fields else None


def _stack_at(state: tuple[Pipeline, RunState] | None, version: int) -> PList[str] | None:
    """The stack of `state` if it is the machine after event `version`, else None."""
    return None if state is None or state[1].version != version else state[1].stack


def _digest(data: JSON) -> bytes:
    """A digest of a machine snapshot's fields but its stack's (kept instead of them)."""
    fields = {key: value for key, value in data.items() if key not in _STACK_KEYS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).digest()


_STACK_KEYS = ("stack", "below")
"""A machine snapshot's keys of its stack."""


RULE_MODULES = (__name__, Pipeline.__module__, "events.table")
"""The modules whose source holds the rules a fold checks (`events.table`: the table's
semantics, a hub's implicit route among them)."""


@functools.cache
def _rules_identity(fingerprint: str) -> str:
    """`fingerprint` with a digest of the rules' source: new rules, new snapshots."""
    digest = hashlib.sha256(fingerprint.encode())
    for name in RULE_MODULES:
        digest.update(inspect.getsource(sys.modules[name]).encode())
    return digest.hexdigest()[:16]
