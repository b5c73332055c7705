"""An erased run is never served again: caches and snapshots follow the erasure generation."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any
from uuid import UUID, uuid4

import pytest

from engine import Engine, Pipeline, RunNotFound
from engine.errors import RunErasedWhileRead
from engine.store.event_store import PAGE
from projections import FailurePatterns, RetryCounts, StageResults
from tests._helpers import REVIEW, erased_after_its_first_page
from tests.audit.tampering import Rows

AT = 1100
"""A version past two snapshot intervals of both runs."""
AGAIN = Pipeline.from_dict({**REVIEW.to_dict(), "name": "code-review-again"})
"""Another pipeline: the id's new run is filed elsewhere than the erased one."""


def erasable_run(engine: Engine, run_id: UUID) -> None:
    """A long run of developer failures ("old ..."), then one kept run recorded after it."""
    run = engine.start_run(REVIEW, run_id=run_id)
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    with run.batch():
        for attempt in range(1, 1200):
            run.stage_failed("developer", error=f"old {attempt}", error_type="OldError")
    kept = engine.start_run(REVIEW)
    kept.stage_completed("project_analysis")


def erase(engine: Engine, run_id: UUID) -> None:
    """Delete the run and compact the store."""
    engine.load(run_id).finish("deleted")
    assert engine.compact().runs == (run_id,)


def reused_run(engine: Engine, run_id: UUID) -> None:
    """A new run of another pipeline under the erased run's id, looping developer/testing."""
    run = engine.start_run(AGAIN, run_id=run_id)
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    with run.batch():
        for attempt in range(600):
            run.stage_completed("developer", result={"new": attempt})
            run.stage_failed("testing", error=f"new {attempt}", error_type="NewError")


def answers(engine: Engine, run_id: UUID) -> dict[str, Any]:
    """What an engine says about the run: by time travel and from persistent projections."""
    engine.projections.register(StageResults)
    retries = engine.project(run_id, RetryCounts, at=AT)
    results = engine.projections.get(StageResults.name, run_id)
    patterns = engine.projections.get(FailurePatterns.name, AGAIN.name)
    return {
        "developer attempts": retries.attempts("developer"),
        "testing attempts": retries.attempts("testing"),
        "results": len(results.attempts("developer")),
        "new failures": patterns.by_stage,
        "summary": [(str(s.run_id), s.pipeline, s.status) for s in engine.runs()],
    }


def truth(engine: Engine, run_id: UUID) -> dict[str, Any]:
    """The answers folded straight from the stored events (no cache, no snapshot)."""
    events = engine.events(run_id)
    retries = RetryCounts().fold(events[:AT])
    results = StageResults().fold(events)
    return {
        "developer attempts": retries.attempts("developer"),
        "testing attempts": retries.attempts("testing"),
        "results": len(results.attempts("developer")),
        "new failures": {"testing": 600},
        "summary": [(str(s.run_id), s.pipeline, s.status) for s in engine.runs()],
    }


class TestGeneration:
    def test_erasure_counts_a_generation(self, store_url: str) -> None:
        """Each erasure adds one, seen by every engine on the store; other writes add none."""
        with Engine(store_url) as engine:
            assert engine.store.generation() == 0
            run = engine.start_run(REVIEW)
            assert engine.store.generation() == 0
            erase(engine, run.id)
            assert engine.store.generation() == 1
            assert engine.store.erase([uuid4()]) == 0
            assert engine.store.generation() == 2
            if store_url != "memory://":
                with Engine(store_url) as other:
                    assert other.store.generation() == 2


class TestErasedRunsAreNotServed:
    def test_the_compacting_engine_serves_the_new_run(self, shared_url: str) -> None:
        """The engine that erased a run answers for the id's new run, not from its caches."""
        run_id = uuid4()
        with Engine(shared_url) as engine:
            erasable_run(engine, run_id)
            before = answers(engine, run_id)
            erase(engine, run_id)
            reused_run(engine, run_id)
            after = answers(engine, run_id)
            assert after == truth(engine, run_id)
        assert before["developer attempts"] == 1097
        assert after["developer attempts"] != before["developer attempts"]

    def test_another_engine_serves_the_new_run(self, shared_url: str) -> None:
        """An engine that read the erased run (caches, snapshots) answers for the new run."""
        run_id = uuid4()
        with Engine(shared_url) as writer, Engine(shared_url) as reader:
            erasable_run(writer, run_id)
            answers(reader, run_id)  # fills its caches and its snapshots in memory
            erase(writer, run_id)
            reused_run(writer, run_id)
            assert answers(reader, run_id) == truth(writer, run_id)

    def test_a_read_only_engine_serves_the_new_run(self, shared_url: str) -> None:
        """A read-only engine folding in memory refolds once runs are erased."""
        run_id = uuid4()
        with Engine(shared_url) as writer:
            erasable_run(writer, run_id)
            writer.projections.register(StageResults)
            with Engine(shared_url, read_only=True) as reader:
                answers(reader, run_id)  # the stored views lag: it folds the run in memory
                erase(writer, run_id)
                reused_run(writer, run_id)
                assert answers(reader, run_id) == truth(writer, run_id)

    def test_snapshots_of_an_older_generation_are_not_read(self, shared_url: str) -> None:
        """A snapshot stored after the erasure by a reader of the old run is never used."""
        run_id = uuid4()
        with Engine(shared_url) as engine:
            erasable_run(engine, run_id)
            stale = engine.store.codec.seal(RetryCounts().encode(RetryCounts().initial()))
            identity = RetryCounts().identity()
            erase(engine, run_id)
            assert engine.store.views is not None
            engine.store.views.save_snapshots(
                str(run_id), "retry_counts", identity, 0, [(1000, stale)]
            )
            assert Rows(shared_url).snapshots(run_id) == 0  # refused: read before the erase
            reused_run(engine, run_id)
        with Engine(shared_url) as fresh:
            expected = RetryCounts().fold(fresh.events(run_id)[:AT])
            assert fresh.project(run_id, RetryCounts, at=AT) == expected


class TestMemorySnapshotsAfterAnErase:
    def test_a_save_read_before_an_erase_stores_nothing(self) -> None:
        """The memory store, like SQLite and PostgreSQL, stores no snapshot saved in an
        erasure generation older than its own: the erased run's state is not kept after
        its erasure."""
        run_id = uuid4()
        with Engine("memory://") as engine:
            erasable_run(engine, run_id)
            stale = engine.store.codec.seal(RetryCounts().encode(RetryCounts().initial()))
            identity = RetryCounts().identity()
            erase(engine, run_id)
            views = engine.store.views
            assert views is not None
            views.save_snapshots(str(run_id), "retry_counts", identity, 0, [(1000, stale)])
            assert views.snapshot(str(run_id), "retry_counts", identity, 0, 1000) is None
            fresh = engine.store.generation()
            views.save_snapshots(str(run_id), "retry_counts", identity, fresh, [(1000, stale)])
            assert views.snapshot(str(run_id), "retry_counts", identity, fresh, 1000) is not None


def long_deleted_run(engine: Engine) -> UUID:
    """A deleted run of two pages and a bit of developer failures, not erased yet."""
    run = engine.start_run(REVIEW)
    run.stage_completed("project_analysis")
    run.stage_completed("code_review")
    with run.batch():
        for attempt in range(2 * PAGE):
            run.stage_failed("developer", error=f"old {attempt}", error_type="OldError")
    run.finish("deleted")
    return run.id


class TestErasedWhileFolded:
    def test_time_travel_refuses_it_and_stores_no_snapshot(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fold of a run a compaction erases between two of its pages raises
        `RunErasedWhileRead`, and no snapshot of what it read is left stored or served:
        the next question finds no run."""
        with Engine(shared_url) as engine:
            doomed = long_deleted_run(engine)
            erased_after_its_first_page(shared_url, doomed, monkeypatch)
            with pytest.raises(RunErasedWhileRead) as refused:
                engine.project(doomed, RetryCounts)
            assert (refused.value.run_id, refused.value.version) == (doomed, PAGE + 1)
            assert Rows(shared_url).snapshots(doomed) == 0
            with pytest.raises(RunNotFound):
                engine.project(doomed, RetryCounts)
            with pytest.raises(RunNotFound):
                engine.project(doomed, RetryCounts, at=PAGE)

    def test_a_fold_read_whole_before_the_erase_stores_no_snapshot_after_it(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fold that read the whole run before a compaction erased it stores none of its
        snapshots after the erase (the store refuses a save read in an older generation),
        and answers `RunErasedWhileRead`, never the empty state of a run no longer there."""
        with Engine(shared_url) as engine:
            doomed = long_deleted_run(engine)
            newest = engine.store.last(doomed)
            assert newest is not None
            erased_after_its_first_page(shared_url, doomed, monkeypatch, after=newest.version)
            with pytest.raises(RunErasedWhileRead) as refused:
                engine.project(doomed, RetryCounts)
            assert refused.value.run_id == doomed
            assert Rows(shared_url).snapshots(doomed) == 0


READER = textwrap.dedent(
    """
    import json, sys
    from uuid import UUID
    from engine import Engine
    from projections import RetryCounts, StageResults

    with Engine(sys.argv[1]) as engine:
        run_id = UUID(sys.argv[2])
        engine.projections.register(StageResults)
        for _ in sys.stdin:  # one line per question
            retries = engine.project(run_id, RetryCounts, at=1100)
            results = engine.projections.get(StageResults.name, run_id)
            answer = [retries.attempts("developer"), len(results.attempts("developer"))]
            print(json.dumps(answer), flush=True)
    """
)


class TestAnotherProcess:
    def test_a_process_that_read_the_run_serves_the_new_one(self, sqlite_url: str) -> None:
        """A live process's caches and snapshots of an erased run are not served for its new run."""
        run_id = uuid4()
        with Engine(sqlite_url) as engine:
            erasable_run(engine, run_id)
            reader = subprocess.Popen(
                [sys.executable, "-c", READER, sqlite_url, str(run_id)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert reader.stdin is not None
            assert reader.stdout is not None
            try:
                reader.stdin.write("ask\n")
                reader.stdin.flush()
                before = json.loads(reader.stdout.readline())
                erase(engine, run_id)
                reused_run(engine, run_id)
                reader.stdin.write("ask\n")
                reader.stdin.flush()
                after = json.loads(reader.stdout.readline())
            finally:
                reader.stdin.close()
                reader.wait(timeout=60)
            events = engine.events(run_id)
        assert before == [1097, 1199]
        expected = [
            RetryCounts().fold(events[:AT]).attempts("developer"),
            len(StageResults().fold(events).attempts("developer")),
        ]
        assert after == expected
