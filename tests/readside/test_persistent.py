from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from uuid import UUID

import pytest

from engine import Engine, Pipeline
from engine.errors import (
    ProjectionError,
    ProjectionNameTaken,
    ProjectionReplaced,
    UnknownProjection,
)
from engine.readside import persistent
from engine.store.meta import EVENTS_TABLE
from events import EventFormatError, NoteAdded, RunFinished, StageFailed
from projections import (
    FailurePatterns,
    ProgressState,
    Projection,
    RetryCounts,
    RoundsTable,
    RunIndex,
    RunSummary,
    StateStack,
    immutable,
    on,
    run_index,
)
from projections.base import _fingerprint
from tests._helpers import LOOP, REVIEW, BreaksOnTimeouts, FailureCount, FailuresByType


def record_failures(engine: Engine, *error_types: str) -> None:
    """One run that reaches the developer stage and fails there once per error type."""
    run = engine.start_run(REVIEW)
    run.stage_completed("project_analysis", result={})
    run.stage_completed("code_review", result={})
    for error_type in error_types:
        run.stage_failed("developer", error="boom", error_type=error_type)


def wait_until(condition: Any, seconds: float = 20.0) -> None:
    """Poll `condition` until it holds; fail after `seconds` (a deadline, not a timing assert)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        time.sleep(0.01)


class TestCatchUp:
    def test_folds_every_run_once(self, engine: Engine) -> None:
        """catch_up folds each run's events into the registered projection exactly once."""
        engine.projections.register(FailuresByType)
        record_failures(engine, "BuildException", "Timeout")
        record_failures(engine, "BuildException")
        folded = engine.projections.catch_up(["failures_by_type"])
        assert folded["failures_by_type"] == 9
        assert engine.projections.get("failures_by_type") == {"BuildException": 2, "Timeout": 1}
        assert engine.projections.catch_up(["failures_by_type"])["failures_by_type"] == 0
        assert engine.projections.get("failures_by_type") == {"BuildException": 2, "Timeout": 1}

    def test_resumes_where_it_stopped(self, engine: Engine) -> None:
        """Events appended after a catch-up are folded by the next one, and only they."""
        engine.projections.register(FailuresByType)
        record_failures(engine, "A")
        engine.projections.catch_up()
        record_failures(engine, "A", "B")
        assert engine.projections.catch_up(["failures_by_type"])["failures_by_type"] == 5
        assert engine.projections.get("failures_by_type") == {"A": 2, "B": 1}

    def test_run_scoped_state_equals_the_on_demand_fold(self, engine: Engine) -> None:
        """A per-run persistent projection holds, per run, what project() computes."""
        engine.projections.register(StateStack)
        record_failures(engine, "A", "B")
        (summary,) = engine.runs()
        persistent = engine.projections.get("state_stack", summary.run_id)
        assert persistent == engine.project(summary.run_id, StateStack)
        assert persistent.depth == 4

    def test_pipeline_scoped_state_is_kept_per_pipeline(self, engine: Engine) -> None:
        """FailurePatterns (scope pipeline) keeps one state per pipeline name."""
        record_failures(engine, "A", "A")
        states = engine.projections.states("failure_patterns")
        assert list(states) == ["code-review"]
        assert states["code-review"].by_error_type == {"A": 2}
        assert states["code-review"].consecutive("developer") == 2
        assert engine.projections.get("failure_patterns", "code-review") == states["code-review"]

    def test_unknown_names_are_refused(self, engine: Engine) -> None:
        """get, catch_up and rebuild of an unregistered name raise UnknownProjection."""
        with pytest.raises(UnknownProjection, match=r"'nope'.*registered: failure_patterns"):
            engine.projections.get("nope")
        with pytest.raises(UnknownProjection):
            engine.projections.catch_up(["nope"])
        with pytest.raises(UnknownProjection):
            engine.projections.rebuild("nope")

    def test_a_name_cannot_hold_two_projections(self, engine: Engine) -> None:
        """Registering another class under a taken name raises ProjectionNameTaken."""

        class Impostor(FailuresByType):
            name = "failure_patterns"

        with pytest.raises(ProjectionNameTaken, match="failure_patterns"):
            engine.projections.register(Impostor)


class TestFailures:
    def test_a_failing_projection_stops_alone(self, engine: Engine) -> None:
        """A handler error is raised and kept; the projection stops just before the event."""
        engine.projections.register(BreaksOnTimeouts)
        engine.projections.register(FailuresByType)
        record_failures(engine, "A", "Timeout", "A")
        with pytest.raises(ProjectionError, match=r"breaks_on_timeouts.*StageFailed.*version 5"):
            engine.projections.catch_up()
        status = {s.name: s for s in engine.projections.status()}
        assert status["failures_by_type"].lag == 0
        assert status["breaks_on_timeouts"].position == 4  # the event before the failing one
        assert "cannot count timeouts" in (status["breaks_on_timeouts"].last_error or "")
        assert status["failures_by_type"].last_error is None
        assert engine.projections.get("failures_by_type", catch_up=False) == {"A": 2, "Timeout": 1}
        assert engine.projections.get("breaks_on_timeouts", catch_up=False) == 1
        with pytest.raises(ProjectionError):  # the next catch-up meets the same event again
            engine.projections.catch_up(["breaks_on_timeouts"])
        assert engine.projections.get("breaks_on_timeouts", catch_up=False) == 1

    def test_stale_code_cannot_write_over_newer_code(self, shared_url: str) -> None:
        """A process whose projection was re-registered elsewhere by other code is refused."""
        with Engine(shared_url) as old:
            old.projections.register(FailuresByType)
            record_failures(old, "A")

            class FailuresByTypeV2(FailuresByType):
                name = "failures_by_type"
                version = 2

            with Engine(shared_url) as new:
                new.projections.register(FailuresByTypeV2)
                with pytest.raises(ProjectionReplaced, match=r"'failures_by_type'.*stale code"):
                    old.projections.catch_up(["failures_by_type"])
                assert new.projections.get("failures_by_type") == {"A": 1}


class TestStatusAndRebuild:
    def test_status_reports_position_head_and_lag(self, engine: Engine) -> None:
        """Before a catch-up the lag is the events not folded; after it, zero."""
        engine.projections.register(FailuresByType)
        record_failures(engine, "A")
        before = {s.name: s for s in engine.projections.status()}["failures_by_type"]
        assert (before.position, before.head, before.lag) == (0, 4, 4)
        engine.projections.catch_up()
        after = {s.name: s for s in engine.projections.status()}["failures_by_type"]
        assert (after.position, after.lag, after.last_error) == (4, 0, None)

    def test_rebuild_gives_the_same_state_and_reports_progress(self, engine: Engine) -> None:
        """rebuild folds from zero to the same state, reporting (name, position, head)."""
        engine.projections.register(FailuresByType)
        record_failures(engine, "A", "B")
        before = engine.projections.get("failures_by_type")
        seen: list[tuple[str, int, int]] = []
        count = engine.projections.rebuild(
            "failures_by_type", on_progress=lambda *p: seen.append(p)
        )
        assert count == 5
        assert seen[-1] == ("failures_by_type", 5, 5)
        assert engine.projections.get("failures_by_type") == before

    def test_changed_code_starts_again_from_zero(self, shared_url: str) -> None:
        """Registering new code under a stored name discards the old state and refolds."""
        with Engine(shared_url) as first:
            first.projections.register(FailuresByType)
            record_failures(first, "A")
            first.projections.catch_up()

        class FailuresByTypeV2(FailuresByType):
            name = "failures_by_type"
            version = 2

            @on(StageFailed)
            def failed(self, state: dict[str, int], event: StageFailed) -> dict[str, int]:
                return {**state, event.error_type.lower(): 1}

        with Engine(shared_url) as second:
            second.projections.register(FailuresByTypeV2)
            position = {s.name: s.position for s in second.projections.status()}
            assert position["failures_by_type"] == 0
            assert second.projections.get("failures_by_type") == {"a": 1}


class TestSharedStore:
    def test_concurrent_catch_ups_fold_each_event_once(self, shared_url: str) -> None:
        """Two engines catching up the same store at once never count an event twice."""
        with Engine(shared_url) as writer:
            for _ in range(30):
                record_failures(writer, "A", "B")
        engines = [Engine(shared_url) for _ in range(2)]
        for engine in engines:
            engine.projections.register(FailuresByType)
        errors: list[BaseException] = []

        def catch_up(engine: Engine) -> None:
            try:
                engine.projections.catch_up()
            except BaseException as error:  # reported below, not swallowed
                errors.append(error)

        threads = [threading.Thread(target=catch_up, args=(e,)) for e in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        for engine in engines:
            assert engine.projections.get("failures_by_type") == {"A": 30, "B": 30}
            engine.close()

    def test_follow_folds_new_events_as_they_arrive(self, shared_url: str) -> None:
        """A follower catches up, then folds events appended later by another engine."""
        stop = threading.Event()
        timeout = 60.0 if shared_url.startswith("postgresql") else 0.05
        with Engine(shared_url) as follower_engine, Engine(shared_url) as writer:
            follower_engine.projections.register(FailuresByType)
            follower = threading.Thread(
                target=follower_engine.projections.follow, args=(stop,), kwargs={"timeout": timeout}
            )
            follower.start()
            try:
                record_failures(writer, "A")
                # On PostgreSQL the wait is 60 s: only a NOTIFY can wake it within the deadline.
                wait_until(lambda: _position(follower_engine) == 4)
            finally:
                stop.set()
                record_failures(writer, "wake")  # a NOTIFY ends the follower's wait at once
                follower.join(timeout=90)
            assert not follower.is_alive()
        assert stop.is_set()


class HookedFailures(FailuresByType):
    """Counts failures by type; runs an instance's test hooks before its page's states are
    loaded (partition keys are computed just before) and as it folds a failure."""

    name = "hooked_failures"
    # by id(instance): instance attributes would change the projection's identity
    before_load: ClassVar[dict[int, list[Any]]] = {}
    while_folding: ClassVar[dict[int, list[Any]]] = {}

    def key(self, event: Any, pipeline: str | None) -> str:
        for hook in HookedFailures.before_load.pop(id(self), []):
            hook()
        return ""

    @on(StageFailed)
    def failed(self, state: dict[str, int], event: StageFailed) -> dict[str, int]:
        for hook in HookedFailures.while_folding.pop(id(self), []):
            hook()
        return super().failed(state, event)


class TestResetDuringAPage:
    @pytest.fixture(autouse=True)
    def no_hooks_left(self) -> Iterator[None]:
        """Hooks a failed test left never run in a later one."""
        yield
        HookedFailures.before_load.clear()
        HookedFailures.while_folding.clear()

    def test_a_reset_folded_back_to_the_page_start_refuses_the_page(self, shared_url: str) -> None:
        """A page whose states were loaded after another process reset the projection is not
        committed, even when that process has folded it back to the page's start meanwhile:
        the page is folded again from what is stored, and no failure is lost."""
        name = HookedFailures.name
        with Engine(shared_url) as compactor:
            compactor.projections.register(HookedFailures)
            record_failures(compactor, "A", "A")
            compactor.projections.catch_up()
            start = _positions(compactor)[name]
            record_failures(compactor, "B")
        # a follower with nothing cached (as after an erasure), and a compactor
        with Engine(shared_url) as follower, Engine(shared_url) as compactor:
            hooked = follower.projections.register(HookedFailures)
            compactor.projections.register(HookedFailures)
            HookedFailures.before_load[id(hooked)] = [lambda: compactor.projections.reset(name)]
            # the compactor's rebuild reaches the page's start while the follower folds
            HookedFailures.while_folding[id(hooked)] = [
                lambda: compactor.projections._catch_up([name], start, None)
            ]
            follower.projections.catch_up()
            assert HookedFailures.while_folding == {}  # both hooks ran
            assert HookedFailures.before_load == {}
            assert follower.projections.get(name) == {"A": 2, "B": 1}
            compactor.projections.rebuild(name)
            assert compactor.projections.get(name) == {"A": 2, "B": 1}


class TestReadOnlyEngine:
    @pytest.mark.parametrize("rebuilt", [False, True], ids=["caught_up", "rebuilt"])
    def test_it_never_counts_what_the_store_folded_since(
        self, shared_url: str, rebuilt: bool
    ) -> None:
        """A read-only engine folding in memory over the stored state never folds an event
        the store's state, loaded later, already holds (caught up or rebuilt meanwhile)."""
        name = FailuresByType.name
        with Engine(shared_url) as writer:
            writer.projections.register(FailuresByType)
            record_failures(writer, "A")
            writer.projections.catch_up()
            with Engine(shared_url, read_only=True) as reader:
                reader.projections.register(FailuresByType)
                assert reader.projections.get(name) == {"A": 1}
                record_failures(writer, "B")
                if rebuilt:
                    writer.projections.rebuild(name)
                else:
                    writer.projections.catch_up()
                assert reader.projections.get(name) == {"A": 1, "B": 1}
                record_failures(writer, "B")
                assert reader.projections.get(name) == {"A": 1, "B": 2}


class TestResetsAndPositions:
    def test_one_read_answers_what_two_reads_answer(self, engine: Engine) -> None:
        """`resets_and_positions` gives the reset count and each position (0 if unknown)."""
        engine.projections.register(FailuresByType)
        record_failures(engine, "A")
        engine.projections.rebuild(FailuresByType.name)
        engine.projections.catch_up()
        views = engine.projections.views
        names = ["failures_by_type", "run_index", "never_registered"]
        resets, positions = views.resets_and_positions(names)
        assert (resets, positions) == (views.resets(), views.positions(names))
        assert positions["never_registered"] == 0
        assert positions["failures_by_type"] == positions["run_index"] > 0
        assert resets >= 1

    def test_a_read_only_engine_answers_its_own_count(self, shared_url: str) -> None:
        """A read-only engine's views answer the resets and positions of its memory."""
        with Engine(shared_url) as writer:
            writer.projections.register(FailuresByType)
            record_failures(writer, "A")
            writer.projections.catch_up()
            with Engine(shared_url, read_only=True) as reader:
                reader.projections.register(FailuresByType)
                assert reader.projections.get(FailuresByType.name) == {"A": 1}
                views = reader.projections.views
                names = [FailuresByType.name]
                assert views.resets_and_positions(names) == (views.resets(), views.positions(names))
                assert views.positions(names)[FailuresByType.name] > 0


def _positions(engine: Engine) -> dict[str, int]:
    return {s.name: s.position for s in engine.projections.status()}


def _position(engine: Engine) -> int:
    return {s.name: s.position for s in engine.projections.status()}["failures_by_type"]


@pytest.fixture
def memory_engine() -> Iterator[Engine]:
    with Engine("memory://") as engine:
        yield engine


class TestDefaults:
    def test_run_index_and_failure_patterns_are_registered(self, memory_engine: Engine) -> None:
        """Every engine keeps the run index and cross-run failure patterns persistent."""
        assert memory_engine.projections.names == ["failure_patterns", "run_index"]
        assert isinstance(memory_engine.projections.projection("failure_patterns"), FailurePatterns)


class TestWaiting:
    def test_a_wait_without_news_ends_at_its_timeout(self, shared_url: str) -> None:
        """With no NOTIFY (or a lost one) the wait ends after its timeout, so a follower polls."""
        with Engine(shared_url) as engine:
            views = engine.store.views
            assert views is not None
            views.wait_for_events(0.01, threading.Event())  # PostgreSQL: LISTEN from now on
            started = time.monotonic()
            notified = views.wait_for_events(0.2, threading.Event())
            assert notified is False
            assert time.monotonic() - started < 30  # a deadline, not a timing assert

    def test_an_append_wakes_a_postgres_wait(self, postgres_url: str) -> None:
        """On PostgreSQL an append's NOTIFY ends the wait early and reports it."""
        with Engine(postgres_url) as engine, Engine(postgres_url) as writer:
            views = engine.store.views
            assert views is not None
            views.wait_for_events(0.01, threading.Event())  # LISTEN from now on
            record_failures(writer, "A")
            assert views.wait_for_events(60, threading.Event()) is True

    def test_what_came_before_the_listen_is_read_at_once(self, postgres_url: str) -> None:
        """An append between a follower's read and its LISTEN makes the first wait return at once.

        It sent its NOTIFY before anyone listened: a wait for the next one would sleep
        the whole timeout (60 s here) with the event unread.
        """
        with Engine(postgres_url) as engine, Engine(postgres_url) as writer:
            engine.projections.register(FailuresByType)
            engine.projections.catch_up()
            record_failures(writer, "A")  # before anyone listens
            views = engine.store.views
            assert views is not None
            assert views.wait_for_events(60, threading.Event()) is True
            engine.projections.catch_up()
            assert engine.projections.get("failures_by_type") == {"A": 1}


class FlakyEncode(FailuresByType):
    name = "flaky_encode"
    failures_left: ClassVar[list[int]] = [1]

    def encode(self, state: dict[str, int]) -> Any:
        if self.failures_left[0]:
            self.failures_left[0] -= 1
            raise RuntimeError("disk hiccup")
        return state


class TestInterruptedPages:
    def test_an_error_mid_page_does_not_fold_the_page_twice(self, engine: Engine) -> None:
        """Any error before a page commits leaves no half-folded state in the cache."""
        FlakyEncode.failures_left[:] = [1]
        engine.projections.register(FlakyEncode)
        record_failures(engine, "A", "A", "A")
        with pytest.raises(RuntimeError, match="disk hiccup"):
            engine.projections.catch_up()
        engine.projections.catch_up()
        assert engine.projections.get("failure_patterns", "code-review").total == 3
        assert engine.projections.get("flaky_encode") == {"A": 3}

    def test_a_follower_survives_a_dropped_listen_connection(self, postgres_url: str) -> None:
        """When its LISTEN connection dies, a follower reconnects and keeps folding."""
        import psycopg

        from tests._helpers import POSTGRES_URL

        stop = threading.Event()
        with Engine(postgres_url) as follower_engine, Engine(postgres_url) as writer:
            follower_engine.projections.register(FailuresByType)
            follower = threading.Thread(
                target=follower_engine.projections.follow, args=(stop,), kwargs={"timeout": 0.2}
            )
            follower.start()
            try:
                record_failures(writer, "A")
                wait_until(lambda: _position(follower_engine) == 4)
                with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
                    )
                record_failures(writer, "B")
                wait_until(lambda: _position(follower_engine) == 8)
                assert follower.is_alive()
            finally:
                stop.set()
                follower.join(timeout=90)


class TestLazyRegistration:
    def test_reading_the_run_index_fingerprints_no_other_projection(self, shared_url: str) -> None:
        """A reader that only lists runs computes the run index's fingerprint alone; a writer's
        open computes failure_patterns' too."""
        with Engine(shared_url) as engine:
            record_failures(engine, "Timeout")
        _fingerprint.cache_clear()  # the code fingerprints computed in this process
        with Engine.for_reading(shared_url) as reader:
            assert len(reader.runs()) == 1
        assert _fingerprint.cache_info().currsize == 1
        with Engine(shared_url) as engine:
            state = engine.projections.get(FailurePatterns.name, REVIEW.name)
            assert state.by_stage == {"developer": 1}
        assert _fingerprint.cache_info().currsize == 2

    def test_a_lazily_registered_projection_of_other_code_starts_over(
        self, sqlite_url: str
    ) -> None:
        """A stored state folded by other code is discarded at the lazy projection's first use,
        never served."""
        with Engine(sqlite_url) as engine:
            record_failures(engine, "Timeout", "Timeout")
            assert engine.projections.get(FailurePatterns.name, REVIEW.name).by_stage == {
                "developer": 2
            }
            stored = engine.store.views
            assert stored is not None
            stored.reset(FailurePatterns.name, "other code")
            stored.register(FailurePatterns.name, "other code")
        with Engine.for_reading(sqlite_url) as engine:
            projections, stored = engine.projections, engine.store.views
            assert stored is not None
            assert projections.status()[0].name == FailurePatterns.name
            assert stored.fingerprint(FailurePatterns.name) == (FailurePatterns().identity())
            state = projections.get(FailurePatterns.name, REVIEW.name)
            assert state.by_stage == {"developer": 2}


TURNS = Pipeline(
    "turns",
    initial="a",
    transitions=[
        ("a", "completed", "b"),
        ("b", "completed", "a"),
        ("a", "failed", "a"),
        ("a", "done", "end"),
    ],
    final=["end"],
)
SMALL_PAGE = 40
"""Notifications per page in `TestLongRunCatchUp`: a few hundred events span many pages."""


def record_long_runs(engine: Engine, outcomes: int) -> dict[str, UUID]:
    """A loop and a run alternating two states, interleaved in batches, the second rolled back
    across pages; a third run deleted after a page's worth of outcomes, a fourth failing."""
    loop, turns = engine.start_run(LOOP), engine.start_run(TURNS)
    doomed, failing = engine.start_run(LOOP), engine.start_run(TURNS)
    state = "a"
    for start in range(0, outcomes, 50):
        with loop.batch():
            for index in range(start, start + 50):
                if index % 7 == 6:
                    loop.stage_failed("work", error="boom", error_type="Build")
                else:
                    loop.stage_completed("work", result={"n": index})
        for _ in range(30):
            turns.stage_completed(state, result={})
            state = "b" if state == "a" else "a"
        if start == 100:
            turns.rollback(steps=45)  # back across the pages folded so far
            state = turns.refresh().state
            doomed.finish("deleted")
        failing.stage_failed("a", error="boom", error_type="Build")
    return {"loop": loop.id, "turns": turns.id, "doomed": doomed.id, "failing": failing.id}


def folded_alone(engine: Engine, run_id: UUID) -> RunSummary | None:
    """The run's summary folded from its events each decoded alone from the notification log."""
    store = engine.store
    notifications = store.recorder.select_notifications(start=1, limit=1_000_000)
    events = [store.mapper.to_domain_event(n) for n in notifications if n.originator_id == run_id]
    return RunIndex().fold(events)


def _refusing_notes(base: type[Projection[Any]]) -> type[Projection[Any]]:
    """`base` (a projection folding stretches of outcomes) refusing every note."""

    def noted(self: Any, state: Any, event: NoteAdded) -> Any:
        raise RuntimeError("cannot take notes")

    namespace = {"name": f"notes_refused_by_{base.name}", "noted": on(NoteAdded)(noted)}
    return type(f"Refusing{base.__name__}", (base,), namespace)


REFUSING = [_refusing_notes(kind) for kind in (RunIndex, ProgressState, RetryCounts, RoundsTable)]
"""Projections folding stretches of outcomes of their own, each refusing every note."""


def rebuilt_to_the_error_alone(engine: Engine, bad: Any) -> Any:
    """The run index's status after a rebuild stopped at the notification `bad`, whose error
    is the one decoding `bad` alone gives."""
    with pytest.raises(EventFormatError) as alone:
        engine.store.mapper.to_domain_event(bad)
    with pytest.raises(EventFormatError) as caught_up:
        engine.projections.rebuild(RunIndex.name)
    assert str(caught_up.value) == str(alone.value)
    (status,) = [s for s in engine.projections.status() if s.name == RunIndex.name]
    return status


class TestLongRunCatchUp:
    @pytest.fixture
    def small_pages(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Pages of `SMALL_PAGE` notifications."""
        monkeypatch.setattr(persistent, "PAGE", SMALL_PAGE)

    @pytest.mark.usefixtures("small_pages")
    def test_each_summary_equals_a_fold_of_its_events(self, engine: Engine) -> None:
        """After catch-ups over many pages (a run touched across pages, rolled back across
        them, a run deleted), each run's stored summary is its events' fold, stored alike."""
        ids = record_long_runs(engine, 200)
        engine.projections.catch_up()
        more = record_long_runs(engine, 150)  # folded on top of the states cached above
        engine.projections.catch_up()
        index = RunIndex()
        for run_id in [*ids.values(), *more.values()]:
            stored = engine.projections.get(RunIndex.name, run_id)
            assert stored == folded_alone(engine, run_id)
            assert index.encode(stored) == index.encode(folded_alone(engine, run_id))
        assert engine.projections.get(RunIndex.name, ids["doomed"]).status == "deleted"
        assert len(engine.projections.get(RunIndex.name, ids["turns"]).states) == 4 * 30 - 45

    @pytest.mark.usefixtures("small_pages")
    def test_a_long_run_s_stack_is_walked_a_bounded_number_of_times(
        self, engine: Engine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Catching the index up over a long run walks each of its stack's states at most a
        few times in all, and never its whole stack at a page (linear, not quadratic)."""
        record_long_runs(engine, 600)
        walks: list[int] = []
        newest_items = immutable.newest_items

        def counted(cells: Any, stops: Any = None) -> Any:
            walked = newest_items(cells, stops)
            walks.append(len(walked[0]))
            return walked

        monkeypatch.setattr(immutable, "newest_items", counted)  # every stack's walk
        engine.projections.rebuild(RunIndex.name)
        assert len(walks) >= 600 // SMALL_PAGE  # one walk a page at least
        assert sum(walks) <= 3 * 1200  # every state of the four runs (~1,200), a few times
        # the states pushed (or a rollback made) since the summary was last restored as
        # stored: fewer than `RESTORE_AFTER` before the page, then the page's; not all below
        assert max(walks) <= persistent.RESTORE_AFTER + 2 * SMALL_PAGE

    @pytest.mark.usefixtures("small_pages")
    def test_a_page_builds_a_run_s_summary_once_not_once_per_outcome(
        self, engine: Engine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Catching the index up folds each run's outcomes in a page as one stretch (its
        summary built once at the stretch's end), not through `outcome` event by event."""
        record_long_runs(engine, 200)
        built: list[int] = []
        make = run_index._SUMMARY

        def counted(*fields: Any) -> Any:
            built.append(1)
            return make(*fields)

        monkeypatch.setattr(run_index, "_SUMMARY", counted)
        engine.projections.rebuild(RunIndex.name)
        pages = -(-engine.projections.head() // SMALL_PAGE)
        assert 0 < len(built) <= 3 * pages  # a stretch per run and page, a few runs a page
        assert 3 * pages < 300  # where `outcome` builds one per outcome (300 of them and more)

    @pytest.mark.usefixtures("small_pages")
    @pytest.mark.parametrize("kind", REFUSING, ids=lambda kind: kind.__name__)
    def test_a_handler_error_mid_page_stops_where_folding_event_by_event_stops(
        self, engine: Engine, kind: type[Projection[Any]]
    ) -> None:
        """A handler failing mid page in a projection folding stretches of its own (the
        summary, progress, retries, rounds): the error names the event, the position stays
        just before it, and every run's stored state is the fold of its events before it
        (none of the page's after it, though the others were folded key by key first)."""
        projection = engine.projections.register(kind)
        loop, turns = engine.start_run(LOOP), engine.start_run(TURNS)
        for index in range(70):  # the note falls mid page, both runs going on after it
            loop.stage_completed("work", result={"n": index})
            turns.stage_completed("a" if index % 2 == 0 else "b", result={})
            if index == 50:
                noted = turns.note("why", "a note")
        with pytest.raises(ProjectionError, match=r"notes_refused_by.*NoteAdded"):
            engine.projections.catch_up([kind.name])
        notifications = engine.store.recorder.select_notifications(start=1, limit=10_000)
        (note,) = [n for n in notifications if n.originator_version == noted.version
                   and n.originator_id == turns.id]  # fmt: skip
        assert note.id % SMALL_PAGE not in (0, 1)  # mid page, not at its edge
        (status,) = [s for s in engine.projections.status() if s.name == kind.name]
        assert status.position == note.id - 1
        mapper = engine.store.mapper
        for run in (loop, turns):
            before = [
                mapper.to_domain_event(n)
                for n in notifications
                if n.originator_id == run.id and n.id < note.id
            ]
            stored = engine.projections.get(kind.name, run.id, catch_up=False)
            assert projection.encode(stored) == projection.encode(projection.fold(before))

    @pytest.mark.usefixtures("small_pages")
    def test_an_unreadable_event_stops_the_catch_up_as_decoding_it_alone_does(
        self, tmp_path: Path
    ) -> None:
        """A stored event that cannot be read stops the catch-up with the error decoding it
        alone gives, the pages before it kept."""
        with Engine(f"sqlite:///{tmp_path / 'bad.db'}") as engine:
            loop_id = record_long_runs(engine, 100)["loop"]
            with sqlite3.connect(tmp_path / "bad.db") as conn:
                conn.execute(
                    f"UPDATE {EVENTS_TABLE} SET state = ? WHERE originator_id = ? "
                    "AND originator_version = 60",
                    (b"{not json", loop_id.bytes),
                )
            conn.close()
            store = engine.store
            (bad,) = [
                n
                for n in store.recorder.select_notifications(start=1, limit=10_000)
                if n.originator_id == loop_id and n.originator_version == 60
            ]
            status = rebuilt_to_the_error_alone(engine, bad)
            assert 0 < status.position < bad.id

    @pytest.mark.usefixtures("small_pages")
    def test_an_unreadable_event_in_one_run_s_page_is_named_as_decoding_it_alone_does(
        self, tmp_path: Path
    ) -> None:
        """A page holding one run's events only (read as rows and decoded at once) with an
        unreadable event mid page: the same error as decoding it alone, the page not kept."""
        with Engine(f"sqlite:///{tmp_path / 'bad.db'}") as engine:
            loop = engine.start_run(LOOP)
            for index in range(100):
                loop.stage_completed("work", result={"n": index})
            with sqlite3.connect(tmp_path / "bad.db") as conn:
                conn.execute(
                    f"UPDATE {EVENTS_TABLE} SET state = ? WHERE originator_version = 60",
                    (b"{not json",),
                )
            conn.close()
            store = engine.store
            (bad,) = [
                n
                for n in store.recorder.select_notifications(start=1, limit=10_000)
                if n.state == b"{not json"
            ]
            status = rebuilt_to_the_error_alone(engine, bad)
            assert status.position == SMALL_PAGE < bad.id  # the page before the bad event's

    @pytest.mark.usefixtures("small_pages")
    def test_a_sqlite_catch_up_reads_rows_not_notification_objects(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On SQLite the catch-up reads its pages as rows (`select_notification_rows`): no
        eventsourcing `Notification` made per event; the summaries are the runs' folds."""
        with Engine(sqlite_url) as engine:
            ids = record_long_runs(engine, 100)
            read = engine.store.recorder.select_notifications
            objects: list[int] = []

            def counted(*args: Any, **kwargs: Any) -> Any:
                page = read(*args, **kwargs)
                objects.append(len(page))
                return page

            monkeypatch.setattr(engine.store.recorder, "select_notifications", counted)
            engine.projections.rebuild(RunIndex.name)
            assert sum(objects) == 0
            monkeypatch.undo()
            for run_id in ids.values():
                stored = engine.projections.get(RunIndex.name, run_id, catch_up=False)
                assert stored == folded_alone(engine, run_id)

    def test_the_first_unreadable_event_of_a_page_is_the_one_named(self, tmp_path: Path) -> None:
        """Two unreadable events of two runs in one page: the catch-up names the one first in
        the page, though its run comes second in the page (decoded after the other's)."""
        with Engine(f"sqlite:///{tmp_path / 'bad.db'}") as engine:
            ids = record_long_runs(engine, 100)
            with sqlite3.connect(tmp_path / "bad.db") as conn:
                for run_id, version in [(ids["loop"], 60), (ids["turns"], 5)]:
                    conn.execute(
                        f"UPDATE {EVENTS_TABLE} SET state = ? WHERE originator_id = ? "
                        "AND originator_version = ?",
                        (b"{not json", run_id.bytes, version),
                    )
            conn.close()
            store = engine.store
            page = store.recorder.select_notifications(start=1, limit=persistent.PAGE)
            bad = [n for n in page if n.state == b"{not json"]
            assert [n.originator_id for n in bad] == [ids["turns"], ids["loop"]]
            assert page[0].originator_id == ids["loop"]
            with pytest.raises(EventFormatError) as alone:
                store.mapper.to_domain_event(bad[0])
            with pytest.raises(EventFormatError) as caught_up:
                engine.projections.rebuild(RunIndex.name)
            assert str(caught_up.value) == str(alone.value)


DECODED: list[Any] = []
"""The states `Versions` decoded (`TestLongRunCatchUp`)."""


class Versions(Projection[list[int]]):
    """Every event's version, in the order folded (scope all), noting each state it decodes."""

    name = "versions_folded"

    def initial(self) -> list[int]:
        """No event yet."""
        return []

    def apply(self, state: list[int], event: Any) -> list[int]:
        """The versions so far and `event`'s."""
        return [*state, event.version]

    def decode(self, data: Any) -> list[int]:
        """`data`, noted in `DECODED`."""
        DECODED.append(data)
        return super().decode(data)


class TestKeptStates:
    def test_other_projections_fold_on_the_states_they_folded(
        self, engine: Engine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A projection other than the run index folds page after page on the states it
        folded, not on ones decoded from what it stored (its codec may not restore them),
        each page's events in the order of the log."""
        monkeypatch.setattr(persistent, "PAGE", SMALL_PAGE)
        DECODED.clear()
        engine.projections.register(Versions)
        record_long_runs(engine, 200)
        engine.projections.catch_up([Versions.name])
        assert DECODED == []
        folded = engine.projections.get(Versions.name, catch_up=False)
        log = engine.store.recorder.select_notifications(start=1, limit=1_000_000)
        assert folded == [notification.originator_version for notification in log]


ENDINGS_BROKEN: list[bool] = []
"""`CountsEndings` raises on a run's end while this is not empty."""


class CountsEndings(FailureCount):
    """`FailureCount` (failures by stage, forgetting a deleted run) under its own name,
    raising on a run's end while `ENDINGS_BROKEN` holds anything."""

    name = "counts_endings"

    @on(RunFinished)
    def ended(self, state: dict[str, int], event: RunFinished) -> dict[str, int]:
        """The state as it was, or an error while `ENDINGS_BROKEN`."""
        if ENDINGS_BROKEN:
            raise RuntimeError("cannot count endings yet")
        return state


class TestForgettingFails:
    def test_a_handler_error_on_a_deletion_keeps_the_run_unforgotten(self, engine: Engine) -> None:
        """A handler failing on the event deleting a run keeps the state before that event,
        the run not forgotten yet: folded again, the run is forgotten once."""
        engine.projections.register(CountsEndings)
        doomed = engine.start_run(REVIEW)
        doomed.stage_completed("project_analysis", result={})
        doomed.stage_completed("code_review", result={})
        for error_type in ["A", "B"]:
            doomed.stage_failed("developer", error="boom", error_type=error_type)
        record_failures(engine, "C")
        ENDINGS_BROKEN.append(True)
        try:
            doomed.finish("deleted")
            with pytest.raises(ProjectionError):
                engine.projections.catch_up([CountsEndings.name])
            assert engine.projections.get(CountsEndings.name, catch_up=False) == {"developer": 3}
        finally:
            ENDINGS_BROKEN.clear()
        engine.projections.catch_up([CountsEndings.name])
        assert engine.projections.get(CountsEndings.name) == {"developer": 1}


class AllProgress(ProgressState):
    """`ProgressState` kept as one state over every run (its stretches' fold, interleaved)."""

    name = "all_progress"
    scope = "all"


class PipelineRetries(RetryCounts):
    """`RetryCounts` kept per pipeline: runs of one pipeline folded into one state."""

    name = "pipeline_retries"
    scope = "pipeline"


class PipelineRounds(RoundsTable):
    """`RoundsTable` kept per pipeline: runs of one pipeline folded into one state."""

    name = "pipeline_rounds"
    scope = "pipeline"


def applied_by_key(engine: Engine, projection: Projection[Any]) -> dict[str, Any]:
    """Each partition's state: the events the notification log holds, in its order, given to
    `apply` one by one (no fold of the projection's own)."""
    store = engine.store
    pipelines = {s.run_id: s.pipeline for s in engine.runs()}
    states: dict[str, Any] = {}
    for notification in store.recorder.select_notifications(start=1, limit=1_000_000):
        event = store.mapper.to_domain_event(notification)
        if projection.relevant(event):
            key = projection.key(event, pipelines[event.run_id])
            states[key] = projection.apply(states.get(key, projection.initial()), event)
    return states


class TestKeyByKeyFolds:
    @pytest.fixture
    def small_pages(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Pages of `SMALL_PAGE` notifications."""
        monkeypatch.setattr(persistent, "PAGE", SMALL_PAGE)

    @pytest.mark.usefixtures("small_pages")
    @pytest.mark.parametrize("kind", [AllProgress, PipelineRetries, PipelineRounds])
    def test_a_partition_over_many_runs_is_their_events_applied_in_log_order(
        self, engine: Engine, kind: type[Projection[Any]]
    ) -> None:
        """A projection folding stretches of its own, kept over all runs or per pipeline (runs
        interleaved in each page, two of one pipeline), holds what `apply` event after event
        in the log's order gives."""
        projection = engine.projections.register(kind)
        record_long_runs(engine, 150)
        engine.projections.catch_up([kind.name])
        record_long_runs(engine, 100)  # on top of the states cached above
        engine.projections.catch_up([kind.name])
        expected = applied_by_key(engine, projection)
        stored = engine.projections.states(kind.name, catch_up=False)
        assert sorted(stored) == sorted(expected)
        for key, state in expected.items():
            assert projection.encode(stored[key]) == projection.encode(state)

    @pytest.mark.usefixtures("small_pages")
    def test_a_page_not_committed_is_folded_once_when_it_comes_again(
        self, engine: Engine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A commit failing mid catch-up (a crash's stand-in) keeps position and states of the
        pages before it together; the next catch-up folds each event once."""
        ids = record_long_runs(engine, 200)
        views = engine.store.views
        assert views is not None
        commit, commits = views.commit, [0]

        def failing(saves: Any) -> None:
            commits[0] += 1
            if commits[0] == 5:
                raise OSError("disk gone")
            commit(saves)

        monkeypatch.setattr(views, "commit", failing)
        with pytest.raises(OSError, match="disk gone"):
            engine.projections.rebuild(RunIndex.name)
        (status,) = [s for s in engine.projections.status() if s.name == RunIndex.name]
        assert status.position == 4 * SMALL_PAGE
        engine.projections.catch_up([RunIndex.name])
        for run_id in ids.values():
            stored = engine.projections.get(RunIndex.name, run_id, catch_up=False)
            assert stored == folded_alone(engine, run_id)

    @pytest.mark.usefixtures("small_pages")
    def test_a_key_s_few_events_in_a_page_are_applied_not_folded(self, sqlite_url: str) -> None:
        """Runs interleaved a few events a page each are applied event by event (a fold of
        one or two events costs more in setting up than it saves); a long run's many are
        folded by the projection's own fold; each run's state is its events' fold."""
        parts: list[int] = []

        class CountedRetries(RetryCounts):
            """RetryCounts counting the events of each of its own folds (not patched in:
            a class's fingerprint is kept once made, and would keep the patched code's)."""

            def _fold(self, events: Any, current: Any, tick: Any) -> Any:
                parts.append(len(events))
                return super()._fold(events, current, tick)

        with Engine(sqlite_url) as engine:
            engine.projections.register(CountedRetries)
            runs = [engine.start_run(TURNS) for _ in range(SMALL_PAGE // 2)]
            for index in range(4):
                for run in runs:
                    run.stage_completed("a" if index % 2 == 0 else "b", result={})
            long = engine.start_run(LOOP)
            for index in range(3 * SMALL_PAGE):
                long.stage_completed("work", result={"n": index})
            parts.clear()  # the engine's own folds of the runs it wrote
            engine.projections.catch_up([CountedRetries.name])
            assert parts  # the long run's
            assert min(parts) >= persistent.FOLD_MIN
            for run in [*runs, long]:
                stored = engine.projections.get(CountedRetries.name, run.id, catch_up=False)
                assert stored == engine.project(run.id, RetryCounts)
