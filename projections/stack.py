"""The pushdown stack of a run: one frame per stage outcome, popped by rollbacks.

`StateStack` pushes a `Frame` for every `StageCompleted` / `StageFailed` and pops
`steps` frames at `StateRolledBack`. Frames live in a persistent list (`Frames`:
the newest kept as rows of their fields, a frame made when read), so a push or a
pop costs the same however deep the stack is; a fold pushes its outcomes' rows in
place (`StateStack.fold`). An outcome that took a hub's
implicit route (`events.table.implicit_route`) pushes two frames, as a recorded
route and the outcome would: the route's (a decided outcome of the hub, attempt 0)
and its own, both made from its event.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from sys import intern
from typing import Any

import attrs

from events import DECIDED, JSON, Event, RunStarted, StageCompleted, StageFailed, StateRolledBack
from events.table import Lookup, as_rows, hub_of, implicit_route, initial_state, lookup, read_table
from events.values import build, maker
from projections.base import EventSource, Projection, folded_by, folds_with, on
from projections.collector import COLLECT_EVERY
from projections.deferred import (
    from_events,
    packed_onto,
    packed_versions,
    ranges_check,
    unpack_ranges,
)
from projections.errors import ProjectionError
from projections.immutable import ROWS_PER_BLOCK, PList, RowList
from projections.interning import interned


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Frame:
    """One stage outcome on the stack, and the state it led to."""

    state: str
    stage: str
    outcome: str
    attempt: int
    failed: bool
    result: JSON
    error: str | None
    error_type: str | None
    duration: float
    version: int
    timestamp: datetime


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Hub:
    """A table's hub, as a stack reads the routes outcomes take from it implicitly."""

    name: str
    lone: frozenset[int] = frozenset()
    """The versions of implicit routes on the stack whose outcome a rollback undid: each
    has its route's frame alone (made from the outcome's event all the same)."""


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Stack:
    """The state stack of a run: its initial state, its table and its frames."""

    initial: str | None = None
    table: Lookup = attrs.field(factory=dict)
    frame_list: PList[Frame] = attrs.field(factory=PList)
    hub: Hub | None = None
    """The table's hub, if it declares one (its implicit routes are frames too)."""

    @property
    def top(self) -> Frame | None:
        """The newest frame, or None when the stack is empty."""
        return self.frame_list.last

    @property
    def depth(self) -> int:
        """How many frames are on the stack."""
        return len(self.frame_list)

    @property
    def frames(self) -> tuple[Frame, ...]:
        """The frames, oldest first."""
        return self.frame_list.to_tuple()

    @property
    def current(self) -> str | None:
        """The state the run is in: the top frame's, else the initial state."""
        top = self.top
        return self.initial if top is None else top.state

    def latest_result(self, stage: str) -> JSON:
        """The result of the newest successful frame of `stage` still on the stack, or None.

        A routed verdict's frame (attempt 0: the stage did not run) is no result of it.
        """
        for frame in self.frame_list.newest_first():
            if frame.stage == stage and not frame.failed and frame.attempt:
                return frame.result
        return None

    def all_latest_results(self) -> dict[str, JSON]:
        """Each stage with a successful frame on the stack → its newest result."""
        results: dict[str, JSON] = {}
        for frame in self.frame_list.newest_first():
            if not frame.failed and frame.attempt:
                results.setdefault(frame.stage, frame.result)
        return results

    def failures(self, stage: str | None = None) -> tuple[Frame, ...]:
        """The failed frames on the stack, oldest first; only those of `stage` if given."""
        return tuple(
            frame
            for frame in self.frame_list
            if frame.failed and (stage is None or frame.stage == stage)
        )


class StateStack(Projection[Stack]):
    """The pushdown stack: a frame per stage outcome (and per hub's implicit route it took),
    frames popped by rollbacks."""

    scope = "run"

    def initial(self) -> Stack:
        """An empty stack with no table."""
        # Kept as shipped: this method's source is part of the fingerprint (see `RowList`'s
        # `__init__` for the empty list's cost).
        return _STACK(None, {}, Frames(), None)

    @on(RunStarted)
    def started(self, state: Stack, event: RunStarted) -> Stack:
        """Take the initial state and the transition lookup from the run's table."""
        # As shipped, not `read_table`: this method's code is part of the fingerprint.
        table, frames = event.table, state.frame_list
        if len(frames):  # rows of another table's frames: a push must not take their states
            frames = PList(frames.cells, len(frames))
        return _STACK(initial_state(table), lookup(table), frames, _hub(hub_of(table), frozenset()))

    @on(StageCompleted)
    def completed(self, state: Stack, event: StageCompleted) -> Stack:
        """Push a frame holding the stage's result."""
        frames = state.frame_list
        if state.hub is not None:
            return _push(state, event)
        if frames.__class__ is not Frames:  # a decoded or restored stack's: rows go on top
            frames = Frames.on(frames)
        frames = frames.pushed(event, state.table, None, None)  # type: ignore[attr-defined]
        return _STACK(state.initial, state.table, frames, None)

    @on(StageFailed)
    def failed(self, state: Stack, event: StageFailed) -> Stack:
        """Push a frame holding the stage's error."""
        frames = state.frame_list
        if state.hub is not None:
            return _push(state, event)
        if frames.__class__ is not Frames:
            frames = Frames.on(frames)
        error, error_type = event.error, event.error_type
        error = interned(error)
        error_type = interned(error_type)
        frames = frames.pushed(event, state.table, error, error_type)  # type: ignore[attr-defined]
        return _STACK(state.initial, state.table, frames, None)

    def fold(self, events: Iterable[Event], state: Stack | None = None) -> Stack:
        """`Projection.fold`, each outcome on a table without a hub pushed as a row in place.

        The states between two events of a fold are nobody's but its own, so the outcomes
        (nearly all of a run's events) go straight onto the newest block of rows
        (`RowList`): no stack, frame list or frame made per event. Any other event, and an
        outcome on a hub's table, goes to its handler, from the stack as `apply` makes it.
        """
        # As shipped (this method's code is part of the fingerprint): `folds_with` answers a
        # `StateStack` itself first, with no look at the handlers.
        if not folds_with(self, StateStack, StageCompleted, StageFailed):
            return super().fold(events, state)  # a subclass takes outcomes its own way
        return folded_by(self, self._pushed_in_place, events, state)

    def _pushed_in_place(
        self, events: Iterable[Event], current: Stack, tick: Callable[[], None]
    ) -> Stack:
        # One loop, its state in locals (the frames' `RowList.parts`, the newest row's
        # names): a call per event would cost what the push does.
        handlers, hub, left, every = self.handlers, current.hub, COLLECT_EVERY, COLLECT_EVERY
        cap = _WIDTH * ROWS_PER_BLOCK
        event: Any
        stage: Any = _NO_NAME
        outcome = state = error = error_type = None
        table: Lookup = {}
        tip: list[Any] = []
        blocks: Any = None
        pushing, cells, size, used = False, None, 0, 0
        for event in events:
            kind = event.__class__
            if (kind is StageCompleted or kind is StageFailed) and hub is None:
                if not pushing:
                    cells, size, tip, used, blocks = Frames.on(current.frame_list).parts()
                    pushing, table, stage = True, current.table, _NO_NAME
                try:
                    named, called = event.stage, event.outcome
                    if named != stage or called != outcome:  # else the newest row's, again
                        stage = intern(named) if named.__class__ is str else named
                        outcome = intern(called) if called.__class__ is str else called
                        state = table.get((stage, outcome), stage)
                    if kind is StageCompleted:
                        row: tuple[Any, ...] = (
                            state, stage, outcome, event.attempt, False, event.result, None,
                            None, event.duration, event.version, event.timestamp,
                        )  # fmt: skip
                    else:
                        error, error_type = event.error, event.error_type
                        error = interned(error)
                        error_type = interned(error_type)
                        row = (
                            state, stage, outcome, event.attempt, True, None, error,
                            error_type, event.duration, event.version, event.timestamp,
                        )  # fmt: skip
                    if used == cap:  # the newest block is full: it goes below, a new one starts
                        blocks, tip, used = Frames.sealed(tip[:used], blocks), [], 0
                    tip.extend(row)
                    used += _WIDTH
                    size += 1
                    if len(tip) != used:  # another list went on from it at the same moment
                        tip = tip[: used - _WIDTH] + list(row)
                except Exception as failure:
                    raise ProjectionError(self.name, event, failure) from failure
            else:
                handler = handlers.get(kind)
                if handler is not None:
                    if pushing:
                        frames = Frames.of_parts(cells, size, tip, used, blocks)
                        current, pushing = _STACK(current.initial, table, frames, None), False
                    try:
                        current = handler(self, current, event)
                    except Exception as failure:
                        raise ProjectionError(self.name, event, failure) from failure
                    hub = current.hub
            left -= 1
            if not left:
                tick()
                left = every
        if pushing:
            frames = Frames.of_parts(cells, size, tip, used, blocks)
            current = _STACK(current.initial, table, frames, None)
        return current

    @on(StateRolledBack)
    def rolled_back(self, state: Stack, event: StateRolledBack) -> Stack:
        """Pop the newest `steps` frames (an implicit route left alone is noted: `Hub.lone`)."""
        hub = state.hub
        if hub is None:
            return _STACK(state.initial, state.table, state.frame_list.pop(event.steps), None)
        frames, lone, popped = state.frame_list, hub.lone, None
        for _ in range(min(event.steps, len(frames))):
            popped = frames.last
            frames = frames.pop()
            if lone and popped is not None and popped.version in lone:
                lone = lone - {popped.version}
        top = frames.last if popped is not None else None
        if top is not None and popped is not None and top.version == popped.version:
            lone = lone | {top.version}  # the outcome undone, the route it took stays
        return _STACK(state.initial, state.table, frames, _hub(hub.name, lone))

    def encode(self, state: Stack) -> JSON:
        """The stack as strict JSON: initial state, table rows, frames oldest first, the hub."""
        return {
            "initial": state.initial,
            "table": sorted(
                [source, outcome, dest] for (source, outcome), dest in state.table.items()
            ),
            "frames": [encode_frame(frame) for frame in state.frame_list],
            **_hub_json(state.hub),
        }

    def decode(self, data: JSON) -> Stack:
        """The stack `encode` turned into `data`."""
        return Stack(
            initial=data["initial"],
            table={(source, outcome): dest for source, outcome, dest in data["table"]},
            frame_list=PList.of([decode_frame(frame) for frame in data["frames"]]),
            hub=_hub(data.get("hub"), frozenset(data.get("lone", ()))),
        )

    def snapshot(self, state: Stack) -> JSON:
        """The stack as the versions of its frames' events, not the frames themselves.

        Each frame is made from one event and the table, so the versions say it all;
        a deferred tail (a snapshot restored) is not walked: it knows its versions.
        """
        return {
            "initial": state.initial,
            "table": sorted(
                [source, outcome, dest] for (source, outcome), dest in state.table.items()
            ),
            **_ranges_json(*packed_versions(state.frame_list)),
            **_hub_json(state.hub),
        }

    def restore(self, data: JSON, events: EventSource) -> Stack:
        """The stack `snapshot` wrote: its frames are made from their events when first needed.

        An implicit route's two frames list their event's version twice: the older is
        the route's; a version listed once is the route's alone if it is `lone`.
        """
        table = {(source, outcome): dest for source, outcome, dest in data["table"]}
        hub = _hub(data.get("hub"), frozenset(data.get("lone", ())))

        def make(event: Event, index: int, count: int) -> Frame:
            if hub is not None and index == 0 and (count > 1 or event.version in hub.lone):
                return _route_frame(hub.name, event)  # type: ignore[arg-type]
            return _frame(table, event)

        totals = (data.get("last"), data.get("count"), data.get("check"))
        ranges = unpack_ranges(data["ranges"], *totals)
        frames = from_events(self.name, ranges, events, make)
        return _STACK(data["initial"], table, frames, hub)


_FIELDS = tuple(field.name for field in attrs.fields(Frame))
_WIDTH = len(_FIELDS)
_new = object.__new__
_NO_NAME = object()
"""A stage no event names: a fold's newest row before its first."""


def encode_frame(frame: Frame) -> list[JSON]:
    """A frame as a JSON array in field order (the timestamp in ISO 8601).

    Arrays, not objects: deep stacks are snapshotted, and arrays halve the bytes.
    """
    row: list[Any] = [getattr(frame, name) for name in _FIELDS]
    row[-1] = frame.timestamp.isoformat()
    return row


def decode_frame(row: Sequence[Any]) -> Frame:
    """The frame `encode_frame` turned into `row`."""
    fields = dict(zip(_FIELDS, row, strict=True))
    fields["timestamp"] = datetime.fromisoformat(row[-1])
    return build(Frame, fields)


def _hub(name: str | None, lone: frozenset[int]) -> Hub | None:
    """The stack's `Hub` of a table whose hub is `name` (None: the table declares none)."""
    return None if name is None else _HUB(name, lone)


def _ranges_json(packed: str, last: int, count: int) -> dict[str, JSON]:
    """A stack's frames' versions as its snapshot's ``ranges``, with their newest version and
    count (``last``, ``count``): a restore then reads neither from the ranges' text, only
    checks them against it (``check``)."""
    return {
        "ranges": packed,
        "last": last,
        "count": count,
        "check": ranges_check(packed, last, count),
    }


def _hub_json(hub: Hub | None) -> dict[str, JSON]:
    """A stack's hub as its encoding's ``hub`` and ``lone`` keys."""
    return {"hub": None, "lone": []} if hub is None else {"hub": hub.name, "lone": sorted(hub.lone)}


def _route_frame(hub: str, event: StageCompleted | StageFailed) -> Frame:
    """The frame of the hub's implicit route that `event` took: a decided outcome of the hub."""
    stage = interned(event.stage)
    return _FRAME(
        stage, interned(hub), stage, DECIDED, False, None, None, None,
        0.0, event.version, event.timestamp,
    )  # fmt: skip


def _frame(table: Lookup, event: Any) -> Frame:
    """The frame a stage outcome pushes.

    Its names and error text interned: a long run's frames repeat a few of them, and
    each event read brings its own copy of each (a deep stack kept one per frame).
    """
    stage, outcome = interned(event.stage), interned(event.outcome)
    state = table.get((stage, outcome), stage)
    if isinstance(event, StageFailed):
        return _FRAME(
            state, stage, outcome, event.attempt, True, None, interned(event.error),
            interned(event.error_type), event.duration, event.version, event.timestamp,
        )  # fmt: skip
    return _FRAME(
        state, stage, outcome, event.attempt, False, event.result, None, None,
        event.duration, event.version, event.timestamp,
    )  # fmt: skip


def _push(state: Stack, event: StageCompleted | StageFailed) -> Stack:
    hub, table = state.hub, state.table
    if hub is None:  # the common table, without a hub: one frame per outcome
        return _STACK(state.initial, table, _on_top(state.frame_list, _frame(table, event)), None)
    frames, name = state.frame_list, hub.name
    if event.stage != name:
        routed_to = table.get((name, event.stage))
        if implicit_route(name, state.current or "", event.stage, routed_to):
            frames = _on_top(frames, _route_frame(name, event))  # the route it took, first
    return _STACK(state.initial, table, _on_top(frames, _frame(table, event)), hub)


def _on_top(frames: PList[Frame], frame: Frame) -> PList[Frame]:
    """`frames` with an outcome's `frame` pushed: as its row onto rows, unchecked (its result
    is its event's, strict JSON), where `RowList.push` would check a frame made by hand."""
    if frames.__class__ is not Frames:
        return frames.push(frame)
    row = tuple([getattr(frame, name) for name in _FIELDS])
    return frames.push_row(row)


# Positional (`maker`), in the fields' declared order: a fold builds a stack per outcome.
_FRAME = maker(Frame)
_STACK = maker(Stack)
_HUB = maker(Hub)


class Frames(RowList[Frame]):
    """A stack's frames, the newest kept as rows of their fields (`RowList`): a fold pushes
    a row per outcome, and a frame is made from it when read."""

    __slots__ = ()

    fields = _FIELDS
    version_at = _FIELDS.index("version")
    frozen_at = _FIELDS.index("result")
    make = staticmethod(_FRAME)

    def pushed(
        self, event: Any, table: Lookup, error: str | None, error_type: str | None
    ) -> Frames:
        """The frames with the one `event`'s outcome pushes (`error` given: a failure's).

        `apply` pushes one per outcome: the names and state of the newest row are taken
        again when its stage and outcome are the event's (a loop's outcomes repeat them: no
        interning, no table lookup), and `RowList.push_row` puts the row at the end of the
        newest block when this list owns it.
        """
        tip, used = self._tip, self._used
        stage, outcome = event.stage, event.outcome
        newest = used - _WIDTH  # where the newest row starts: state, stage, outcome, ...
        if used and stage == tip[newest + 1] and outcome == tip[newest + 2]:
            state, stage, outcome = tip[newest : newest + 3]
        else:
            stage = intern(stage) if stage.__class__ is str else stage
            outcome = intern(outcome) if outcome.__class__ is str else outcome
            state = table.get((stage, outcome), stage)
        row: tuple[Any, ...]
        if event.__class__ is StageCompleted:
            row = (
                state, stage, outcome, event.attempt, False, event.result, None, None,
                event.duration, event.version, event.timestamp,
            )  # fmt: skip
        else:
            row = (
                state, stage, outcome, event.attempt, True, None, error, error_type,
                event.duration, event.version, event.timestamp,
            )  # fmt: skip
        return self.push_row(row)  # type: ignore[return-value]


class StackShape:
    """The versions of a run's stack frames, followed as its writer commits: no frame made.

    What `StateStack.snapshot` stores, for a writer keeping its run's snapshots
    (`engine.readside.SnapshotKeeper`): an outcome pushes its version (twice for a
    hub's implicit route), a rollback pops, where the fold would make a frame per
    outcome. The versions below the last `snapshot` are held packed as it stored
    them, so each snapshot of a deep stack packs only what changed since.

    A hub's implicit route depends on the run's state, so a hub's table holds each
    unpacked frame's state too; a rollback below them leaves the shape unknown
    (`known` False): its keeper then folds from a stored snapshot instead.

    Args:
        initial, table, hub: the stack's (`Stack`), from the run's table.
        packed, last, count: the older frames' versions as `pack_ranges` packs them,
            their newest version and how many frames they are.
        below: the state the newest packed frame left (a hub's table; None: none).
    """

    __slots__ = (
        "_below",
        "_count",
        "_hub",
        "_last",
        "_lone",
        "_packed",
        "_rows",
        "_states",
        "_table",
        "_versions",
        "initial",
        "known",
        "version",
    )

    def __init__(
        self,
        initial: str | None,
        table: Lookup,
        hub: Hub | None,
        *,
        packed: str = "",
        last: int = 0,
        count: int = 0,
        below: str | None = None,
        version: int = 1,
    ) -> None:
        self.initial, self._table, self._hub = initial, table, None if hub is None else hub.name
        self._lone = set() if hub is None else set(hub.lone)
        self._rows: list[list[str]] = as_rows(table)
        self._packed, self._last, self._count, self._below = packed, last, count, below
        self._versions = _new_versions()  # frames above the packed ones, newest last
        self._states: list[str] = []  # their states (a hub's table only)
        self.known = True
        self.version = version
        """The run's version the shape is at."""

    @classmethod
    def started(cls, event: RunStarted) -> StackShape:
        """The shape of a run's stack right after its `RunStarted`: no frame."""
        initial, moves, hub = read_table(event.table)
        return cls(initial, moves, _hub(hub, frozenset()))

    @classmethod
    def of(cls, stack: Stack, version: int) -> StackShape:
        """The shape of `stack`, the run's after event `version` (a restored stack's
        deferred frames are not walked)."""
        packed, last, count = packed_versions(stack.frame_list)
        below = stack.current if stack.hub is not None else None
        return cls(
            stack.initial,
            stack.table,
            stack.hub,
            packed=packed,
            last=last,
            count=count,
            below=below,
            version=version,
        )

    @property
    def depth(self) -> int:
        """How many frames the stack holds (the machine's `RunState.depth`)."""
        return self._count + len(self._versions)

    def advance(self, events: Sequence[Event]) -> None:
        """Follow `events`, the run's next ones (`known` turns False if they are not)."""
        if not events or events[0].version != self.version + 1:
            self.known = False
            return
        push, hub = self._versions.append, self._hub
        for event in events:
            kind = type(event)
            if kind is StageCompleted or kind is StageFailed:
                if hub is None:
                    push(event.version)
                else:
                    self._push_at_hub(hub, event)  # type: ignore[arg-type]
            elif kind is StateRolledBack:
                self._pop(event.steps)  # type: ignore[attr-defined]
        self.version = events[-1].version

    def snapshot(self) -> JSON:
        """`StateStack.snapshot` of the stack; the frames followed since are packed now."""
        self._packed, self._last, self._count = packed_onto(
            self._packed, self._last, self._count, self._versions
        )
        if self._hub is not None:
            self._below = self._current()
        self._versions, self._states = _new_versions(), []
        return {
            "initial": self.initial,
            "table": self._rows,
            **_ranges_json(self._packed, self._last, self._count),
            **_hub_json(None if self._hub is None else _HUB(self._hub, frozenset(self._lone))),
        }

    def _current(self) -> str | None:
        if self._states:
            return self._states[-1]
        return self._below if self._count else self.initial

    def _push_at_hub(self, hub: str, event: StageCompleted | StageFailed) -> None:
        table, version = self._table, event.version
        stage = event.stage
        routed_to = table.get((hub, stage))
        if stage != hub and implicit_route(hub, self._current() or "", stage, routed_to):
            self._versions.append(version)
            self._states.append(stage)  # the route's frame: it leads to the stage
        self._versions.append(version)
        self._states.append(table.get((stage, event.outcome), stage))

    def _pop(self, steps: int) -> None:
        steps = min(steps, self.depth)
        above = len(self._versions)
        if self._hub is None:
            del self._versions[max(above - steps, 0) :]
            if steps > above:
                self._packed, self._last, self._count = _drop_newest(
                    self._packed, self._last, self._count, steps - above
                )
            return
        if steps > above:  # the states of the packed frames are not held
            self.known = False
            return
        popped = None
        for _ in range(steps):  # as `StateStack.rolled_back`
            popped = self._versions.pop()
            self._states.pop()
            self._lone.discard(popped)
        top = self._versions[-1] if self._versions else self._last if self._count else None
        if popped is not None and top == popped:
            self._lone.add(top)  # the outcome undone, the route it took stays


def _new_versions() -> array[int]:
    """An empty list of versions, a machine word each (an int object each would be 4 times
    the size: a writer holds these for each live handle)."""
    return array("q")


def _drop_newest(packed: str, last: int, count: int, drop: int) -> tuple[str, int, int]:
    """`packed` ranges (newest `last`, `count` versions) without their `drop` newest versions."""
    while drop > 0 and count > 0:
        start = packed.rfind(",") + 1
        step, _, extra = packed[start:].partition("+")
        length = int(extra or 0) + 1
        if drop < length:  # the range's older part stays
            rest = length - drop - 1
            packed = packed[:start] + (step if rest == 0 else f"{step}+{rest}")
            return packed, last - drop, count - drop
        packed, last = packed[: max(start - 1, 0)], last - length + 1 - int(step)
        count, drop = count - length, drop - length
    return packed, last, count
