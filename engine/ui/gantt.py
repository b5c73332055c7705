"""The timeline drawn as SVG: a row per stage, a bar per attempt, a triangle per decision.

Written as strings here rather than by the template: a window of a run has
hundreds of bars, which Jinja2 takes longer to render. Every text that comes
from the run is escaped (`markupsafe.escape`). A bar's or a marker's text (what
it was, how long it took, its event) is its ``aria-label``, not a ``<title>``
element: the page's script makes the tooltip's ``<title>`` when the pointer
first comes over it, so a window the page draws has half as many elements to
parse and style.

The time axis compresses idle time: a stretch in which no attempt runs and
nothing is recorded (a breaker's wait, a retry's delay), longer than `MIN_IDLE`
seconds and than `IDLE_SHARE` of the time left once the longer ones are drawn
short, is drawn `GAP` units wide and marked as a break with its length, so the
attempts around it keep their width. Decisions at one instant are stacked in lanes: no marker hides
another.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence

import attrs
from markupsafe import Markup, escape

from engine.ui.timeline import Bar, Marker, Timeline, attempt_seconds

WIDTH = 1000.0
"""The drawing's width in SVG units (it scales to the page)."""

LABELS = 150.0
"""Room for the stage names at the left."""

RIGHT = 12.0
"""Room at the right, so the last marker is whole."""

ROW = 24.0
"""Height of one stage's row."""

LANE = 11.0
"""Height of one lane of markers (a triangle and a little room)."""

MAX_LANES = 6
"""Lanes of markers at most; decisions past that share a marker (its title lists them)."""

AXIS = 22.0
"""Height of the time axis and its labels."""

GAP = 36.0
"""Width of a compressed idle stretch."""

IDLE_SHARE = 0.08
"""An idle stretch is compressed when longer than this share of the span drawn..."""

MIN_IDLE = 2.0
"""...and longer than this many seconds."""

PAD = 12.0
"""Room around each stretch of activity (more when the drawing has width to spare)."""

MAX_SCALE = 200.0
"""Units per second at most: instants a few milliseconds apart are not spread over the page."""

TICK_SPACING = 80.0
"""The least room between two labels of the time axis."""

_STEPS: tuple[float, ...] = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800)
_STEPS += (3600, 7200, 21600, *(86400 * n for n in (1, 2, 7, 14, 30, 90, 365)))


@attrs.frozen
class Piece:
    """A stretch of the axis: seconds `start`..`end` drawn from `x0` to `x1`.

    A stretch of activity has `pad` units of room, half on each side, so that what
    happened at one instant still has a place of its own.
    """

    start: float
    end: float
    x0: float
    x1: float
    idle: bool
    pad: float = 0.0
    _inner: tuple[float, float, float] = attrs.field(init=False, repr=False, eq=False)
    """Where the stretch's room begins, its width and its length in seconds (0: an
    instant), worked out once: a window's drawing asks for a thousand places."""

    @_inner.default
    def _room(self) -> tuple[float, float, float]:
        inner0, inner1 = self.x0 + self.pad / 2, self.x1 - self.pad / 2
        if self.end <= self.start:
            return (inner0 + inner1) / 2, 0.0, 0.0
        return inner0, inner1 - inner0, self.end - self.start

    def x(self, at: float) -> float:
        """Where `at` (within the stretch) is drawn."""
        inner0, width, seconds = self._inner
        if not seconds:
            return inner0
        return inner0 + (at - self.start) / seconds * width


@attrs.frozen
class Axis:
    """Seconds to x, with idle stretches compressed."""

    pieces: tuple[Piece, ...]
    scale: float
    """Units per second of the stretches that are not compressed."""
    ends: tuple[float, ...] = attrs.field(init=False)
    """Each stretch's end, for a binary search (a window draws hundreds of stretches)."""

    @ends.default
    def _ends(self) -> tuple[float, ...]:
        return tuple(piece.end for piece in self.pieces)

    def x(self, at: float) -> float:
        """Where the time `at` (seconds from the run's start) is drawn."""
        pieces = self.pieces
        if len(pieces) == 1:  # no idle stretch: the common case
            piece = pieces[0]
        else:  # the first stretch that reaches `at`...
            index = min(bisect.bisect_left(self.ends, at), len(pieces) - 1)
            piece = pieces[index]
            if piece.idle and index + 1 < len(pieces) and pieces[index + 1].start <= at:
                piece = pieces[index + 1]  # ...or the activity that begins where a gap ends
        start, end = piece.start, piece.end
        return piece.x(start if at < start else end if at > end else at)


def axis(line: Timeline) -> Axis:
    """The axis of a timeline: its span drawn on the width, its long idle stretches compressed."""
    busy = _busy([(bar.start, bar.end) for bar in line.bars] + [(t, t) for t in line.times])
    if not busy:
        return Axis((Piece(0.0, 1.0, LABELS, WIDTH - RIGHT, False),), (WIDTH - RIGHT - LABELS))
    room = WIDTH - RIGHT - LABELS
    holes = [(end, start) for (_, end), (start, _) in itertools.pairwise(busy)]
    idle: set[tuple[float, float]] = set()
    left = busy[-1][1] - busy[0][0]
    for start, end in sorted(holes, key=lambda hole: hole[0] - hole[1]):  # longest first
        # Long against what is left once the longer ones are drawn short (a 600 s wait
        # must not hide that a 30 s one also dwarfs every attempt).
        if end - start <= max(MIN_IDLE, IDLE_SHARE * left) or len(idle) >= room / 2 / GAP:
            break
        idle.add((start, end))
        left -= end - start
    pad = min(PAD, room * 0.4 / len(busy))  # many stretches: less room around each
    fixed = GAP * len(idle) + pad * len(busy)
    scale = min((room - fixed) / left if left > 0 else math.inf, MAX_SCALE)
    stretch = (room - left * scale) / fixed  # what the fixed widths grow by to fill the room
    spans = [(start, end, False) for start, end in busy]
    spans += [(start, end, (start, end) in idle) for start, end in holes]
    active, pieces, x = set(busy), [], LABELS
    for start, end, compressed in sorted(spans):
        if compressed:
            width, room_around = GAP * stretch, 0.0
        elif (start, end) in active:
            room_around = pad * stretch
            width = (end - start) * scale + room_around
        else:
            width, room_around = (end - start) * scale, 0.0
        pieces.append(Piece(start, end, x, x + width, compressed, room_around))
        x += width
    return Axis(tuple(pieces), scale)


def _busy(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The spans merged: when an attempt ran or something was recorded."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


@attrs.frozen
class Gantt:
    """The drawing, and where the slider's cursor stands after each version drawn."""

    svg: Markup
    width: float
    height: float
    cursor: tuple[float, ...]
    """The x of each event drawn (by its position among the events of the timeline)."""


def draw(line: Timeline) -> Gantt:
    """The SVG of a run's timeline (or of a window of it)."""
    scale = axis(line)
    lanes = _lanes(line.markers, scale)
    rows_height = max(len(line.stages), 1) * ROW
    height = rows_height + max(len(lanes), 1) * LANE + AXIS + 4
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="gantt" id="gantt"'
        f' viewBox="0 0 {WIDTH:g} {height:g}"'
        f' role="img" aria-label="attempts over time">'
    ]
    for row, stage in enumerate(line.stages):
        parts.append(
            f'<text class="row-label" x="{LABELS - 8:g}" y="{row * ROW + 16:g}">'
            f"{_text(_short(stage))}<title>{_text(stage)}</title></text>"
            f'<line class="row-line" x1="{LABELS:g}" x2="{WIDTH:g}"'
            f' y1="{(row + 1) * ROW:g}" y2="{(row + 1) * ROW:g}"></line>'
        )
    parts += [_idle(piece, rows_height + len(lanes) * LANE) for piece in scale.pieces if piece.idle]
    parts += [_bar(bar, scale) for bar in line.bars]
    for lane, markers in enumerate(lanes):
        y = rows_height + lane * LANE + 2
        parts += [_marker(group, scale, y) for group in markers]
    parts.append(_ticks(scale, height - AXIS + 2))
    parts.append("</svg>")
    cursor = tuple(round(scale.x(at), 2) for at in line.times)
    return Gantt(Markup("".join(parts)), WIDTH, height, cursor)


def _short(stage: str) -> str:
    return stage if len(stage) <= 22 else stage[:21] + "…"


def _bar(bar: Bar, scale: Axis) -> str:
    x0, x1 = scale.x(bar.start), scale.x(bar.end)
    width = max(x1 - x0, 3.0)  # a short attempt still shows, grown to the left of its end
    outcome = f" ({bar.outcome})" if bar.outcome else ""
    title = (
        f"{bar.stage} attempt {bar.attempt}: {bar.kind}{outcome},"
        f" {attempt_seconds(bar.seconds)}, event {bar.version}"
    )
    return (
        f'<rect class="bar {bar.kind}" x="{x1 - width:.2f}" y="{bar.row * ROW + 4:g}"'
        f' width="{width:.2f}" height="{ROW - 8:g}" rx="2" data-version="{bar.version}"'
        f' data-attempt="{bar.attempt}" aria-label="{_attribute(title)}"></rect>'
    )


def _lanes(markers: Sequence[Marker], scale: Axis) -> list[list[list[Marker]]]:
    """The markers in lanes, so that none is drawn over another; crowds share a marker."""
    lanes: list[list[list[Marker]]] = []
    ends: list[float] = []
    for marker in sorted(markers, key=lambda m: (m.at, m.version)):
        x = scale.x(marker.at)
        free = next((lane for lane, end in enumerate(ends) if x - end >= LANE), None)
        if free is None and len(lanes) < MAX_LANES:
            lanes.append([])
            ends.append(-math.inf)
            free = len(lanes) - 1
        if free is None:  # every lane is crowded here: join the nearest marker
            nearest = min(range(len(lanes)), key=lambda lane: x - ends[lane])
            lanes[nearest][-1].append(marker)
            continue
        lanes[free].append([marker])
        ends[free] = x
    return lanes


def _marker(group: list[Marker], scale: Axis, y: float) -> str:
    first = group[0]
    x = scale.x(first.at)
    title = "\n".join(f"{marker.label} (event {marker.version})" for marker in group)
    versions = " ".join(str(marker.version) for marker in group)
    return (
        f'<path class="marker {first.kind}" d="M{x - 5:.2f},{y:g} h10 l-5,8 z"'
        f' data-version="{first.version}" data-versions="{versions}"'
        f' aria-label="{_attribute(title)}"></path>'
    )


def _text(text: str) -> str:
    """`text` escaped for an element's content, its carriage returns kept (a parser, HTML or
    XML, makes a raw one a line feed)."""
    return str(escape(text)).replace("\r", "&#13;")


def _attribute(text: str) -> str:
    """`text` escaped for an attribute's value, its line breaks kept (an XML parser would
    make them spaces, either parser a raw carriage return a line feed)."""
    return _text(text).replace("\n", "&#10;")


def _idle(piece: Piece, bottom: float) -> str:
    """A compressed idle stretch: shaded, two break marks, its length."""
    x0, x1 = piece.x0 + 4, piece.x1 - 4
    length = seconds_label(piece.end - piece.start)
    return (
        f'<g class="idle"><rect x="{x0:.2f}" y="0" width="{x1 - x0:.2f}" height="{bottom:g}">'
        f"<title>{length} with no attempt running: drawn short</title></rect>"
        f'<path d="M{x0:.2f},{bottom + 2:g} l4,-5 M{x1 - 4:.2f},{bottom + 2:g} l4,-5"></path>'
        f'<text x="{(x0 + x1) / 2:.2f}" y="9">{length}</text></g>'
    )


def _ticks(scale: Axis, y: float) -> str:
    """The time axis: a labelled tick every step of the stretches drawn to scale."""
    step = next((s for s in _STEPS if s * scale.scale >= TICK_SPACING), _STEPS[-1])
    parts = [f'<g class="axis"><line x1="{LABELS:g}" x2="{WIDTH:g}" y1="{y:g}" y2="{y:g}"></line>']
    last, said = -math.inf, ""
    for piece in scale.pieces:
        if piece.idle:
            continue
        tick = math.ceil(piece.start / step) * step
        if tick > piece.end and piece.pad:  # a stretch no tick falls in: label its start
            tick = piece.start
        while tick <= piece.end:
            x, text = piece.x(tick), seconds_label(tick)
            if x - last >= TICK_SPACING * 0.6 and text != said:
                parts.append(
                    f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{y:g}" y2="{y + 4:g}"></line>'
                    f'<text x="{x:.2f}" y="{y + 15:g}">{"" if tick < 0 else "+"}{text}</text>'
                )
                last, said = x, text
            tick += step
    parts.append("</g>")
    return "".join(parts)


def seconds_label(seconds: float) -> str:
    """A time on the axis: ``45s``, ``2m30s``, ``1h05m``, ``2d03h`` (``-5s`` before the start)."""
    if seconds < 0:
        return "-" + seconds_label(-seconds)
    tenths = round(seconds, 1)
    if tenths < 10 and tenths != round(tenths):
        return f"{tenths:.1f}s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s" if whole % 60 else f"{whole // 60}m"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
