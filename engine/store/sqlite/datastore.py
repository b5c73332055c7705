"""The SQLite datastore: eventsourcing's, with one kept writing connection, or read-only."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import quote

from eventsourcing.sqlite import SQLiteDatastore

from engine.store.sqlite.writer import WriterConnection

LOCK_TIMEOUT = 30
"""Seconds a writer waits for another process's write lock before "database is locked"."""


class Datastore(SQLiteDatastore):
    """eventsourcing's SQLite datastore: write transactions IMMEDIATE, or the file read-only.

    Args:
        path: the store file.
        read_only: open the file read-only (``mode=ro``), never switching its
            journal mode: a read must not change a file, ours or another program's.
    """

    def __init__(self, path: str, *, read_only: bool) -> None:
        name = read_only_uri(path) if read_only else f"file:{quote(os.path.abspath(path))}"
        super().__init__(db_name=name, pool_size=2, max_overflow=8, lock_timeout=LOCK_TIMEOUT)
        if read_only:  # the pool would otherwise switch the file to WAL on first connect
            self.pool.is_journal_mode_wal = True
        self.writer = WriterConnection(name, LOCK_TIMEOUT)

    def transaction(self, *, commit: bool) -> AbstractContextManager[Any]:  # type: ignore[override]
        """A transaction: a committing one on the writing connection, from BEGIN IMMEDIATE."""
        if commit:
            return self.writer.transaction()
        return super().transaction(commit=False)

    def close(self) -> None:
        """Close the writing connection and eventsourcing's pool."""
        self.writer.close()
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
