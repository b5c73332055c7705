"""The one-time upgrade of a SQLite store to compact events: asked for, never done on open.

A store written before issue 26 keeps run ids as hex text and topics in full
(`meta.TEXT`); it still opens, reads, verifies and appends as it is. Upgrading
rewrites its events table into the compact one (`engine.store.sqlite.compact`)
inside one ``BEGIN IMMEDIATE`` … ``COMMIT``: every row keeps its notification id
(rowid), version and stored bytes, so tracking positions, the hash chain and
exports are the same; the rewrite checks row by row, before it commits, that
each new row says what the old one said. Either into a copy (``VACUUM INTO``,
the store only read) or, asked explicitly, in place under the write lock.

Neither events table declares an ``INTEGER PRIMARY KEY`` (eventsourcing's SQLite
recorder keys events by run and version, and the notification id is the rowid),
and SQLite documents that ``VACUUM`` may change the rowids of such a table. It
keeps them (it copies rows in rowid order, rowids and all), but notification ids
must never change (followers track them), so each ``VACUUM`` here is checked: the
first and the last event before it must hold the same notification ids after.
A renumbering moves one of them (it can only close gaps, in order), and the
check costs two lookups by rowid, whatever the size of the store.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import attrs

from engine.store import meta
from engine.store.errors import StoreError
from engine.store.sqlite.compact import TOPICS_TABLE, create_statements
from engine.store.sqlite.datastore import LOCK_TIMEOUT, read_only_uri

_NEW = "stagetrail_events_compact"
"""The compact table while it is filled, renamed to `meta.EVENTS_TABLE` before commit."""


@attrs.frozen
class Upgraded:
    """What an upgrade did: the file written, its events, its size before and after, and
    why its pages could not be packed ("": they were)."""

    path: str
    events: int
    bytes_before: int
    bytes_after: int
    not_packed: str = ""


def layout_of(path: str) -> str:
    """The events layout of the SQLite store at `path` (read-only).

    Raises:
        StoreError: no such file, or not a stagetrail store.
    """
    if not os.path.isfile(path):
        raise StoreError(path, f"no store at {path} (the file does not exist)")
    try:
        with contextlib.closing(sqlite3.connect(read_only_uri(path), uri=True)) as connection:
            rows = dict(connection.execute(f"SELECT key, value FROM {meta.META_TABLE}").fetchall())
    except sqlite3.Error as error:
        raise StoreError(path, f"not a stagetrail store: {error}") from None
    return str(rows.get(meta.LAYOUT, meta.TEXT))


def upgrade_copy(source: str, target: str) -> Upgraded:
    """Write a compact copy of the store `source` to the new file `target`; `source` is
    only read.

    Raises:
        StoreError: `target` exists, `source` is not a text-layout store, a row differs,
            or a ``VACUUM`` changed notification ids (the copy deleted).
    """
    _check_text(source)
    if os.path.exists(target):
        raise StoreError(target, f"{target} exists: upgrade writes a new file, give another path")
    with contextlib.closing(sqlite3.connect(read_only_uri(source), uri=True)) as connection:
        ends = _ends(connection)
        connection.execute("VACUUM INTO ?", (target,))  # a consistent copy, pages packed
    try:
        with _stopping(target, "the copy was deleted"):
            _check_kept(target, ends, _RENUMBERED_COPY)
        events = _rewrite(target)
        with _stopping(target, "the copy was deleted"):
            _vacuum(target, _RENUMBERED_COPY)
    except BaseException:
        Path(target).unlink(missing_ok=True)  # ours, half made: never left behind
        raise
    return Upgraded(target, events, _size(source), _size(target))


def upgrade_in_place(path: str) -> Upgraded:
    """Rewrite the store at `path` compact, in one write transaction, then pack its pages.

    Other processes may keep reading while the rewrite runs, and see the text layout
    until it commits. A process that opened the store before cannot use it after:
    its reads and appends raise a `StoreError` saying to open the store again (an
    append is refused by the compact table's CHECKs, nothing written). The rewrite
    committed, a failure to pack the pages (another process holding the write lock
    for the whole lock timeout) leaves a compact, usable store: it is returned, its
    `not_packed` saying why (run ``VACUUM`` on it later to give the space back).

    Raises:
        StoreError: not a text-layout store, locked for too long, or a row differs
            (nothing changed); or the packing changed notification ids (upgraded,
            renumbered: projections and followers must start again).
    """
    _check_text(path)
    before = _size(path)
    events = _rewrite(path)
    try:
        _vacuum(path, _RENUMBERED_IN_PLACE)
    except sqlite3.Error as error:
        return Upgraded(path, events, before, _size(path), not_packed=str(error))
    return Upgraded(path, events, before, _size(path))


def _check_text(path: str) -> None:
    if layout_of(path) != meta.TEXT:
        raise StoreError(path, "the store's events are compact already: nothing to upgrade")


def _rewrite(path: str) -> int:
    """Rewrite the events table of `path` compact in one transaction; the events moved."""
    with _stopping(path, "nothing changed"), _writing(path) as connection:
        connection.execute("BEGIN IMMEDIATE")
        try:
            if meta.read_layout(connection, meta.META_TABLE) != meta.TEXT:  # by another process
                raise StoreError(path, "the store's events are compact already")
            events = _move(connection, path)
            connection.executemany(
                f"INSERT OR REPLACE INTO {meta.META_TABLE} VALUES (?, ?)",
                [("schema_version", str(meta.COMPACT_SCHEMA)), (meta.LAYOUT, meta.COMPACT)],
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
    return events


def _move(connection: sqlite3.Connection, path: str) -> int:
    """Fill the compact table from the text one, check every row, and put it in its place."""
    old = meta.EVENTS_TABLE
    topics, events = create_statements(_NEW)
    connection.execute(topics)
    connection.execute(events)
    connection.execute(
        f"INSERT OR IGNORE INTO {TOPICS_TABLE} (topic) "
        f"SELECT topic FROM {old} GROUP BY topic ORDER BY MIN(rowid)"
    )
    connection.execute(
        f"INSERT INTO {_NEW} (rowid, originator_id, originator_version, topic, state) "
        f"SELECT e.rowid, uuid_bytes(e.originator_id), e.originator_version, t.id, e.state "
        f"FROM {old} e JOIN {TOPICS_TABLE} t ON t.topic = e.topic ORDER BY e.rowid"
    )
    count = connection.execute(f"SELECT count(*) FROM {old}").fetchone()[0]
    same = connection.execute(
        f"SELECT count(*) FROM {old} e JOIN {_NEW} n ON n.rowid = e.rowid "
        f"JOIN {TOPICS_TABLE} t ON t.id = n.topic "
        "WHERE n.originator_id = uuid_bytes(e.originator_id) "
        "AND n.originator_version = e.originator_version AND t.topic = e.topic "
        "AND n.state IS e.state"
    ).fetchone()[0]
    moved = connection.execute(f"SELECT count(*) FROM {_NEW}").fetchone()[0]
    if not count == same == moved:
        raise StoreError(
            path, f"upgrade stopped, nothing changed: {count} events, {same} copied alike"
        )
    connection.execute(f"DROP TABLE {old}")
    connection.execute(f"ALTER TABLE {_NEW} RENAME TO {old}")
    return int(count)


@contextlib.contextmanager
def _stopping(path: str, outcome: str) -> Iterator[None]:
    """A SQLite error inside as a `StoreError` saying the upgrade stopped, and its `outcome`."""
    try:
        yield
    except sqlite3.Error as error:
        raise StoreError(path, f"upgrade stopped, {outcome}: {error}") from error


@contextlib.contextmanager
def _writing(path: str) -> Iterator[sqlite3.Connection]:
    """A connection writing `path` (autocommit: the caller begins), run ids made bytes."""
    connection = sqlite3.connect(path, timeout=LOCK_TIMEOUT, isolation_level=None)
    try:
        connection.create_function("uuid_bytes", 1, _uuid_bytes, deterministic=True)
        yield connection
    finally:
        connection.close()


def _uuid_bytes(text: str) -> bytes:
    """A run id as the text layout holds it (hex, or with dashes) as its 16 bytes."""
    return UUID(text).bytes


def _vacuum(path: str, renumbered: str) -> None:
    """Pack the file's pages (the text table's freed pages would keep its size), checking
    that its events keep their notification ids.

    Raises:
        sqlite3.Error: the file could not be packed (busy): nothing of it changed.
        StoreError: it was packed, and notification ids changed (`renumbered` says what then).
    """
    with _writing(path) as connection:
        ends = _ends(connection)
        _pack(connection)
        _check_kept(path, ends, renumbered)
        # VACUUM writes the packed file through the WAL: fold it back in (readers permitting).
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _pack(connection: sqlite3.Connection) -> None:
    """``VACUUM``: the file rewritten without its free pages."""
    connection.execute("VACUUM")


_RENUMBERED_COPY = "the copy was deleted; the store is unchanged"
_RENUMBERED_IN_PLACE = (
    "the store is compact and holds every event, but under other notification ids: "
    "rebuild every persistent projection (stagetrail projections rebuild NAME) "
    "and start every other follower from the beginning"
)


def _ends(connection: sqlite3.Connection) -> list[tuple[object, ...]]:
    """The first and the last event's notification id, run id and version (none: empty)."""
    table = meta.EVENTS_TABLE
    return connection.execute(
        f"SELECT rowid, originator_id, originator_version FROM {table} WHERE rowid IN "
        f"((SELECT MIN(rowid) FROM {table}), (SELECT MAX(rowid) FROM {table})) ORDER BY rowid"
    ).fetchall()


def _check_kept(path: str, ends: list[tuple[object, ...]], renumbered: str) -> None:
    """Nothing, if the events `ends` named still hold their notification ids in `path`.

    Raises:
        StoreError: one of them moved (VACUUM renumbered the table); `renumbered` says
            what that leaves.
    """
    ids = [row[0] for row in ends]
    with contextlib.closing(sqlite3.connect(read_only_uri(path), uri=True)) as connection:
        found = connection.execute(
            f"SELECT rowid, originator_id, originator_version FROM {meta.EVENTS_TABLE} "
            f"WHERE rowid IN ({','.join('?' * len(ids))}) ORDER BY rowid",
            ids,
        ).fetchall()
    if found != ends:
        raise StoreError(
            path,
            f"VACUUM changed the events' notification ids (the events at {ids} moved): "
            + renumbered,
        )


def _size(path: str) -> int:
    """The bytes of the store: its file and its WAL."""
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))
