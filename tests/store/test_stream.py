"""A run's stream: events built as they are taken, a page read at a time, narrowed by folds."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from engine import Engine
from engine.store.errors import StoreError
from engine.store.event_store import PAGE
from engine.store.mapper import EventMapper
from engine.store.meta import EVENTS_TABLE
from events import Event, StageCompleted, StageFailed
from projections import BUILT_INS, TaskTable, handled_topics
from tests.store.test_lean_read import KEY, LOOP
from tests.store.test_schema_evolution import CHILD, OPEN, REVIEW, STORE

OUTCOMES = PAGE + 700
"""Outcomes recorded: the run spans three pages."""


@pytest.fixture(params=["memory", "sqlite", "sqlite-sealed", "postgres", "postgres-sealed"])
def sealed_or_not(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine over each backend, SQLite and PostgreSQL also compressed and encrypted."""
    kind = str(request.param)
    if kind == "memory":
        url = "memory://"
    elif kind.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    sealed = kind.endswith("-sealed")
    if sealed:
        url += ("&" if "?" in url else "?") + "compress=zlib"
    with Engine(url, cipher_key=KEY if sealed else None) as engine:
        yield engine


def recorded(engine: Engine) -> UUID:
    """A loop run of every kind of outcome, tasks, notes and a rollback, over three pages."""
    run = engine.start_run(LOOP, labels={"team": "a"})
    with run.batch():
        run.add_task("t1", title="first")
        for index in range(OUTCOMES):
            if index % 7 == 6:
                run.stage_failed("work", f"boom {index % 3}", error_type="Boom", duration=2.5)
            else:
                run.stage_started("work")
                run.stage_completed("work", {"n": index, "f": index / 8}, duration=1.0)
            if index % 500 == 0:
                run.note("strategy", {"at": index})
        run.task_started("t1")
        run.task_completed("t1", result={"ok": True})
        run.spend(0.25)
    run.rollback(steps=3, reason="undo")
    return run.id


def read_eagerly(engine: Engine, run_id: UUID) -> list[Event]:
    """The run's events by `Store.read`, a whole page decoded at once (not the stream)."""
    events: list[Event] = []
    while True:
        page = engine.store.read(run_id, gt=len(events), limit=PAGE)
        events += page
        if len(page) < PAGE:
            return events


class TestStreamFolds:
    def test_every_built_in_projection_folds_the_stream_as_the_events_read(
        self, sealed_or_not: Engine
    ) -> None:
        """Each built-in projection folds a stream (narrowed, built as taken) to the state the
        same events read page by page give, on every backend, sealed or not."""
        run_id = recorded(sealed_or_not)
        events = read_eagerly(sealed_or_not, run_id)
        assert list(sealed_or_not.store.stream(run_id)) == events
        for cls in BUILT_INS:
            streamed = cls().fold(sealed_or_not.store.stream(run_id))
            assert streamed == cls().fold(events), cls.name

    def test_a_narrowed_stream_gives_the_events_of_its_topics_only(
        self, sealed_or_not: Engine
    ) -> None:
        """`narrowed` keeps every event of the topics given, in order, and nothing else."""
        run_id = recorded(sealed_or_not)
        events = read_eagerly(sealed_or_not, run_id)
        topics = {StageFailed.topic, StageCompleted.topic}
        narrowed = list(sealed_or_not.store.stream(run_id).narrowed(topics))
        assert narrowed == [event for event in events if event.topic in topics]
        assert len(narrowed) == OUTCOMES


class TestNarrowing:
    def test_pages_all_or_partly_of_the_topics_give_those_events_in_order(
        self, sqlite_url: str
    ) -> None:
        """A narrowed stream whose first page holds an event of a topic left out, and whose
        later pages hold none, gives every event of the topics kept, in order."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            events = read_eagerly(engine, run_id)
            kept = {event.topic for event in events} - {events[0].topic}
            narrowed = list(engine.store.stream(run_id).narrowed(kept))
        assert narrowed == events[1:]
        assert events[0].topic not in {event.topic for event in events[1:]}

    def test_a_fold_decodes_only_the_events_its_handlers_take(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fold of a stream has the mapper build only the events of its handled topics."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            expected = TaskTable().fold(read_eagerly(engine, run_id))
            mapper = engine.store.mapper
            decoded, topics = mapper.decoded, set[str]()

            def counted(run: UUID, rows: Any, *rest: Any) -> Iterator[Event]:
                topics.update(row[1] for row in rows)
                return decoded(run, rows, *rest)

            monkeypatch.setattr(mapper, "decoded", counted)
            assert TaskTable().fold(engine.store.stream(run_id)) == expected
        handled = handled_topics(TaskTable())
        assert handled is not None
        assert topics
        assert topics <= handled

    def test_a_stream_already_begun_is_not_narrowed(self, sqlite_url: str) -> None:
        """Once an event was taken, `narrowed` gives the stream itself, which goes on."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            stream = engine.store.stream(run_id)
            first = next(stream)
            assert stream.narrowed({StageFailed.topic}) is stream
            assert [first, *stream] == read_eagerly(engine, run_id)


class TestLaziness:
    def test_a_page_is_read_only_when_the_stream_reaches_it(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Nothing is read before the first event is taken, the next page only after the
        page before it was taken whole: a fold holds one page of rows at a time."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            recorder: Any = engine.store.recorder
            select, reads = recorder.select_rows, []

            def counted(*args: Any, **kwargs: Any) -> Any:
                reads.append(kwargs.get("gt"))
                return select(*args, **kwargs)

            monkeypatch.setattr(recorder, "select_rows", counted)
            stream = engine.store.stream(run_id)
            assert reads == []
            for _ in range(PAGE):
                next(stream)
            assert reads == [0]
            next(stream)
            assert reads == [0, PAGE]

    def test_an_unreadable_event_fails_the_stream_where_it_is_reached(self, tmp_path: Path) -> None:
        """The events before an unreadable one are given; it fails naming its run and version."""
        path = tmp_path / "runs.db"
        with Engine(f"sqlite:///{path}") as engine:
            run_id = recorded(engine)
            expected = read_eagerly(engine, run_id)[: PAGE + 9]
        with sqlite3.connect(path) as connection:
            connection.execute(
                f"UPDATE {EVENTS_TABLE} SET state = ? WHERE originator_version = ?",
                (b'{"stage": 5}', PAGE + 10),
            )
        connection.close()
        taken: list[Event] = []
        with (
            Engine(f"sqlite:///{path}", create=False) as engine,
            pytest.raises(StoreError, match=rf"run {run_id} version {PAGE + 10}"),
        ):
            taken.extend(engine.store.stream(run_id))  # keeps what it took before
        assert taken == expected


class TestUpcasting:
    @pytest.mark.parametrize("run_id", [REVIEW, CHILD, OPEN])
    def test_a_stream_of_first_schema_events_folds_as_each_event_decoded_alone(
        self, tmp_path: Path, run_id: UUID
    ) -> None:
        """Events of the oldest class versions stream upcast, as `to_domain_event` decodes
        each alone, and every built-in projection folds them to the same state."""
        copy = tmp_path / "v1.db"
        shutil.copyfile(STORE, copy)
        with Engine(f"sqlite:///{copy}") as engine:
            mapper = engine.store.mapper
            alone = [mapper.to_domain_event(s) for s in engine.store.stored_stream(run_id)]
            assert len(alone) > 2
            assert list(engine.store.stream(run_id)) == alone
            for cls in BUILT_INS:
                assert cls().fold(engine.store.stream(run_id)) == cls().fold(alone), cls.name


class TestJoinedPages:
    @pytest.mark.parametrize("layout", ["compact", "text"])
    def test_a_page_the_database_joins_reads_as_its_rows_would(
        self, tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A stream read as pages SQLite joins into one JSON array gives the events a read of
        rows gives, ints beyond 64 bits exact (that page read as rows), narrowed or not."""
        url = f"sqlite:///{tmp_path / 'runs.db'}?layout={layout}"
        with Engine(url) as engine:
            run_id = recorded(engine)
            engine.resume(run_id).stage_completed("work", {"big": 2**70, "neg": -(2**64)})
            joined = list(engine.store.stream(run_id))
            narrowed = list(engine.store.stream(run_id).narrowed({StageFailed.topic}))
            monkeypatch.setattr(EventMapper, "reads_joined", False)
            rows = list(engine.store.stream(run_id))
        assert joined == rows
        assert joined[-1].result == {"big": 2**70, "neg": -(2**64)}  # type: ignore[attr-defined]
        assert narrowed == [event for event in rows if type(event) is StageFailed]
