"""A run's attempts on a time axis (the Gantt chart of the run page), from its events.

One bar per stage attempt, one row per stage (in the table's order, else in order
of first appearance), and a marker per decision. An outcome that is no attempt (a
decided one, or a framework's own ``__…`` stage such as LangGraph's routing hub) has
neither bar nor row; nor has a hub's implicit route, which an outcome took (it is
one more step for a rollback, as a recorded route is). This is drawing data, not a
projection: the states the slider shows come from the projections themselves
(`engine.ui.snapshot`). The events may be a window of a run (the page draws the
events around its slider): an outcome whose start is before the window is drawn
from its recorded duration.

An attempt has one duration everywhere (`attempt_seconds`): what its outcome
recorded (`duration`, by default the time since its `StageStarted`), which the
stack and the stage results show too; its bar ends at its outcome and is that
long. An attempt still open has run from its start to the newest event.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import attrs

from events import (
    DECIDED,
    JSON,
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    Event,
    NoteAdded,
    RetryScheduled,
    RunFinished,
    StageCompleted,
    StageFailed,
    StageStarted,
    StateRolledBack,
)
from events.table import Lookup, hub_of, implicit_route, lookup
from events.values import evolve

STUCK_STATUSES = frozenset({"aborted_stuck", "done_partial"})
"""Finish statuses that are a progress verdict, marked as such."""

_NO_BAR = -1
"""On the stack of outcomes drawn: an outcome that has no bar (see `_no_attempt`)."""

VERDICT_NOTES = frozenset({"gave_up", "circuit_rejected", "progress_verdict"})
"""Keys of the notes in which the supervisor records a decision."""


@attrs.frozen
class Bar:
    """One attempt of a stage: when it ran and how it ended.

    `kind` is ``completed``, ``failed``, ``retried`` (failed, then tried again),
    ``rolled_back`` (its outcome was undone by a rollback) or ``open`` (no outcome yet).
    """

    stage: str
    row: int
    attempt: int
    kind: str
    outcome: str
    start: float
    end: float
    version: int

    @property
    def seconds(self) -> float:
        """The attempt's one duration (`attempt_seconds` of its outcome; open: so far)."""
        return self.end - self.start


@attrs.frozen
class Marker:
    """A decision on the time axis: ``retry``, ``breaker``, ``rollback``, ``verdict`` or ``finish``.

    A ``verdict`` is the supervisor's: a run ended stuck or partial, or a decision note.
    """

    kind: str
    at: float
    version: int
    label: str


@attrs.frozen
class Timeline:
    """Every attempt and decision of a run, in seconds from its first event."""

    stages: tuple[str, ...]
    bars: tuple[Bar, ...]
    markers: tuple[Marker, ...]
    times: tuple[float, ...]
    """Seconds from the start of each event, by version - 1."""

    @property
    def span(self) -> float:
        """Seconds from the first event to the last one (or the end of the last bar)."""
        ends = [bar.end for bar in self.bars]
        return max([*self.times, *ends, 0.0])


def attempt_seconds(duration: float) -> str:
    """An attempt's duration as every part of the page writes it (timeline, stack, results)."""
    return f"{duration:.1f}s"


@attrs.define
class _Builder:
    """The mutable state of one pass over the events."""

    start: datetime | None = None
    stages: list[str] = attrs.Factory(list)
    bars: list[Bar] = attrs.Factory(list)
    markers: list[Marker] = attrs.Factory(list)
    times: list[float] = attrs.Factory(list)
    opened: dict[str, tuple[float, int]] = attrs.Factory(dict)
    pushed: list[int] = attrs.Factory(list)
    failed_last: dict[str, int] = attrs.Factory(dict)
    hub: str | None = None
    moves: Lookup = attrs.Factory(dict)
    state: str | None = None
    """The run's state after the newest outcome drawn (None: not known in this window)."""
    left: list[str] = attrs.Factory(list)
    """The state each step of `pushed` left (a rollback of it returns there)."""

    def row(self, stage: str) -> int:
        if stage not in self.stages:
            self.stages.append(stage)
        return self.stages.index(stage)

    def retry_of(self, stage: str) -> None:
        """A new attempt of `stage`: its last failed attempt was retried."""
        index = self.failed_last.pop(stage, None)
        if index is not None and self.bars[index].kind == "failed":
            self.bars[index] = evolve(self.bars[index], kind="retried")

    def mark(self, kind: str, at: float, event: Event, label: str) -> None:
        self.markers.append(Marker(kind, at, event.version, label))


def timeline(
    events: Iterable[Event],
    *,
    start: datetime | None = None,
    stages: Iterable[str] = (),
    table: JSON = None,
) -> Timeline:
    """The attempts and decisions of a run's events (oldest first).

    Args:
        start: time zero (the run's first event); default the first event given.
        stages: the rows' order (the table's states); a stage not named gets a row after them.
        table: the run's stored table, whose hub's implicit routes are steps of the stack
            (before the window's first outcome, the run is taken to be in the hub).
    """
    build = _Builder(start=start, hub=hub_of(table), moves=lookup(table))
    known = list(stages)
    for event in events:
        if build.start is None:
            build.start = event.timestamp
        at = (event.timestamp - build.start).total_seconds()
        build.times.append(at)
        _add(build, event, at)
    last = build.times[-1] if build.times else 0.0
    for stage, (opened, version) in build.opened.items():
        build.bars.append(Bar(stage, build.row(stage), 0, "open", "", opened, last, version))
    order = {stage: index for index, stage in enumerate(known)}
    rows = sorted(build.stages, key=lambda stage: order.get(stage, len(order)))
    moved = {build.stages.index(stage): row for row, stage in enumerate(rows)}
    bars = tuple(
        bar if moved[bar.row] == bar.row else evolve(bar, row=moved[bar.row]) for bar in build.bars
    )
    return Timeline(tuple(rows), bars, tuple(build.markers), tuple(build.times))


def _add(build: _Builder, event: Event, at: float) -> None:
    if isinstance(event, StageStarted):
        build.row(event.stage)
        build.retry_of(event.stage)
        build.opened[event.stage] = (at, event.version)
    elif isinstance(event, StageCompleted | StageFailed):
        _outcome(build, event, at)
    elif isinstance(event, StateRolledBack):
        _rollback(build, event, at)
    else:
        _decision(build, event, at)


def _outcome(build: _Builder, event: StageCompleted | StageFailed, at: float) -> None:
    if _took_route(build, event):  # the hub's implicit route: a step with no bar
        build.pushed.append(_NO_BAR)
        build.left.append(build.hub or event.stage)
    build.state = build.moves.get((event.stage, event.outcome))
    build.left.append(event.stage)  # a checked outcome names the state it leaves
    if _no_attempt(event):  # it still goes on the stack: a rollback counts it as a step
        build.pushed.append(_NO_BAR)
        return
    opened = build.opened.pop(event.stage, None)
    if opened is None:  # an outcome recorded without StageStarted opens and closes its attempt
        build.retry_of(event.stage)
    start = at - event.duration  # the attempt's one duration: what its outcome recorded
    failed = isinstance(event, StageFailed)
    row = build.row(event.stage)
    kind = "failed" if failed else "completed"
    bar = Bar(event.stage, row, event.attempt, kind, event.outcome, start, at, event.version)
    build.bars.append(bar)
    build.pushed.append(len(build.bars) - 1)
    if failed:
        build.failed_last[event.stage] = len(build.bars) - 1
    else:
        build.failed_last.pop(event.stage, None)


def _took_route(build: _Builder, event: StageCompleted | StageFailed) -> bool:
    """Whether `event` took its table's hub's implicit route (`events.table.implicit_route`)."""
    hub = build.hub
    if hub is None or event.stage == hub:
        return False
    state = hub if build.state is None else build.state
    return implicit_route(hub, state, event.stage, build.moves.get((hub, event.stage)))


def _no_attempt(event: StageCompleted | StageFailed) -> bool:
    """Whether an outcome is no attempt, so it has no bar nor row: a decided one (a routed
    verdict, a LangGraph route) or a framework's own stage (``__…``, LangGraph's hub)."""
    decided = event.attempt == DECIDED and type(event) is StageCompleted
    return decided or event.stage.startswith("__")


def _rollback(build: _Builder, event: StateRolledBack, at: float) -> None:
    if event.steps:  # back to the state the oldest step undone left, if drawn in this window
        known = event.steps <= len(build.left)
        build.state = build.left[-event.steps] if known else None
    for _ in range(min(event.steps, len(build.pushed))):
        build.left.pop()
        index = build.pushed.pop()
        if index == _NO_BAR:
            continue
        build.bars[index] = evolve(build.bars[index], kind="rolled_back")
    reason = f": {event.reason}" if event.reason else ""
    build.mark("rollback", at, event, f"rolled back {event.steps}{reason}")


def _decision(build: _Builder, event: Event, at: float) -> None:
    if isinstance(event, RetryScheduled):
        build.mark("retry", at, event, f"retry {event.stage} (attempt {event.attempt})")
    elif isinstance(event, CircuitOpened | CircuitHalfOpened | CircuitClosed):
        name = type(event).__name__.removeprefix("Circuit").lower()
        build.mark("breaker", at, event, f"breaker {name} for {event.stage}: {event.reason}")
    elif isinstance(event, NoteAdded) and event.key in VERDICT_NOTES:
        build.mark("verdict", at, event, f"{event.key}")
    elif isinstance(event, RunFinished):
        kind = "verdict" if event.status in STUCK_STATUSES else "finish"
        build.mark(kind, at, event, f"finished: {event.status}")
