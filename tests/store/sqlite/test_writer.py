"""The SQLite store's one writing connection: one transaction at a time, eventsourcing's errors."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from eventsourcing.persistence import IntegrityError, OperationalError

from engine import ConcurrencyConflict, Engine, StoreError
from engine.store.sqlite.writer import WriterConnection
from tests._helpers import REVIEW


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[WriterConnection]:
    """A writer on a new database with one table ``t (k PRIMARY KEY)``."""
    path = tmp_path / "w.db"
    sqlite3.connect(path).execute("CREATE TABLE t (k INTEGER PRIMARY KEY)").connection.close()
    connection = WriterConnection(f"file:{path}", timeout=5)
    yield connection
    connection.close()


def rows(writer: WriterConnection) -> list[int]:
    """The keys committed to ``t``, read on a connection of its own."""
    path = writer.uri.removeprefix("file:")
    with sqlite3.connect(path) as conn:
        return [k for (k,) in conn.execute("SELECT k FROM t ORDER BY k")]


class TestWriterConnection:
    def test_a_transaction_commits_at_the_end_of_its_block(self, writer: WriterConnection) -> None:
        """What a block inserts is committed when the block ends, and readable elsewhere."""
        with writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
            cursor.execute("INSERT INTO t VALUES (2)")
        assert rows(writer) == [1, 2]

    def test_an_error_rolls_the_whole_block_back(self, writer: WriterConnection) -> None:
        """A block that raises leaves nothing of itself, and the next block writes."""
        with pytest.raises(RuntimeError), writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
            raise RuntimeError("stop")
        with writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (3)")
        assert rows(writer) == [3]

    def test_sqlite_errors_become_eventsourcing_errors(self, writer: WriterConnection) -> None:
        """A duplicate key is eventsourcing's IntegrityError (the store's conflict), rolled back."""
        with writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(IntegrityError), writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (2)")
            cursor.execute("INSERT INTO t VALUES (1)")
        assert rows(writer) == [1]

    def test_threads_take_turns(self, writer: WriterConnection) -> None:
        """Eight threads writing at once each commit all of their rows, none lost."""

        def insert(first: int) -> None:
            for k in range(first, first + 50):
                with writer.transaction() as cursor:
                    cursor.execute("INSERT INTO t VALUES (?)", (k,))

        threads = [threading.Thread(target=insert, args=(n * 50,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert rows(writer) == list(range(400))

    def test_a_nested_transaction_fails_instead_of_waiting_forever(self, tmp_path: Path) -> None:
        """A thread that begins a write inside its own gets a clear error after the timeout."""
        path = tmp_path / "w.db"
        sqlite3.connect(path).close()
        writer = WriterConnection(f"file:{path}", timeout=0.05)
        with writer.transaction(), pytest.raises(OperationalError, match="write connection"):
            writer.transaction().__enter__()
        writer.close()

    def test_a_closed_writer_refuses_to_write(self, writer: WriterConnection) -> None:
        """After close, a transaction fails with an error saying the database is closed."""
        with writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
        writer.close()
        with pytest.raises(OperationalError, match="closed"), writer.transaction():
            pass

    def test_insert_commits_at_once_and_gives_the_last_row_id(
        self, writer: WriterConnection
    ) -> None:
        """`insert` is one statement, committed when it returns; it gives the last row's id."""
        assert writer.insert("INSERT INTO t VALUES (?), (?)", [4, 7]) == 7
        assert writer.insert("INSERT INTO t VALUES (?)", [9]) == 9
        assert rows(writer) == [4, 7, 9]

    def test_a_failed_insert_is_an_eventsourcing_error_and_leaves_nothing(
        self, writer: WriterConnection
    ) -> None:
        """A duplicate row in a multi-row insert is IntegrityError; none of its rows stay."""
        writer.insert("INSERT INTO t VALUES (?)", [1])
        with pytest.raises(IntegrityError):
            writer.insert("INSERT INTO t VALUES (?), (?)", [2, 1])
        assert writer.insert("INSERT INTO t VALUES (?)", [3]) == 3  # the lock was given back
        assert rows(writer) == [1, 3]

    def test_insert_after_close_is_refused(self, writer: WriterConnection) -> None:
        """After close, an insert fails with an error saying the database is closed."""
        writer.insert("INSERT INTO t VALUES (?)", [1])
        writer.close()
        with pytest.raises(OperationalError, match="closed"):
            writer.insert("INSERT INTO t VALUES (?)", [2])


class TestReadIfIdle:
    def test_an_idle_writer_reads_what_another_connection_committed(
        self, writer: WriterConnection
    ) -> None:
        """After its own write, the writing connection reads another connection's commit."""
        with writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
        path = writer.uri.removeprefix("file:")
        with sqlite3.connect(path) as other:
            other.execute("INSERT INTO t VALUES (2)")
        read = writer.read_if_idle(lambda cursor: cursor.execute("SELECT k FROM t").fetchall())
        assert [k for (k,) in read or []] == [1, 2]

    def test_a_busy_or_unopened_writer_reads_nothing(self, writer: WriterConnection) -> None:
        """With a transaction holding it, or no connection opened yet, it never waits: None."""
        select = "SELECT count(*) FROM t"
        assert writer.read_if_idle(lambda cursor: cursor.execute(select).fetchone()) is None
        with writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
            held = threading.Thread(
                target=lambda: found.append(writer.read_if_idle(lambda c: 1)), daemon=True
            )
            found: list[object] = []
            held.start()
            held.join(5)
            assert found == [None]
        assert writer.read_if_idle(lambda cursor: cursor.execute(select).fetchone()[0]) == 1

    def test_a_transaction_left_open_is_not_read(self, writer: WriterConnection) -> None:
        """A transaction left open on the writing connection (as after a COMMIT that failed)
        is never read through: its rows were not committed."""
        with writer.transaction() as cursor:
            cursor.execute("INSERT INTO t VALUES (1)")
        writer.read_if_idle(lambda cursor: cursor.execute("BEGIN"))
        assert writer.read_if_idle(lambda cursor: cursor.execute("SELECT 1").fetchone()) is None


class TestStoreWrites:
    def test_every_append_goes_through_the_kept_connection(self, tmp_path: Path) -> None:
        """A run's appends reuse one connection: its statement cache holds the INSERT."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            run = engine.start_run(REVIEW)
            writer = engine.store.recorder.datastore.writer  # type: ignore[attr-defined]
            first = writer._connection
            run.stage_completed("project_analysis")
            run.stage_completed("code_review")
            assert first is not None
            assert writer._connection is first
            assert [e.version for e in engine.events(run.id)] == [1, 2, 3]

    def test_a_conflict_is_still_a_conflict(self, tmp_path: Path) -> None:
        """Two handles on one run: the second append at a taken version is a ConcurrencyConflict."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            run = engine.start_run(REVIEW)
            other = engine.load(run.id)
            run.stage_completed("project_analysis")
            with pytest.raises(ConcurrencyConflict):
                other.stage_completed("project_analysis")
            assert len(engine.events(run.id)) == 2

    def test_an_engine_that_wrote_sees_another_engines_erasure(self, tmp_path: Path) -> None:
        """The erasure generation, read on the writing connection after a write, is current."""
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        with Engine(url) as writer, Engine(url) as other:
            run = writer.start_run(REVIEW)
            run.stage_completed("project_analysis")
            assert writer.store.generation() == 0
            other.load(run.id).finish("deleted")
            other.compact()
            assert writer.store.generation() == 1

    def test_a_closed_engine_refuses_appends_with_a_store_error(self, tmp_path: Path) -> None:
        """An append after the engine closed is one StoreError; nothing is written."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        engine = Engine(url)
        run = engine.start_run(REVIEW)
        engine.close()
        with pytest.raises(StoreError):
            run.stage_completed("project_analysis")
        with Engine(url) as again:
            assert len(again.events(run.id)) == 1
