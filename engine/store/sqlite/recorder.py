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
eventsourcing's. An append is one multi-row ``INSERT`` on the store's writing
connection (`engine.store.sqlite.writer`), its own transaction, rather than
``BEGIN`` … an ``INSERT`` per event … ``COMMIT``.

A text-layout recorder can outlive its layout: ``stagetrail upgrade --in-place``
in another process rewrites the table compact, where its hex run ids and topic
names match nothing. So a read of it that finds nothing (or a row it cannot
read) looks at the meta table's layout, one small SELECT, and raises a
`StoreError` saying to open the store again rather than answer "no such run";
a read that finds rows pays nothing.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar, Literal, overload
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder

from engine.store import meta
from engine.store.errors import HeadMissing, StoreError
from engine.store.sqlite.datastore import Datastore
from engine.store.sqlite.joined import JoinedPage, masked, page_of, parameters
from engine.store.sqlite.joined import statement as joined_statement
from engine.store.sqlite.readers import ReaderConnections
from engine.store.sqlite.writer import WriterConnection

ONE_STATEMENT = 200
"""The most events appended by one multi-row ``INSERT`` (4 parameters each: well within
the 999 parameters the oldest SQLite builds allow in a statement)."""
BLOB = bytearray
"""What a BLOB parameter of an append is bound as: the same bytes stored, but `sqlite3` binds a
bytearray as it is, where it first looks for an adapter of each `bytes` (a raised and cleared
AttributeError: ~6,000 instructions, more than the copy and the row's insert together)."""
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
    topics_table: ClassVar[str | None] = None
    """The table of the events' topic ids (None: the events hold their topics as text)."""

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
        self._utf8: bool | None = None
        """Whether the database holds its text as UTF-8 (None: not asked yet)."""
        self.writer = writer
        self.url = url or datastore.uri

    def run_key(self, run_id: UUID) -> str | bytes | bytearray:
        """What the events table holds for `run_id`: its 32 hex characters."""
        return run_id.hex

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Insert a batch in one ``INSERT`` of all its rows, its own transaction; their ids.

        Rows inserted by one statement under the write lock take consecutive rowids
        (each the table's largest plus one), so the last one gives them all. A longer
        batch is one ``INSERT`` per `ONE_STATEMENT` rows inside one ``BEGIN IMMEDIATE``
        … ``COMMIT``; a recorder without a writing connection appends as eventsourcing's.

        Raises:
            HeadMissing: a run's event of ``heads`` (see `Store.write`) is not stored.
        """
        if self.writer is None:
            return super().insert_events(stored_events, **kwargs)
        return self.insert_rows(
            self.writer, stored_events, kwargs.get("heads", ()), kwargs.get("head_states")
        )

    def insert_rows(
        self,
        writer: WriterConnection,
        stored_events: Sequence[StoredEvent],
        heads: Sequence[tuple[UUID, int]],
        head_states: Sequence[bytes | None] | None = None,
    ) -> list[int]:
        """Append `stored_events` on `writer` if the store holds every event of `heads`
        (with the bytes `head_states` gives, where it gives them).

        Checked under the write lock the append holds: in the ``INSERT`` itself, or
        first in the transaction of a longer batch.

        Raises:
            HeadMissing: an event of `heads` is not stored (or not with those bytes);
                nothing was written.
        """
        count = len(stored_events)
        if count == 0:
            return []
        states = head_states is not None
        checks = [
            value
            for index, (run_id, version) in enumerate(heads)
            for value in (
                (self.run_key(run_id), version, head_states[index])
                if head_states is not None
                else (self.run_key(run_id), version)
            )
        ]
        if count <= ONE_STATEMENT:
            statement = insert_statement(self.events_table_name, count, len(heads), states)
            last = writer.insert(statement, [*self.rows(stored_events), *checks])
            if last is None:
                raise HeadMissing(f"an event before the batch is gone: {heads}")
            return list(range(last - count + 1, last + 1))
        ids: list[int] = []
        with writer.transaction() as cursor:
            held = held_statement(self.events_table_name, len(heads), states)
            if heads and cursor.execute(held, checks).fetchone()[0] < len(heads):
                raise HeadMissing(f"an event before the batch is gone: {heads}")
            for start in range(0, count, ONE_STATEMENT):
                chunk = stored_events[start : start + ONE_STATEMENT]
                statement = insert_statement(self.events_table_name, len(chunk))
                cursor.execute(statement, self.rows(chunk))
                last = cursor.lastrowid
                assert last is not None  # an INSERT sets it
                ids += range(last - len(chunk) + 1, last + 1)
        return ids

    def rows(self, stored_events: Sequence[StoredEvent]) -> list[Any]:
        """The INSERT's parameters: each event's run key, version, topic and state (see
        `BLOB`)."""
        params: list[Any] = []
        run_id: Any = None
        for stored in stored_events:
            if stored.originator_id is not run_id:  # a batch is mostly one run's: one key
                run_id = stored.originator_id
                key = run_id.hex if isinstance(run_id, UUID) else run_id
            params += (key, stored.originator_version, stored.topic, BLOB(stored.state))
        return params

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

    @overload
    def select_rows(
        self,
        run_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> list[tuple[int, str, bytes]]: ...

    @overload
    def select_rows(
        self,
        run_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
        joined: Collection[str] | Literal[True],
    ) -> JoinedPage | None: ...

    def select_rows(
        self,
        run_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
        joined: Collection[str] | bool = False,
    ) -> list[tuple[int, str, bytes]] | JoinedPage | None:
        """`select_events`' rows as plain (version, topic, state) tuples: the lean read of a
        streaming pass (the chain check), which needs no `StoredEvent` per row.

        Args:
            joined: read the page as one `JoinedPage` instead (ascending, `limit` given),
                narrowed to these topics (True: every topic); its result None: a page
                to read as rows (see `engine.store.sqlite.joined`).
        """
        if joined is not False:
            assert limit is not None  # a stream's page: ascending, `limit` rows
            assert not desc
            return self._select_joined(run_id, gt, lte, limit, None if joined is True else joined)
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

    def _select_joined(
        self,
        run_id: UUID,
        gt: int | None,
        lte: int | None,
        limit: int,
        topics: Collection[str] | None,
    ) -> JoinedPage | None:
        """A page read as one aggregated row (see `select_rows`' ``joined``)."""
        keys, newest = (None, None) if topics is None else self.topic_keys(topics)
        narrowed = None if keys is None else len(keys)
        mask = keys is not None and masked(keys)
        table = self.events_table_name
        statement = joined_statement(
            table, gt is not None, lte is not None, narrowed, self.topics_table, mask
        )
        params = parameters(self.run_key(run_id), gt, lte, limit, keys or (), mask)
        connection = self.readers.borrow()
        try:
            if self._utf8 is None:  # group_concat reads a BLOB as text in this encoding
                self._utf8 = connection.execute("PRAGMA encoding").fetchone()[0] == "UTF-8"
            row = connection.execute(statement, params).fetchone() if self._utf8 else None
        except sqlite3.DataError as error:  # a page of large states longer than SQLite's
            if error.sqlite_errorname != "SQLITE_TOOBIG":  # longest string: read as rows
                raise
            row = None
        finally:
            self.readers.give_back(connection)
        if row is None:
            return None
        if not row[0]:
            self.check_layout()
        return page_of(row, self.topics_of(), newest)

    def topic_keys(self, topics: Collection[str]) -> tuple[list[Any], Any]:
        """What the events table's topic column holds for `topics` (here: the topics), and the
        newest key it may hold that a read of them knows (None: every key is known)."""
        return sorted(topics), None

    def topics_of(self) -> Callable[[list[Any]], list[str]] | None:
        """What turns the topic ids a page read into topics (None: it read topics)."""
        return None

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

    def notification_id(self, run_id: UUID, version: int) -> int | None:
        """The notification id of the run's event `version` (None: not stored)."""
        statement = (
            f"SELECT rowid FROM {self.events_table_name} "
            "WHERE originator_id=? AND originator_version=?"
        )
        connection = self.readers.borrow()
        try:
            row = connection.execute(statement, (self.run_key(run_id), version)).fetchone()
        finally:
            self.readers.give_back(connection)
        return None if row is None else int(row[0])

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


@functools.lru_cache(maxsize=512)  # group commits give many shapes: keep the recent ones
def insert_statement(table: str, count: int, heads: int = 0, states: bool = False) -> str:
    """The ``INSERT`` of `count` events in one statement; with `heads`, only if the table
    holds each of that many (run key, version) events, given after the rows' parameters
    (with `states`, each also with the bytes given after its version, where not NULL)."""
    values = ",".join(["(?,?,?,?)"] * count)
    if not heads:
        return f"INSERT INTO {table} VALUES {values}"
    held = f"EXISTS (SELECT 1 FROM {table} AS h WHERE {_held(table, states)})"
    return f"INSERT INTO {table} SELECT * FROM (VALUES {values}) WHERE " + " AND ".join(
        [held] * heads
    )


@functools.lru_cache(maxsize=512)
def held_statement(table: str, heads: int, states: bool = False) -> str:
    """How many of `heads` (run key, version) events the table holds (as `insert_statement`)."""
    held = f"({_held(table, states)})"
    return f"SELECT COUNT(*) FROM {table} AS h WHERE " + " OR ".join([held] * heads)


def _held(table: str, states: bool) -> str:
    """The condition one head's event (row `h`) meets: its run and version (and bytes,
    unless NULL), and the run's newest: a later event with the next version free is a
    run being erased (`Store.erasure_begun`), whose hole no append may fill."""
    newest = (
        f"NOT EXISTS (SELECT 1 FROM {table} AS l WHERE l.originator_id=h.originator_id "
        "AND l.originator_version>h.originator_version)"
    )
    if not states:
        return f"h.originator_id=? AND h.originator_version=? AND {newest}"
    return f"h.originator_id=? AND h.originator_version=? AND coalesce(h.state=?, 1) AND {newest}"


@functools.cache  # a few tables, 16 shapes each: one text per shape
def select_statement(table: str, gt: bool, lte: bool, desc: bool, limit: bool) -> str:
    """The SELECT for one shape of query (its parameters: run id, gt, lte, limit): the same
    text object each time, its hash kept (sqlite3's statement cache looks it up by it)."""
    return (
        f"SELECT originator_version, topic, state FROM {table} WHERE originator_id=?"
        + (" AND originator_version>?" if gt else "")
        + (" AND originator_version<=?" if lte else "")
        + f" ORDER BY originator_version {'DESC' if desc else 'ASC'}"
        + (" LIMIT ?" if limit else "")
    )
