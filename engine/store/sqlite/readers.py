"""The connections a process reads one SQLite store through, one caller at a time each."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

KEEP = 4
"""Idle reading connections kept per store (eventsourcing's pool keeps 2 for all uses)."""


class ReaderConnections:
    """Connections kept for reading one database, lent to one caller at a time.

    A connection is opened when every kept one is in use (so threads never share
    one), returned after its read, and closed by `close`; they hold no
    transaction between reads, so they never hold back a WAL checkpoint.

    Args:
        uri: the database as a ``file:`` URI (``mode=ro`` for a read-only store:
            a reader never changes the file, nor its journal mode).
        timeout: seconds to wait for a lock (WAL recovery) before failing.
        keep: idle connections kept at most; one given back beyond them is
            closed, so a burst of reading threads leaves no open files behind.
        rows: the connections' row factory (None: tuples, the cheapest).
    """

    def __init__(
        self,
        uri: str,
        timeout: float,
        keep: int = KEEP,
        rows: Callable[[sqlite3.Cursor, tuple[Any, ...]], Any] | None = None,
    ) -> None:
        self.uri = uri
        self.timeout = timeout
        self.keep = keep
        self.rows = rows
        self._idle: list[sqlite3.Connection] = []
        self._closed = False

    def borrow(self) -> sqlite3.Connection:
        """An idle connection, or a new one.

        Raises:
            sqlite3.ProgrammingError: the connections were closed.
        """
        if self._closed:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
        try:
            return self._idle.pop()  # list.pop and append are atomic: no lock needed
        except IndexError:
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        # Autocommit (no BEGIN): each SELECT is its own read transaction, ended with it.
        # A connection moves between threads (never used by two at once).
        connection = sqlite3.connect(
            self.uri, uri=True, timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        connection.row_factory = self.rows
        return connection

    def give_back(self, connection: sqlite3.Connection) -> None:
        """Keep `connection` for the next read (or close it: `keep` are idle, or closed)."""
        if len(self._idle) >= self.keep:
            connection.close()
            return
        self._idle.append(connection)
        if self._closed:  # close ran while it was lent: it was not there to be closed
            self._drain()

    def close(self) -> None:
        """Close every kept connection; reads after this fail."""
        self._closed = True
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return
