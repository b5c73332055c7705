"""The pages of the viewer, rendered by Jinja2 with autoescaping on (payloads are text).

`run_page` serves both the live viewer and the offline report: the same
template, the same script; only where the states come from differs (the JSON
API, or the states the report embeds).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any
from uuid import UUID

import attrs
import jinja2

from engine.diagram import drawn_table
from engine.errors import RunNotFound, StoreError
from engine.payloads import observed_graph, readable_payload
from engine.payloads import summary as payload_summary
from engine.ui import gantt
from engine.ui.diagram import drawn_states, pipeline_svg
from engine.ui.timeline import timeline
from events import Event, RunStarted
from projections import RunIndex, RunSummary

if TYPE_CHECKING:
    from engine.engine import Engine

EVENTS_PER_PAGE = 100
"""Events listed per page of the run page (the API pages them the same way)."""

WINDOW = 600
"""Events in the timeline's window around the slider (the page and the API draw no more)."""

_SUMMARY_FIELDS = (
    "stage",
    "attempt",
    "outcome",
    "error_type",
    "error",
    "status",
    "task_id",
    "key",
    "steps",
    "delay",
    "amount",
    "unit",
    "reason",
)


_WITH_DESCRIBED = tuple(name for name in _SUMMARY_FIELDS if name != "task_id")
"""The fields summarised beside `engine.payloads.summary` (which names the task itself)."""


@functools.cache
def environment() -> jinja2.Environment:
    """The Jinja2 environment of the package's templates (autoescaped)."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("engine.ui", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    environment.filters["readable"] = readable
    return environment


_FIRST = {"rule": 0, "detected": 1}


def readable(value: Any) -> str:
    """A JSON value as a person reads it: text as is, an object as ``key: value · ...``.

    A finish reason is often an object (the supervisor's verdicts: ``rule``,
    ``detected``, the policy's limits); those two keys come first.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        keys = sorted(value, key=lambda key: _FIRST.get(key, len(_FIRST)))
        return " · ".join(f"{key}: {readable(value[key])}" for key in keys)
    if isinstance(value, list):
        return ", ".join(readable(item) for item in value)
    return json.dumps(value, ensure_ascii=False)


def render(template: str, **context: Any) -> str:
    """A template of the package rendered with `context`."""
    return environment().get_template(template).render(**context)


def asset(name: str) -> str:
    """The text of a static asset shipped in the package (``ui.css``, ``run.js``)."""
    return resources.files("engine.ui").joinpath("static", name).read_text(encoding="utf-8")


@attrs.frozen
class EventRow:
    """One line of the event list, and the payload it expands to."""

    version: int
    kind: str
    at: float
    decision: bool
    summary: str
    payload: str


def event_row(event: Event, start: float) -> EventRow:
    """The event as the list shows it: kind, seconds from the start, a summary, the payload."""
    state = readable_payload(event)  # a framework's serialised values decoded, never base64
    described = payload_summary(event)  # a checkpoint or a task's writes: as the CLI says it
    fields = _SUMMARY_FIELDS if described is None else _WITH_DESCRIBED
    parts = [_word(state[name]) for name in fields if state.get(name) not in (None, "")]
    summary = " · ".join(parts if described is None else [*parts, described])
    decision = any(marker in type(event).__name__ for marker in ("Retry", "Circuit", "Finished"))
    return EventRow(
        version=event.version,
        kind=type(event).__name__,
        at=round(event.timestamp.timestamp() - start, 3),
        decision=decision or type(event).__name__ == "StateRolledBack",
        summary=summary if len(summary) <= 140 else summary[:139] + "…",
        payload=json.dumps(state, indent=2, ensure_ascii=False, sort_keys=True),
    )


def _word(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@attrs.frozen
class RunData:
    """What the run page shows of one run whatever its length: its start, summary and size."""

    run_id: UUID
    first: RunStarted
    summary: RunSummary | None
    last_version: int


def read_run(engine: Engine, run_id: UUID, *, with_summary: bool = True) -> RunData:
    """The run's `RunStarted`, its summary (`RunIndex`, unless not asked) and newest version.

    Raises:
        RunNotFound: no such run.
        StoreError: the run does not begin with `RunStarted`.
    """
    last = engine.store.last(run_id)
    if last is None:
        raise RunNotFound(run_id, engine.url)
    first = engine.store.read(run_id, lte=1)[0]
    if not isinstance(first, RunStarted):
        raise StoreError(engine.url, f"run {run_id} does not begin with RunStarted")
    summary = run_summary(engine, run_id) if with_summary else None
    return RunData(run_id, first, summary, last.version)


def run_summary(engine: Engine, run_id: UUID) -> RunSummary | None:
    """The run's row of the run index (kept by the engine, caught up: no fold of the run)."""
    found: RunSummary | None = engine.projections.get(RunIndex.name, run_id)
    return found


@attrs.frozen
class Window:
    """Events `first`..`last` of a run, around the slider: the timeline's and the list's."""

    first: int
    last: int
    events: Sequence[Event]
    drawing: gantt.Gantt

    def to_json(self) -> dict[str, Any]:
        """What the page's script draws: the span, the SVG, the cursor's x and each kind."""
        return {
            "first": self.first,
            "last": self.last,
            "svg": str(self.drawing.svg),
            "cursor": list(self.drawing.cursor),
            "kinds": [type(event).__name__ for event in self.events],
        }


def window_span(at: int, last_version: int, size: int = WINDOW) -> tuple[int, int]:
    """The first and last versions of the window of `size` events around version `at`.

    Windows start at multiples of half a window (the run's end excepted), with `at`
    at least a quarter of a window from either edge: nearby versions share a
    window, which the page and the viewer then draw once (`WindowCache`).
    """
    half = size // 2
    first = max(0, (at - 1 - size // 4) // half) * half + 1
    first = max(1, min(first, last_version - size + 1))
    return first, min(last_version, first + size - 1)


def read_window(engine: Engine, data: RunData, first: int, last: int) -> Window:
    """The events `first`..`last` of the run and their timeline (drawn on the run's clock)."""
    events = engine.store.read(data.run_id, gt=first - 1, lte=last)
    table = data.first.table
    line = timeline(events, start=data.first.timestamp, stages=drawn_states(table), table=table)
    return Window(first, last, events, gantt.draw(line))


class WindowCache:
    """The windows drawn lately (a window of a run's events never changes once recorded).

    Keyed by the store's erasure generation, the run and the span: once runs are
    erased (an id may then name another run), nothing drawn before is served again.
    """

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._windows: OrderedDict[tuple[int, UUID, int, int], Window] = OrderedDict()
        self._lock = threading.Lock()

    def window(self, engine: Engine, data: RunData, first: int, last: int) -> Window:
        """`read_window`'s answer, drawn now or lately."""
        key = (engine.store.generation(), data.run_id, first, last)
        with self._lock:
            found = self._windows.get(key)
            if found is not None:
                self._windows.move_to_end(key)
                return found
        drawn = read_window(engine, data, first, last)
        with self._lock:
            self._windows[key] = drawn
            while len(self._windows) > self._size:
                self._windows.popitem(last=False)
        return drawn


def run_page(
    data: RunData,
    window: Window,
    *,
    start: int,
    listed: Sequence[Event],
    initial: Mapping[str, Any] | None = None,
    page: int = 0,
    embedded: Mapping[str, Any] | None = None,
    note: str = "",
    api: str = "",
    home: str = "/",
) -> str:
    """The run page: header, slider, diagram, panels, timeline and events.

    Args:
        window: the events around the slider whose timeline is drawn.
        start: the version the slider starts at.
        initial: the view at `start`, in the page (the report's); None for the live
            page, which asks the API for it once shown, so the page itself is never
            held up by a fold of the run.
        listed: the events listed (a page of them; the report's: its window's).
        page: which page of `EVENTS_PER_PAGE` events `listed` is (the report: 0, it
            holds its window's pages and shows one at a time).
        embedded: the report's states; None for the live page, which calls `api`.
        note: a line under the slider (what a report of a long run leaves out).
    """
    began = data.first.timestamp.timestamp()
    observed = observed_graph(window.events)  # a framework graph's edges, as taken nearby
    js = asset("run.js") if embedded is not None else ""
    script = {
        "run_id": str(data.run_id),
        "last_version": data.last_version,
        "api": api,
        "states": drawn_states(data.first.table),
        "window": {key: value for key, value in window.to_json().items() if key != "svg"},
        "start": start,
        "initial": initial,
        "embedded": embedded,
        "per_page": EVENTS_PER_PAGE,
    }
    return render(
        "run.html",
        run_id=str(data.run_id),
        first=data.first,
        summary=data.summary,
        last_version=data.last_version,
        start_version=start,
        svg=pipeline_svg(drawn_table(data.first.table, data.first.params, observed)),
        gantt=window.drawing,
        window=window,
        rows=[event_row(event, began) for event in listed],
        first_page=-(-listed[0].version // EVENTS_PER_PAGE) if listed else 1,
        page=page,
        pages=max(1, -(-data.last_version // EVENTS_PER_PAGE)),
        per_page=EVENTS_PER_PAGE,
        script=script,
        note=note,
        home=home,
        offline=embedded is not None,
        css=asset("ui.css") if embedded is not None else "",
        js=js,
        script_hash=_sha256(js),
    )


def _sha256(text: str) -> str:
    """The CSP source that allows exactly this inline script (the report runs no other)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return "sha256-" + base64.b64encode(digest).decode("ascii")


def page_of(version: int) -> int:
    """The page of the event list that holds `version`."""
    return -(-version // EVENTS_PER_PAGE)


def read_page(engine: Engine, run_id: UUID, page: int) -> list[Event]:
    """The events of one page of the list."""
    return engine.store.read(run_id, gt=(page - 1) * EVENTS_PER_PAGE, lte=page * EVENTS_PER_PAGE)
