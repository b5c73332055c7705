from __future__ import annotations

import contextlib
import copy
import json
import random
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from freezegun import freeze_time

from engine import Engine, RunNotFound
from engine.errors import InvalidArgument
from engine.machine import MachineFold, replay
from engine.readside import TimeTravel
from engine.readside import snapshots as snapshots_module
from engine.store import Store
from engine.ui import snapshot
from engine.ui.snapshot import RunView
from events import RunStarted, StageCompleted, StageFailed, StageStarted
from projections import (
    BUILT_INS,
    ProjectionError,
    ProjectionStateError,
    RetryCounts,
    RunIndex,
    StageResults,
    StateStack,
)
from projections.base import Projection
from projections.deferred import FIRST_READ
from tests._helpers import REVIEW, BreaksOnTimeouts, FailuresByType, calls_to, hub_table

T0 = datetime(2026, 4, 1, 8, 0, tzinfo=UTC)


def review_with_loops(engine: Engine) -> uuid.UUID:
    """A run with failures, a rollback, tasks, budget and a finish, the clock ticking."""
    with freeze_time(T0, auto_tick_seconds=1):
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", result={"kind": "python"})
        run.stage_completed("code_review", result={"critical": 6})
        run.add_task("t1", title="fix")
        run.task_started("t1")
        run.stage_failed("developer", error="build", error_type="BuildException")
        run.rollback(steps=1, reason="retry review")
        run.stage_failed("developer", error="build", error_type="BuildException")
        run.observe_progress(changed_files=0, test_signature="sig")
        run.stage_completed("developer", result={"ok": True})
        run.task_completed("t1", result=1)
        run.spend(0.5, "usd")
        run.stage_failed("testing", error="red")
        run.stage_completed("developer", result={"ok": 2})
        run.stage_completed("testing", result={"green": True})
        run.finish("succeeded")
    return run.id


def damage_snapshots(url: str, projection: str, *, newest_only: bool) -> list[int]:
    """Overwrite the stored snapshots of `projection` (only the newest, if asked) with bytes
    no codec reads; return the versions of all of them, oldest first."""
    path = url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        rows = db.execute(
            "SELECT version FROM stagetrail_snapshots WHERE projection=? ORDER BY version",
            (projection,),
        ).fetchall()
        versions = [version for (version,) in rows]
        damaged = versions[-1:] if newest_only else versions
        db.executemany(
            "UPDATE stagetrail_snapshots SET state=? WHERE projection=? AND version=?",
            [(b"\x00not a snapshot\xff", projection, version) for version in damaged],
        )
    assert len(versions) >= 2, versions
    return versions


class CountingReader:
    """The real store's reader, counting the events it hands out."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.count = 0

    def stream(self, run_id: uuid.UUID, *, gt: int = 0, lte: int | None = None) -> Iterator[Any]:
        for event in self.store.stream(run_id, gt=gt, lte=lte):
            self.count += 1
            yield event

    def generation(self) -> int:
        return self.store.generation()


class TestProject:
    @pytest.mark.parametrize("projection", BUILT_INS, ids=lambda p: p.name)
    def test_every_version_equals_folding_that_prefix(
        self, engine: Engine, projection: Any
    ) -> None:
        """The state at=N is the fold of the first N events, for every N and built-in."""
        run_id = review_with_loops(engine)
        events = engine.events(run_id)
        for version in range(len(events) + 1):
            expected = projection().fold(events[:version])
            assert engine.project(run_id, projection, at=version) == expected, version

    def test_without_at_gives_the_current_state(self, engine: Engine) -> None:
        """project() with no `at` folds the whole run."""
        run_id = review_with_loops(engine)
        stack = engine.project(run_id, StateStack)
        assert stack.top is not None
        assert (stack.top.stage, stack.depth) == ("testing", 7)
        assert stack.latest_result("code_review") == {"critical": 6}

    def test_at_a_time_gives_the_state_after_the_last_event_by_then(self, engine: Engine) -> None:
        """at=datetime folds the events stamped at or before it."""
        run_id = review_with_loops(engine)
        events = engine.events(run_id)
        halfway = events[5].timestamp + (events[6].timestamp - events[5].timestamp) / 2
        assert events[5].timestamp < halfway < events[6].timestamp
        summaries = [
            engine.project(run_id, RunIndex, at=at)
            for at in (halfway, events[6].timestamp, T0 + timedelta(days=1))
        ]
        assert [(s.version, s.status) if s else None for s in summaries] == [
            (6, "running"),
            (7, "running"),
            (len(events), "succeeded"),
        ]
        assert engine.project(run_id, RunIndex, at=T0 - timedelta(days=1)) is None

    def test_past_the_end_is_the_current_state(self, engine: Engine) -> None:
        """A version past the newest gives the current state."""
        run_id = review_with_loops(engine)
        assert engine.project(run_id, StateStack, at=10_000) == engine.project(run_id, StateStack)

    @pytest.mark.parametrize("at", [-1, 2.5, "3", datetime(2026, 4, 1)])
    def test_bad_at_is_named(self, engine: Engine, at: Any) -> None:
        """A negative, fractional, textual or naive `at` raises InvalidArgument naming 'at'."""
        run_id = review_with_loops(engine)
        with pytest.raises(InvalidArgument, match="'at'"):
            engine.project(run_id, StateStack, at=at)

    def test_unknown_run(self, engine: Engine) -> None:
        """Projecting a run that is not in the store raises RunNotFound."""
        with pytest.raises(RunNotFound):
            engine.project(uuid.uuid4(), StateStack)

    def test_a_past_state_reads_only_the_events_its_projection_handles(
        self, engine: Engine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Below the first snapshot, the events read for at=N are those the projection handles."""
        run_id = review_with_loops(engine)
        read = engine.store.read
        given: list[type] = []

        def observed(*args: Any, **kwargs: Any) -> Any:
            events = read(*args, **kwargs)
            given.extend(type(event) for event in events)
            return events

        events = engine.events(run_id)
        monkeypatch.setattr(engine.store, "read", observed)
        assert engine.project(run_id, StateStack, at=8) == StateStack().fold(events[:8])
        assert set(given) == set(StateStack.handlers)  # tasks' events left unread
        assert len(given) == 6

    def test_a_past_state_before_any_handled_event_is_the_initial_state(
        self, engine: Engine
    ) -> None:
        """A run with no handled event by at=N gives the initial state; no run, RunNotFound."""
        run_id = review_with_loops(engine)
        assert engine.project(run_id, FailuresByType, at=3) == FailuresByType().initial()
        with pytest.raises(RunNotFound):
            engine.project(uuid.uuid4(), FailuresByType, at=3)

    def test_user_projections_work_the_same(self, engine: Engine) -> None:
        """A user projection gets on-demand and time-travel use with no extra code."""
        run_id = review_with_loops(engine)
        assert engine.project(run_id, FailuresByType) == {"BuildException": 2, "Error": 1}
        assert engine.project(run_id, FailuresByType, at=7) == {"BuildException": 1}


class TestSnapshots:
    def long_run(self, engine: Engine, outcomes: int) -> uuid.UUID:
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", result={})
        run.stage_completed("code_review", result={})
        with run.batch():
            for index in range(outcomes):
                run.stage_failed("developer", error=f"e{index % 7}")
        return run.id

    def test_a_new_process_folds_only_from_the_nearest_stored_snapshot(
        self, sqlite_url: str
    ) -> None:
        """After one query stored snapshots, a fresh engine folds at most one interval."""
        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine, 1_300)
            engine.project(run_id, StateStack, at=1_250)
        with Engine(sqlite_url) as fresh:
            reader = CountingReader(fresh.store)
            travel = TimeTravel(reader, fresh.store.views)
            at_1250 = travel.project(run_id, StateStack(), 1_250)
            assert reader.count == 250
            at_1100 = travel.project(run_id, StateStack(), 1_100)
            assert reader.count == 250 + 100
            assert at_1250.depth == 1_250 - 1
            events = fresh.events(run_id, upto=1_250)
            assert at_1250 == StateStack().fold(events)  # its older frames read now
            assert at_1100 == StateStack().fold(events[:1_100])

    def test_a_restored_stack_makes_its_older_frames_only_when_walked(
        self, sqlite_url: str
    ) -> None:
        """A deep stack from a snapshot reads no frame event until its frames are walked."""
        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine, 2_600)
            engine.project(run_id, StateStack, at=2_500)
        with Engine(sqlite_url) as fresh:
            reader = CountingReader(fresh.store)
            stack = TimeTravel(reader, fresh.store.views).project(run_id, StateStack(), 2_501)
            assert reader.count == 1
            assert stack.depth == 2_500
            assert stack.top is not None
            assert stack.top.version == 2_501
            assert reader.count == 1
            assert stack.frame_list.nth_newest(1).version == 2_500  # a first, short read
            assert reader.count == 1 + FIRST_READ
            assert stack.frame_list.nth_newest(FIRST_READ + 1).version == 2_500 - FIRST_READ
            assert reader.count == 1 + FIRST_READ + 1_000  # then pages of 1,000
            expected = StateStack().fold(fresh.events(run_id, upto=2_501))
            assert stack.frames == expected.frames

    def test_a_restored_stack_is_not_read_once_its_run_was_erased(self, sqlite_url: str) -> None:
        """Walking a restored stack after its run was erased raises rather than read another run."""
        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine, 1_300)
            engine.project(run_id, StateStack, at=1_250)
        with Engine(sqlite_url) as fresh:
            stack = fresh.project(run_id, StateStack, at=1_001)
            run = fresh.load(run_id)
            run.finish("deleted")
            fresh.compact()
            with pytest.raises(ProjectionStateError, match="erased"):
                stack.frames  # noqa: B018

    def test_snapshots_of_other_code_are_not_used(self, sqlite_url: str) -> None:
        """A projection with another fingerprint folds from zero, not from old snapshots."""
        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine, 600)
            engine.project(run_id, FailuresByType)

        class Renamed(FailuresByType):
            version = 2

        with Engine(sqlite_url) as fresh:
            reader = CountingReader(fresh.store)
            travel = TimeTravel(reader, fresh.store.views)
            assert travel.project(run_id, Renamed(), 602) == {"Error": 599}
            assert reader.count == 602

    @pytest.mark.parametrize("damaged", ["newest", "all"])
    def test_a_snapshot_that_cannot_be_read_is_passed_over(
        self, sqlite_url: str, damaged: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A stored snapshot whose bytes are damaged is passed over with a warning naming it:
        the fold starts from the one before it (or the first event), and its state is right."""
        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine, 2_300)
            engine.project(run_id, FailuresByType, at=2_250)
        newest_only = damaged == "newest"
        versions = damage_snapshots(sqlite_url, FailuresByType.name, newest_only=newest_only)
        with Engine(sqlite_url) as fresh:
            reader = CountingReader(fresh.store)
            travel = TimeTravel(reader, fresh.store.views)
            state = travel.project(run_id, FailuresByType(), 2_250)
            assert state == FailuresByType().fold(fresh.events(run_id, upto=2_250))
        assert reader.count == (2_250 - versions[-2] if newest_only else 2_250)
        warned = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
        assert f"after event {versions[-1]} cannot be read" in warned[0]

    def test_at_most_unreadable_passed_snapshots_are_passed_over(
        self, sqlite_url: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Past `UNREADABLE_PASSED` damaged snapshots the fold starts from the first event,
        having read (and warned of) that many and no more."""
        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine, 3_300)
            engine.project(run_id, FailuresByType, at=3_250)
        versions = damage_snapshots(sqlite_url, FailuresByType.name, newest_only=False)
        assert len(versions) > snapshots_module.UNREADABLE_PASSED + 1
        with Engine(sqlite_url) as fresh:
            reader = CountingReader(fresh.store)
            travel = TimeTravel(reader, fresh.store.views)
            state = travel.project(run_id, FailuresByType(), 3_250)
            assert state == FailuresByType().fold(fresh.events(run_id, upto=3_250))
        assert reader.count == 3_250
        warned = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
        assert len(warned) == snapshots_module.UNREADABLE_PASSED

    def test_close_states_are_kept_only_near_the_version_asked(self, engine: Engine) -> None:
        """A projection kept every 10 events keeps its close states in memory only within
        `DENSE_KEPT` events before the version a fold was asked for, further back one every
        interval: near it a question folds under 10 events, far back under an interval."""

        class Close(FailuresByType):
            kept_every = 10

        run_id = self.long_run(engine, 8_000)
        reader = CountingReader(engine.store)
        travel = TimeTravel(reader, None)
        travel.project(run_id, Close(), 8_000)
        assert 8_000 - snapshots_module.DENSE_KEPT > 1_000  # the far question lies out of it
        for version, folded in ((7_995, 5), (1_495, 495)):
            reader.count = 0
            state = travel.project(run_id, Close(), version)
            assert reader.count == folded, version
            assert state == FailuresByType().fold(engine.events(run_id, upto=version))

    def test_memory_snapshots_serve_the_next_question(self, engine: Engine) -> None:
        """In one process, a second query near the end folds only the tail."""
        run_id = self.long_run(engine, 1_100)
        reader = CountingReader(engine.store)
        travel = TimeTravel(reader, None)
        first = travel.project(run_id, StateStack(), 1_102)
        assert reader.count == 1_102
        assert travel.project(run_id, StateStack(), 1_050) == StateStack().fold(
            engine.events(run_id, upto=1_050)
        )
        assert reader.count == 1_102 + 50
        assert first.depth == 1_101

    def test_a_projection_kept_every_fewer_events_folds_only_from_its_closer_state(
        self, engine: Engine
    ) -> None:
        """A projection with `kept_every` 50 is kept in memory every 50 events, not every 500."""

        class CloseStack(StateStack):
            kept_every = 50

        run_id = self.long_run(engine, 1_100)
        reader = CountingReader(engine.store)
        travel = TimeTravel(reader, None)
        travel.project(run_id, CloseStack(), 1_102)
        assert reader.count == 1_102
        assert travel.project(run_id, CloseStack(), 1_090) == StateStack().fold(
            engine.events(run_id, upto=1_090)
        )
        assert reader.count == 1_102 + 40  # from the state kept at 1,050, not at 1,000
        assert travel.project(run_id, CloseStack(), 60).depth == 59
        assert reader.count == 1_102 + 40 + 10  # from 50: below 500 too

    @pytest.mark.parametrize("every", [True, "50", -50, 300, 2.5])
    def test_a_kept_every_that_is_no_divisor_is_refused(self, engine: Engine, every: Any) -> None:
        """`kept_every` must be 0 or an int dividing the snapshot interval: anything else is
        one error naming the class and the attribute, never a silent fallback."""

        class OddStack(StateStack):
            kept_every = every

        run_id = self.long_run(engine, 600)
        with pytest.raises(InvalidArgument, match=r"OddStack\.kept_every") as caught:
            TimeTravel(engine.store, None).project(run_id, OddStack(), 550)
        assert repr(every) in str(caught.value)

    def test_a_projection_kept_densely_stores_snapshots_but_goes_on_from_its_own_state(
        self, sqlite_url: str
    ) -> None:
        """Its fold stores snapshots, yet its states share their items: none is cut off."""

        class CloseStack(StateStack):
            name = "close_stack"
            kept_every = 100

        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine, 1_100)
            stack = engine.project(run_id, CloseStack, at=1_102)
            views = engine.store.views
            assert views is not None
            stored = views.snapshot(str(run_id), CloseStack.name, CloseStack().identity(), 0, 1_102)
        assert stored is not None
        assert stored[0] == 1_000
        assert [tail for _, tail in stack.frame_list.newest_cells() if tail is not None] == []

    def test_a_read_only_engine_seals_no_snapshot_and_keeps_its_fold_whole(
        self, sqlite_url: str
    ) -> None:
        """A read-only engine stores no snapshot, so its fold is never cut into a deferred tail."""

        class Unstored(StateStack):  # no writer keeps snapshots of it: the reader folds it all
            name = "unstored_stack"

        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine, 1_100)
        reader = Engine(sqlite_url, read_only=True)
        try:
            stack = reader.project(run_id, Unstored, at=1_102)
        finally:
            reader.close()
        assert [tail for _, tail in stack.frame_list.newest_cells() if tail is not None] == []
        assert stack.depth == 1_101


class TestLoadFromSnapshots:
    def long_run(self, engine: Engine) -> uuid.UUID:
        """1,300 events: loops, rollbacks, tasks and an open attempt."""
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", result={})
        run.stage_completed("code_review", result={})
        with run.batch():
            for index in range(1_290):
                if index % 10 == 9:
                    run.rollback(1, reason="again")
                elif index % 50 == 3:
                    run.add_task(f"t{index}")
                else:
                    run.stage_failed("developer", error=f"e{index % 7}")
        run.stage_started("developer")
        return run.id

    def test_a_long_run_loads_as_replaying_it_does(self, sqlite_url: str) -> None:
        """engine.load of a long run equals replaying every event, in this and a new engine."""
        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine)
            first, *rest = engine.events(run_id)
            assert isinstance(first, RunStarted)
            expected = replay(first, rest)[1]
            assert engine.load(run_id).machine == expected
        with Engine(sqlite_url) as fresh:
            loaded = fresh.load(run_id)
            assert loaded.machine == expected
            assert loaded.machine.stack.to_tuple() == expected.stack.to_tuple()
            loaded.stage_failed("developer", error="closes the open attempt")
            loaded.rollback(3, reason="checks the stack below the snapshot")
            loaded.stage_completed("developer", result={})
            assert loaded.state == "testing"
            assert fresh.verify(run_id).ok

    def test_a_new_engine_loads_from_the_newest_snapshot(self, sqlite_url: str) -> None:
        """A fresh engine reads only the events after the machine's newest stored snapshot."""
        with Engine(sqlite_url) as engine:
            run_id = self.long_run(engine)
            engine.load(run_id)
        with Engine(sqlite_url) as fresh:
            reader = CountingReader(fresh.store)
            travel = TimeTravel(reader, fresh.store.views)
            last = fresh.store.last(run_id)
            assert last is not None
            folded = travel.project(run_id, MachineFold(), last.version)
            assert folded is not None
            assert reader.count == last.version % 500
            assert folded[1] == fresh.load(run_id).machine


class TestGrowingStatesFromSnapshots:
    @pytest.mark.parametrize("projection", [StateStack, StageResults, RunIndex])
    def test_a_fresh_engine_answers_from_small_snapshots(
        self, sqlite_url: str, projection: Any
    ) -> None:
        """States that grow with the run come back from snapshots far smaller than themselves."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", result={})
            run.stage_completed("code_review", result={})
            with run.batch():
                for index in range(1_700):
                    if index % 13 == 12:
                        run.rollback(2, reason="again")
                    else:
                        run.stage_failed("developer", error=f"e{index % 5}")
            engine.project(run.id, projection, at=1_650)
            whole = _written_out(projection, engine.project(run.id, projection))
        path = sqlite_url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as db:
            sizes = db.execute(
                "SELECT version, length(state) FROM stagetrail_snapshots WHERE projection = ?",
                (projection.name,),
            ).fetchall()
        assert [version for version, _ in sizes] == [500, 1_000, 1_500]
        assert max(size for _, size in sizes) < whole / 10
        with Engine(sqlite_url) as fresh:
            for at in (1_000, 1_501, 1_702):
                expected = projection().fold(fresh.events(run.id, upto=at))
                assert fresh.project(run.id, projection, at=at) == expected


def _written_out(projection: Any, state: Any) -> int:
    """The length of `state` as JSON with every item listed (a run index row packs its stack)."""
    data = projection().encode(state)
    if projection is RunIndex:
        data = {**data, "states": list(state.states.to_tuple()), "state_codes": ""}
    return len(json.dumps(data))


def random_histories(seed: int, steps: int = 600) -> list[list[Any]]:
    """The events of `recorded_histories`' three runs, recorded into a memory store."""
    with Engine("memory://") as engine:
        return [engine.events(run_id) for run_id in recorded_histories(engine, seed, steps)]


def applied_one_by_one(projection: Any, events: list[Any]) -> dict[int, Any]:
    """The state after each version of `events`, given to `apply` one event at a time."""
    state, states = projection.initial(), {}
    for event in events:
        state = projection.apply(state, event)
        states[event.version] = state
    return states


def broken(event: Any, **changes: Any) -> Any:
    """`event` with `changes` past its validators, as a corrupt store would hold it."""
    made = copy.copy(event)
    for name, value in changes.items():
        object.__setattr__(made, name, value)
    return made


class CloseView(RunView):
    """The viewer's `RunView`, kept every 10 events (its registered `folding` serves it)."""

    kept_every = 10


class TestFoldingBetweenKeptStates:
    def test_a_fold_of_its_own_takes_the_events_between_two_kept_states_at_once(self) -> None:
        """A projection with a fold of its own (`StateStack`'s rows pushed in place) is given
        the events between two kept states in one call, not one `apply` per event."""
        calls: list[int] = []

        class CountingStack(StateStack):
            def fold(self, events: Any, state: Any = None) -> Any:
                calls.append(len(events))
                return super().fold(events, state)

        with Engine("memory://") as engine:
            run_id = recorded_histories(engine, 4)[0]
            last = len(engine.events(run_id))
            TimeTravel(engine.store, None, interval=20).project(run_id, CountingStack(), last)
        assert calls
        assert max(calls) > 1

    def test_a_registered_folding_is_fed_the_events_between_two_kept_states(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A projection with a registered `folding` (the viewer's, `RunView`'s) is fed the
        events between two kept states by it, in one part each."""
        fed = calls_to(monkeypatch, snapshot._Panels, "feed")
        with Engine("memory://") as engine:
            run_id = recorded_histories(engine, 4)[0]
            last = len(engine.events(run_id))
            TimeTravel(engine.store, None, interval=20).project(run_id, CloseView(), last)
        assert fed
        assert max(len(call[1]) for call in fed) == 10

    @pytest.mark.parametrize("projection", [RunIndex, StateStack, CloseView])
    def test_an_error_names_the_first_event_apply_stops_at(self, projection: Any) -> None:
        """Where a later event breaks the first part folded and an earlier one another part,
        the error is `apply`'s event by event: the earlier event, its version, its part."""
        with Engine("memory://") as engine:
            run_id = recorded_histories(engine, 5, steps=600)[0]
            events = engine.events(run_id)
            early, late = next(
                (start, outcome)
                for start in events
                for outcome in events
                if type(start) is StageStarted
                and type(outcome) is StageCompleted
                and 10 < start.version < outcome.version <= (start.version - 1) // 10 * 10 + 10
            )  # one stretch between two kept states (every 10 events), not its first event
            changes = {early.version: {"stage": [1]}, late.version: {"outcome": [1]}}
            reader = TamperedReader(engine.store, changes)
            expected = None
            try:
                applied_one_by_one(projection(), list(reader.stream(run_id)))
            except ProjectionError as error:
                expected = error
            travel = TimeTravel(reader, None, interval=20)
            with pytest.raises(ProjectionError) as caught:
                travel.project(run_id, projection(), events[-1].version)
        assert expected is not None
        assert (caught.value.projection, caught.value.version) == (
            expected.projection,
            expected.version,
        )
        assert str(caught.value) == str(expected)
        assert type(caught.value.__cause__) is type(expected.__cause__)

    def test_a_state_none_that_is_not_the_initial_one_is_folded_on_from_none(self) -> None:
        """A state that became None (its initial state is not) goes on from None, as `apply`
        takes it, not from the initial state a fold of its own starts from when given None."""

        class Dropped(Projection[int | None]):
            every_event = True

            def initial(self) -> int | None:
                return 0

            def apply(self, state: int | None, event: Any) -> int | None:
                return None if state is None or event.version == 1 else state + 1

            def _fold(self, events: Any, current: Any, tick: Any) -> Any:
                return Projection._fold(self, events, current, tick)  # a fold of its own

        with Engine("memory://") as engine:
            run_id = recorded_histories(engine, 6)[0]
            last = len(engine.events(run_id))
            travel = TimeTravel(engine.store, None, interval=20)
            assert travel.project(run_id, Dropped(), last) is None


def recorded_histories(engine: Engine, seed: int, steps: int = 300) -> list[uuid.UUID]:
    """The ids of a review run (failures, retries, rollbacks, tasks), a hub's run (routes
    recorded and implicit) and a strict table's, recorded by `engine` from `steps` random
    steps (illegal ones write nothing)."""
    from tests.ui.test_run_view_dispatch import step

    pick = random.Random(seed)
    actions = ["completed", "failed", "start", "rollback", "route", "stage_done"]
    actions += ["stage_failed", "add_task", "task_completed", "progress", "spend", "note"]
    runs = {
        "review": engine.start_run(REVIEW),
        "hub": engine.start_run(hub_table(hub=True)),
        "strict": engine.start_run(hub_table(hub=False)),
    }
    for _ in range(steps):
        which = pick.choice(list(runs))
        step(engine, runs, which, pick.choice(actions), pick.randint(1, 3))
    return [run.id for run in runs.values()]


class TamperedReader:
    """The real store's reader, handing out `changes` (by version) in place of its events."""

    def __init__(self, store: Store, changes: dict[int, dict[str, Any]]) -> None:
        self.store, self.changes = store, changes

    def stream(self, run_id: uuid.UUID, *, gt: int = 0, lte: int | None = None) -> Iterator[Any]:
        for event in self.store.stream(run_id, gt=gt, lte=lte):
            changes = self.changes.get(event.version)
            yield event if changes is None else broken(event, **changes)

    def generation(self) -> int:
        return self.store.generation()


class KeptOften:
    """A mixin keeping a projection's states every 5 events (its folds are its class's)."""

    kept_every = 5


STORED_KINDS = [*BUILT_INS, RunView]


def kept_often(kind: Any) -> Any:
    """`kind`, kept every 5 events (a subclass taking its events as `kind` does)."""
    return type(f"Often{kind.__name__}", (KeptOften, kind), {})


class TestFoldingBetweenKeptStatesFromAStore:
    @pytest.mark.parametrize("kind", STORED_KINDS, ids=lambda kind: kind.name)
    def test_states_asked_and_kept_are_apply_s_and_stay_so(
        self, shared_url: str, kind: Any
    ) -> None:
        """Each state asked for (every version, in random order) and each state held from a
        kept version while the fold went on is what `apply` makes event by event."""
        pick = random.Random(kind.name)
        with Engine(shared_url) as engine:
            for run_id in recorded_histories(engine, 8):
                events = engine.events(run_id)
                expected = applied_one_by_one(kind(), events)
                for projection in (kind(), kept_often(kind)()):
                    travel = TimeTravel(engine.store, engine.store.views, interval=100)
                    grid = travel.grid(projection)
                    held = {
                        version: travel.project(run_id, projection, version)
                        for version in range(grid, len(events) + 1, grid)
                    }
                    versions = list(expected)
                    pick.shuffle(versions)
                    for version in versions:
                        assert travel.project(run_id, projection, version) == expected[version]
                    for version, state in held.items():
                        assert state == expected[version], version
                        assert kind().encode(state) == kind().encode(expected[version])

    @pytest.mark.parametrize("kind", STORED_KINDS, ids=lambda kind: kind.name)
    def test_snapshots_stored_are_those_of_apply_s_states(self, shared_url: str, kind: Any) -> None:
        """Each snapshot a fold stores is the projection's `snapshot` of the state `apply`
        makes event by event at its version."""
        checked = 0
        with Engine(shared_url) as engine:
            views, identity = engine.store.views, kind().identity()
            assert views is not None
            for run_id in recorded_histories(engine, 9, steps=600):
                events = engine.events(run_id)
                expected = applied_one_by_one(kind(), events)
                travel = TimeTravel(engine.store, views, interval=100)
                travel.project(run_id, kind(), len(events))
                generation = engine.store.generation()
                for version in range(100, len(events) + 1, 100):
                    stored = views.snapshot(str(run_id), kind.name, identity, generation, version)
                    if stored is not None and stored[0] == version:
                        data = views.codec.unseal(stored[1])
                        assert data == kind().snapshot(expected[version]), version
                        checked += 1
        assert checked

    @pytest.mark.parametrize("kind", [StateStack, RunIndex, StageResults, RunView])
    def test_an_erasure_while_read_is_refused(
        self, shared_url: str, kind: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A deleted run a compaction erases after its first page was read is refused with
        `RunErasedWhileRead` naming the first version not found, its events folded together
        between kept states or not."""
        from engine.errors import RunErasedWhileRead
        from engine.store.event_store import PAGE
        from tests._helpers import erased_after_its_first_page

        with Engine(shared_url) as engine:
            doomed = engine.start_run(REVIEW)
            doomed.stage_completed("project_analysis", result={})
            doomed.stage_completed("code_review", result={})
            with doomed.batch():
                for index in range(PAGE + 10):
                    doomed.stage_failed("developer", error=f"e{index % 7}")
            doomed.finish("deleted")
        erased_after_its_first_page(shared_url, doomed.id, monkeypatch)
        with Engine(shared_url) as engine, pytest.raises(RunErasedWhileRead) as refused:
            engine.project(doomed.id, kind, at=PAGE + 5)
        assert (refused.value.run_id, refused.value.version) == (doomed.id, PAGE + 1)

    @pytest.mark.parametrize("kind", [StateStack, RunIndex, StageResults, RetryCounts, RunView])
    def test_an_error_between_kept_states_keeps_nothing_of_its_fold(
        self, sqlite_url: str, kind: Any
    ) -> None:
        """An outcome no handler takes (its stage a list) between two kept states raises
        `apply`'s error (its event, version and projection); the states kept before it stay
        `apply`'s, and nothing of the failed fold is kept in memory or stored."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", result={})
            run.stage_completed("code_review", result={})
            with run.batch():
                for index in range(400):
                    run.stage_failed("developer", error=f"e{index % 7}")
                    run.note(f"n{index}", index)
            events = engine.events(run.id)
            run_id, store = run.id, engine.store
            bad = next(e for e in events[250:] if type(e) is StageFailed and e.version % 100)
            stream = [broken(e, stage=[1]) if e is bad else e for e in events]
            with pytest.raises(ProjectionError) as expected:
                applied_one_by_one(kind(), stream)
            expected_states = applied_one_by_one(kind(), events)
            reader = TamperedReader(store, {bad.version: {"stage": [1]}})
            travel = TimeTravel(reader, store.views, interval=100)
            before = bad.version - 1
            assert travel.project(run_id, kind(), before) == expected_states[before]
            with pytest.raises(ProjectionError) as caught:
                travel.project(run_id, kind(), len(events))
            assert str(caught.value) == str(expected.value)
            assert (caught.value.projection, caught.value.version) == (
                expected.value.projection,
                bad.version,
            )
            generation, views = store.generation(), store.views
            assert views is not None
            newest = views.snapshot(
                str(run_id), kind.name, kind().identity(), generation, len(events)
            )
            assert newest is None or newest[0] < bad.version
            for version in range(before - before % 10, before + 1):
                assert travel.project(run_id, kind(), version) == expected_states[version]

    @pytest.mark.parametrize("kind", [StateStack, kept_often(StateStack)])
    def test_the_events_folded_together_are_those_between_two_kept_states(
        self, sqlite_url: str, kind: Any
    ) -> None:
        """A fold gathers at most the events between two kept states (`kept_every`, else the
        interval), never the run, whatever the version asked."""
        sizes: list[int] = []

        class Sized(kind):  # type: ignore[misc]
            def fold(self, events: Any, state: Any = None) -> Any:
                sizes.append(len(events))
                return super().fold(events, state)

        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", result={})
            run.stage_completed("code_review", result={})
            with run.batch():
                for index in range(2_345):
                    run.stage_failed("developer", error=f"e{index % 7}")
            travel = TimeTravel(engine.store, engine.store.views)
            grid = travel.grid(Sized())
            assert travel.project(run.id, Sized(), 2_348) == StateStack().fold(
                engine.events(run.id)
            )
        assert sizes
        assert max(sizes) == grid


class TestTheFirstFailureIsRaised:
    @pytest.mark.parametrize("kind", [BreaksOnTimeouts, StateStack])
    def test_a_handler_error_before_an_unreadable_page_is_raised(
        self, sqlite_url: str, kind: Any
    ) -> None:
        """A handler failing on an event and, before the next kept state, a page the store
        cannot read (an event's state NULL): the fold raises the handler's `ProjectionError`
        naming its event, as `apply` event by event stops there before that page is read."""
        from engine.store.event_store import PAGE
        from tests.audit.tampering import Rows

        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", result={})
            run.stage_completed("code_review", result={})
            with run.batch():
                for index in range(PAGE + 900):
                    run.stage_failed("developer", error=f"e{index % 7}")
            first, breaking, unreadable = 700, PAGE + 690, PAGE + 710  # pages after `first`
            rows = Rows(sqlite_url)
            topic, _ = rows.get(run.id, unreadable)
            rows.put(run.id, unreadable, topic, None)  # type: ignore[arg-type]
            changes = {"stage": [1]} if kind is StateStack else {"error_type": "Timeout"}
            travel = TimeTravel(TamperedReader(engine.store, {breaking: changes}), None)
            assert travel.project(run.id, kind(), first) == kind().fold(
                engine.events(run.id, upto=first)
            )  # kept: a later fold starts there, its pages end at 1,700 (not a kept version)
            with pytest.raises(ProjectionError) as caught:
                travel.project(run.id, kind(), PAGE + 800)
            assert (caught.value.projection, caught.value.version) == (kind.name, breaking)
