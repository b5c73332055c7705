"""The offline report: one self-contained HTML file of a run's page, slider included.

Inline CSS, script and SVG; the states the slider shows are folded by the
projections here, in Python, and embedded, so the slider works from ``file://``
with no server. A run of up to `REPORT_WINDOW` events is held whole: every
event, the state after each, the whole timeline. A longer one keeps the report
small (a few megabytes at most, whatever the run's length): its newest
`REPORT_WINDOW` events, listed, drawn and with the state after each, plus the
states of `SPACED` evenly spaced earlier versions (the slider shows the nearest
embedded one; their stacks list `SPACED_FRAMES` frames); the page says what it
left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import attrs

from engine.errors import InvalidArgument
from engine.ui import pages, snapshot

if TYPE_CHECKING:
    from engine.engine import Engine

REPORT_WINDOW = 1000
"""The newest events a report lists, draws and holds every state of (a multiple of a page)."""

SPACED = 50
"""Earlier versions of a longer run whose states a report embeds, evenly spaced."""

SPACED_FRAMES = 20
"""The newest frames of the stack an earlier version's state lists (a window's list 100)."""

FULL_LIMIT = 10_000
"""The longest run a ``full`` report holds whole unless told otherwise (`build_report`'s
``limit``): about ten times the size of a windowed report, and slower to write and open."""


@attrs.frozen
class Report:
    """What a report holds: its run, its events, and the versions whose states it embeds."""

    run_id: UUID
    events: int
    embedded: int
    html: str
    first_listed: int = 1
    """The oldest event the report lists and draws (1 unless the run is longer than a window)."""

    @property
    def every_version(self) -> bool:
        """Whether the state of every version is embedded."""
        return self.embedded == self.events


def build_report(
    engine: Engine, run_id: UUID, *, full: bool = False, limit: int = FULL_LIMIT
) -> Report:
    """The report of `run_id` (read from the store, folded here).

    Args:
        full: hold every event, the whole timeline and the state after each event,
            whatever the run's length, up to `limit` events.
        limit: the longest run a `full` report is written for.

    Raises:
        RunNotFound: no such run.
        InvalidArgument: `full` for a run longer than `limit` events (nothing is read).
    """
    if full:
        _check_full(engine, run_id, limit)
    data = pages.read_run(engine, run_id)
    last = data.last_version
    whole = full or last <= REPORT_WINDOW
    first = 1 if whole else _page_start(last - REPORT_WINDOW + 1)
    window = pages.read_window(engine, data, first, last)
    embedded = _Embedder()
    earlier = snapshot.spaced_versions(first - 1, SPACED) if first > 1 else []
    for version in earlier:
        (event,) = engine.store.read(run_id, gt=version - 1, lte=version)
        states = engine.project(run_id, snapshot.RunView, at=version)
        views = dict(zip(snapshot.PANELS, states, strict=True))
        embedded.add(version, views, event, frames=SPACED_FRAMES)
    before = engine.project(run_id, snapshot.RunView, at=first - 1) if first > 1 else None
    versions = range(first, last + 1)
    kinds = {event.version: event for event in window.events}
    for version, states in snapshot.every_state(window.events, versions, before):
        embedded.add(version, states, kinds[version])
    initial = {**snapshot.view(last, last, embedded.last), "kind": type(kinds[last]).__name__}
    note = _left_out(first, last, len(earlier))
    html = pages.run_page(
        data,
        window,
        start=last,
        initial=initial,
        listed=window.events,
        embedded=embedded.data(),
        note=note,
        home="#",
    )
    return Report(run_id, last, len(earlier) + len(versions), html, first)


def _check_full(engine: Engine, run_id: UUID, limit: int) -> None:
    """Refuse a full report of a run longer than `limit` events: its file would be huge."""
    newest = engine.store.last(run_id)
    if newest is not None and newest.version > limit:
        raise InvalidArgument(
            "full",
            f"run {run_id} has {newest.version:,} events, more than the {limit:,} a full"
            " report holds (its file would take tens of megabytes and long to open); leave"
            " out --full for a report of its newest events and spaced states, or raise the"
            f" limit with --full-limit {newest.version}",
        )


def _page_start(version: int) -> int:
    """The first version of the page of the event list that holds `version`."""
    return (pages.page_of(version) - 1) * pages.EVENTS_PER_PAGE + 1


def _left_out(first: int, last: int, earlier: int) -> str:
    """What a report of a long run leaves out, said on its page."""
    if first == 1:
        return ""
    return (
        f"This report holds events {first}\u2013{last} of {last}: listed, on the timeline, and"
        f" the state after each. Of the {first - 1} events before them it holds the states"
        f" of {earlier} evenly spaced versions (the slider shows the nearest one at or"
        f" before the event chosen; their stacks list the newest {SPACED_FRAMES} frames)"
        " and leaves out their events and timeline."
        " `stagetrail ui` shows every event."
    )


def write_report(
    engine: Engine, run_id: UUID, path: str | Path, *, full: bool = False, limit: int = FULL_LIMIT
) -> Report:
    """Write the report of `run_id` to `path` (UTF-8), replacing the file (see `build_report`)."""
    report = build_report(engine, run_id, full=full, limit=limit)
    Path(path).write_text(report.html, encoding="utf-8")
    return report


class _Embedder:
    """The views of many versions, with each frame and each distinct value stored once.

    Distinct values are a panel's JSON, a stage's row of the results, and the list
    of frames a stack shows (it changes only when an outcome or a rollback does).

    The page's script puts a view back together (`expand` in run.js): the same
    JSON `snapshot.view` gives, which the API serves.
    """

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.index: dict[str, int] = {}
        self.frames: dict[str, Any] = {}
        self.states: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}

    def add(
        self,
        version: int,
        states: dict[str, Any],
        event: Any,
        frames: int = snapshot.SHOWN_FRAMES,
    ) -> None:
        """Embed the view after `version` (`event`) listing `frames` frames of the stack."""
        shown = snapshot.shown_frames(states["stack"], frames)
        for position, frame in shown:
            key = snapshot.frame_key(frame)
            if key not in self.frames:
                as_json = snapshot.frame_json(frame, position)
                del as_json["n"]
                self.frames[key] = as_json
        stack = {
            **snapshot.stack_view(states["stack"], frames),
            "frames": self._ref([snapshot.frame_key(frame) for _, frame in shown]),
        }
        panels = snapshot.panels(states)
        refs: dict[str, Any] = {name: self._ref(value) for name, value in panels.items()}
        refs["results"] = [self._ref(row) for row in panels["results"]]  # a row per stage
        kind = type(event).__name__
        self.states.append({"version": version, "kind": kind, "stack": stack, **refs})
        self.last = states

    def _ref(self, value: Any) -> int:
        key = json.dumps(value, sort_keys=True)
        if key not in self.index:
            self.index[key] = len(self.values)
            self.values.append(value)
        return self.index[key]

    def data(self) -> dict[str, Any]:
        """What the page's script reads: versions, compact states, frames and values."""
        return {
            "versions": [state["version"] for state in self.states],
            "states": self.states,
            "frames": self.frames,
            "values": self.values,
        }
