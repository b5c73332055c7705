"""The timeline's bars and markers, from a run's events (no browser)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from freezegun import freeze_time

from engine import Engine, Run
from engine.ui.timeline import timeline
from events import CircuitOpened, RetryScheduled
from tests._helpers import REVIEW


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
