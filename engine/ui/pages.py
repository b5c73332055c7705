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
from engine.ui import gantt, snapshot
from engine.ui.diagram import pipeline_svg
from engine.ui.timeline import Timeline, timeline
from events import Event, RunStarted
from projections import RunIndex, RunSummary

if TYPE_CHECKING:
    from engine.engine import Engine

EVENTS_PER_PAGE = 100
"""Events listed per page of the run page (the API pages them the same way)."""

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
    return jinja2.Environment(
        loader=jinja2.PackageLoader("engine.ui", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )


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
    """Everything the run page shows of one run, read once from the store."""

    run_id: UUID
    first: RunStarted
    events: Sequence[Event]
    summary: RunSummary | None
    timeline: Timeline

    @property
    def last_version(self) -> int:
        """The run's newest version."""
        return self.events[-1].version


def read_run(engine: Engine, run_id: UUID) -> RunData:
    """The run's events, its summary from the run index and its timeline.

    Raises:
        RunNotFound: no such run.
        StoreError: the run does not begin with `RunStarted`.
    """
    events = engine.events(run_id)
    if not events:
        raise RunNotFound(run_id, engine.url)
    first = events[0]
    if not isinstance(first, RunStarted):
        raise StoreError(engine.url, f"run {run_id} does not begin with RunStarted")
    summary = engine.project(run_id, RunIndex)
    return RunData(run_id, first, events, summary, timeline(events))


def run_page(
    data: RunData,
    *,
    page: int,
    initial: Mapping[str, Any],
    embedded: Mapping[str, Any] | None = None,
    note: str = "",
    api: str = "",
    home: str = "/",
) -> str:
    """The run page: header, slider, diagram, panels, timeline and events.

    Args:
        page: which page of events to list (1-based); the report lists them all (0).
        initial: the view the page draws before the slider moves (its version is where
            the slider starts).
        embedded: the report's states; None for the live page, which calls `api`.
        note: a line under the slider (e.g. that a report embeds spaced versions).
    """
    start = data.first.timestamp.timestamp()
    events = data.events if page == 0 else data.events[_page_slice(page)]
    pages = max(1, -(-len(data.events) // EVENTS_PER_PAGE))
    drawing = gantt.draw(data.timeline)
    observed = observed_graph(data.events)  # a framework graph's edges, as taken
    js = asset("run.js") if embedded is not None else ""
    script = {
        "run_id": str(data.run_id),
        "last_version": data.last_version,
        "api": api,
        "kinds": [type(event).__name__ for event in data.events],
        "cursor": drawing.cursor,
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
        start_version=initial["version"],
        svg=pipeline_svg(drawn_table(data.first.table, data.first.params, observed)),
        gantt=drawing,
        rows=[event_row(event, start) for event in events],
        page=page,
        pages=pages,
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


def _page_slice(page: int) -> slice:
    return slice((page - 1) * EVENTS_PER_PAGE, page * EVENTS_PER_PAGE)


def initial_view(engine: Engine, data: RunData, version: int | None = None) -> dict[str, Any]:
    """The view after event `version` (default: the newest), from the projections."""
    at = data.last_version if version is None else min(version, data.last_version)
    return snapshot.at_version(engine, data.run_id, at, data.last_version)
