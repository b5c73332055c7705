"""The SQLite datastore: one kept writing connection, kept reading connections, or read-only."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import quote

from eventsourcing.sqlite import SQLiteConnection, SQLiteDatastore, SQLiteTransaction

from engine.store.sqlite.readers import ReaderConnections
from engine.store.sqlite.writer import WriterConnection

LOCK_TIMEOUT = 30
"""Seconds a writer waits for another process's write lock before "database is locked"."""


class Datastore(SQLiteDatastore):
    """eventsourcing's SQLite datastore, every transaction on stagetrail's own connections.

    Writing transactions take the one writing connection (``BEGIN IMMEDIATE``),
    reading ones a kept reading connection (``BEGIN`` … ``ROLLBACK``), both with
    eventsourcing's transaction class, so its recorders raise its errors as
    before. eventsourcing's pool is never asked for a connection: it would switch
    the file to WAL on its first, and a read-only store must never be changed.

    Args:
        path: the store file.
        read_only: open the file read-only (``mode=ro``), never switching its
            journal mode: a read must not change a file, ours or another program's.
    """

    def __init__(self, path: str, *, read_only: bool) -> None:
        name = read_only_uri(path) if read_only else f"file:{quote(os.path.abspath(path))}"
        super().__init__(db_name=name, pool_size=2, max_overflow=8, lock_timeout=LOCK_TIMEOUT)
        self.uri = name
        self.writer = WriterConnection(name, LOCK_TIMEOUT)
        self.readers = ReaderConnections(name, LOCK_TIMEOUT, rows=sqlite3.Row)

    def transaction(self, *, commit: bool) -> AbstractContextManager[Any]:  # type: ignore[override]
        """A transaction: a committing one on the writing connection, from BEGIN IMMEDIATE."""
        if commit:
            return self.writer.transaction()
        return self._read()

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        """A read transaction on a kept reading connection, rolled back as it ends."""
        connection = self.readers.borrow()
        try:
            with SQLiteTransaction(SQLiteConnection(connection, max_age=None)) as cursor:
                yield cursor
        finally:
            self.readers.give_back(connection)

    def close(self) -> None:
        """Close the writing and reading connections (and eventsourcing's unused pool)."""
        self.writer.close()
        self.readers.close()
        super().close()


def read_only_uri(path: str) -> str:
    """A URI opening `path` read-only.

    A WAL file is read through its shared-memory file, which a reader creates
    when missing; where it cannot (a read-only directory or file system) and
    no writer has one open (none exists), the file cannot change while it is
    read, and SQLite is told so (``immutable=1``) instead of failing to open.
    """
    absolute = os.path.abspath(path)
    uri = f"file:{quote(absolute)}?mode=ro"
    writable = os.access(os.path.dirname(absolute), os.W_OK)
    if not writable and not os.path.exists(absolute + "-shm"):
        uri += "&immutable=1"
    return uri
