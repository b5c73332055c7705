"""The SQLite recorder's lean read: eventsourcing's answers, on kept reading connections."""

from __future__ import annotations

import functools
import sqlite3
import threading
import types
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import IntegrityError, StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder

from engine import Engine, StoreError
from engine.store.sqlite.readers import ReaderConnections
from engine.store.sqlite.recorder import ONE_STATEMENT, SQLiteRecorder
from projections import StateStack
from tests._helpers import REVIEW

KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64

QUERIES: list[dict[str, Any]] = [
    {},
    {"gt": 2},
    {"lte": 4},
    {"gt": 1, "lte": 3},
    {"limit": 2},
    {"gt": 1, "limit": 2},
    {"gt": 2, "lte": 5, "limit": 1},
    {"desc": True},
    {"desc": True, "limit": 1},
    {"desc": True, "lte": 3, "limit": 2},
    {"gt": 0, "lte": 0},
    {"gt": 99},
    {"lte": -1},
    {"limit": 0},
]


@pytest.fixture(params=["compact", "text"])
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new store of each events layout: compact (the default) and text (before issue 26)."""
    return f"sqlite:///{tmp_path / 'runs.db'}?layout={request.param}"


@pytest.fixture
def stored(sqlite_url: str) -> Iterator[tuple[Engine, uuid.UUID]]:
    """A SQLite engine and a run of 6 events."""
    with Engine(sqlite_url) as engine:
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", {"score": 1})
        run.stage_completed("code_review")
        run.stage_failed("developer", "flaky")
        run.note("k", "v")
        run.stage_started("developer")
        yield engine, run.id


def recorder_of(engine: Engine) -> SQLiteRecorder:
    """The engine's SQLite recorder."""
    recorder = engine.store.recorder
    assert isinstance(recorder, SQLiteRecorder)
    return recorder


class TestSelectEvents:
    @pytest.mark.parametrize("query", QUERIES, ids=str)
    def test_same_events_as_eventsourcings_read(
        self, stored: tuple[Engine, uuid.UUID], query: dict[str, Any]
    ) -> None:
        """Every shape of query returns what eventsourcing's own select_events returns (on
        the text layout, its own table), and the same slice of the run on either layout."""
        engine, run_id = stored
        recorder = recorder_of(engine)
        theirs: Callable[..., Sequence[StoredEvent]]
        if "layout=text" in engine.url:
            theirs = types.MethodType(SQLiteApplicationRecorder.select_events, recorder)
        else:
            theirs = functools.partial(sliced, recorder.select_events(run_id))
        for asked in (run_id, run_id.hex):
            assert recorder.select_events(asked, **query) == theirs(asked, **query)
            assert recorder.select_events(asked, **query) == sliced(
                recorder.select_events(run_id), asked, **query
            )

    def test_an_unknown_run_has_no_events(self, stored: tuple[Engine, uuid.UUID]) -> None:
        """A run id the store never saw reads as no events, not an error."""
        engine, _ = stored
        assert recorder_of(engine).select_events(uuid.uuid4()) == []

    def test_rows_carry_the_run_id_as_a_uuid(self, stored: tuple[Engine, uuid.UUID]) -> None:
        """Each StoredEvent names its run by UUID, whichever spelling was asked."""
        engine, run_id = stored
        for asked in (run_id, str(run_id), run_id.hex):
            events = recorder_of(engine).select_events(asked)
            assert {e.originator_id for e in events} == {run_id}
            assert [e.originator_version for e in events] == [1, 2, 3, 4, 5, 6]

    def test_another_writers_commit_is_read_at_once(
        self, stored: tuple[Engine, uuid.UUID], sqlite_url: str
    ) -> None:
        """A kept reading connection holds no snapshot: another engine's append shows."""
        engine, run_id = stored
        assert engine.store.last(run_id).version == 6  # type: ignore[union-attr]
        with Engine(sqlite_url) as other:
            other.load(run_id).note("from", "other")
        assert engine.store.last(run_id).version == 7  # type: ignore[union-attr]

    @pytest.mark.parametrize("options", ["?compress=zlib", ""], ids=["compressed", "plain"])
    def test_encrypted_events_are_decoded_by_the_mapper(self, tmp_path: Path, options: str) -> None:
        """The lean read hands the stored bytes to the store's mapper: decrypted, decompressed."""
        url = f"sqlite:///{tmp_path / 'secret.db'}{options}"
        with Engine(url, cipher_key=KEY) as engine:
            run = engine.start_run(REVIEW, params={"card": "SECRET-1"})
            run.stage_completed("project_analysis", {"token": "x" * 500})
            assert isinstance(engine.store.recorder, SQLiteRecorder)
            events = engine.events(run.id)
        assert events[0].params == {"card": "SECRET-1"}  # type: ignore[attr-defined]
        assert events[1].result == {"token": "x" * 500}  # type: ignore[attr-defined]
        assert b"SECRET-1" not in (tmp_path / "secret.db").read_bytes()

    def test_idle_readers_hold_back_no_checkpoint(
        self, stored: tuple[Engine, uuid.UUID], tmp_path: Path
    ) -> None:
        """After its reads, no kept connection is in a transaction: the WAL truncates fully."""
        engine, run_id = stored
        for _ in range(3):
            engine.events(run_id)
            engine.project(run_id, StateStack, at=2)
        with sqlite3.connect(tmp_path / "runs.db") as conn:
            busy, frames, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert (busy, frames, done) == (0, 0, 0)

    def test_threads_read_at_once(self, stored: tuple[Engine, uuid.UUID]) -> None:
        """Eight threads reading together each get the whole run, on connections of their own."""
        engine, run_id = stored
        results: list[list[int]] = []

        def read() -> None:
            for _ in range(50):
                results.append([e.version for e in engine.events(run_id)])

        threads = [threading.Thread(target=read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [[1, 2, 3, 4, 5, 6]] * 400

    def test_a_read_after_close_is_a_store_error(self, sqlite_url: str) -> None:
        """Reading a closed store is one StoreError, not a reopened connection."""
        engine = Engine(sqlite_url)
        run = engine.start_run(REVIEW)
        engine.close()
        with pytest.raises(StoreError, match="read failed: Cannot operate on a closed database"):
            engine.store.read(run.id)


class TestSelectRows:
    @pytest.mark.parametrize("query", QUERIES, ids=str)
    def test_the_same_bytes_as_select_events(
        self, stored: tuple[Engine, uuid.UUID], query: dict[str, Any]
    ) -> None:
        """The lean read returns each event's version, topic text and stored bytes exactly
        as select_events does, on either layout, as plain tuples."""
        engine, run_id = stored
        recorder = recorder_of(engine)
        rows = recorder.select_rows(run_id, **query)
        events = recorder.select_events(run_id, **query)
        assert rows == [(e.originator_version, e.topic, e.state) for e in events]
        assert all(type(row) is tuple and type(row[2]) is bytes for row in rows)

    def test_the_store_pages_rows_as_it_pages_events(
        self, stored: tuple[Engine, uuid.UUID], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run longer than a page reads, a page at a time, as the same rows as its
        StoredEvents, and through the lean read alone (no StoredEvent made)."""
        engine, run_id = stored
        monkeypatch.setattr("engine.store.event_store.PAGE", 4)
        events = [e for page in engine.store.stored_pages(run_id) for e in page]

        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError("the lean read went through select_events")

        monkeypatch.setattr(recorder_of(engine), "select_events", refused)
        pages = list(engine.store.stored_rows(run_id))
        assert [len(page) for page in pages] == [4, 2]
        assert [r for page in pages for r in page] == [
            (e.originator_version, e.topic, e.state) for e in events
        ]


class TestReaderConnections:
    def test_a_connection_given_back_is_lent_again(self, tmp_path: Path) -> None:
        """The next read reuses the idle connection instead of opening one."""
        readers = ReaderConnections(f"file:{tmp_path / 'a.db'}", 1)
        first = readers.borrow()
        readers.give_back(first)
        assert readers.borrow() is first
        readers.close()

    def test_connections_in_use_are_never_shared(self, tmp_path: Path) -> None:
        """Two reads at once get two connections."""
        readers = ReaderConnections(f"file:{tmp_path / 'a.db'}", 1)
        assert readers.borrow() is not readers.borrow()
        readers.close()

    def test_no_more_than_keep_are_kept_idle(self, tmp_path: Path) -> None:
        """A connection given back while `keep` are idle is closed, not kept."""
        readers = ReaderConnections(f"file:{tmp_path / 'a.db'}", 1, keep=2)
        lent = [readers.borrow() for _ in range(3)]
        for connection in lent:
            readers.give_back(connection)
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            lent[2].execute("SELECT 1")
        assert {readers.borrow(), readers.borrow()} == set(lent[:2])
        readers.close()

    def test_close_closes_kept_and_lent_connections(self, tmp_path: Path) -> None:
        """close closes the idle ones at once and a lent one when it comes back; borrow fails."""
        readers = ReaderConnections(f"file:{tmp_path / 'a.db'}", 1)
        idle, lent = readers.borrow(), readers.borrow()
        readers.give_back(idle)
        readers.close()
        readers.give_back(lent)
        for connection in (idle, lent):
            with pytest.raises(sqlite3.ProgrammingError, match="closed"):
                connection.execute("SELECT 1")
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            readers.borrow()

    def test_a_read_only_uri_stays_read_only(self, tmp_path: Path) -> None:
        """A connection opened on a mode=ro URI refuses to write."""
        path = tmp_path / "a.db"
        sqlite3.connect(path).close()
        readers = ReaderConnections(f"file:{path}?mode=ro", 1)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            readers.borrow().execute("CREATE TABLE t (x)")
        readers.close()


def stored_events(run_id: uuid.UUID, versions: range) -> list[StoredEvent]:
    """Raw stored events of one run at `versions` (the recorder does not decode them)."""
    return [StoredEvent(run_id, v, "t", f'{{"v":{v}}}'.encode()) for v in versions]


def sliced(
    events: Sequence[StoredEvent],
    asked: object,
    *,
    gt: int | None = None,
    lte: int | None = None,
    desc: bool = False,
    limit: int | None = None,
) -> list[StoredEvent]:
    """What select_events means: a run's `events` with gt < version <= lte, ordered, limited."""
    low, high = -1 if gt is None else gt, float("inf") if lte is None else lte
    kept = [e for e in events if low < e.originator_version <= high]
    kept.sort(key=lambda e: e.originator_version, reverse=desc)
    return kept if limit is None else kept[:limit]


def rowids(engine: Engine, run_id: uuid.UUID) -> list[int]:
    """The notification ids (rowids) the file holds for the run, by version."""
    path = engine.url.removeprefix("sqlite:///").split("?")[0]
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT rowid FROM stagetrail_events WHERE originator_id=? ORDER BY originator_version",
            (recorder_of(engine).run_key(run_id),),
        )
        return [rowid for (rowid,) in rows]


class TestOneStatementAppend:
    @pytest.mark.parametrize("count", [1, 2, 7, ONE_STATEMENT, ONE_STATEMENT + 1, 450])
    def test_the_ids_returned_are_the_rows_stored(self, sqlite_url: str, count: int) -> None:
        """One INSERT or a transaction of many: each event's notification id is its rowid."""
        with Engine(sqlite_url) as engine:
            recorder = recorder_of(engine)
            other = uuid.uuid4()
            recorder.insert_events(stored_events(other, range(1, 4)))
            run_id = uuid.uuid4()
            ids = recorder.insert_events(stored_events(run_id, range(1, count + 1)))
            assert list(ids or ()) == rowids(engine, run_id)
            assert len(rowids(engine, run_id)) == count

    def test_a_taken_version_stores_nothing_of_the_batch(self, sqlite_url: str) -> None:
        """A conflict on the batch's last row leaves none of its rows: the statement is atomic."""
        with Engine(sqlite_url) as engine:
            recorder = recorder_of(engine)
            run_id = uuid.uuid4()
            recorder.insert_events(stored_events(run_id, range(5, 6)))
            with pytest.raises(IntegrityError):
                recorder.insert_events(stored_events(run_id, range(1, 6)))
            assert [e.originator_version for e in recorder.select_events(run_id)] == [5]

    def test_two_engines_appending_in_turn_get_their_own_ids(self, sqlite_url: str) -> None:
        """Batches from two connections to one file interleave without sharing an id."""
        with Engine(sqlite_url) as one, Engine(sqlite_url) as two:
            runs = [uuid.uuid4(), uuid.uuid4()]
            returned: dict[uuid.UUID, list[int]] = {run: [] for run in runs}
            for version in range(1, 30, 3):
                for engine, run in zip((one, two), runs, strict=True):
                    batch = stored_events(run, range(version, version + 3))
                    returned[run] += recorder_of(engine).insert_events(batch) or []
            for run in runs:
                assert returned[run] == rowids(one, run)
            assert not set(returned[runs[0]]) & set(returned[runs[1]])
