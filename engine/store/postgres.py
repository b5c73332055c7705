"""The PostgreSQL backend: a probe connection for clear errors, eventsourcing's pooled
recorder in the store's schema, the views beside the events, and LISTEN/NOTIFY waiting.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Tracking
from eventsourcing.postgres import PostgresDatastore, PostgresTrackingRecorder
from psycopg.sql import SQL, Identifier

from engine.store import meta
from engine.store.backend import Backend, prepare_views
from engine.store.errors import StoreError
from engine.store.sql import NAMES, SQLViews
from engine.store.urls import LIBPQ_OPTIONS, StoreURL

TRACKING_TABLE = "stagetrail_tracking"
_log = logging.getLogger(__name__)
_INDEXES = ("runs_started", "runs_parent")
# Lower case only: eventsourcing creates its composite type under the folded name.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,50}")


class PostgresViews(PostgresTrackingRecorder, SQLViews):
    """eventsourcing's PostgreSQL tracking recorder, extended with the views' tables."""

    placeholder = "%s"
    prefix_match = 'run_id COLLATE "C">=? AND run_id COLLATE "C"<?'
    """Byte order, whatever the database's collation (which may skip the hyphens)."""
    prefix_order = 'run_id COLLATE "C"'
    """The order of the byte-order index, so a prefix lookup reads only its range."""

    def __init__(self, datastore: PostgresDatastore, channel: str) -> None:
        super().__init__(datastore, tracking_table_name=TRACKING_TABLE)
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

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _insert_tracking_row(self, cursor: Any, tracking: Tracking) -> None:
        self._insert_tracking(cursor, tracking)

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """Wait for a NOTIFY from an append, at most `timeout` seconds (a lost one cannot stall)."""
        import psycopg

        try:
            if self._listener is None:
                self._listener = self._listen()
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


def open_postgres(url: StoreURL, create: bool, settings: meta.AtRest) -> Backend:
    """Open or create a stagetrail store in a PostgreSQL schema.

    Raises:
        StoreError: unreachable server, missing rights, missing store, newer schema, wrong key.
    """
    import psycopg
    from eventsourcing.persistence import PersistenceError
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

    try:
        with _connect(url) as conn:
            settings, has_events = _settle_meta(conn, url, create, settings)
    except psycopg.Error as error:
        raise StoreError(url.masked, f"cannot open the store: {_describe(error, url)}") from None
    datastore = PostgresDatastore(
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
    try:
        recorder = PostgresApplicationRecorder(datastore, events_table_name=meta.EVENTS_TABLE)
        if not has_events:  # a read-only role can open a store it could not create
            recorder.create_table()
    except (psycopg.Error, PersistenceError) as error:
        datastore.close()
        raise StoreError(url.masked, f"cannot prepare the store: {_describe(error, url)}") from None

    views, problem = prepare_views(lambda: PostgresViews(datastore, recorder.channel_name))
    erase = functools.partial(erase_runs, datastore, views)
    return Backend(recorder, settings.mapper(), _closer(datastore, views), views, problem, erase)


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
