"""The timeline drawn as SVG: a row per stage, a bar per attempt, a triangle per decision.

Written as strings here rather than by the template: a 10,000-event run has
thousands of bars, which Jinja2 takes a second to render and this a tenth of
that. Every text that comes from the run is escaped (`markupsafe.escape`).
"""

from __future__ import annotations

import attrs
from markupsafe import Markup, escape

from engine.ui.timeline import Bar, Marker, Timeline

WIDTH = 1000.0
"""The drawing's width in SVG units (it scales to the page)."""

LABELS = 150.0
"""Room for the stage names at the left."""

ROW = 24.0
"""Height of one stage's row."""


@attrs.frozen
class Gantt:
    """The drawing, and where the slider's cursor stands after each version."""

    svg: Markup
    width: float
    height: float
    cursor: tuple[float, ...]
    """The x of each version's event (by version - 1)."""


def draw(line: Timeline) -> Gantt:
    """The SVG of a run's timeline."""
    scale = (WIDTH - LABELS - 10) / (line.span or 1.0)
    height = max(len(line.stages), 1) * ROW + 20
    parts = [
        f'<svg class="gantt" id="gantt" viewBox="0 0 {WIDTH:g} {height:g}"'
        f' role="img" aria-label="attempts over time">'
    ]
    for row, stage in enumerate(line.stages):
        parts.append(
            f'<text class="row-label" x="{LABELS - 8:g}" y="{row * ROW + 16:g}">'
            f"{escape(stage)}</text>"
            f'<line class="row-line" x1="{LABELS:g}" x2="{WIDTH:g}"'
            f' y1="{(row + 1) * ROW:g}" y2="{(row + 1) * ROW:g}"></line>'
        )
    parts += [_bar(bar, scale) for bar in line.bars]
    parts += [_marker(marker, scale, height) for marker in line.markers]
    parts.append("</svg>")
    cursor = tuple(round(LABELS + at * scale, 2) for at in line.times)
    return Gantt(Markup("".join(parts)), WIDTH, height, cursor)


def _bar(bar: Bar, scale: float) -> str:
    x = LABELS + bar.start * scale
    width = max((bar.end - bar.start) * scale, 3.0)
    outcome = f" ({bar.outcome})" if bar.outcome else ""
    title = (
        f"{bar.stage} attempt {bar.attempt}: {bar.kind}{outcome},"
        f" {bar.end - bar.start:.1f}s, event {bar.version}"
    )
    return (
        f'<rect class="bar {bar.kind}" x="{x:.2f}" y="{bar.row * ROW + 4:g}" width="{width:.2f}"'
        f' height="{ROW - 8:g}" rx="2" data-version="{bar.version}"'
        f' data-stage="{escape(bar.stage)}" data-attempt="{bar.attempt}">'
        f"<title>{escape(title)}</title></rect>"
    )


def _marker(marker: Marker, scale: float, height: float) -> str:
    x = LABELS + marker.at * scale
    return (
        f'<path class="marker {marker.kind}" d="M{x - 5:.2f},{height - 12:g} h10 l-5,8 z"'
        f' data-version="{marker.version}">'
        f"<title>{escape(marker.label)} (event {marker.version})</title></path>"
    )
