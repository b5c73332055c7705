"""`RunIndex`: one summary row per run, persistent, backing `engine.runs()`."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, ClassVar
from uuid import UUID

import attrs

from events import (
    JSON,
    CheckpointSaved,
    Event,
    NoteAdded,
    RunDeleted,
    RunFinished,
    RunStarted,
    StageCompleted,
    StageFailed,
    StateRolledBack,
    task_writes,
)
from events.table import Lookup, as_rows, from_rows, lookup, took_implicit_route
from events.values import evolve, maker
from projections import immutable
from projections.base import EventSource, Folding, Projection, folding, folds_with, on
from projections.collector import COLLECT_EVERY, no_tick
from projections.errors import ProjectionError
from projections.immutable import RUN_CELLS, Cons, Deferred, PList
from projections.stretches import StretchFolding, folded_in_stretches

RUNNING = "running"
"""The status of a run that has not finished."""
PAUSED_STATUSES = frozenset({"idle", "waiting", "failed_resumable"})
"""Statuses of a run that has not finished but waits to be resumed (a LangGraph thread):
``idle`` at its graph's end, ``waiting`` for input (an interrupt), ``failed_resumable``
after a node's failure. The run's next step (`CheckpointSaved`) makes it ``running``."""
STATUS_NOTE = "run.status"
"""The key of a note that pauses a run: ``{"status": <a PAUSED_STATUSES>, "reason": ...}``."""


RUNS_KEPT = 8
"""Stacks of states whose runs `StateList.runs` keeps (by their newest cell)."""

_Packed = tuple[tuple[str, ...], str, int]
"""`pack_states`' names and codes of a stack's oldest runs, and how many runs they are."""

_runs: dict[int, tuple[object, tuple[tuple[str, int], ...], _Packed | None]] = {}
_runs_lock = threading.Lock()


class StateList(PList[str]):
    """A run's stack of states: a `PList` whose `runs` walks only the states pushed since
    the runs of a stack it grew from were last read, and whose runs `pack_states` packs
    onto the packing of that stack's.

    A fold of a long run storing a snapshot every few hundred events (the viewer's) packs
    the stack each time (`RunIndex.encode`): walking and packing it whole made that fold
    quadratic in the run's length. The runs of the newest `RUNS_KEPT` stacks read are
    kept, by their newest cell (the cell itself held, so an id reused is never mistaken for
    it), with the packing of all their runs but the newest (which may still grow).
    """

    __slots__ = ()

    def pop(self, count: int = 1) -> StateList:
        """A stack without its `count` newest states."""
        popped = super().pop(count)
        return StateList(popped.cells, len(popped))

    def runs(self) -> list[tuple[str, int]]:
        """The states as runs ``(state, count)`` of equal ones, oldest first (see the class)."""
        runs: list[tuple[str, int]] = []
        packed: _Packed | None = None
        newest, below, known = immutable.newest_items(self.cells, _runs)
        if known is not None:
            runs, packed = list(known[1]), known[2]
        elif below is not None:
            runs = list(below.about)  # type: ignore[union-attr]
        for item in reversed(newest):
            if runs and runs[-1][0] == item:
                runs[-1] = (item, runs[-1][1] + 1)
            else:
                runs.append((item, 1))
        made = _Runs(runs)
        made.cells = self.cells
        if newest:  # the oldest runs' packing holds: only the newest run may have grown
            _keep(self.cells, tuple(runs), packed)
        return made


class _Runs(list[tuple[str, int]]):
    """A stack's runs as `StateList.runs` made them, naming the stack (`pack_states`)."""

    __slots__ = ("cells",)
    cells: object

    def packed(self) -> tuple[list[str], str] | None:
        """`pack_states` of these runs, packed onto the kept packing of their oldest ones;
        None unless the runs are still those kept for the stack (not changed since)."""
        cells = self.cells
        known = _runs.get(id(cells))
        if known is None or known[0] is not cells or tuple(self) != known[1]:
            return None
        names_kept, codes, done = known[2] or ((), "", 0)
        names = dict(zip(names_kept, range(len(names_kept)), strict=True))
        codes = _joined(codes, [_code(names, name, count) for name, count in self[done:-1]])
        if len(self) > 1:
            _keep(cells, known[1], (tuple(names), codes, len(self) - 1))
        if self:
            codes = _joined(codes, [_code(names, *self[-1])])
        return list(names), codes


def _code(names: dict[str, int], name: str, count: int) -> str:
    """A run's code as `pack_states` writes it (`name` numbered in `names` if new)."""
    index = names.setdefault(name, len(names))
    return str(index) if count == 1 else f"{index}*{count}"


def _joined(codes: str, more: list[str]) -> str:
    return ",".join([codes, *more]) if codes and more else codes or ",".join(more)


def _keep(cells: object, runs: tuple[tuple[str, int], ...], packed: _Packed | None) -> None:
    with _runs_lock:
        _runs[id(cells)] = (cells, runs, packed)
        while len(_runs) > RUNS_KEPT:
            del _runs[next(iter(_runs))]


def forget_runs() -> None:
    """Drop the runs kept (`RUNS_KEPT`) and the stacks they hold (runs were erased)."""
    with _runs_lock:
        _runs.clear()


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class RunSummary:
    """What the run index knows about one run."""

    run_id: UUID
    pipeline: str
    status: str
    state: str
    started: datetime
    updated: datetime
    version: int = 1
    finished: datetime | None = None
    attempts: int = 0
    failures: int = 0
    labels: dict[str, str] = attrs.field(factory=dict)
    parent_run_id: UUID | None = None
    forked_from: tuple[UUID, int] | None = None
    reason: JSON = None
    moves: Lookup = attrs.field(factory=dict, repr=False)
    states: PList[str] = attrs.field(factory=StateList, repr=False)

    @property
    def duration(self) -> float:
        """Seconds from the start to the finish (or to the newest event while running)."""
        return ((self.finished or self.updated) - self.started).total_seconds()

    def to_json(self) -> dict[str, Any]:
        """The public fields as JSON (the stable shape of ``stagetrail runs --json``)."""
        return {
            "run_id": str(self.run_id),
            "pipeline": self.pipeline,
            "status": self.status,
            "state": self.state,
            "started": iso(self.started),
            "finished": None if self.finished is None else iso(self.finished),
            "duration": self.duration,
            "version": self.version,
            "attempts": self.attempts,
            "failures": self.failures,
            "labels": dict(self.labels),
            "parent_run_id": None if self.parent_run_id is None else str(self.parent_run_id),
            "forked_from": _fork_json(self.forked_from),
            "reason": self.reason,
        }


_SUMMARY = maker(RunSummary)
"""`RunSummary`'s fields by position, in their declared order (`maker`)."""


class RunIndex(Projection["RunSummary | None"]):
    """One `RunSummary` per run: pipeline, status, state, times, attempts, failures, labels."""

    name: ClassVar[str] = "run_index"
    scope: ClassVar[str] = "run"
    every_event: ClassVar[bool] = True

    def initial(self) -> RunSummary | None:
        """No run before its `RunStarted`."""
        return None

    @on(RunStarted)
    def started(self, summary: RunSummary | None, event: RunStarted) -> RunSummary:
        """A run begins in its pipeline's initial state."""
        table: Any = event.table
        return RunSummary(
            run_id=event.run_id,
            pipeline=event.pipeline,
            status=RUNNING,
            state=str(table["initial"]),
            started=event.timestamp,
            updated=event.timestamp,
            labels=dict(event.labels),
            parent_run_id=event.parent_run_id,
            forked_from=event.forked_from,
            moves=lookup(table),
        )

    @on(StageCompleted, StageFailed)
    def outcome(
        self, summary: RunSummary | None, event: StageCompleted | StageFailed
    ) -> RunSummary | None:
        """An outcome moves the run along its table and counts an attempt.

        A stage named ``__…`` is a framework's own (LangGraph's hub, ``__graph__``,
        routing to the next node): it moves the run but is no attempt; so does a hub's
        implicit route (`events.table.took_implicit_route`), taken before the outcome.
        A failure that carries a framework task's writes leaves the run ``failed_resumable``.
        """
        if summary is None:
            return None
        state, states = summary.state, summary.states
        if event.stage != state and took_implicit_route(summary.moves, state, event.stage):
            state, states = event.stage, states.push(state)  # the hub's route, first
        failed = isinstance(event, StageFailed)
        resumable = failed and task_writes(event.details) is not None  # type: ignore[union-attr]
        # Every field by position (`maker`): the handler a rebuild calls most, per outcome.
        return _SUMMARY(
            summary.run_id,
            summary.pipeline,
            "failed_resumable" if resumable else summary.status,
            summary.moves.get((state, event.outcome), state),
            summary.started,
            event.timestamp,
            event.version,
            summary.finished,
            # A routed verdict (attempt 0) and a framework's own stage are no attempts.
            summary.attempts + (event.attempt > 0 and not event.stage.startswith("__")),
            summary.failures + failed,
            summary.labels,
            summary.parent_run_id,
            summary.forked_from,
            summary.reason,
            summary.moves,
            states.push(state),
        )

    @on(CheckpointSaved)
    def step(self, summary: RunSummary | None, event: CheckpointSaved) -> RunSummary | None:
        """A paused run's next step: it runs again."""
        if summary is None or summary.status not in PAUSED_STATUSES:
            return None if summary is None else _touch(summary, event)
        return _touch(summary, event, status=RUNNING, reason=None)

    @on(NoteAdded)
    def noted(self, summary: RunSummary | None, event: NoteAdded) -> RunSummary | None:
        """A `STATUS_NOTE` pauses the run: its status and why (an interrupt's value)."""
        if summary is None:
            return None
        value: Any = event.value
        if event.key != STATUS_NOTE or not isinstance(value, dict):
            return _touch(summary, event)
        if value.get("status") not in PAUSED_STATUSES or summary.finished is not None:
            return _touch(summary, event)
        return _touch(summary, event, status=value["status"], reason=value.get("reason"))

    @on(StateRolledBack)
    def rolled_back(self, summary: RunSummary | None, event: StateRolledBack) -> RunSummary | None:
        """A rollback returns to the state before the undone outcomes."""
        if summary is None:
            return None
        states = summary.states
        back_to = summary.state
        for _ in range(min(event.steps, len(states))):
            back_to = states.last or back_to
            states = states.pop()
        return _touch(summary, event, state=back_to, states=states)

    @on(RunFinished)
    def finished(self, summary: RunSummary | None, event: RunFinished) -> RunSummary | None:
        """The run's final status, reason and time."""
        if summary is None:
            return None
        return _touch(
            summary, event, status=event.status, finished=event.timestamp, reason=event.reason
        )

    @on(RunDeleted)
    def deleted(self, summary: RunSummary | None, event: RunDeleted) -> RunSummary | None:
        """A deleted run stays listed as ``deleted`` (finished then) until it is erased."""
        if summary is None:
            return None
        finished = summary.finished or event.timestamp
        return _touch(summary, event, status="deleted", finished=finished, reason=event.rule)

    def apply(self, state: RunSummary | None, event: Event) -> RunSummary | None:
        """Every event moves the run's version and last update; handlers do the rest."""
        handler = self.handlers.get(type(event))
        if handler is None:
            return None if state is None else _touch(state, event)
        try:
            return handler(self, state, event)  # type: ignore[no-any-return]
        except Exception as error:
            raise ProjectionError(self.name, event, error) from error

    def _fold(
        self, events: Iterable[Event], current: RunSummary | None, tick: Callable[[], None]
    ) -> RunSummary | None:
        """`Projection._fold`, each stretch of outcomes of the run's current state folded into
        one summary at its end: the summary, a value of 16 fields, is built once per stretch,
        not once per outcome (a long loop's every event). The same state as `apply` event
        after event (`outcome`'s arithmetic, inline); anything else goes to `apply`."""
        if not folds_with(self, RunIndex, StageCompleted, StageFailed):
            return Projection._fold(self, events, current, tick)  # a subclass: its own way
        return folded_in_stretches(self.name, self.apply, _begun, events, current, tick)

    def settled(self, state: RunSummary | None) -> bool:
        """A finished run's summary changes only if it is deleted (`RunDeleted`), rarely."""
        return state is not None and state.finished is not None

    def encode(self, state: RunSummary | None) -> JSON:
        """The summary as JSON: the public fields, the table and the state stack (`pack_states`).

        The stack grows with the run; packed into one string (a few bytes a state)
        it is read back without making an object per state, and unpacked only when
        a rollback walks it: listing runs does not slow down with a run's length.
        """
        if state is None:
            return None
        data = state.to_json()
        data["updated"] = iso(state.updated)
        data["moves"] = as_rows(state.moves)
        data["state_names"], data["state_codes"] = pack_states(state.states.runs())
        data["state_count"] = len(state.states)
        return data

    def snapshot(self, state: RunSummary | None) -> JSON:
        """`encode`: its stack is packed already (a deferred tail's runs are not walked)."""
        return self.encode(state)

    def restore(self, data: JSON, events: EventSource) -> RunSummary | None:
        """`decode`: the stack is unpacked when a rollback first walks it."""
        return self.decode(data)

    def decode(self, data: JSON) -> RunSummary | None:
        """The summary `encode` stored."""
        if data is None:
            return None
        assert isinstance(data, dict)
        fork = data["forked_from"]
        parent = data["parent_run_id"]
        return RunSummary(
            run_id=UUID(data["run_id"]),
            pipeline=data["pipeline"],
            status=data["status"],
            state=data["state"],
            started=datetime.fromisoformat(data["started"]),
            updated=datetime.fromisoformat(data["updated"]),
            version=data["version"],
            finished=None if data["finished"] is None else datetime.fromisoformat(data["finished"]),
            attempts=data["attempts"],
            failures=data["failures"],
            labels=data["labels"],
            parent_run_id=None if parent is None else UUID(parent),
            forked_from=None if fork is None else (UUID(fork[0]), fork[1]),
            reason=data["reason"],
            moves=from_rows(data["moves"]),
            states=_states(data),
        )


def _states(data: dict[str, Any]) -> PList[str]:
    """The stack of states `decode` reads: packed (`encode`), else listed (`snapshot`'s)."""
    if "state_codes" not in data:
        return StateList.of(data["states"])
    size = data["state_count"]
    if not size:
        return StateList()
    return StateList.deferred(
        _deferred_states(PackedRuns(data["state_names"], data["state_codes"]), size)
    )


def _deferred_states(packed: PackedRuns, size: int) -> Deferred[str]:
    """The `size` states of `packed`, made `RUN_CELLS` at a time from the newest end when
    first walked: a rollback after a restore reads the few it pops, not the whole text."""

    def load() -> Cons[str]:
        items, below = packed.newest(RUN_CELLS)
        cells: Cons[str] = None if below is None else _deferred_states(below, size - len(items))
        for item in reversed(items):  # items are newest first
            cells = (item, cells)
        return cells

    return Deferred(load, size, about=packed)


def pack_states(runs: Iterable[tuple[str, int]]) -> tuple[list[str], str]:
    """Runs of equal states, oldest first, as their distinct names and one string of codes.

    Each run is ``i`` (name `i`, once) or ``i*n`` (`n` times), comma-separated.
    """
    if type(runs) is _Runs and (packed := runs.packed()) is not None:
        return packed  # a stack's runs packed lately: only the runs since are coded
    # Each distinct run coded once, in the order runs first come (so names are numbered
    # in the order they first come): a stack of states alternating between a few holds
    # as many runs as states, and a persistent index packs it again after every page.
    runs = list(runs)
    coded: dict[tuple[str, int], Any] = dict.fromkeys(runs)
    names: dict[str, int] = {}
    for name, count in coded:
        index = names.setdefault(name, len(names))
        coded[name, count] = str(index) if count == 1 else f"{index}*{count}"
    return list(names), ",".join(map(coded.__getitem__, runs))


class PackedRuns:
    """The runs `pack_states` packed, unpacked only when iterated or read from the newest end.

    They are ``codes[:end]`` and then `newest`, a run split by a read of the newest
    states (the runs below a page share the codes read, not a copy of them).
    """

    __slots__ = ("codes", "end", "names", "newest_code")

    def __init__(
        self, names: list[str], codes: str, *, end: int | None = None, newest: str = ""
    ) -> None:
        self.names, self.codes, self.newest_code = names, codes, newest
        self.end = len(codes) if end is None else end

    def __iter__(self) -> Iterator[tuple[str, int]]:
        names = self.names
        text = self.codes if self.end == len(self.codes) else self.codes[: self.end]
        codes = text.split(",") if text else []
        if self.newest_code:
            codes.append(self.newest_code)
        # Each distinct code read once: a long stack repeats a few (`pack_states`).
        runs: dict[str, tuple[str, int]] = {}
        for code in dict.fromkeys(codes):
            index, _, count = code.partition("*")
            runs[code] = names[int(index)], int(count) if count else 1
        return map(runs.__getitem__, codes)

    def newest(self, most: int) -> tuple[list[str], PackedRuns | None]:
        """The newest `most` states (newest first) and the runs below them (None: none),
        reading the codes backwards from their end."""
        names, text, end = self.names, self.codes, self.end
        code: str | None = self.newest_code or None
        items: list[str] = []
        while len(items) < most and (code is not None or end > 0):
            if code is None:  # the next run back in the codes
                start = text.rfind(",", 0, end) + 1
                code, end = text[start:end], max(start - 1, 0)
            index, _, count = code.partition("*")
            times = int(count) if count else 1
            take = min(times, most - len(items))
            items += [names[int(index)]] * take
            left = times - take
            code = None if not left else index if left == 1 else f"{index}*{left}"
        if code is None and end <= 0:
            return items, None
        return items, PackedRuns(names, text, end=end, newest=code or "")


@folding.register(RunIndex)
def _folding(projection: RunIndex, state: RunSummary | None = None) -> Folding[RunSummary | None]:
    """`folding` of the run index: its stretch of outcomes left open between parts (`_fold`)."""
    kind = type(projection)
    if (
        not folds_with(projection, RunIndex, StageCompleted, StageFailed)
        or kind.fold is not Projection.fold
        or kind._fold is not RunIndex._fold
    ):
        return Folding(projection, state)  # a subclass folding its own way: through `fold`
    return StretchFolding(projection, _begun, state)


class _Stretch:
    """Outcomes folded into a summary (`RunIndex._fold`), the summary built when asked for."""

    __slots__ = (
        "attempts", "failures", "last", "move", "push", "pushed", "start", "state", "status",
    )  # fmt: skip

    def __init__(self, start: RunSummary) -> None:
        self.start, self.state, self.status = start, start.state, start.status
        self.attempts, self.failures = start.attempts, start.failures
        self.last: StageCompleted | StageFailed | None = None
        self.pushed: list[str] = []
        """The states the outcomes taken pushed, oldest first: cells made once, by `made`."""
        self.push = self.pushed.append
        self.move: tuple[Any, Any, Any, Any, bool] = (_NO_NAME, _NO_NAME, _NO_NAME, None, False)
        """The newest outcome's state, stage and outcome, the state they moved to, and whether
        the stage is no framework's own (``__…``): a loop repeats it, outcome after outcome."""

    def took(self, event: StageCompleted | StageFailed) -> bool:
        """Fold `event` as `RunIndex.outcome` does; False: its stage takes an implicit route
        (left to `outcome`, nothing taken)."""
        return self.took_from(event, iter(()), RunIndex.name, no_tick) is None

    def took_from(
        self, event: Event, rest: Iterator[Event], name: str, tick: Callable[[], None]
    ) -> Event | None:
        """Fold `event` and the outcomes after it from `rest` as `RunIndex.outcome` does,
        until an event that is no outcome, or whose stage takes an implicit route (left to
        `outcome`): that one, else None. One loop, the stretch's fields in its locals: a
        writer folds its every commit so (`engine.readside.keeper`)."""
        state, move, push, last = self.state, self.move, self.push, self.last
        attempts, failures, left = self.attempts, self.failures, COLLECT_EVERY
        for event in itertools.chain((event,), rest):  # noqa: B020 (the one not taken)
            try:  # around each event, not the loop: what `rest` raises is its source's
                kind = event.__class__
                if kind is not StageCompleted and kind is not StageFailed:
                    break
                stage = event.stage  # type: ignore[attr-defined]
                if state == move[0] and stage == move[1] and event.outcome == move[2]:  # type: ignore[attr-defined]
                    to = move[3]  # the newest outcome's move, again: no route to look for
                else:
                    if stage != state and took_implicit_route(self.start.moves, state, stage):
                        break
                    outcome = event.outcome  # type: ignore[attr-defined]
                    to = self.start.moves.get((state, outcome), state)
                    move = (state, stage, outcome, to, not stage.startswith("__"))
                if kind is StageFailed:
                    failures += 1
                    if task_writes(event.details) is not None:  # type: ignore[attr-defined]
                        self.status = "failed_resumable"
                if move[4] and event.attempt > 0:  # type: ignore[attr-defined]
                    attempts += 1
            except Exception as error:
                raise ProjectionError(name, event, error) from error
            push(state)
            state, last = to, event  # type: ignore[assignment]
            left -= 1
            if not left:
                tick()
                left = COLLECT_EVERY
        else:
            event = None  # type: ignore[assignment]
        self.state, self.move, self.last = state, move, last
        self.attempts, self.failures = attempts, failures
        return event

    def made(self) -> RunSummary:
        """The summary after the outcomes taken."""
        below = self.start.states
        cells = below.cells
        for state in self.pushed:  # cons cells directly, as `PList.of` makes them
            cells = (state, cells)
        return self._summary(StateList(cells, len(below) + len(self.pushed)))

    def made_deferred(self) -> RunSummary:
        """`made`, the states pushed made into cells only when walked, their runs (and those
        below) counted now: a writer's summary, packed and stored, then let go."""
        below, pushed = self.start.states, tuple(self.pushed)  # the stretch may go on
        runs = list(below.runs())
        for state, group in itertools.groupby(pushed):
            count = len(list(group))
            if runs and runs[-1][0] == state:
                runs[-1] = (state, runs[-1][1] + count)
            else:
                runs.append((state, count))

        def load() -> Cons[str]:
            cells = below.cells
            for state in pushed:
                cells = (state, cells)
            return cells

        size = len(below) + len(pushed)
        return self._summary(StateList.deferred(Deferred(load, size, about=runs)))

    def _summary(self, states: PList[str]) -> RunSummary:
        start, last = self.start, self.last
        if last is None:
            return start
        return _SUMMARY(
            start.run_id, start.pipeline, self.status, self.state, start.started, last.timestamp,
            last.version, start.finished, self.attempts, self.failures, start.labels,
            start.parent_run_id, start.forked_from, start.reason, start.moves, states,
        )  # fmt: skip


_NO_NAME: Any = object()
"""A name no event gives: a stretch's newest state, outcome and stage before its first."""


def _begun(summary: RunSummary | None) -> _Stretch | None:
    """The stretch of outcomes from `summary` (None: no run started, `outcome` says so)."""
    return None if summary is None else _Stretch(summary)


def _touch(summary: RunSummary, event: Event, **changes: Any) -> RunSummary:
    # Every event of every run passes here when the index is rebuilt: see `evolve`.
    return evolve(summary, version=event.version, updated=event.timestamp, **changes)


def _fork_json(fork: tuple[UUID, int] | None) -> list[Any] | None:
    return None if fork is None else [str(fork[0]), fork[1]]


def iso(moment: datetime) -> str:
    """A UTC timestamp as fixed-width ISO text, so text order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")
