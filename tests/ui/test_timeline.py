"""The timeline's bars and markers, from a run's events (no browser)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from xml.etree import ElementTree

import pytest
from freezegun import freeze_time

from engine import Engine, Run
from engine.integrations.langgraph.table import HUB, thread_pipeline
from engine.ui import gantt
from engine.ui.timeline import Marker, Timeline, attempt_seconds, timeline
from events import (
    DECIDED,
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    RetryScheduled,
    StageCompleted,
)
from tests._helpers import REVIEW, hub_history, hub_table


def _retried(run: Run) -> None:
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    run.stage_failed("developer", "broke")
    run.stage_completed("developer")


def _rolled_back(run: Run) -> None:
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    run.rollback(1, reason="bad review")
    run.stage_completed("code_review")


def _failed_last(run: Run) -> None:
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    run.stage_failed("developer", "broke")


def _open(run: Run) -> None:
    run.stage_completed("project_analysis")
    run.stage_started("code_review")


def _decisions(run: Run) -> None:
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    run.stage_failed("developer", "broke")
    run.record(RetryScheduled, stage="developer", attempt=2, delay=1.0, reason="retry")
    run.record(CircuitOpened, stage="developer", reason="too many")
    run.finish("aborted_stuck", reason="no progress")


CASES: list[tuple[str, Callable[[Run], None], list[str], list[str]]] = [
    ("retried", _retried, ["completed", "completed", "retried", "completed"], []),
    ("rolled back", _rolled_back, ["completed", "rolled_back", "completed"], ["rollback"]),
    ("failed last", _failed_last, ["completed", "completed", "failed"], []),
    ("open attempt", _open, ["completed", "open"], []),
    (
        "decisions",
        _decisions,
        ["completed", "completed", "failed"],
        ["retry", "breaker", "verdict"],
    ),
]


class TestTimeline:
    @pytest.mark.parametrize(
        ("record", "bars", "markers"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
    )
    def test_bars_and_markers(
        self, record: Callable[[Run], None], bars: list[str], markers: list[str]
    ) -> None:
        """Each attempt is one bar of the right kind; each decision one marker."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            record(run)
            line = timeline(engine.events(run.id))
        assert [bar.kind for bar in line.bars] == bars
        assert [marker.kind for marker in line.markers] == markers

    def test_a_row_per_stage_in_order_of_first_appearance(self) -> None:
        """Stages get rows in the order they first ran; a retry stays on its stage's row."""
        with Engine("memory://") as engine:
            run = engine.start_run(REVIEW)
            _retried(run)
            line = timeline(engine.events(run.id))
        assert line.stages == ("project_analysis", "code_review", "developer")
        assert [bar.row for bar in line.bars] == [0, 1, 2, 2]

    def test_a_route_through_a_framework_loop_has_no_row(self) -> None:
        """LangGraph's routes (decided outcomes of its ``__graph__`` hub) draw no row nor bar."""
        with Engine("memory://") as engine:
            run = engine.start_run(thread_pipeline(["fetch", "think"]))
            for node in ("fetch", "think", "fetch"):
                run.record(StageCompleted, stage=HUB, attempt=DECIDED, outcome=node)
                run.stage_completed(node)
            line = timeline(engine.events(run.id))
        assert line.stages == ("fetch", "think")
        assert [(bar.stage, bar.attempt) for bar in line.bars] == [
            ("fetch", 1),
            ("think", 1),
            ("fetch", 2),
        ]

    def test_a_framework_stage_numbered_as_an_attempt_has_no_row(self) -> None:
        """A hub route stored with an attempt number (by earlier releases) draws no row either."""
        with Engine("memory://") as engine:
            run = engine.start_run(thread_pipeline(["fetch"]))
            run.stage_completed(HUB, outcome="fetch")
            run.stage_completed("fetch")
            line = timeline(engine.events(run.id))
        assert line.stages == ("fetch",)

    def test_a_rollback_counts_a_route_as_a_step(self) -> None:
        """Rolling back over a route and a node marks the node's bar, the route has none."""
        with Engine("memory://") as engine:
            run = engine.start_run(thread_pipeline(["fetch", "think"]))
            for node in ("fetch", "think"):
                run.record(StageCompleted, stage=HUB, attempt=DECIDED, outcome=node)
                run.stage_completed(node)
            run.rollback(2, reason="undo think")
            line = timeline(engine.events(run.id))
        assert [(bar.stage, bar.kind) for bar in line.bars] == [
            ("fetch", "completed"),
            ("think", "rolled_back"),
        ]

    @pytest.mark.parametrize("steps", [1, 2, 3, 4])
    def test_a_rollback_counts_an_implicit_route_as_a_step(self, steps: int) -> None:
        """Bars rolled back are the same whether the hub's routes were recorded or implicit."""
        drawn = []
        with Engine("memory://") as engine:
            for explicit in (True, False):
                run = hub_history(engine, explicit=explicit)
                run.rollback(steps)
                events = engine.events(run.id)
                line = timeline(events, table=events[0].table)  # type: ignore[attr-defined]
                drawn.append([(bar.stage, bar.attempt, bar.kind) for bar in line.bars])
        assert drawn[0] == drawn[1]
        kinds = [kind for _, _, kind in drawn[1]]
        assert kinds.count("rolled_back") == {1: 1, 2: 2, 3: 2, 4: 3}[steps]  # 3: a route

    def test_an_outcome_after_a_rollback_into_a_node_takes_no_route(self) -> None:
        """After a rollback leaves the run in a node, its next outcome is one step, not two."""
        drawn = []
        with Engine("memory://") as engine:
            for explicit in (True, False):
                run = engine.start_run(hub_table(hub=not explicit))
                for _ in range(2):
                    if explicit:
                        run.record(StageCompleted, stage="hub", attempt=DECIDED, outcome="a")
                    run.stage_completed("a")
                run.rollback(1)  # back in a, its route kept
                run.stage_completed("a")
                run.rollback(3)  # a's third outcome, the second route, a's first outcome
                events = engine.events(run.id)
                line = timeline(events, table=events[0].table)  # type: ignore[attr-defined]
                drawn.append([(bar.stage, bar.attempt, bar.kind) for bar in line.bars])
        assert drawn[0] == drawn[1] == [("a", n, "rolled_back") for n in (1, 2, 3)]

    def test_times_are_seconds_from_the_first_event(self) -> None:
        """A started attempt spans start to outcome; one without a start ends at its outcome."""
        with Engine("memory://") as engine, freeze_time("2026-11-20 09:00:00") as clock:
            run = engine.start_run(REVIEW)
            clock.tick(10)
            run.stage_started("project_analysis")
            clock.tick(5)
            run.stage_completed("project_analysis", duration=5.0)
            clock.tick(20)
            run.stage_completed("code_review", duration=8.0)
            line = timeline(engine.events(run.id))
        assert [(bar.start, bar.end) for bar in line.bars] == [(10.0, 15.0), (27.0, 35.0)]
        assert line.times == (0.0, 10.0, 15.0, 35.0)
        assert line.span == 35.0


def _breaker_wait(run: Run, clock: Any) -> None:
    """Attempts of 40-50 s, then three breaker events at one instant and a 600 s wait."""
    run.stage_started("project_analysis")
    clock.tick(40)
    run.stage_completed("project_analysis", duration=40.0)
    run.stage_completed("code_review", duration=0.0)
    run.stage_started("developer")
    clock.tick(50)
    run.stage_failed("developer", "down", duration=50.0)
    run.record(CircuitOpened, stage="developer", reason="3 failures")
    run.record(CircuitHalfOpened, stage="developer", reason="probe")
    run.record(CircuitClosed, stage="developer", reason="ok")
    clock.tick(600)
    run.stage_started("developer")
    clock.tick(45)
    run.stage_completed("developer", duration=45.0)
    run.finish("aborted_stuck", reason="stuck")


def _drawn(record: Callable[[Run, Any], None]) -> tuple[Timeline, ElementTree.Element]:
    with Engine("memory://") as engine, freeze_time("2026-11-20 09:00:00") as clock:
        run = engine.start_run(REVIEW)
        record(run, clock)
        line = timeline(engine.events(run.id))
    return line, ElementTree.fromstring(str(gantt.draw(line).svg))


SVG = "{http://www.w3.org/2000/svg}"


class TestOneDuration:
    def test_a_bar_is_as_long_as_its_recorded_duration(self) -> None:
        """An attempt started 30 s before an outcome that recorded 12 s is a 12 s bar, said so."""
        with Engine("memory://") as engine, freeze_time("2026-11-20 09:00:00") as clock:
            run = engine.start_run(REVIEW)
            run.stage_started("project_analysis")
            clock.tick(30)
            run.stage_completed("project_analysis", duration=12.0)
            line = timeline(engine.events(run.id))
        (bar,) = line.bars
        assert (bar.start, bar.end, bar.seconds) == (18.0, 30.0, 12.0)
        svg = ElementTree.fromstring(str(gantt.draw(line).svg))
        (drawn,) = [rect for rect in svg.iter(f"{SVG}rect") if rect.get("data-version") == "3"]
        assert drawn.get("aria-label", "").endswith(f", {attempt_seconds(12.0)}, event 3")


class TestTooltips:
    def test_bars_and_markers_carry_their_text_as_a_label_not_an_element(self) -> None:
        """Each bar and marker says what it was in its aria-label; no <title> is drawn for them
        (the page makes one when the pointer comes over it)."""
        _, svg = _drawn(_breaker_wait)
        shapes = [e for e in svg.iter() if e.get("data-version") is not None]
        assert shapes
        assert all(shape.get("aria-label") for shape in shapes)
        assert all(shape.find(f"{SVG}title") is None for shape in shapes)

    def test_a_shared_marker_lists_each_decision_on_its_own_line(self) -> None:
        """Decisions past the last lane share a marker; its label keeps one line per decision."""
        markers = tuple(Marker("retry", 0.0, version, f"retry {version}") for version in range(8))
        line = Timeline(("build",), (), markers, (0.0,) * 8)
        svg = ElementTree.fromstring(str(gantt.draw(line).svg))
        labels = [p.get("aria-label", "") for p in svg.iter(f"{SVG}path") if p.get("data-versions")]
        shared = [label.split("\n") for label in labels if "\n" in label]
        assert shared
        assert all(line.endswith(")") and "(event " in line for lines in shared for line in lines)
        assert sum(len(lines) for lines in shared) + len(labels) - len(shared) == 8


class TestDrawing:
    def test_markers_at_one_instant_never_hide_each_other(self) -> None:
        """Three breaker events and the finish at one instant: four markers, four places."""
        _, svg = _drawn(_breaker_wait)
        markers = [p for p in svg.iter(f"{SVG}path") if "marker" in (p.get("class") or "")]
        kinds = [m.get("class") for m in markers]
        assert kinds.count("marker breaker") == 3
        assert kinds.count("marker verdict") == 1
        places = [m.get("d", "").split(" ")[0] for m in markers]
        assert len(set(places)) == len(places)

    def test_a_long_idle_wait_is_a_marked_break(self) -> None:
        """A 600 s breaker wait is drawn short and labelled; the attempts keep their width."""
        line, svg = _drawn(_breaker_wait)
        scale = gantt.axis(line)
        assert [(p.start, p.end) for p in scale.pieces if p.idle] == [(90.0, 690.0)]
        idle = [g for g in svg.iter(f"{SVG}g") if g.get("class") == "idle"]
        assert [t.text for g in idle for t in g.iter(f"{SVG}text")] == ["10m"]
        widths = [
            float(r.get("width", 0))
            for r in svg.iter(f"{SVG}rect")
            if "bar" in (r.get("class") or "")
        ]
        assert min(sorted(widths)[1:]) > 150
        # the 40, 50 and 45 s attempts each take over 150 of 1,000 units: no sliver

    def test_the_axis_is_labelled_in_time_since_the_start(self) -> None:
        """The time axis has ticks labelled from the run's start, in order."""
        _, svg = _drawn(_breaker_wait)
        axis = next(g for g in svg.iter(f"{SVG}g") if g.get("class") == "axis")
        labels = [t.text for t in axis.iter(f"{SVG}text")]
        assert labels[0] == "+0s"
        assert len(labels) >= 3
        xs = [float(t.get("x", 0)) for t in axis.iter(f"{SVG}text")]
        assert xs == sorted(xs)

    @pytest.mark.parametrize(
        ("seconds", "label"),
        [
            (0.5, "0.5s"),
            (0.004, "0s"),
            (45, "45s"),
            (60, "1m"),
            (150, "2m30s"),
            (3900, "1h05m"),
            (90000, "1d01h"),
            (-25, "-25s"),
        ],
    )
    def test_seconds_label(self, seconds: float, label: str) -> None:
        """Axis labels are short: seconds, minutes, hours, days."""
        assert gantt.seconds_label(seconds) == label


class TestAxis:
    def test_many_stretches_still_fit_the_width_in_order(self) -> None:
        """600 events a few milliseconds apart: every x on the drawing, in time order."""
        with Engine("memory://") as engine, freeze_time("2026-11-20 09:00:00") as clock:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis")
            run.stage_completed("code_review")
            for _ in range(300):
                clock.tick(0.003)
                run.stage_started("developer")
                clock.tick(0.003)
                run.stage_failed("developer", "broke")
            line = timeline(engine.events(run.id))
        cursor = gantt.draw(line).cursor
        assert min(cursor) >= gantt.LABELS
        assert max(cursor) <= gantt.WIDTH
        assert list(cursor) == sorted(cursor)
