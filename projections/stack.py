"""The pushdown stack of a run: one frame per stage outcome, popped by rollbacks.

`StateStack` pushes a `Frame` for every `StageCompleted` / `StageFailed` and pops
`steps` frames at `StateRolledBack`. Frames live in a persistent list, so a push
or a pop costs the same however deep the stack is. An outcome that took a hub's
implicit route (`events.table.implicit_route`) pushes two frames, as a recorded
route and the outcome would: the route's (a decided outcome of the hub, attempt 0)
and its own, both made from its event.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs

from events import DECIDED, JSON, Event, RunStarted, StageCompleted, StageFailed, StateRolledBack
from events.table import Lookup, hub_of, implicit_route, initial_state, lookup
from events.values import build, maker
from projections.base import EventSource, Projection, on
from projections.deferred import from_events, pack_ranges, unpack_ranges, version_ranges
from projections.immutable import PList
from projections.interning import interned


@attrs.frozen
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


@attrs.frozen
class Hub:
    """A table's hub, as a stack reads the routes outcomes take from it implicitly."""

    name: str
    lone: frozenset[int] = frozenset()
    """The versions of implicit routes on the stack whose outcome a rollback undid: each
    has its route's frame alone (made from the outcome's event all the same)."""


@attrs.frozen
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
        return _STACK(None, {}, PList(), None)

    @on(RunStarted)
    def started(self, state: Stack, event: RunStarted) -> Stack:
        """Take the initial state and the transition lookup from the run's table."""
        table = event.table
        return build(
            Stack,
            {
                "initial": initial_state(table),
                "table": lookup(table),
                "frame_list": state.frame_list,
                "hub": _hub(hub_of(table), frozenset()),
            },
        )

    @on(StageCompleted)
    def completed(self, state: Stack, event: StageCompleted) -> Stack:
        """Push a frame holding the stage's result."""
        return _push(state, event)

    @on(StageFailed)
    def failed(self, state: Stack, event: StageFailed) -> Stack:
        """Push a frame holding the stage's error."""
        return _push(state, event)

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
            "ranges": pack_ranges(version_ranges(state.frame_list)),
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

        frames = from_events(self.name, unpack_ranges(data["ranges"]), events, make)
        return _STACK(data["initial"], table, frames, hub)


_FIELDS = tuple(field.name for field in attrs.fields(Frame))


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
        return _STACK(state.initial, table, state.frame_list.push(_frame(table, event)), None)
    frames, name = state.frame_list, hub.name
    if event.stage != name:
        routed_to = table.get((name, event.stage))
        if implicit_route(name, state.current or "", event.stage, routed_to):
            frames = frames.push(_route_frame(name, event))  # the route it took, first
    return _STACK(state.initial, table, frames.push(_frame(table, event)), hub)


# Positional (`maker`), in the fields' declared order: a fold builds both per outcome.
_FRAME = maker(Frame)
_STACK = maker(Stack)
_HUB = maker(Hub)
