"""The compact events table of new SQLite stores: 16-byte run ids and topic ids.

A store written before issue 26 keys each event by its run id as 32 hex
characters, in the table and again in its primary-key index, and names its
topic in full in every row (``stagetrail:StageCompleted``). A new store keeps
the same eventsourcing table and columns, the run id as its 16 bytes (a BLOB)
and the topic as the small integer id of a row of a topics table, so an event
costs ~55 bytes less; the state (the mapper's bytes) is the same. The recorder
is `SQLiteRecorder` with these conversions at its edges: every row it hands
out is still eventsourcing's `StoredEvent` or `Notification`, with a `UUID` and
the topic text. The table's CHECKs refuse a row of the older shape, so a
process that opened the store before `stagetrail upgrade` rewrote it fails
loudly instead of writing text ids beside binary ones.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, ClassVar
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent

from engine.store import meta
from engine.store.errors import StoreError
from engine.store.sqlite.recorder import (
    BLOB,
    SQLiteRecorder,
)
from engine.store.sqlite.writer import WriterConnection

TOPICS_TABLE = "stagetrail_topics"
"""Each topic of a compact store's events once, with the small integer its rows hold."""


def create_statements(events: str) -> list[str]:
    """The compact events table and its topics table."""
    return [
        f"CREATE TABLE IF NOT EXISTS {TOPICS_TABLE} "
        "(id INTEGER PRIMARY KEY, topic TEXT NOT NULL UNIQUE)",
        f"CREATE TABLE IF NOT EXISTS {events} ("
        "originator_id BLOB NOT NULL CHECK (typeof(originator_id)='blob' "
        "AND length(originator_id)=16), "
        "originator_version INTEGER NOT NULL, "
        "topic INTEGER NOT NULL CHECK (typeof(topic)='integer'), "
        "state BLOB, "
        "PRIMARY KEY (originator_id, originator_version))",
    ]


class TopicNames(dict[int, str]):
    """Topic ids to topics, loading the topics table again for an id not seen yet."""

    def __init__(self, load: Callable[[], Iterable[tuple[int, str]]]) -> None:
        super().__init__()
        self._load = load

    def __missing__(self, key: int) -> str:
        self.update(self._load())
        name = self.get(key)
        if name is None:  # a row naming no topic: the mapper says which event it is
            return f"(topic id {key} is not in {TOPICS_TABLE})"
        return name


class CompactRecorder(SQLiteRecorder):
    """`SQLiteRecorder` over the compact table: run ids as 16-byte BLOBs, topics as ids."""

    layout: ClassVar[str] = meta.COMPACT
    topics_table: ClassVar[str | None] = TOPICS_TABLE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.topic_names = TopicNames(self._read_topics)
        self.topic_ids: dict[str, int] = {}

    def construct_create_table_statements(self) -> list[str]:
        """The compact events table and the topics table (see `create_statements`)."""
        return create_statements(self.events_table_name)

    def run_key(self, run_id: UUID) -> bytearray:
        """What the events table holds for `run_id`: its 16 bytes, bound as a `BLOB` (no look
        for an adapter of `bytes` per read: a raised and cleared AttributeError)."""
        # `UUID.bytes` is this, in a Python property: one frame less per read.
        return BLOB(run_id.int.to_bytes(16, "big"))

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Insert a batch, ids and topics compact, as `SQLiteRecorder` does; their ids.

        Raises:
            StoreError: the recorder was made without a writing connection.
            HeadMissing: a run's event of ``heads`` (see `Store.write`) is not stored.
        """
        writer = self._writer()
        self._know_topics(stored_events)
        return self.insert_rows(
            writer, stored_events, kwargs.get("heads", ()), kwargs.get("head_states")
        )

    def rows(self, stored_events: Sequence[StoredEvent]) -> list[Any]:
        """The INSERT's parameters: each event's run key, version, topic id and state (see
        `BLOB`)."""
        params: list[Any] = []
        run_id: Any = None
        ids = self.topic_ids
        for stored in stored_events:
            if stored.originator_id is not run_id:  # a batch is mostly one run's: one key
                run_id = stored.originator_id
                key = BLOB(_as_uuid(run_id).bytes)
            params += (key, stored.originator_version, ids[stored.topic], BLOB(stored.state))
        return params

    def topic_keys(self, topics: Collection[str]) -> tuple[list[Any], Any]:
        """The ids of `topics` in the topics table (read again: another process may have
        added one since), those stored under no id left out; and the newest id read (a
        page read after it holding a newer one is read as rows: its topic may be wanted)."""
        rows = self._read_topics()
        self.topic_names.update(rows)
        newest = max((key for key, _ in rows), default=0)
        return sorted(key for key, topic in rows if topic in topics), newest

    def topics_of(self) -> Callable[[list[Any]], list[str]] | None:
        """Topic ids read to topics (`topic_names`)."""
        return self._named

    def _named(self, ids: list[Any]) -> list[str]:
        return list(map(self.topic_names.__getitem__, ids))

    def topics_named(self, rows: list[Any]) -> list[tuple[int, str, bytes]]:
        """Rows as the compact table holds them, each topic id turned back into its topic."""
        names = self.topic_names
        return [(version, names[topic], state) for version, topic, state in rows]

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Events in notification order from `start` (eventsourcing's query), ids and topics
        turned back into a `UUID` and text."""
        rows = self._selected(start, limit, stop, topics, inclusive_of_start)
        return self._notifications(rows)

    def select_notification_rows(
        self, start: int, limit: int, stop: int
    ) -> tuple[list[int], list[UUID], list[tuple[int, str, bytes]]]:
        """The notifications after `start` up to `stop` (`limit` of them) as rows, not objects
        (a persistent catch-up's read): their ids, their runs (one `UUID` object a run) and
        their (version, topic, state), as `EventMapper.from_rows` reads them."""
        rows = self._selected(start, limit, stop, (), False)
        names, runs = self.topic_names, _RunIds()
        return (
            [row[0] for row in rows],
            [runs[row[1]] for row in rows],
            [(row[2], names[row[3]], row[4]) for row in rows],
        )

    def _selected(
        self,
        start: int | None,
        limit: int,
        stop: int | None,
        topics: Sequence[str],
        inclusive_of_start: bool,
    ) -> list[Any]:
        """`select_notifications`' rows as the table holds them (run key, topic id)."""
        where, params = [], []
        if start is not None:
            where.append("rowid>=?" if inclusive_of_start else "rowid>?")
            params.append(start)
        if stop is not None:
            where.append("rowid<=?")
            params.append(stop)
        if topics:
            self.topic_names.update(self._read_topics())
            wanted = [i for i, name in self.topic_names.items() if name in set(topics)]
            where.append(f"topic IN ({','.join('?' * len(wanted))})" if wanted else "0")
            params += wanted
        statement = (
            f"SELECT rowid, originator_id, originator_version, topic, state "
            f"FROM {self.events_table_name}"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY rowid LIMIT ?"
        )
        with self.datastore.transaction(commit=False) as c:
            c.execute(statement, [*params, limit])
            return c.fetchall()  # type: ignore[no-any-return]

    def _notifications(self, rows: Sequence[Any]) -> list[Notification]:
        names, runs = self.topic_names, _RunIds()
        return [
            Notification(
                id=row[0], originator_id=runs[row[1]], originator_version=row[2],
                topic=names[row[3]], state=row[4],
            )
            for row in rows
        ]  # fmt: skip

    def _know_topics(self, stored_events: Sequence[StoredEvent]) -> None:
        """Give each new topic of `stored_events` its id (a committed row of its own first)."""
        ids = self.topic_ids
        for stored in stored_events:
            if stored.topic not in ids:
                self._add_topic(stored.topic)

    def _add_topic(self, topic: str) -> None:
        # Its own statement before the events': a topic row without events is harmless,
        # and another process adding the same topic meanwhile is ignored by UNIQUE.
        with self._writer().statement() as cursor:
            cursor.execute(f"INSERT OR IGNORE INTO {TOPICS_TABLE} (topic) VALUES (?)", (topic,))
            row = cursor.execute(
                f"SELECT id FROM {TOPICS_TABLE} WHERE topic=?", (topic,)
            ).fetchone()
        self.topic_ids[topic] = row[0]
        self.topic_names[row[0]] = topic

    def _writer(self) -> WriterConnection:
        """The store's writing connection: a compact store has no other way to be written.

        Raises:
            StoreError: the recorder was made without one.
        """
        if self.writer is None:
            raise StoreError(
                self.url,
                "a compact events table is written through the store's writing connection, "
                "and this recorder was made without one (writer=None): nothing written",
            )
        return self.writer

    def _read_topics(self) -> list[tuple[int, str]]:
        connection = self.readers.borrow()
        try:
            return connection.execute(f"SELECT id, topic FROM {TOPICS_TABLE}").fetchall()
        finally:
            self.readers.give_back(connection)


class _RunIds(dict[bytes, UUID]):
    """16-byte run keys to `UUID`s, each made once per page."""

    def __missing__(self, key: bytes) -> UUID:
        run_id = self[key] = UUID(bytes=bytes(key))
        return run_id


def _as_uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(value)
