"""eventsourcing's SQLite recorder, reading a run's events with one SELECT on a kept connection.

eventsourcing reads a run through its connection pool: a reader-writer lock,
``BEGIN`` … ``ROLLBACK`` around the ``SELECT``, and a `UUID` parsed per row. For
the few events of a point-in-time question that costs twice the query itself.
Here a run's events are one ``SELECT`` in autocommit mode on a connection kept
for reading (a single statement is its own consistent snapshot in WAL mode),
and every row shares the run id already asked for. `select_events` gives
eventsourcing's `StoredEvent`s; `select_rows` the same rows as plain tuples,
which the store's stream and the chain check read (no object per row), its
mapper still decrypting, decompressing and upcasting them; every other read is
eventsourcing's. An append
is one multi-row ``INSERT`` on the store's writing connection (`engine.store.sqlite.writer`),
its own transaction, rather than ``BEGIN`` … an ``INSERT`` per event … ``COMMIT``.

A text-layout recorder can outlive its layout: ``stagetrail upgrade --in-place``
in another process rewrites the table compact, where its hex run ids and topic
names match nothing. So a read of it that finds nothing (or a row it cannot
read) looks at the meta table's layout, one small SELECT, and raises a
`StoreError` saying to open the store again rather than answer "no such run";
a read that finds rows pays nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder

from engine.store import meta
from engine.store.errors import StoreError
from engine.store.sqlite.datastore import Datastore
from engine.store.sqlite.readers import ReaderConnections
from engine.store.sqlite.writer import WriterConnection

ONE_STATEMENT = 200
"""The most events appended by one multi-row ``INSERT`` (4 parameters each: well within
the 999 parameters the oldest SQLite builds allow in a statement)."""
UPGRADED = (
    "another process upgraded the store to compact events (stagetrail upgrade --in-place) "
    "after this one opened it: open the store again"
)
"""Why a process that opened a text-layout store can no longer read or write it."""


class SQLiteRecorder(SQLiteApplicationRecorder):
    """eventsourcing's SQLite application recorder with the lean read of a run's events.

    Args:
        datastore: the store's datastore (its connections write and read).
        events_table_name: the events table.
        timeout: seconds a read waits for a lock.
        writer: the store's writing connection (None: eventsourcing's appends).
        url: the store's URL (masked) its errors name.
    """

    layout: ClassVar[str] = meta.TEXT
    """The events layout this recorder reads and writes."""

    def __init__(
        self,
        datastore: Datastore,
        events_table_name: str,
        *,
        timeout: float,
        writer: WriterConnection | None = None,
        url: str = "",
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        self.readers = ReaderConnections(datastore.uri, timeout)
        self.writer = writer
        self.url = url or datastore.uri

    def run_key(self, run_id: UUID) -> str | bytes:
        """What the events table holds for `run_id`: its 32 hex characters."""
        return run_id.hex

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Insert a batch in one ``INSERT`` of all its rows, its own transaction; their ids.

        Rows inserted by one statement under the write lock take consecutive rowids
        (each the table's largest plus one), so the last one gives them all. A batch
        too long for one statement (or a recorder without a writing connection) is
        eventsourcing's: an ``INSERT`` per event inside ``BEGIN IMMEDIATE`` … ``COMMIT``.
        """
        count = len(stored_events)
        if self.writer is None or not 0 < count <= ONE_STATEMENT:
            return super().insert_events(stored_events, **kwargs)
        params: list[Any] = []
        run_id: Any = None
        for stored in stored_events:
            if stored.originator_id is not run_id:  # a batch is mostly one run's: one hex
                run_id = stored.originator_id
                key = run_id.hex if isinstance(run_id, UUID) else run_id
            params += (key, stored.originator_version, stored.topic, stored.state)
        last = self.writer.insert(insert_statement(self.events_table_name, count), params)
        assert last is not None  # an INSERT sets it
        return list(range(last - count + 1, last + 1))

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The run's stored events with `gt < version <= lte`, in version order, at most `limit`."""
        run_id = originator_id if isinstance(originator_id, UUID) else UUID(originator_id)
        rows = self.select_rows(run_id, gt=gt, lte=lte, desc=desc, limit=limit)
        return [StoredEvent(run_id, version, topic, state) for version, topic, state in rows]

    def select_rows(
        self,
        run_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> list[tuple[int, str, bytes]]:
        """`select_events`' rows as plain (version, topic, state) tuples: the lean read of a
        streaming pass (the chain check), which needs no `StoredEvent` per row."""
        statement = select_statement(
            self.events_table_name, gt is not None, lte is not None, desc, limit is not None
        )
        params: list[Any] = [self.run_key(run_id)]
        for bound in (gt, lte, limit):  # a loop, not a generator: point-in-time reads are short
            if bound is not None:
                params.append(bound)
        connection = self.readers.borrow()
        try:
            rows = connection.execute(statement, params).fetchall()
        finally:
            self.readers.give_back(connection)
        if not rows:
            self.check_layout()
        return self.topics_named(rows)

    def topics_named(self, rows: list[Any]) -> list[tuple[int, str, bytes]]:
        """Rows as the events table holds them, each topic as its text (as this table has it)."""
        return rows

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """eventsourcing's page of notifications, refused once the table was upgraded."""
        try:
            page = super().select_notifications(
                start, limit, stop, topics, inclusive_of_start=inclusive_of_start
            )
        except (TypeError, ValueError):  # a 16-byte run id is no hex UUID
            self.check_layout()
            raise
        if not page:  # compact topic ids match no topic name
            self.check_layout()
        return page

    def check_layout(self) -> None:
        """Nothing, while the events table is still in the layout this recorder reads.

        Raises:
            StoreError: another process upgraded it to compact since this one opened it.
        """
        connection = self.readers.borrow()
        try:
            layout = meta.read_layout(connection, meta.META_TABLE)
        finally:
            self.readers.give_back(connection)
        if layout != self.layout:
            raise StoreError(self.url, UPGRADED)

    def close(self) -> None:
        """Close the reading connections (the datastore closes its own pool)."""
        self.readers.close()


@functools.cache
def insert_statement(table: str, count: int) -> str:
    """The ``INSERT`` of `count` events in one statement."""
    return f"INSERT INTO {table} VALUES " + ",".join(["(?,?,?,?)"] * count)


@functools.cache
def select_statement(table: str, gt: bool, lte: bool, desc: bool, limit: bool) -> str:
    """The SELECT for one shape of query (its parameters: run id, gt, lte, limit)."""
    return (
        f"SELECT originator_version, topic, state FROM {table} WHERE originator_id=?"
        + (" AND originator_version>?" if gt else "")
        + (" AND originator_version<=?" if lte else "")
        + f" ORDER BY originator_version {'DESC' if desc else 'ASC'}"
        + (" LIMIT ?" if limit else "")
    )
