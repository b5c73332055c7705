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
    embedded = _Embedder()
    for version, states in snapshot.every_state(data.events, versions):
        embedded.add(version, states)
    note = ""
    if len(versions) < data.last_version:
        note = (
            f"This report embeds the states of {len(versions)} evenly spaced versions of"
            f" {data.last_version}; the slider shows the nearest one at or before the event"
            " chosen. `stagetrail ui` shows every version."
        )
    initial = snapshot.view(data.last_version, data.last_version, embedded.last)
    html = pages.run_page(
        data, page=0, initial=initial, embedded=embedded.data(), note=note, home="#"
    )
    return Report(run_id, data.last_version, len(versions), html)


def write_report(engine: Engine, run_id: UUID, path: str | Path) -> Report:
    """Write the report of `run_id` to `path` (UTF-8), replacing the file."""
    report = build_report(engine, run_id)
    Path(path).write_text(report.html, encoding="utf-8")
    return report


class _Embedder:
    """The views of many versions, with each frame and each distinct panel value stored once.

    The page's script puts a view back together (`expand` in run.js): the same
    JSON `snapshot.view` gives, which the API serves.
    """

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.index: dict[str, int] = {}
        self.frames: dict[int, Any] = {}
        self.states: list[dict[str, Any]] = []
        self.last: dict[str, Any] = {}

    def add(self, version: int, states: dict[str, Any]) -> None:
        """Embed the view after `version`, its panels' states given by name."""
        shown = snapshot.shown_frames(states["stack"])
        for position, frame in shown:
            if frame.version not in self.frames:
                as_json = snapshot.frame_json(frame, position)
                del as_json["n"]
                self.frames[frame.version] = as_json
        stack = {**snapshot.stack_view(states["stack"]), "frames": [f.version for _, f in shown]}
        refs = {name: self._ref(value) for name, value in snapshot.panels(states).items()}
        self.states.append({"version": version, "stack": stack, **refs})
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
