"""The offline report: one self-contained HTML file of a run's page, slider included.

Inline CSS, script and SVG; the states of every version (or of `EMBEDDED_VERSIONS`
evenly spaced ones for a longer run) are folded by the projections here, in
Python, and embedded, so the slider works from ``file://`` with no server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import attrs

from engine.ui import pages, snapshot

if TYPE_CHECKING:
    from engine.engine import Engine


@attrs.frozen
class Report:
    """What a report holds: its run, its events, and the versions whose states it embeds."""

    run_id: UUID
    events: int
    embedded: int
    html: str

    @property
    def every_version(self) -> bool:
        """Whether the state of every version is embedded."""
        return self.embedded == self.events


def build_report(engine: Engine, run_id: UUID) -> Report:
    """The report of `run_id` (read from the store, folded here).

    Raises:
        RunNotFound: no such run.
    """
    data = pages.read_run(engine, run_id)
    versions = snapshot.spaced_versions(data.last_version, snapshot.EMBEDDED_VERSIONS)
    views = list(snapshot.every_version(data.events, versions))
    note = ""
    if len(versions) < data.last_version:
        note = (
            f"This report embeds the states of {len(versions)} evenly spaced versions of"
            f" {data.last_version}; the slider shows the nearest one at or before the event"
            " chosen. `stagetrail ui` shows every version."
        )
    html = pages.run_page(
        data, page=0, initial=views[-1], embedded=_compact(views), note=note, home="#"
    )
    return Report(run_id, data.last_version, len(versions), html)


def write_report(engine: Engine, run_id: UUID, path: str | Path) -> Report:
    """Write the report of `run_id` to `path` (UTF-8), replacing the file."""
    report = build_report(engine, run_id)
    Path(path).write_text(report.html, encoding="utf-8")
    return report


def _compact(views: list[dict[str, Any]]) -> dict[str, Any]:
    """The views with each frame and each distinct panel value stored once."""
    values: list[Any] = []
    index: dict[str, int] = {}
    frames: dict[int, Any] = {}

    def ref(value: Any) -> int:
        key = json.dumps(value, sort_keys=True)
        if key not in index:
            index[key] = len(values)
            values.append(value)
        return index[key]

    states = []
    for view in views:
        stack = view["stack"]
        for frame in stack["frames"]:
            frames.setdefault(frame["version"], {k: v for k, v in frame.items() if k != "n"})
        states.append(
            {
                "version": view["version"],
                "stack": {**stack, "frames": [frame["version"] for frame in stack["frames"]]},
                **{name: ref(view[name]) for name in ("summary", "results", "retries", "progress")},
            }
        )
    versions = [view["version"] for view in views]
    return {"versions": versions, "states": states, "frames": frames, "values": values}
