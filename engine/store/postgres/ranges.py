"""Reading a run's versions by range over a connection of its own: what checking a long
run's hash chain streams, in this process or in worker processes (`engine.store.chain_workers`).

One query per range, its rows streamed a page at a time (libpq's chunked rows, or a
server-side cursor where the client library predates them): the server sends the next
page while the client hashes this one, where reading page by page waits a round trip
and a query for each. Each reader is picklable (the store's URL, the password with it:
a worker process opens its own connection, as the process that started it does).
"""

from __future__ import annotations

import itertools
from collections.abc import Generator
from typing import Any
from uuid import UUID

from engine.store import meta
from engine.store.chain import StoredRow
from engine.store.postgres.datastore import connect, schema_of
from engine.store.urls import StoreURL

CHUNKED_LIBPQ = 170000
"""The first libpq whose chunked rows mode `stream(size=...)` uses (17)."""


class RangeReader:
    """Streams the rows of a run's versions `first` to `last` from the store at `url`."""

    def __init__(self, url: StoreURL) -> None:
        self.url = url
        self._connection: Any = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as the URL alone: a connection never crosses into another process."""
        return {"url": self.url}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled unconnected (it connects at its first read)."""
        self.url, self._connection = state["url"], None

    def pages(
        self, run_id: UUID, first: int, last: int, size: int
    ) -> Generator[list[StoredRow], None, None]:
        """The run's rows with `first <= version <= last`, in version order, `size` a page.

        Raises:
            StoreError: the server cannot be reached.
            psycopg.Error: the read failed.
        """
        from psycopg.rows import tuple_row
        from psycopg.sql import SQL, Identifier

        statement = SQL(
            "SELECT originator_version, topic, state FROM {} WHERE originator_id = %s "
            "AND originator_version >= %s AND originator_version <= %s "
            "ORDER BY originator_version"
        ).format(Identifier(schema_of(self.url), meta.EVENTS_TABLE))
        connection = self._connected()
        params = (run_id, first, last)
        if _chunked():
            with connection.cursor(row_factory=tuple_row, binary=True) as cursor:
                rows = cursor.stream(statement, params, binary=True, size=size)
                yield from iter(lambda: list(itertools.islice(rows, size)), [])
            return
        with connection.transaction(), connection.cursor("range", row_factory=tuple_row) as cursor:
            cursor.execute(statement, params, binary=True)
            while page := cursor.fetchmany(size):
                yield page

    def _connected(self) -> Any:
        if self._connection is None or self._connection.closed:
            self._connection = connect(self.url)
        return self._connection

    def close(self) -> None:
        """Close its connection (a later read opens another)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _chunked() -> bool:
    """Whether psycopg's libpq streams rows in chunks (else a server-side cursor pages them)."""
    from psycopg import pq

    return pq.version() >= CHUNKED_LIBPQ
