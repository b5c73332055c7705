"""The one connection a process writes a SQLite store through, taken by one transaction at a time.

SQLite lets one transaction write a database at a time, and eventsourcing's
pool already lends its writing connection to one caller at a time. Lending it
costs more than the ``INSERT`` itself: the pool's semaphore, reader-writer
lock and condition on each side, and its connections keep one compiled
statement (``cached_statements=True`` is a cache of one), so ``BEGIN``,
``INSERT`` and ``COMMIT`` compile again on every append. A store's writes
(events, tracking records, the views' tables) go through one kept connection
instead, behind a lock, with sqlite3's default statement cache; every
transaction is still eventsourcing's `SQLiteTransaction` (its error classes),
begun ``IMMEDIATE``, and an append of events is a single ``INSERT`` that is its
own transaction (`Statement`). Reads stay on eventsourcing's pool and the
recorder's reading connections, but for small reads right after a write (`read_if_idle`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, TypeVar

from eventsourcing.persistence import OperationalError
from eventsourcing.sqlite import SQLiteConnection, SQLiteCursor, SQLiteTransaction

_T = TypeVar("_T")


class ImmediateTransaction(SQLiteTransaction):
    """A write transaction that takes the write lock when it begins.

    eventsourcing begins every transaction DEFERRED: one that reads, then writes
    (creating a store, registering a projection) cannot wait for the lock in WAL
    mode when another process committed in between, and fails at once with
    "database is locked". BEGIN IMMEDIATE waits its turn (the busy timeout) instead.
    """

    def __enter__(self) -> SQLiteCursor:
        cursor = self.connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        return cursor


class Statement(SQLiteTransaction):
    """One statement on an autocommit connection: SQLite's own transaction, committed as it ends.

    A single ``INSERT`` of several rows is atomic and durable by itself (its
    implicit transaction takes the write lock as it starts, waiting for it as
    ``BEGIN IMMEDIATE`` does, and commits before the call returns); without
    ``BEGIN`` and ``COMMIT`` around it, an append is one call into SQLite, not
    three. Errors are mapped to eventsourcing's classes as in any transaction.
    """

    def __enter__(self) -> SQLiteCursor:
        return self.connection.cursor()


class WriterConnection:
    """A kept connection for writing one database, lent to one transaction at a time.

    Args:
        uri: the database as a ``file:`` URI.
        timeout: seconds a transaction waits for another (in this process, then
            in any process: SQLite's busy timeout) before failing.
    """

    def __init__(self, uri: str, timeout: float) -> None:
        self.uri = uri
        self.timeout = timeout
        self._lock = threading.Lock()
        self._connection: SQLiteConnection | None = None
        self._cursor: sqlite3.Cursor | None = None  # kept for `insert`, with the connection
        self._closed = False

    def transaction(self) -> WriteTransaction:
        """A write transaction (``BEGIN IMMEDIATE``), committed at the block's end."""
        return WriteTransaction(self, ImmediateTransaction)

    def statement(self) -> WriteTransaction:
        """A block for one writing statement, its own transaction (see `Statement`)."""
        return WriteTransaction(self, Statement)

    def insert(self, sql: str, params: Sequence[Any]) -> int | None:
        """Execute one ``INSERT``, its own transaction (see `Statement`); the last row id
        (None: it inserted no row).

        The append hot path: one kept cursor, no transaction objects. An error is
        mapped to eventsourcing's classes by `Statement`, as in `statement()`.

        Raises:
            IntegrityError, OperationalError, ...: eventsourcing's, as a transaction raises.
        """
        connection = self.acquire()
        try:
            cursor = self._cursor or self._open_cursor(connection)
            cursor.execute(sql, params)
            return cursor.lastrowid if cursor.rowcount else None
        except sqlite3.Error as error:
            Statement(connection, commit=True).__exit__(type(error), error, error.__traceback__)
            raise  # pragma: no cover - the line above always raises
        finally:
            self._lock.release()

    def _open_cursor(self, connection: SQLiteConnection) -> sqlite3.Cursor:
        self._cursor = connection.cursor().sqlite_cursor
        return self._cursor

    def close(self) -> None:
        """Close the connection once no transaction holds it; later writes fail."""
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = self._cursor = None

    def acquire(self) -> SQLiteConnection:
        """Take the connection (opened on first use) for one transaction.

        Raises:
            OperationalError: another transaction of this process held it for
                `timeout` seconds, or the connections were closed.
        """
        if not self._lock.acquire(timeout=self.timeout):
            raise OperationalError(
                f"database is locked: another thread of this process held the store's "
                f"write connection for {self.timeout:g} s"
            )
        try:
            return self._connection or self._connect()
        except BaseException:
            self._lock.release()
            raise

    def release(self) -> None:
        """Give the connection back after its transaction ended."""
        self._lock.release()

    def read_if_idle(self, read: Callable[[sqlite3.Cursor], _T]) -> _T | None:
        """`read` on the writing connection if it is open and no transaction holds it, else None.

        Each commit of another connection makes a reading connection drop its page
        cache, so the first read after this process wrote pays for reloading pages; the
        writing connection made that commit and its cache is current. A small read
        that follows a write (the store's erasure generation) costs several times less
        here. It never waits: with the connection busy or not open, the caller reads
        elsewhere.
        """
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._connection is None:
                return None
            cursor = self._connection.cursor().sqlite_cursor
            try:
                # a transaction left open (a COMMIT that failed) would show uncommitted rows
                return None if cursor.connection.in_transaction else read(cursor)
            finally:
                cursor.close()  # an unfinished SELECT would hold a read snapshot on the writer
        finally:
            self._lock.release()

    def _connect(self) -> SQLiteConnection:
        if self._closed:
            raise OperationalError("Cannot operate on a closed database.")
        try:
            # Autocommit: the transaction says BEGIN IMMEDIATE and COMMIT itself.
            raw = sqlite3.connect(
                self.uri, uri=True, timeout=self.timeout, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
        except sqlite3.Error as error:
            raise OperationalError(error) from error
        raw.row_factory = sqlite3.Row  # rows by name, as on eventsourcing's connections
        self._connection, self._cursor = SQLiteConnection(raw, max_age=None), None
        return self._connection


class WriteTransaction:
    """The context of `WriterConnection.transaction` and `statement`: the cursor of one commit."""

    __slots__ = ("_cursor", "_kind", "_transaction", "_writer")

    def __init__(self, writer: WriterConnection, kind: type[SQLiteTransaction]) -> None:
        self._writer, self._kind = writer, kind
        self._transaction: SQLiteTransaction | None = None
        self._cursor: SQLiteCursor | None = None

    def __enter__(self) -> sqlite3.Cursor:
        connection = self._writer.acquire()
        try:
            self._transaction = self._kind(connection, commit=True)
            self._cursor = self._transaction.__enter__()
        except BaseException:
            self._writer.release()
            raise
        return self._cursor.sqlite_cursor

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self._transaction is not None
        assert self._cursor is not None
        try:
            self._cursor.__exit__()
            self._transaction.__exit__(kind, error, trace)  # commits, or rolls back and raises
        finally:
            self._writer.release()
