"""The unit of work: a run's pending events, its groupings, commit points and observers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engine import ConcurrencyConflict, Engine
from engine.run import unit_of
from events import Event, StageStarted, utc_now
from tests._helpers import REVIEW


class Follower:
    """An observer that keeps the versions it was told of, and each rewind."""

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.rewinds: list[int] = []

    def recorded(self, event: Event) -> None:
        self.versions.append(event.version)

    def rewound(self, version: int) -> None:
        self.rewinds.append(version)


class TestGrouping:
    def test_grouped_events_are_written_together_at_a_commit_and_at_the_end(
        self, engine: Engine
    ) -> None:
        """Inside a grouping nothing is stored until commit(); the rest is stored at its end."""
        run = engine.start_run(REVIEW)
        work = unit_of(run)
        with work.grouped():
            run.stage_completed("project_analysis")
            run.note("k", "v")
            assert (len(engine.events(run.id)), run.version) == (1, 3)
            work.commit()
            assert len(engine.events(run.id)) == 3
            run.stage_started("code_review")
            assert len(engine.events(run.id)) == 3
        assert [e.version for e in engine.events(run.id)] == [1, 2, 3, 4]

    def test_an_exception_in_the_grouping_still_writes_what_was_recorded(
        self, engine: Engine
    ) -> None:
        """Unlike a batch, a grouping that raises keeps its events: they happened."""
        run = engine.start_run(REVIEW)
        with pytest.raises(RuntimeError), unit_of(run).grouped():
            run.stage_completed("project_analysis")
            raise RuntimeError("the supervisor gives up")
        assert (run.version, len(engine.events(run.id))) == (2, 2)

    def test_a_start_written_with_earlier_events_names_the_first(self, engine: Engine) -> None:
        """committed_with is the version the start's transaction began with, None when alone."""
        run = engine.start_run(REVIEW)
        work = unit_of(run)
        with work.grouped():
            run.stage_started("project_analysis")
            work.commit()
            run.stage_completed("project_analysis")
            run.note("k", "v")
            run.stage_started("code_review")
        starts = [e for e in engine.events(run.id) if isinstance(e, StageStarted)]
        assert [(s.version, s.committed_with) for s in starts] == [(2, None), (5, 3)]

    def test_calling_writes_what_is_pending_then_each_event_at_once(self, engine: Engine) -> None:
        """Inside calling() what was grouped is stored first, and each new event at once."""
        run = engine.start_run(REVIEW)
        work = unit_of(run)
        with work.grouped():
            run.stage_completed("project_analysis")
            with work.calling():
                assert len(engine.events(run.id)) == 2
                run.note("by", "the stage function")
                assert len(engine.events(run.id)) == 3
            run.note("after", "the call")
            assert len(engine.events(run.id)) == 3
        assert len(engine.events(run.id)) == 4

    def test_a_nested_grouping_joins_the_outer_one(self, engine: Engine) -> None:
        """Leaving an inner grouping writes nothing; the outer one writes all."""
        run = engine.start_run(REVIEW)
        work = unit_of(run)
        with work.grouped():
            with work.grouped():
                run.stage_completed("project_analysis")
            assert len(engine.events(run.id)) == 1
        assert len(engine.events(run.id)) == 2

    def test_a_failed_commit_leaves_the_run_as_the_store_holds_it(self, engine: Engine) -> None:
        """A conflicting writer makes the grouped events fail whole; the run goes back."""
        run = engine.start_run(REVIEW)
        with pytest.raises(ConcurrencyConflict), unit_of(run).grouped():
            run.stage_completed("project_analysis")
            engine.load(run.id).note("other", "writer")
        assert (run.version, run.state) == (1, "project_analysis")
        assert [type(e).__name__ for e in engine.events(run.id)] == ["RunStarted", "NoteAdded"]

    def test_a_batch_inside_a_grouping_joins_it(self, engine: Engine) -> None:
        """A batch in a grouping is written at the grouping's commit; raising drops only it."""
        run = engine.start_run(REVIEW)
        with unit_of(run).grouped():
            run.note("kept", 1)
            with pytest.raises(RuntimeError), run.batch():
                run.note("dropped", 2)
                raise RuntimeError("stop")
            with run.batch():
                run.note("kept", 3)
            assert len(engine.events(run.id)) == 1
        assert [e.value for e in engine.events(run.id)[1:]] == [1, 3]  # type: ignore[attr-defined]

    def test_commit_and_calling_outside_a_grouping_do_nothing_more(self, engine: Engine) -> None:
        """Without a grouping commit() writes nothing and calling() changes nothing."""
        run = engine.start_run(REVIEW)
        work = unit_of(run)
        work.commit()
        with work.calling():
            run.note("k", "v")
        assert len(engine.events(run.id)) == 2
        assert (work.pending, work.groups) == ([], 0)


class TestObservers:
    def test_an_observer_sees_each_event_as_it_is_recorded(self, engine: Engine) -> None:
        """Recorded events reach observers at once, grouped or not, in version order."""
        run = engine.start_run(REVIEW)
        follower = Follower()
        unit_of(run).observers.append(follower)
        run.note("a", 1)
        with unit_of(run).grouped():
            run.note("b", 2)
            assert follower.versions == [2, 3]
        assert follower.rewinds == []

    def test_a_taken_back_batch_and_a_failed_commit_rewind_observers(self, engine: Engine) -> None:
        """A batch that raises and a failed commit tell observers the version they go back to."""
        run = engine.start_run(REVIEW)
        follower = Follower()
        unit_of(run).observers.append(follower)
        with pytest.raises(RuntimeError), run.batch():
            run.note("a", 1)
            raise RuntimeError("stop")
        engine.load(run.id).note("other", "writer")
        with pytest.raises(ConcurrencyConflict):
            run.note("b", 2)
        assert (follower.versions, follower.rewinds) == ([2, 2], [1, 1])

    def test_refresh_passes_other_writers_events_on(self, engine: Engine) -> None:
        """Events another writer stored reach observers when the handle refreshes."""
        run = engine.start_run(REVIEW)
        follower = Follower()
        unit_of(run).observers.append(follower)
        engine.load(run.id).note("other", "writer")
        run.refresh()
        assert follower.versions == [2]


class TestStamping:
    def test_overlapping_blocks_share_the_outer_clock_and_restore_once(
        self, engine: Engine
    ) -> None:
        """Nested or overlapping stamped blocks keep the outer clock; the last exit restores."""
        run = engine.start_run(REVIEW)
        work = unit_of(run)
        later = datetime(2031, 1, 1, tzinfo=UTC)
        outer, inner = work.stamped(lambda: later), work.stamped(lambda: later)
        outer.__enter__()
        inner.__enter__()
        outer.__exit__(None, None, None)
        assert run.note("k", 1).timestamp == later
        inner.__exit__(None, None, None)
        assert run.note("k", 2).timestamp == later  # a run's time never goes back: 2031 stays
        # Monotonic time hides the wall clock behind 2031: check that it is back in place.
        assert work.clock is utc_now
