"""Opening a SQLite store: the file checked, its meta table, WAL, the recorder and views.

The recorder is `engine.store.sqlite.recorder.SQLiteRecorder`: eventsourcing's,
except that a run's events are read with one SELECT on a kept reading connection;
every write goes through the store's one writing connection (`writer`).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import attrs
from eventsourcing.persistence import PersistenceError
from eventsourcing.sqlite import SQLiteDatastore

from engine.store import meta
from engine.store.backend import Backend, joined_reader, prepare_views, row_reader
from engine.store.codec import Codec
from engine.store.errors import StoreError
from engine.store.failures import classify
from engine.store.sql import NAMES
from engine.store.sqlite.compact import CompactRecorder
from engine.store.sqlite.datastore import LOCK_TIMEOUT, Datastore, read_only_uri
from engine.store.sqlite.ranges import RangeReader, identity
from engine.store.sqlite.readers import ReaderConnections
from engine.store.sqlite.recorder import UPGRADED, SQLiteRecorder
from engine.store.sqlite.views import SQLiteViews
from engine.store.sqlite.writer import WriterConnection
from engine.store.urls import StoreURL

_HEADER = b"SQLite format 3\x00"
LAYOUT_VARIABLE = "STAGETRAIL_SQLITE_LAYOUT"
"""The environment variable naming the events layout of new SQLite stores (default compact)."""
UPGRADE = "keeps run ids as text and topics in full (written before compact storage)"
"""What `stagetrail upgrade` improves in a store of the text layout."""


def open_sqlite(
    url: StoreURL, create: bool, settings: meta.AtRest, *, read_only: bool = False
) -> Backend:
    """Open (or create, when allowed) the SQLite store file `url` names.

    A file that is not (yet) a stagetrail store is inspected read-only and left
    exactly as it was; with `read_only` the file is opened ``mode=ro`` and the
    projections fold in memory over what it holds.

    Raises:
        StoreError: no such file (and not allowed to create it), not a stagetrail
            store, or not readable (`StoreReadOnly` when it cannot be created).
    """
    _check_sqlite_path(url, create)
    settings = attrs.evolve(settings, layout=_layout(url))
    found = _inspect(url, create, settings)
    if not read_only:
        _use_wal(url)
    datastore = Datastore(url.path, read_only=read_only)
    try:
        if found is None:  # a new store: meta first, so a half-made one is still ours
            with datastore.transaction(commit=True) as cursor:
                found = _sqlite_meta(cursor, url, create, settings) or _create_meta(
                    cursor, settings
                )
        kind = CompactRecorder if found.layout == meta.COMPACT else SQLiteRecorder
        recorder = kind(
            datastore, meta.EVENTS_TABLE, timeout=LOCK_TIMEOUT, writer=datastore.writer,
            url=url.masked,
        )  # fmt: skip
        if not read_only:
            recorder.create_table()
        chain = _settle_chain(datastore, url, found, read_only=read_only)
        # The file as opened: a later change of directory, or another file put there, is not it.
        path = os.path.abspath(url.path)
        file = identity(path)
    except StoreError:
        datastore.close()
        raise
    except (sqlite3.Error, PersistenceError, OSError) as error:
        datastore.close()
        raise classify(url.masked, error, "cannot open the store") from error
    close = functools.partial(_close, recorder, datastore)
    mapper = found.mapper()
    codec = found.codec(mapper)
    generation = functools.partial(read_generation, recorder.readers, recorder.writer)
    after = functools.partial(stored_after, recorder)
    rows, joined = row_reader(recorder), joined_reader(recorder)
    ranges = functools.partial(
        RangeReader, path, recorder.events_table_name, recorder.topics_table,
        url=url.masked, file=file,
    )  # fmt: skip
    # Offered for an older store, unless the text layout is what the URL or environment asks.
    upgrade = UPGRADE if found.layout == meta.TEXT != settings.layout else ""
    if read_only:
        views = _views(datastore, url.masked, codec)
        return Backend(
            recorder, mapper, close, views, read_only=True, codec=codec, generation=generation,
            chain=chain, stored_after=after, upgrade=upgrade, stored_rows=rows,
            joined_rows=joined, range_reader=ranges,
        )  # fmt: skip
    views, problem = prepare_views(lambda: SQLiteViews(datastore, url.masked), codec)
    erase = functools.partial(erase_runs, datastore, recorder, views is not None)
    return Backend(
        recorder, mapper, close, views, problem, erase, codec=codec, generation=generation,
        chain=chain, stored_after=after, upgrade=upgrade, stored_rows=rows,
        joined_rows=joined, range_reader=ranges,
    )  # fmt: skip


def _layout(url: StoreURL) -> str:
    """The events layout a new store gets: compact, unless the URL says ``layout=text``
    (or, without the option, ``STAGETRAIL_SQLITE_LAYOUT=text``): the layout of every store
    before issue 26, for a release older than it to read.

    Raises:
        StoreError: another layout is named.
    """
    layout = url.options.get("layout") or os.environ.get(LAYOUT_VARIABLE) or meta.COMPACT
    if layout not in (meta.COMPACT, meta.TEXT):
        raise StoreError(url.masked, f"layout={layout!r} is not a layout; use compact or text")
    return layout


def _settle_chain(
    datastore: Datastore, url: StoreURL, settings: meta.AtRest, *, read_only: bool
) -> meta.ChainRecord | None:
    """The store's recorded chain; a writer's key checked against it, or (an older store)
    recorded as this writer's, chained from the newest event now.

    Raises:
        ChainKeyMismatch: the writer's chain key is not the recorded one.
    """
    with datastore.transaction(commit=not read_only) as cursor:
        cursor.execute(f"SELECT key, value FROM {meta.META_TABLE}")
        record = meta.read_chain(dict(cursor.fetchall()))
        if read_only:
            return record
        if record is not None:
            meta.check_chain(record, settings, url.masked)
            return record
        newest = cursor.execute(f"SELECT MAX(rowid) FROM {meta.EVENTS_TABLE}").fetchone()[0]
        rows = meta.chain_rows(settings, newest or 0)
        cursor.executemany(
            f"INSERT OR IGNORE INTO {meta.META_TABLE} VALUES (?, ?)", list(rows.items())
        )
        return meta.read_chain(rows)


def stored_after(recorder: SQLiteRecorder, run_id: UUID, position: int) -> int | None:
    """The run's first version stored after notification `position` (None: none is)."""
    readers = recorder.readers
    connection = readers.borrow()
    try:
        row = connection.execute(
            f"SELECT MIN(originator_version) FROM {meta.EVENTS_TABLE} "
            "WHERE originator_id=? AND rowid>?",
            (recorder.run_key(run_id), position),
        ).fetchone()
    finally:
        readers.give_back(connection)
    if row[0] is None:
        recorder.check_layout()  # or the run's key matched nothing of an upgraded table
        return None
    return int(row[0])


def writable(url: StoreURL) -> bool:
    """Whether the existing file and its directory (for the WAL's files) may be written."""
    path = os.path.abspath(url.path)
    return os.access(path, os.W_OK) and os.access(os.path.dirname(path), os.W_OK)


def _close(recorder: SQLiteRecorder, datastore: SQLiteDatastore) -> None:
    """Close the recorder's reading connections, then the datastore's pool."""
    recorder.close()
    datastore.close()


def erase_runs(
    datastore: Datastore, recorder: SQLiteRecorder, has_views: bool, run_ids: Sequence[UUID]
) -> int:
    """Delete the runs' events and snapshots, counting one more erasure generation, in one
    transaction; return the events deleted."""
    removed = 0
    with datastore.transaction(commit=True) as cursor:
        if meta.read_layout(cursor, meta.META_TABLE) != recorder.layout:
            raise StoreError(recorder.url, UPGRADED)  # its keys would delete nothing
        meta.bump_generation(cursor, meta.META_TABLE)
        for run_id in run_ids:
            key = recorder.run_key(run_id)
            cursor.execute(f"DELETE FROM {meta.EVENTS_TABLE} WHERE originator_id=?", (key,))
            removed += cursor.rowcount
            if has_views:
                cursor.execute(f"DELETE FROM {NAMES['snapshots']} WHERE run_id=?", (str(run_id),))
        if has_views:  # SQLite gives the highest rowid + 1 next: no position may pass it
            newest = cursor.execute(f"SELECT MAX(rowid) FROM {meta.EVENTS_TABLE}").fetchone()[0]
            cursor.execute(
                "UPDATE tracking SET notification_id=? WHERE notification_id>?",
                (newest or 0, newest or 0),
            )
    return removed


def read_generation(readers: ReaderConnections, writer: WriterConnection | None = None) -> int:
    """The store's erasure generation, as committed now (one SELECT on a kept connection).

    Read on the writing connection when it is idle (see `WriterConnection.read_if_idle`:
    a saver reads it before each of its appends, right after the last one), else on a
    reading connection.
    """
    read = functools.partial(meta.read_generation, table=meta.META_TABLE)
    found = None if writer is None else writer.read_if_idle(read)
    if found is not None:
        return found
    connection = readers.borrow()
    try:
        return meta.read_generation(connection, meta.META_TABLE)
    finally:
        readers.give_back(connection)


def _views(datastore: Datastore, url: str, codec: Codec) -> SQLiteViews | None:
    """The file's views if it has them (a read-only open creates nothing)."""
    with datastore.transaction(commit=False) as cursor:
        cursor.execute("SELECT 1 FROM sqlite_master WHERE name=?", (NAMES["projections"],))
        if cursor.fetchone() is None:
            return None
    views = SQLiteViews(datastore, url)
    views.codec = codec
    return views


def _inspect(url: StoreURL, create: bool, settings: meta.AtRest) -> meta.AtRest | None:
    """Check an existing file read-only: its settings if it is a store, None if new.

    Raises:
        StoreError: not a SQLite file, another program's database, or empty and
            `create` not allowed.
    """
    if not os.path.exists(url.path):
        return None
    if os.path.getsize(url.path) == 0:
        if create:
            return None
        raise StoreError(url.masked, f"not a stagetrail store: {url.path} is an empty file")
    _check_header(url)
    try:
        conn = sqlite3.connect(read_only_uri(url.path), uri=True)
    except sqlite3.Error as error:
        raise classify(url.masked, error, "cannot read the store") from error
    try:
        return _sqlite_meta(conn.cursor(), url, create, settings)
    except sqlite3.Error as error:
        raise classify(url.masked, error, "cannot read the store") from error
    finally:
        conn.close()


def _use_wal(url: StoreURL) -> None:
    """Put the store (new, or checked to be ours) in WAL mode, waiting for other openers.

    eventsourcing's pool switches the journal mode on its first connection, and
    SQLite refuses that at once ("database is locked") while another process
    holds the file: the case of a fleet of workers creating one store together.

    Raises:
        StoreError: the file stayed locked for `LOCK_TIMEOUT` seconds, or cannot be opened.
    """
    deadline = None  # read the clock only once something waits (frozen clocks tick per read)
    while True:
        try:
            conn = sqlite3.connect(url.path, timeout=LOCK_TIMEOUT)
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                return
            finally:
                conn.close()
        except sqlite3.OperationalError as error:
            busy = (error.sqlite_errorcode & 0xFF) == sqlite3.SQLITE_BUSY
            deadline = deadline or time.monotonic() + LOCK_TIMEOUT
            if not busy or time.monotonic() > deadline:
                raise classify(url.masked, error, "cannot open the store") from error
            time.sleep(0.01)


def _check_header(url: StoreURL) -> None:
    try:
        with open(url.path, "rb") as file:
            header = file.read(len(_HEADER))
    except OSError as error:
        raise classify(url.masked, error, "cannot read the store") from None
    if header != _HEADER:
        raise StoreError(url.masked, f"not a stagetrail store: {url.path} is not a SQLite database")


def _check_sqlite_path(url: StoreURL, create: bool) -> None:
    if os.path.isdir(url.path):
        raise StoreError(url.masked, f"{url.path} is a directory, not a store file")
    if os.path.exists(url.path):
        return
    if not create:
        raise StoreError(url.masked, f"no store at {url.path} (the file does not exist)")
    parent = os.path.dirname(url.path) or "."
    if not os.path.isdir(parent):
        raise StoreError(url.masked, f"cannot create {url.path}: no directory {parent}")


def _sqlite_meta(
    cursor: Any, url: StoreURL, create: bool, settings: meta.AtRest
) -> meta.AtRest | None:
    """The store's settings from its meta table, or None for a file without tables.

    Raises:
        StoreError: another program's tables, a store this program cannot read,
            or no store and `create` not allowed.
    """
    cursor.execute("SELECT name FROM sqlite_master WHERE type='table'")
    tables = {row[0] for row in cursor.fetchall()}
    if meta.META_TABLE in tables:
        cursor.execute(f"SELECT key, value FROM {meta.META_TABLE}")
        return meta.settle(
            dict(cursor.fetchall()), settings, url.masked, newest=meta.COMPACT_SCHEMA
        )
    foreign = sorted(t for t in tables if not t.startswith("sqlite_"))
    if foreign:
        raise StoreError(
            url.masked, f"not a stagetrail store: it holds other tables ({', '.join(foreign)})"
        )
    if not create:
        raise StoreError(url.masked, "no stagetrail store in this file")
    return None


def _create_meta(cursor: Any, settings: meta.AtRest) -> meta.AtRest:
    """Create the meta table of a new store (inside the caller's write transaction), its
    events compact unless the settings ask for the older layout."""
    cursor.execute(
        f"CREATE TABLE IF NOT EXISTS {meta.META_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
    )
    cursor.executemany(
        f"INSERT OR IGNORE INTO {meta.META_TABLE} VALUES (?, ?)",
        list(meta.new_meta(settings).items()),
    )
    return settings
