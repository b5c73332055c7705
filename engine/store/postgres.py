"""The PostgreSQL backend: a probe connection for clear errors, eventsourcing's pooled
recorder in the store's schema, the views beside the events, and LISTEN/NOTIFY waiting.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    OperationalError,
    StoredEvent,
    Tracking,
)
from eventsourcing.postgres import (
    PostgresApplicationRecorder,
    PostgresDatastore,
    PostgresTrackingRecorder,
)
from psycopg.sql import SQL, Identifier, Literal

from engine.store import meta, overlay
from engine.store.backend import Backend, prepare_views
from engine.store.errors import AppendOutcomeUnknown, StoreError
from engine.store.sql import NAMES, SQLViews
from engine.store.urls import LIBPQ_OPTIONS, StoreURL

TRACKING_TABLE = "stagetrail_tracking"
_log = logging.getLogger(__name__)
_INDEXES = ("runs_started", "runs_parent")
# Lower case only: eventsourcing creates its composite type under the folded name.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,50}")


PIPELINE_BYTES = 1 << 20
"""Largest append (bytes of event state) sent in psycopg's pipeline mode.

psycopg's pipeline deadlocks on large parameters: the client waits in the
pipeline sync for results while the server still waits for the rest of the
INSERT, holding the events table's EXCLUSIVE lock (every writer then blocks).
Larger appends go statement by statement, where a round trip is negligible.
"""

RETRY_SECONDS = 30.0
"""How long an append keeps retrying a lost connection before it gives up."""

_CONNECTION_LOST = (OperationalError, InterfaceError)


class Datastore(PostgresDatastore):
    """eventsourcing's datastore, discarding a connection as soon as it is found lost.

    eventsourcing gives a failed connection back to the pool, which may keep it
    (a pipeline that failed part-way still looks healthy) and serve it to every
    retry in turn. Closing it on the spot makes the pool replace it, and checking
    the idle ones spares the next calls the other dead connections of a restart.
    """

    @contextlib.contextmanager
    def get_connection(self) -> Iterator[Any]:
        """A pooled connection (see `PostgresDatastore.get_connection`)."""
        import psycopg

        try:
            with super().get_connection() as conn:
                try:
                    yield conn
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    conn.close()
                    raise
        except _CONNECTION_LOST:
            with contextlib.suppress(Exception):  # the server may still be down
                self.pool.check()
            raise


class PostgresRecorder(PostgresApplicationRecorder):
    """eventsourcing's application recorder, with appends that never hang nor double.

    An append whose connection is lost around its commit may have been committed
    although the client saw an error. eventsourcing's recorder would send it again
    and report a conflict with itself; this one asks the database whether the
    very bytes it sent are stored at those versions, and reports success if so.
    """

    retry_seconds = RETRY_SECONDS
    recovered: dict[str, int]
    """Appends whose connection was lost, by what the check found (for the fault suite)."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        # eventsourcing names the NOTIFY channel after the table alone, so every
        # store of the database (one per schema) would wake every other's followers.
        self.channel_name = f"stagetrail_{datastore.schema}"
        self.recovered = {"stored": 0, "absent": 0}
        self._select_versions = SQL(
            "SELECT originator_version, topic, state, notification_id FROM {0}.{1} "
            "WHERE originator_id = %s AND originator_version >= %s "
            "AND originator_version <= %s"
        ).format(Identifier(datastore.schema), Identifier(events_table_name))

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Append atomically; retry a lost connection without ever writing twice.

        Raises:
            IntegrityError: another writer holds one of the versions.
            AppendOutcomeUnknown: the database stayed unreachable, so whether the
                append was committed could not be learned.
            OperationalError: the database refused the append (nothing written).
        """
        if not stored_events:
            return []
        try:
            return self._insert_once(stored_events)
        except _CONNECTION_LOST as error:
            return self._recover(stored_events, error)

    def _recover(self, stored_events: Sequence[StoredEvent], error: Exception) -> Sequence[int]:
        """After a lost connection: the append's ids if it was stored, else send it again.

        Raises:
            error: the store stayed unreachable and the append was never sent.
        """
        deadline = time.monotonic() + self.retry_seconds  # read only here: frozen clocks tick
        pause, maybe_sent = _FIRST_PAUSE, _maybe_sent(error)
        while True:
            found = self._stored_ids(stored_events, deadline) if maybe_sent else []
            self.recovered["stored" if found else "absent"] += 1
            if found:
                _log.warning("connection lost after a commit; the append was stored")
                return found
            _log.debug("append retried after: %s", error)
            pause = _pause(deadline, error, pause)
            try:
                return self._insert_once(stored_events) or []
            except IntegrityError:
                # A commit of ours that was still in flight when we looked may hold them.
                found = self._stored_ids(stored_events, deadline)
                if found:
                    return found
                raise
            except _CONNECTION_LOST as lost:
                error, maybe_sent = lost, maybe_sent or _maybe_sent(lost)

    def _insert_once(self, stored_events: Sequence[StoredEvent]) -> Sequence[int] | None:
        if sum(len(event.state) for event in stored_events) <= PIPELINE_BYTES:
            pipelined = PostgresApplicationRecorder.insert_events.__wrapped__
            return pipelined(self, stored_events)  # type: ignore[no-any-return]
        with self.datastore.get_connection() as conn, conn.transaction(), conn.cursor() as curs:
            self._insert_stored_events(curs, stored_events)
            return self._fetch_ids_after_insert_events(curs, stored_events)

    def _stored_ids(self, stored_events: Sequence[StoredEvent], deadline: float) -> list[int]:
        """Notification ids of `stored_events` if these very events are stored, else [].

        Raises:
            IntegrityError: another writer's events hold some of the versions.
            AppendOutcomeUnknown: the database could not be asked before `deadline`.
        """
        pause = _FIRST_PAUSE
        while True:
            try:
                return self._compare(stored_events)
            except _CONNECTION_LOST as lost:
                error = lost
                if time.monotonic() >= deadline:
                    raise AppendOutcomeUnknown(str(error)) from error
                pause = _pause(deadline, error, pause)

    def _compare(self, stored_events: Sequence[StoredEvent]) -> list[int]:
        sent = {(str(e.originator_id), e.originator_version): e for e in stored_events}
        found: dict[tuple[str, int], int] = {}
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            for originator_id, low, high in _ranges(stored_events):
                curs.execute(self._select_versions, (originator_id, low, high))
                for row in curs.fetchall():
                    key = (str(originator_id), row["originator_version"])
                    mine = sent.get(key)
                    if mine is None or (mine.topic, mine.state) != (
                        row["topic"],
                        bytes(row["state"]),
                    ):
                        raise IntegrityError(f"another writer holds version {key[1]}")
                    found[key] = row["notification_id"]
        if not found:
            return []
        if len(found) != len(sent):  # an append is one transaction: never partly stored
            raise IntegrityError("part of the versions are held by another writer")
        return [found[(str(e.originator_id), e.originator_version)] for e in stored_events]


def _maybe_sent(error: BaseException) -> bool:
    """Whether an append that failed with `error` may have reached the server.

    Only a pool that could not hand out a connection proves nothing was sent.
    """
    from psycopg_pool import PoolTimeout

    return not isinstance(error.__cause__, PoolTimeout)


def _ranges(stored_events: Sequence[StoredEvent]) -> list[tuple[Any, int, int]]:
    """(originator id, lowest, highest version) for each originator of an append."""
    spans: dict[Any, tuple[int, int]] = {}
    for event in stored_events:
        version = event.originator_version
        low, high = spans.get(event.originator_id, (version, version))
        spans[event.originator_id] = (min(low, version), max(high, version))
    return [(key, low, high) for key, (low, high) in spans.items()]


_FIRST_PAUSE = 0.02


def _pause(deadline: float, error: Exception, pause: float) -> float:
    """Wait `pause` before another attempt and return the next, longer one (at most 1 s).

    Raises:
        error: the deadline has passed.
    """
    if time.monotonic() >= deadline:
        raise error
    time.sleep(pause)
    return min(pause * 2, 1.0)


class PostgresViews(PostgresTrackingRecorder, SQLViews):
    """eventsourcing's PostgreSQL tracking recorder, extended with the views' tables."""

    placeholder = "%s"
    prefix_match = 'run_id COLLATE "C">=? AND run_id COLLATE "C"<?'
    """Byte order, whatever the database's collation (which may skip the hyphens)."""
    prefix_order = 'run_id COLLATE "C"'
    """The order of the byte-order index, so a prefix lookup reads only its range."""

    def __init__(self, datastore: PostgresDatastore, channel: str, url: str = "-") -> None:
        super().__init__(datastore, tracking_table_name=TRACKING_TABLE)
        self.url = url
        schema = datastore.schema
        self.names = {
            key: table if key in _INDEXES else f'"{schema}"."{table}"'
            for key, table in NAMES.items()
        }
        self.tracking_table = f'"{schema}"."{TRACKING_TABLE}"'
        self._channel = channel
        self._listener: Any = None

    def _create_table(self, curs: Any) -> None:
        super()._create_table(curs)
        self.create_views(curs)
        # The primary key sorts by the database's collation; prefixes need byte order.
        index = f"CREATE INDEX IF NOT EXISTS stagetrail_runs_id_bytes ON {self.names['runs']}"
        curs.execute(f'{index} ((run_id COLLATE "C"))')

    def _database_transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _insert_tracking_row(self, cursor: Any, tracking: Tracking) -> None:
        self._insert_tracking(cursor, tracking)

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """Wait for a NOTIFY from an append, at most `timeout` seconds (a lost one cannot stall).

        The first call (and the first after a lost connection) only starts listening
        and returns True at once: what was appended between the caller's last read and
        the LISTEN sent no notification this connection could receive, so the caller
        reads again now rather than after `timeout`.
        """
        import psycopg

        try:
            if self._listener is None:
                self._listener = self._listen()
                return not stop.is_set()
            for _ in self._listener.notifies(timeout=timeout, stop_after=1):
                return not stop.is_set()
        except psycopg.Error as error:  # a dropped connection: listen afresh next time
            _log.warning("LISTEN connection lost, reconnecting: %s", error)
            self.close_listener()
            stop.wait(timeout)
        return False

    def _listen(self) -> Any:
        import psycopg

        pool: Any = self.datastore.pool
        conn = psycopg.connect(pool.conninfo, autocommit=True, **dict(pool.kwargs))
        conn.execute(SQL("LISTEN {0}").format(Identifier(self._channel)))
        return conn

    def close_listener(self) -> None:
        """Close the LISTEN connection, if one was opened."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail too
                listener.close()


def _connection_options(url: StoreURL) -> dict[str, Any]:
    """libpq settings passed through from the URL (sslmode, application_name, ...)."""
    return {key: value for key, value in url.options.items() if key in LIBPQ_OPTIONS}


def _connect(url: StoreURL) -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreError(
            url.masked, "PostgreSQL support is not installed: pip install 'stagetrail[postgres]'"
        ) from None
    try:
        return psycopg.connect(
            host=url.host,
            port=url.port,
            user=url.user,
            password=url.password,
            dbname=url.dbname,
            autocommit=True,
            connect_timeout=_timeout(url),
            **_connection_options(url),
        )
    except psycopg.Error as error:
        raise StoreError(
            url.masked, f"cannot connect to PostgreSQL: {_describe(error, url)}"
        ) from None


def _timeout(url: StoreURL) -> int:
    text = url.options.get("connect_timeout", "5")
    if not text.isdigit() or int(text) < 1:
        raise StoreError(url.masked, f"connect_timeout={text!r} must be a whole number of seconds")
    return int(text)


def _describe(error: Exception, url: StoreURL) -> str:
    text = " ".join(str(error).split())
    return text.replace(url.password, "***") if url.password else text


def _schema(url: StoreURL) -> str:
    schema = url.options.get("schema", "public")
    if not _IDENTIFIER.fullmatch(schema):
        raise StoreError(url.masked, f"schema {schema!r} must be lower-case letters, digits and _")
    return schema


def _settle_meta(
    conn: Any, url: StoreURL, create: bool, settings: meta.AtRest
) -> tuple[meta.AtRest, bool]:
    """Check or create the meta table; return the settings and whether events exist."""
    from psycopg import sql

    schema = _schema(url)
    meta_table = sql.Identifier(schema, meta.META_TABLE)
    has_meta, has_events = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
        (f"{schema}.{meta.META_TABLE}", f"{schema}.{meta.EVENTS_TABLE}"),
    ).fetchone()
    if has_meta:
        rows = conn.execute(sql.SQL("SELECT key, value FROM {}").format(meta_table)).fetchall()
        return meta.settle(dict(rows), settings, url.masked), has_events
    if has_events:
        raise StoreError(url.masked, f"schema {schema!r} has events but no stagetrail meta table")
    if not create:
        raise StoreError(url.masked, f"no stagetrail store in schema {schema!r}")
    _check_not_reserved(conn, url, schema)
    _create_meta(conn, schema, settings)
    return settings, False


def _check_not_reserved(conn: Any, url: StoreURL, schema: str) -> None:
    reserved = conn.execute(
        "SELECT 1 FROM pg_get_keywords() WHERE word = %s AND catcode <> 'U'", (schema,)
    ).fetchone()
    if reserved:
        raise StoreError(url.masked, f"schema {schema!r} is an SQL keyword; choose another name")


def _create_meta(conn: Any, schema: str, settings: meta.AtRest) -> None:
    from psycopg import sql

    meta_table = sql.Identifier(schema, meta.META_TABLE)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            ).format(meta_table)
        )
        for key, value in meta.new_meta(settings).items():
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, %s) ON CONFLICT (key) DO NOTHING").format(
                    meta_table
                ),
                (key, value),
            )


def open_postgres(
    url: StoreURL, create: bool, settings: meta.AtRest, *, read_only: bool = False
) -> Backend:
    """Open or create a stagetrail store in a PostgreSQL schema.

    Workers opening a new store at the same moment take turns: creation runs
    under an advisory lock on the schema's name (PostgreSQL's CREATE ... IF NOT
    EXISTS is not safe against a concurrent creation of the same table or type).
    With `read_only` nothing is created or written (a read-only role, a replica):
    projections fold in memory over the stored views.

    Raises:
        StoreError: unreachable server, missing rights, missing store, newer schema, wrong key.
    """
    import psycopg

    with _connect(url) as conn:
        try:
            if create:  # held until the probe connection closes, after the views exist
                conn.execute("SELECT pg_advisory_lock(%s)", (_creation_lock(_schema(url)),))
            settings, has_events = _settle_meta(conn, url, create, settings)
        except psycopg.Error as error:
            problem = f"cannot open the store: {_describe(error, url)}"
            raise StoreError(url.masked, problem) from None
        datastore = _datastore(url)
        recorder = _recorder(url, datastore, has_events or read_only)
        if read_only:
            views = overlay.read_only(
                url.masked, PostgresViews(datastore, recorder.channel_name, url.masked)
            )
            return Backend(recorder, settings.mapper(), _closer(datastore, views), views)
        views, problem = prepare_views(
            lambda: PostgresViews(datastore, recorder.channel_name, url.masked)
        )
    erase = functools.partial(erase_runs, datastore, views)
    return Backend(recorder, settings.mapper(), _closer(datastore, views), views, problem, erase)


def writable(url: StoreURL) -> bool:
    """Whether this role may append and save projections here: a primary, not read-only."""
    import psycopg

    probe = SQL(
        "SELECT NOT pg_is_in_recovery()"
        " AND current_setting('transaction_read_only') = 'off'"
        " AND has_table_privilege({events}, 'INSERT')"
        " AND has_table_privilege({projections}, 'UPDATE')"
    ).format(
        events=_qualified(url, meta.EVENTS_TABLE), projections=_qualified(url, NAMES["projections"])
    )
    try:
        with _connect(url) as conn:
            return bool(conn.execute(probe).fetchone()[0])
    except (StoreError, psycopg.Error):  # no such store, or no rights: the read-only open says
        return False


def _qualified(url: StoreURL, table: str) -> Any:
    """`schema.table` as a string literal, for the privilege functions."""
    return Literal(f"{_schema(url)}.{table}")


def _creation_lock(schema: str) -> int:
    """The advisory lock key (a signed 64-bit int) serialising creation in `schema`."""
    digest = hashlib.sha256(f"stagetrail:create:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _datastore(url: StoreURL) -> Datastore:
    datastore = Datastore(
        dbname=url.dbname,
        host=url.host,
        port=url.port,
        user=url.user,
        password=url.password,
        schema=_schema(url),
        pool_size=2,
        max_overflow=8,
        connect_timeout=float(_timeout(url)),
    )
    # eventsourcing's datastore knows no libpq options; its pool passes these on.
    datastore.pool.kwargs.update(_connection_options(url))  # type: ignore[union-attr]
    return datastore


def _recorder(url: StoreURL, datastore: Datastore, has_events: bool) -> PostgresRecorder:
    import psycopg
    from eventsourcing.persistence import PersistenceError

    try:
        recorder = PostgresRecorder(datastore, events_table_name=meta.EVENTS_TABLE)
        if not has_events:  # a read-only role can open a store it could not create
            recorder.create_table()
    except (psycopg.Error, PersistenceError) as error:
        datastore.close()
        raise StoreError(url.masked, f"cannot prepare the store: {_describe(error, url)}") from None
    return recorder


def erase_runs(datastore: Any, views: PostgresViews | None, run_ids: Sequence[UUID]) -> int:
    """Delete the runs' events and snapshots in one transaction; return the events deleted."""
    events = SQL("DELETE FROM {} WHERE originator_id=%s").format(
        Identifier(datastore.schema, meta.EVENTS_TABLE)
    )
    snapshots = SQL("DELETE FROM {} WHERE run_id=%s").format(
        Identifier(datastore.schema, NAMES["snapshots"])
    )
    removed = 0
    with datastore.transaction(commit=True) as cursor:
        for run_id in run_ids:
            cursor.execute(events, (run_id,))
            removed += cursor.rowcount
            if views is not None:
                cursor.execute(snapshots, (str(run_id),))
    return removed


def _closer(datastore: Any, views: Any) -> Any:
    def close() -> None:
        if views is not None:
            views.close_listener()
        datastore.close()

    return close
