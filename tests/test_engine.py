from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time

from benchmarks._common import CountedWrites
from engine import ConcurrencyConflict, Engine, Pipeline, RunNotFound, StoreError
from engine.errors import (
    InvalidArgument,
    InvalidFork,
    InvalidPayload,
    InvalidTransition,
    RunAlreadyExists,
)
from engine.run import Run
from engine.store import PAGE
from engine.supervise.perform import history
from events import RunStarted
from tests._helpers import REVIEW


class TestStartRun:
    def test_run_started_carries_the_whole_definition(self, engine: Engine) -> None:
        """RunStarted stores the pipeline name, table, params and labels."""
        run = engine.start_run(REVIEW, params={"card": "C-42"}, labels={"team": "core"})
        first = engine.events(run.id)[0]
        assert isinstance(first, RunStarted)
        assert first.pipeline == "code-review"
        assert Pipeline.from_dict(first.table) == REVIEW
        assert (first.params, first.labels) == ({"card": "C-42"}, {"team": "core"})
        assert (run.state, run.version, run.status) == ("project_analysis", 1, "running")

    def test_parent_run_is_linked(self, engine: Engine) -> None:
        """A child run records its parent's id, given a Run or a UUID."""
        parent = engine.start_run(REVIEW)
        by_run = engine.start_run(REVIEW, parent=parent)
        by_id = engine.start_run(REVIEW, parent=parent.id)
        for child in (by_run, by_id):
            first = engine.events(child.id)[0]
            assert isinstance(first, RunStarted)
            assert first.parent_run_id == parent.id

    def test_a_chosen_run_id_cannot_be_reused(self, engine: Engine) -> None:
        """Starting a run under an existing id is a conflict, not an overwrite."""
        run_id = uuid.uuid4()
        engine.start_run(REVIEW, run_id=run_id, params={"n": 1})
        with pytest.raises(ConcurrencyConflict, match="already exists; choose another run_id"):
            engine.start_run(REVIEW, run_id=run_id, params={"n": 2})
        first = engine.events(run_id)[0]
        assert isinstance(first, RunStarted)
        assert first.params == {"n": 1}

    def test_labels_must_be_a_mapping(self, engine: Engine) -> None:
        """labels='x' raises InvalidPayload naming labels, not a ValueError from dict()."""
        with pytest.raises(InvalidPayload, match="'labels'"):
            engine.start_run(REVIEW, labels="team=core")  # type: ignore[arg-type]

    def test_only_pipelines_can_be_started(self, engine: Engine) -> None:
        """start_run refuses anything that is not a Pipeline."""
        with pytest.raises(TypeError, match="needs a Pipeline"):
            engine.start_run(REVIEW.to_dict())  # type: ignore[arg-type]


class TestDeferredStart:
    def test_the_start_is_written_with_the_first_batch(self, engine: Engine) -> None:
        """deferred=True stores nothing at once; the first batch writes the start with it."""
        with CountedWrites(engine.store) as counted:
            run = engine.start_run(REVIEW, params={"n": 1}, deferred=True)
            assert engine.store.last(run.id) is None
            with run.batch():
                run.stage_completed("project_analysis")
                run.stage_completed("code_review")
        assert [len(batch) for batch in counted.batches] == [3]
        kinds = [type(event).__name__ for event in engine.events(run.id)]
        assert kinds == ["RunStarted", "StageCompleted", "StageCompleted"]
        assert engine.verify(run.id).ok

    def test_a_refused_event_of_the_first_batch_is_never_written(self, engine: Engine) -> None:
        """An unstorable event in the first batch is dropped with its block, and the start
        with it: nothing is stored; the run goes on, its next event written with the start."""
        run = engine.start_run(REVIEW, deferred=True)
        with pytest.raises(InvalidPayload), run.batch():
            run.stage_completed("project_analysis", {"bad": "\x00"})
        assert engine.store.last(run.id) is None
        run.stage_completed("project_analysis")
        assert [e.version for e in engine.events(run.id)] == [1, 2]
        assert engine.verify(run.id).ok

    @pytest.mark.parametrize("raised", [InvalidTransition, RuntimeError])
    def test_a_failed_first_batch_writes_nothing(
        self, engine: Engine, raised: type[Exception]
    ) -> None:
        """A first batch that raises (a refused transition, the caller's own error) writes
        nothing, not the start alone; the next batch writes the start with its events."""
        run = engine.start_run(REVIEW, deferred=True)
        with CountedWrites(engine.store) as counted:
            with pytest.raises(raised), run.batch():
                run.stage_completed("project_analysis")
                if raised is RuntimeError:
                    raise RuntimeError("the caller's own error")
                run.stage_completed("no_such_stage")
            assert engine.store.last(run.id) is None
            assert (run.version, run.state) == (1, "project_analysis")
            with run.batch():
                run.stage_completed("project_analysis")
        assert [len(batch) for batch in counted.batches] == [2]
        kinds = [type(event).__name__ for event in engine.events(run.id)]
        assert kinds == ["RunStarted", "StageCompleted"]
        assert engine.verify(run.id).ok

    def test_a_failed_first_async_batch_writes_nothing(self, engine: Engine) -> None:
        """``async with run.batch()`` raising first writes nothing either."""

        async def scenario(run: Run) -> None:
            with pytest.raises(RuntimeError):
                async with run.batch():
                    run.stage_completed("project_analysis")
                    raise RuntimeError("the caller's own error")
            assert engine.store.last(run.id) is None
            async with run.batch():
                run.stage_completed("project_analysis")

        run = engine.start_run(REVIEW, deferred=True)
        asyncio.run(scenario(run))
        assert [e.version for e in engine.events(run.id)] == [1, 2]

    def test_a_failed_first_batch_raises_its_own_error_not_a_conflict(self, engine: Engine) -> None:
        """Under a taken id, a first batch that raises gives the caller its own error: no
        lone start is written to conflict with the other run."""
        run_id = uuid.uuid4()
        late = engine.start_run(REVIEW, run_id=run_id, deferred=True)
        engine.start_run(REVIEW, run_id=run_id, params={"n": 1})
        with pytest.raises(InvalidPayload), late.batch():
            late.stage_completed("project_analysis", {"bad": "\x00"})
        assert len(engine.events(run_id)) == 1

    def test_a_deferred_run_holds_its_start_once(self, engine: Engine) -> None:
        """The handle's history of a deferred run holds its start once, before and after the
        first commit."""
        run = engine.start_run(REVIEW, deferred=True)
        assert [e.version for e in history(run)] == [1]
        run.stage_completed("project_analysis")
        assert [e.version for e in history(run)] == [1, 2]

    def test_a_supervisor_drives_a_deferred_run(self, engine: Engine) -> None:
        """A supervisor given a deferred run drives it to its end; the start is written once,
        with the first events."""
        once = Pipeline(
            "once", initial="work", transitions=[("work", "completed", "done")], final=["done"]
        )
        run = engine.start_run(once, deferred=True)
        engine.supervisor().drive(run, {"work": lambda context: {"ok": True}})
        assert run.status == "succeeded"
        events = engine.events(run.id)
        assert [e.version for e in events] == list(range(1, len(events) + 1))
        assert sum(isinstance(e, RunStarted) for e in events) == 1
        assert engine.verify(run.id).ok

    def test_a_taken_id_fails_the_first_commit_and_writes_nothing(self, engine: Engine) -> None:
        """Another run under the id first: the deferred run's first commit is a conflict, and
        no later event of it is ever written under the other run."""
        run_id = uuid.uuid4()
        late = engine.start_run(REVIEW, run_id=run_id, params={"n": 2}, deferred=True)
        engine.start_run(REVIEW, run_id=run_id, params={"n": 1})
        for _ in range(2):
            with pytest.raises(ConcurrencyConflict):
                late.stage_completed("project_analysis")
        assert len(engine.events(run_id)) == 1
        first = engine.events(run_id)[0]
        assert isinstance(first, RunStarted)
        assert first.params == {"n": 1}


class TestLoad:
    def test_load_rebuilds_the_machine_from_the_store_alone(self, store_url: str) -> None:
        """A second engine (another process) rebuilds the same machine state."""
        with Engine(store_url) as writer:
            run = writer.start_run(REVIEW)
            run.stage_completed("project_analysis")
            run.stage_failed("code_review", "x", outcome="aborted")
            if store_url == "memory://":
                loaded = writer.load(run.id)
            else:
                with Engine(store_url) as reader:
                    loaded = reader.load(run.id)
        assert loaded.machine == run.machine
        assert loaded.pipeline == REVIEW

    def test_load_accepts_a_string_id(self, engine: Engine) -> None:
        """Run ids may be given as strings."""
        run = engine.start_run(REVIEW)
        assert engine.load(str(run.id)).id == run.id

    @pytest.mark.parametrize("run_id", [uuid.UUID(int=1), "not-a-uuid"])
    def test_unknown_runs_raise_run_not_found(self, engine: Engine, run_id: object) -> None:
        """load and events name the missing run with a LookupError."""
        with pytest.raises(RunNotFound) as caught:
            engine.load(run_id)  # type: ignore[arg-type]
        assert isinstance(caught.value, LookupError)
        with pytest.raises(RunNotFound):
            engine.events(run_id)  # type: ignore[arg-type]

    def test_long_runs_are_streamed_in_pages(
        self, engine: Engine, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run longer than two pages loads whole and in order, reading one page at a time."""
        run = engine.start_run(REVIEW)
        with run.batch():
            for index in range(2 * PAGE + 1):
                run.note("n", index)
        limits: list[int | None] = []
        recorder = engine.store.recorder
        # A SQLite recorder's reads are its lean rows; the others' StoredEvents.
        name = "select_rows" if hasattr(recorder, "select_rows") else "select_events"
        select = getattr(recorder, name)

        def observed(*args: Any, **kwargs: Any) -> Any:
            limits.append(kwargs.get("limit"))
            return select(*args, **kwargs)

        monkeypatch.setattr(recorder, name, observed)
        loaded = engine.load(run.id)
        assert loaded.version == 2 * PAGE + 2
        assert limits == [1, PAGE, PAGE, PAGE]  # the newest event (snapshots serve long runs)
        stored = engine.events(run.id)
        assert [e.version for e in stored] == list(range(1, 2 * PAGE + 3))


class TestEventsUpto:
    def test_upto_a_version(self, engine: Engine) -> None:
        """upto=N gives the first N events; 0 none; past the head all."""
        run = engine.start_run(REVIEW)
        for index in range(4):
            run.note("n", index)
        assert [e.version for e in engine.events(run.id, upto=3)] == [1, 2, 3]
        assert engine.events(run.id, upto=0) == []
        assert len(engine.events(run.id, upto=99)) == 5

    def test_upto_a_time(self, engine: Engine) -> None:
        """upto=datetime gives the events stamped at or before it."""
        with freeze_time("2026-05-01 12:00:00") as clock:
            run = engine.start_run(REVIEW)
            clock.tick(10)
            run.note("a", 1)
            clock.tick(10)
            run.note("b", 2)
        cut = datetime(2026, 5, 1, 12, 0, 10, tzinfo=UTC)
        assert [e.version for e in engine.events(run.id, upto=cut)] == [1, 2]

    @pytest.mark.parametrize("upto", [-1, 1.5, datetime(2026, 1, 1)])
    def test_bad_upto_is_refused(self, engine: Engine, upto: object) -> None:
        """A negative, fractional or naive upto raises InvalidArgument naming 'upto'."""
        run = engine.start_run(REVIEW)
        with pytest.raises(InvalidArgument, match="'upto'"):
            engine.events(run.id, upto=upto)  # type: ignore[arg-type]


class TestDefaultStore:
    def test_default_is_stagetrail_db_in_the_working_directory(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Engine() without a URL and without $STAGETRAIL_STORE writes ./stagetrail.db."""
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("STAGETRAIL_STORE", raising=False)
        with Engine() as engine:
            engine.start_run(REVIEW)
            assert engine.url == "sqlite:///stagetrail.db"
        assert (tmp_path / "stagetrail.db").is_file()

    def test_environment_variable_names_the_store(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """$STAGETRAIL_STORE is the default URL."""
        url = f"sqlite:///{tmp_path / 'env.db'}"
        monkeypatch.setenv("STAGETRAIL_STORE", url)
        with Engine() as engine:
            assert engine.url == url
        assert (tmp_path / "env.db").is_file()


class TestFork:
    def record(self, engine: Engine) -> Any:
        run = engine.start_run(REVIEW, labels={"team": "core"}, params={"card": 1})
        run.stage_completed("project_analysis", result={"a": 1})
        run.stage_completed("code_review", result={"b": 2})
        run.stage_failed("developer", error="x")
        return run

    def test_copies_the_prefix_and_records_lineage(self, engine: Engine) -> None:
        """The fork's events are the first N of the origin, re-stamped, with forked_from set."""
        with freeze_time("2026-06-01T10:00:00Z"):
            origin = self.record(engine)
        with freeze_time("2026-06-02T10:00:00Z"):
            fork = engine.fork(origin.id, at=3)
        assert (fork.state, fork.version) == ("developer", 3)
        assert fork.id != origin.id
        copied, original = engine.events(fork.id), engine.events(origin.id, upto=3)
        assert [e.run_id for e in copied] == [fork.id] * 3
        assert copied[0].forked_from == (origin.id, 3)  # type: ignore[attr-defined]
        assert copied[0].labels == {"team": "core"}  # type: ignore[attr-defined]
        for mine, theirs in zip(copied[1:], original[1:], strict=True):
            assert mine.payload() == theirs.payload()
        assert {e.timestamp.day for e in copied} == {2}
        assert engine.runs(limit=1)[0].forked_from == (origin.id, 3)

    def test_the_fork_continues_independently(self, engine: Engine) -> None:
        """Recording on the fork leaves the origin untouched."""
        origin = self.record(engine)
        fork = engine.fork(origin.id, at=3)
        fork.stage_completed("developer", result={})
        assert fork.state == "testing"
        reloaded = engine.load(origin.id)
        assert (reloaded.state, reloaded.version) == ("developer", 4)

    @pytest.mark.parametrize("at", [0, -2, 9, 1.5])
    def test_versions_outside_the_run_are_refused(self, engine: Engine, at: Any) -> None:
        """Forking at a version the run does not have raises InvalidFork; nothing is written."""
        origin = self.record(engine)
        with pytest.raises(InvalidFork, match=f"at version {at}"):
            engine.fork(origin.id, at=at)
        assert len(engine.runs()) == 1

    def test_cannot_fork_at_the_finish(self, engine: Engine) -> None:
        """A fork that would include RunFinished is refused (fork before it)."""
        origin = self.record(engine)
        origin.finish("cancelled")
        with pytest.raises(InvalidFork, match="RunFinished"):
            engine.fork(origin.id, at=5)
        assert engine.fork(origin.id, at=4).status == "running"

    def test_a_fork_of_a_child_leaves_the_parents_tree(self, engine: Engine) -> None:
        """A fork has no parent run, so tree totals do not count its copies twice."""
        parent = engine.start_run(REVIEW)
        child = engine.start_run(REVIEW, parent=parent)
        child.add_task("t1")
        child.task_completed("t1", result=1)
        fork = engine.fork(child.id, at=3)
        assert engine.tree(parent.id) == [parent.id, child.id]
        assert engine.runs(limit=1)[0].parent_run_id is None
        assert engine.events(fork.id)[0].forked_from == (child.id, 3)  # type: ignore[attr-defined]

    def test_a_chosen_id_must_be_new(self, engine: Engine) -> None:
        """Forking onto an existing run id raises RunAlreadyExists."""
        origin = self.record(engine)
        with pytest.raises(RunAlreadyExists):
            engine.fork(origin.id, at=2, new_run_id=origin.id)

    def test_params_and_labels_may_be_given(self, engine: Engine) -> None:
        """A fork takes the origin's params unless given; given labels go over the origin's."""
        origin = self.record(engine)
        chosen = uuid.uuid4()
        fork = engine.fork(
            origin.id, at=2, new_run_id=chosen, params={"card": 2}, labels={"try": "b"}
        )
        first = engine.events(fork.id)[0]
        assert isinstance(first, RunStarted)
        assert fork.id == chosen
        assert (first.params, first.labels) == ({"card": 2}, {"team": "core", "try": "b"})
        plain = engine.events(engine.fork(origin.id, at=2).id)[0]
        assert isinstance(plain, RunStarted)
        assert (plain.params, plain.labels) == ({"card": 1}, {"team": "core"})

    def test_a_label_that_is_not_a_string_is_refused(self, engine: Engine) -> None:
        """The fork's labels are checked as start_run's are; nothing is written."""
        origin = self.record(engine)
        with pytest.raises(InvalidPayload):
            engine.fork(origin.id, at=2, labels={"try": 1})  # type: ignore[dict-item]
        assert len(engine.runs()) == 1


class TestTree:
    def coordinator(self, engine: Engine) -> tuple[Any, Any, Any]:
        with freeze_time("2026-07-01T08:00:00Z", auto_tick_seconds=1):
            parent = engine.start_run(REVIEW)
            parent.add_task("feature-1", title="login")
            child = engine.start_run(REVIEW, parent=parent)
            child.add_task("t1", parent="feature-1")
            child.task_completed("t1", result="ok")
            grandchild = engine.start_run(REVIEW, parent=child)
            grandchild.add_task("t2", parent="feature-1")
            grandchild.task_failed("t2", error="no")
            parent.spend(1.5, "usd")
            child.spend(0.5, "usd")
        return parent, child, grandchild

    def test_lists_the_run_and_its_descendants_parents_first(self, engine: Engine) -> None:
        """tree() is the run, then its children, then theirs."""
        parent, child, grandchild = self.coordinator(engine)
        assert engine.tree(parent.id) == [parent.id, child.id, grandchild.id]
        assert engine.tree(child.id) == [child.id, grandchild.id]
        with pytest.raises(RunNotFound):
            engine.tree(uuid.uuid4())

    def test_task_table_over_the_tree(self, engine: Engine) -> None:
        """project(tree=True) folds child runs in: tasks and budget of the whole tree."""
        from projections import TaskTable

        parent, _, _ = self.coordinator(engine)
        tasks = engine.project(parent.id, TaskTable, tree=True)
        assert [t.task_id for t in tasks.completed] == ["t1"]
        assert [t.task_id for t in tasks.failed] == ["t2"]
        assert [t.task_id for t in tasks.pending] == ["feature-1"]
        assert {t.task_id for t in tasks.children("feature-1")} == {"t1", "t2"}
        assert tasks.budget == {"usd": 2.0}
        alone = engine.project(parent.id, TaskTable)
        assert [t.task_id for t in alone.tasks] == ["feature-1"]

    def test_tree_at_a_time(self, engine: Engine) -> None:
        """With tree=True, `at` is a time; a version is refused as ambiguous."""
        from projections import TaskTable

        parent, _, _ = self.coordinator(engine)
        child_done = engine.events(engine.tree(parent.id)[1])[-2].timestamp
        early = engine.project(parent.id, TaskTable, tree=True, at=child_done)
        assert [t.task_id for t in early.completed] == ["t1"]
        assert early.failed == ()
        with pytest.raises(InvalidArgument, match="'at'"):
            engine.project(parent.id, TaskTable, tree=True, at=3)


class TestProjectionsUnavailable:
    def test_a_store_refusing_view_writes_still_reads_and_travels(self, tmp_path: Path) -> None:
        """When the views cannot be written, runs load and project; runs() names the reason."""
        import sqlite3

        from projections import StateStack

        path = tmp_path / "guarded.db"
        with Engine(f"sqlite:///{path}") as engine:
            run = engine.start_run(REVIEW)
            run.stage_completed("project_analysis", result={})
        with sqlite3.connect(path) as db:  # stale code registered, and no writes allowed
            db.execute("UPDATE stagetrail_projections SET fingerprint = 'old'")
            for action in ("INSERT", "UPDATE", "DELETE"):
                db.execute(
                    f"CREATE TRIGGER guard_{action.lower()} BEFORE {action} "
                    "ON stagetrail_projections BEGIN SELECT RAISE(ABORT, 'views are frozen'); END"
                )
        db.close()
        with Engine(f"sqlite:///{path}", create=False) as reader:
            assert reader.load(run.id).state == "code_review"
            assert reader.project(run.id, StateStack).depth == 1
            with pytest.raises(StoreError, match=r"cannot keep projections.*views are frozen"):
                reader.runs()


class TestForReading:
    def test_a_writable_store_opens_with_its_run_index_saved(self, sqlite_url: str) -> None:
        """On a store it may write, a reader's engine is writable and its run index is current."""
        with Engine(sqlite_url) as engine:
            engine.start_run(REVIEW)
        with Engine.for_reading(sqlite_url) as reader:
            assert reader.store.read_only is False
            assert {s.name: s.lag for s in reader.projections.status()}["run_index"] == 0

    def test_a_missing_store_is_refused_not_created(self, tmp_path: Path) -> None:
        """A reader never creates a store: a missing file is one StoreError, and stays missing."""
        path = tmp_path / "none.db"
        with pytest.raises(StoreError):
            Engine.for_reading(f"sqlite:///{path}")
        assert not path.exists()


class TestRunsPages:
    def test_offset_passes_over_the_newest_runs(self, engine: Engine) -> None:
        """`runs(limit, offset)` is a page of the newest-first listing; a bad offset is refused."""
        started = []
        for second in range(5):
            with freeze_time(datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)):
                started.append(engine.start_run(REVIEW).id)
        newest_first = started[::-1]
        assert [s.run_id for s in engine.runs(limit=2)] == newest_first[:2]
        assert [s.run_id for s in engine.runs(limit=2, offset=2)] == newest_first[2:4]
        assert [s.run_id for s in engine.runs(limit=2, offset=4)] == newest_first[4:]
        assert engine.runs(offset=5) == []
        with pytest.raises(InvalidArgument, match=r"offset.: must be an int >= 0"):
            engine.runs(offset=-1)
