"""Erasing on PostgreSQL: transactions bounded by events, so appends wait for little."""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest
from psycopg import sql

from engine import Engine
from engine.errors import RunErased
from engine.readside import persistent
from engine.store import meta
from engine.store.postgres import open as postgres_open
from engine.store.postgres import recorder as recorder_module
from engine.store.postgres.recorder import PostgresRecorder
from events import Event
from tests._helpers import POSTGRES_URL, REVIEW, FailureCount, compact_killed_after_first_erase
from tests.test_compact import LOOP

BOUND = 7
"""Events per erase transaction in these tests."""


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Erase transactions of at most `BOUND` events."""
    monkeypatch.setattr(postgres_open, "ERASE_EVENTS", BOUND)


@pytest.fixture
def logged(postgres_url: str) -> str:
    """The store's schema, with a trigger logging each deleted event's transaction id."""
    schema = postgres_url.rsplit("schema=", 1)[1]
    with Engine(postgres_url):  # creates the tables
        pass
    statements = [
        "CREATE TABLE {s}.erased (tx bigint NOT NULL)",
        "CREATE FUNCTION {s}.log_erased() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO {s}.erased VALUES (txid_current()); RETURN OLD; END $$",
        "CREATE TRIGGER log_erased AFTER DELETE ON {s}.{t} "
        "FOR EACH ROW EXECUTE FUNCTION {s}.log_erased()",
    ]
    names = {"s": sql.Identifier(schema), "t": sql.Identifier(meta.EVENTS_TABLE)}
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(**names))
    return schema


def per_transaction(schema: str) -> list[int]:
    """The events each erase transaction deleted, in the order the transactions ran."""
    query = sql.SQL("SELECT count(*) FROM {}.erased GROUP BY tx ORDER BY tx").format(
        sql.Identifier(schema)
    )
    with psycopg.connect(POSTGRES_URL) as conn:
        return [count for (count,) in conn.execute(query).fetchall()]


def deleted_runs(engine: Engine, lengths: list[int]) -> int:
    """Runs of `lengths` events each, finished as deleted (one more event); their events."""
    for length in lengths:
        run = engine.start_run(REVIEW)
        with run.batch():
            for index in range(length - 1):
                run.note(f"n{index}", index)
        run.finish("deleted")
    return sum(lengths) + len(lengths)


@pytest.mark.usefixtures("bounded")
class TestEraseBound:
    def test_no_transaction_deletes_more_than_the_bound(
        self, postgres_url: str, logged: str
    ) -> None:
        """Short and long runs are erased in transactions of at most the bound, packed full."""
        with Engine(postgres_url) as engine:
            total = deleted_runs(engine, [2, 3, 30, 1, 16])
            generation = engine.store.generation()
            done = engine.compact()
            assert done.events == total
            counts = per_transaction(logged)
            assert sum(counts) == total
            assert max(counts) <= BOUND
            assert len(counts) == math.ceil(total / BOUND)
            assert engine.store.generation() - generation >= len(counts)  # one per transaction
            assert engine.runs(status="deleted") == []

    def test_each_transaction_counts_one_more_generation(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Another process reads a new erasure generation after every erase transaction of a
        long run, so nothing it caches between two is served after the next."""
        with Engine(postgres_url) as engine, Engine(postgres_url) as other:
            total = deleted_runs(engine, [30])
            seen = [other.store.generation()]
            first = postgres_open._erase_some

            def observed(*args: object) -> object:
                erased = first(*args)  # type: ignore[arg-type]
                seen.append(other.store.generation())
                return erased

            monkeypatch.setattr(postgres_open, "_erase_some", observed)
            assert engine.compact().events == total
            assert len(seen) - 1 == math.ceil(total / BOUND)
            assert seen == list(range(seen[0], seen[0] + len(seen)))

    def test_a_stale_handle_of_a_long_erased_run_is_refused(self, postgres_url: str) -> None:
        """A run erased over several transactions still refuses its stale handles' appends."""
        with Engine(postgres_url) as engine, Engine(postgres_url) as other:
            stale = engine.start_run(REVIEW)
            with stale.batch():
                for index in range(40):
                    stale.note(f"n{index}", index)
            other.load(stale.id).finish("deleted")
            assert other.compact().events == 42
            with pytest.raises(RunErased):
                stale.note("late", 1)
            assert engine.store.last(stale.id) is None


class TestSelectRuns:
    def test_every_event_of_several_runs_in_one_read(self, postgres_url: str) -> None:
        """The recorder reads several runs' events at once, by run and version (for forgetting)."""
        with Engine(postgres_url) as engine:
            first, second = engine.start_run(REVIEW), engine.start_run(REVIEW)
            first.note("a", 1)
            second.note("b", 2)
            second.note("c", 3)
            recorder = engine.store.recorder
            assert isinstance(recorder, PostgresRecorder)
            stored = recorder.select_runs([first.id, second.id])
            got = sorted((s.originator_id, s.originator_version) for s in stored)
            assert got == sorted(
                [(first.id, 1), (first.id, 2), *((second.id, v) for v in (1, 2, 3))]
            )
            assert [s.originator_version for s in stored if s.originator_id == second.id] == [
                1,
                2,
                3,
            ]

    def test_a_run_longer_than_the_page_is_read_in_bounded_queries(self, postgres_url: str) -> None:
        """No query answers more than the page; together the pages are every event, in order."""
        with Engine(postgres_url) as engine:
            long, short = engine.start_run(REVIEW), engine.start_run(REVIEW)
            with long.batch():
                for index in range(12):
                    long.note(f"n{index}", index)
            short.note("a", 1)
            recorder = engine.store.recorder
            assert isinstance(recorder, PostgresRecorder)
            pages = list(recorder.select_run_pages([long.id, short.id], page=5))
            assert [len(page) for page in pages] == [5, 5, 5]
            got = [(s.originator_id, s.originator_version) for page in pages for s in page]
            assert got == sorted(
                [*((long.id, v) for v in range(1, 14)), (short.id, 1), (short.id, 2)]
            )
            assert [
                (s.originator_id, s.originator_version)
                for s in recorder.select_runs([long.id, short.id])
            ] == got

    def test_forgetting_reads_whole_runs_within_a_budget(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A page deleting runs longer than the budget reads only whole runs at once (the
        rest run by run), and the forgetting projection still equals a rebuild."""
        monkeypatch.setattr(persistent, "GONE_EVENTS", 8)
        monkeypatch.setattr(recorder_module, "RUNS_PAGE", 3)
        with Engine(postgres_url) as engine:
            engine.projections.register(FailureCount)
            runs = []
            for length in (2, 9, 3, 4):
                run = engine.start_run(LOOP)
                for _ in range(length):
                    run.stage_failed("a", error=RuntimeError("broke"))
                runs.append(run)
            engine.projections.catch_up()
            deletions: list[Event] = [run.finish("deleted") for run in runs]
            gone = engine.projections._deleted_runs([FailureCount.name], deletions)
            assert sum(len(got) for got in gone.values()) <= 8 + 3
            for run_id, got in gone.items():  # only whole runs
                assert [e.version for e in got] == list(range(1, len(engine.events(run_id)) + 1))
            assert len(gone) < len(deletions)
            engine.projections.catch_up()
            after = engine.projections.states(FailureCount.name)
            assert not any(after.values())
            engine.projections.rebuild(FailureCount.name)
            assert engine.projections.states(FailureCount.name) == after


class TestEraseAgainstTheAppendFunction:
    def test_an_append_waiting_on_an_erase_finds_its_run_gone(self, postgres_url: str) -> None:
        """A call blocked by an erase's lock checks its heads after the erase commits."""
        import threading

        schema = postgres_url.rsplit("schema=", 1)[1]
        with Engine(postgres_url) as engine:
            assert engine.store.recorder.function  # type: ignore[attr-defined]
            stale = engine.start_run(REVIEW)
            failures: list[BaseException] = []
            with psycopg.connect(POSTGRES_URL) as eraser:
                eraser.execute(
                    f"LOCK TABLE {schema}.{meta.EVENTS_TABLE} IN SHARE ROW EXCLUSIVE MODE"
                )
                eraser.execute(
                    f"DELETE FROM {schema}.{meta.EVENTS_TABLE} WHERE originator_id = %s",
                    (stale.id,),
                )

                def append() -> None:
                    try:
                        stale.note("late", 1)
                    except BaseException as error:  # the thread reports it
                        failures.append(error)

                writer = threading.Thread(target=append)
                writer.start()
                with psycopg.connect(POSTGRES_URL, autocommit=True) as watcher:
                    for _ in range(3000):  # until the call waits on the erase's lock
                        row: Any = watcher.execute(
                            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                            "%s::regclass",
                            (f"{schema}.{meta.EVENTS_TABLE}",),
                        ).fetchone()
                        waiting = row[0]
                        if waiting:
                            break
                        threading.Event().wait(0.01)
                    assert waiting, "the append never waited on the erase"
                eraser.commit()
                writer.join(30)
            assert len(failures) == 1, failures
            assert isinstance(failures[0], RunErased), failures
            assert engine.store.last(stale.id) is None


@pytest.mark.usefixtures("bounded")
class TestInterruptedErase:
    def test_a_crash_between_erase_transactions_leaves_a_store_that_compacts(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """After a kill between erase transactions the run index folds again and compact resumes."""
        with Engine(postgres_url) as engine:
            total = deleted_runs(engine, [30])
            engine.runs()  # the index folded the deletion, as compact has it first
            compact_killed_after_first_erase(engine, monkeypatch)
        with Engine(postgres_url) as other:
            other.projections.rebuild("run_index")  # e.g. after an upgrade changed its code
            assert len(other.runs(status="deleted")) == 1
            assert other.compact().events == total - BOUND
            assert other.runs(status="deleted") == []

    def test_erasing_runs_already_gone_or_of_one_event_deletes_what_is_there(
        self, postgres_url: str
    ) -> None:
        """A resumed erase passes runs with no events left (and short ones) without error."""
        with Engine(postgres_url) as engine:
            deleted_runs(engine, [1, 20])
            runs = [s.run_id for s in engine.runs(status="deleted")]
            datastore = engine.store.recorder.datastore  # type: ignore[attr-defined]
            assert postgres_open.erase_runs(datastore, None, runs) == 23
            assert postgres_open.erase_runs(datastore, None, [*runs, runs[0]]) == 0
