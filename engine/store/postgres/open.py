"""Opening a PostgreSQL store: its schema's meta table under an advisory lock, the recorder
and the views; whether a role may write; erasing runs.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg.sql import SQL, Identifier, Literal

from engine.store import meta
from engine.store.backend import Backend, prepare_views, row_reader
from engine.store.errors import StoreError, StoreReadOnly
from engine.store.failures import READ_ONLY_TRANSACTION, classify
from engine.store.postgres.datastore import (
    connect,
    describe,
    make_datastore,
    read_retried,
    schema_of,
)
from engine.store.postgres.ranges import RangeReader
from engine.store.postgres.recorder import (
    CONCURRENT_SCHEMA,
    has_tx_column,
    install_append,
    make_recorder,
    upgrade,
)
from engine.store.postgres.views import PostgresViews
from engine.store.sql import NAMES
from engine.store.urls import StoreURL


def _settle_meta(
    conn: Any, url: StoreURL, create: bool, settings: meta.AtRest
) -> tuple[meta.AtRest, bool]:
    """Check or create the meta table; return the settings and whether events exist."""
    from psycopg import sql

    schema = schema_of(url)
    meta_table = sql.Identifier(schema, meta.META_TABLE)
    has_meta, has_events = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
        (f"{schema}.{meta.META_TABLE}", f"{schema}.{meta.EVENTS_TABLE}"),
    ).fetchone()
    if has_meta:
        rows = conn.execute(sql.SQL("SELECT key, value FROM {}").format(meta_table)).fetchall()
        newest = CONCURRENT_SCHEMA
        return meta.settle(dict(rows), settings, url.masked, newest=newest), has_events
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
    Under the same lock, a store written by an older release, whose appends took
    the events table's EXCLUSIVE lock, is upgraded to concurrent appends
    (`recorder.upgrade`; see docs/scaling.md for stopping the older processes first).
    With `read_only` nothing is created or written (a read-only role, a replica):
    projections fold in memory over the stored views. Opened for writing where the
    session's transactions are read-only (a standby, ``default_transaction_read_only``),
    the same holds, nothing is upgraded, and each append or erase raises `StoreReadOnly`.

    Raises:
        StoreError: unreachable server, missing rights, missing store, newer schema, wrong key.
    """
    import psycopg

    with connect(url) as conn:
        try:
            if not read_only:  # held until the probe connection closes, after the views exist
                conn.execute("SELECT pg_advisory_lock(%s)", (_creation_lock(schema_of(url)),))
            settings, has_events = _settle_meta(conn, url, create, settings)
            read_only_server = not read_only and _server_read_only(conn)
            chain = _settle_chain(
                conn, url, settings, has_events, read_only=read_only, record=not read_only_server
            )
            concurrent = not (read_only or read_only_server) or has_tx_column(conn, schema_of(url))
        except psycopg.Error as error:
            if error.sqlstate == READ_ONLY_TRANSACTION:  # creating on a read-only server
                raise classify(url.masked, error, "cannot create the store") from None
            problem = f"cannot open the store: {describe(error, url)}"
            raise StoreError(url.masked, problem) from None
        datastore = make_datastore(url)
        recorder = make_recorder(url, datastore, has_events or read_only, concurrent=concurrent)
        if not (read_only or read_only_server):  # there, appends fail, each saying why
            recorder.function = _upgrade(conn, url, datastore)
        mapper = settings.mapper()
        codec = settings.codec(mapper)
        generation = functools.partial(read_generation, datastore)
        after = functools.partial(stored_after, datastore)
        rows = row_reader(recorder)
        ranges = functools.partial(RangeReader, url)
        if read_only or read_only_server:  # views folded in memory: nothing kept
            views = PostgresViews(datastore, recorder.channel_name, url.masked)
            views.codec = codec
            closer = _closer(datastore, views, recorder)
            erase = None if read_only else functools.partial(_refuse_erase, url)
            return Backend(
                recorder, mapper, closer, views, erase=erase, read_only=True, codec=codec,
                generation=generation, chain=chain, stored_after=after, stored_rows=rows,
                range_reader=ranges,
            )  # fmt: skip
        views, problem = prepare_views(
            lambda: PostgresViews(datastore, recorder.channel_name, url.masked), codec
        )
    erase = functools.partial(erase_runs, datastore, views)
    closer = _closer(datastore, views, recorder)
    return Backend(
        recorder, mapper, closer, views, problem, erase, codec=codec, generation=generation,
        chain=chain, stored_after=after, stored_rows=rows, range_reader=ranges,
    )  # fmt: skip


def _settle_chain(
    conn: Any,
    url: StoreURL,
    settings: meta.AtRest,
    has_events: bool,
    *,
    read_only: bool,
    record: bool = True,
) -> meta.ChainRecord | None:
    """The store's recorded chain; a writer's key checked against it, or (an older store)
    recorded as this writer's, chained from the newest event now (under the creation lock)
    unless it may not `record` (a read-only server: none of its appends can succeed).

    Raises:
        ChainKeyMismatch: the writer's chain key is not the recorded one.
    """
    schema = schema_of(url)
    meta_table = Identifier(schema, meta.META_TABLE)
    rows = conn.execute(SQL("SELECT key, value FROM {}").format(meta_table)).fetchall()
    found = meta.read_chain(dict(rows))
    if read_only:
        return found
    if found is not None:
        meta.check_chain(found, settings, url.masked)
        return found
    if not record:
        return None
    newest = 0
    if has_events:
        events = Identifier(schema, meta.EVENTS_TABLE)
        found = conn.execute(SQL("SELECT max(notification_id) FROM {}").format(events)).fetchone()
        newest = found[0] or 0
    written = meta.chain_rows(settings, newest)
    insert = SQL("INSERT INTO {} VALUES (%s, %s) ON CONFLICT (key) DO NOTHING").format(meta_table)
    with conn.transaction():
        for key, value in written.items():
            conn.execute(insert, (key, value))
    return meta.read_chain(written)


def stored_after(datastore: Any, run_id: UUID, position: int) -> int | None:
    """The run's first version stored after notification `position` (None: none is)."""
    statement = SQL(
        "SELECT min(originator_version) FROM {} WHERE originator_id=%s AND notification_id>%s"
    ).format(Identifier(datastore.schema, meta.EVENTS_TABLE))

    def read() -> Any:
        with datastore.cursor() as cursor:  # autocommit: no BEGIN, no COMMIT
            cursor.execute(statement, (run_id, position))
            return cursor.fetchone()

    row = read_retried(read)
    value = row["min"] if isinstance(row, dict) else row[0]
    return None if value is None else int(value)


def _upgrade(conn: Any, url: StoreURL, datastore: Any) -> bool:
    """Give a new store, or one an older release wrote, concurrent appends and its append
    function (under the lock); whether appends call the function."""
    import psycopg

    try:
        upgrade(conn, schema_of(url), meta.META_TABLE)
        return install_append(conn, schema_of(url))
    except psycopg.Error as error:
        datastore.close()
        problem = f"cannot upgrade the store to concurrent appends: {describe(error, url)}"
        raise StoreError(url.masked, problem) from None


def _refuse_erase(url: StoreURL, run_ids: Sequence[UUID]) -> int:
    """An erase of a store opened for writing on a read-only server: refused, even were the
    server writable by now, since its views fold in memory (an erase would leave the stored
    rows of the runs it removes).

    Raises:
        StoreReadOnly: always.
    """
    raise StoreReadOnly(
        url.masked,
        f"erase of {len(run_ids)} run(s) refused, nothing removed: the PostgreSQL server was "
        "read-only when the store was opened (a standby, or default_transaction_read_only on "
        "for the server, the database or the role); open it on the primary, or with that "
        "setting off",
    )


def _server_read_only(conn: Any) -> bool:
    """Whether this role's transactions on the server are read-only: a standby, or
    ``default_transaction_read_only`` set for the server, the database or the role."""
    row = conn.execute(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'"
    ).fetchone()
    return bool(row[0])


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
        with connect(url) as conn:
            return bool(conn.execute(probe).fetchone()[0])
    except (StoreError, psycopg.Error):  # no such store, or no rights: the read-only open says
        return False


def _qualified(url: StoreURL, table: str) -> Any:
    """`schema.table` as a string literal, for the privilege functions."""
    return Literal(f"{schema_of(url)}.{table}")


def _creation_lock(schema: str) -> int:
    """The advisory lock key (a signed 64-bit int) serialising creation in `schema`."""
    digest = hashlib.sha256(f"stagetrail:create:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def read_generation(datastore: Any) -> int:
    """The store's erasure generation, as committed now."""

    def read() -> int:
        with datastore.cursor() as cursor:  # autocommit: no BEGIN, no COMMIT
            return meta.read_generation(cursor, _meta_table(datastore))

    return read_retried(read)


def _meta_table(datastore: Any) -> str:
    return f'"{datastore.schema}"."{meta.META_TABLE}"'


ERASE_EVENTS = 500
"""At most this many events are deleted per erase transaction (a longer run takes several)."""


def erase_runs(
    datastore: Any,
    views: PostgresViews | None,
    run_ids: Sequence[UUID],
    *,
    limit: int | None = None,
) -> int:
    """Delete the runs' events and snapshots in transactions of at most `limit` events
    (default `ERASE_EVENTS`),
    each counting one more erasure generation; return the events deleted.

    Each transaction locks the events table against appends until it commits, so
    bounding it by events, not runs, bounds how long an append waits. A longer run
    loses its events between the first and the last newest first: until its last
    transaction what is left of it is its history's beginning, from its `RunStarted`,
    and its deletion, so a projection folded again from the start (the run index too)
    sees a history the run had, whose it is, and forgets what it folded of it; every
    reader of the run refuses it meanwhile (`Store.erasure_begun`).
    """
    removed, pending, bound = 0, list(run_ids), max(2, limit or ERASE_EVENTS)
    while pending:
        erased, pending = _erase_some(datastore, views, pending, bound)
        removed += erased
    return removed


def _erase_some(
    datastore: Any, views: PostgresViews | None, run_ids: list[UUID], limit: int
) -> tuple[int, list[UUID]]:
    """One transaction: up to `limit` of the runs' events, whole runs where they fit, else
    a run's newest events before its last (its first stays); the events deleted, runs left."""
    table = Identifier(datastore.schema, meta.EVENTS_TABLE)
    # One statement per run: all its events where they fit in the budget, else the
    # newest ones before its last, never its first (RETURNING tells which it was).
    some = SQL(
        "WITH t AS (SELECT count(*) AS total FROM {0} WHERE originator_id=%(run)s), "
        "d AS (DELETE FROM {0} WHERE originator_id=%(run)s AND ((SELECT total FROM t) "
        "<= %(budget)s OR originator_version IN (SELECT originator_version FROM {0} "
        "WHERE originator_id=%(run)s ORDER BY originator_version DESC OFFSET 1 "
        "LIMIT GREATEST(0, LEAST(%(budget)s, (SELECT total FROM t) - 2)))) RETURNING 1) "
        "SELECT (SELECT count(*) FROM d) AS removed, (SELECT total FROM t) <= %(budget)s AS whole"
    ).format(table)
    snapshots = SQL("DELETE FROM {} WHERE run_id=%s").format(
        Identifier(datastore.schema, NAMES["snapshots"])
    )
    # Appends hold ROW EXCLUSIVE until they commit: this lock waits for those in flight
    # and holds back new ones, so the DELETE sees every committed event of the runs and
    # an append after it finds its run's events gone (`Store.write`'s heads).
    lock = SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(table)
    removed, budget = 0, limit
    with datastore.transaction(commit=True) as cursor:
        cursor.execute(lock)
        meta.bump_generation(cursor, _meta_table(datastore))
        while run_ids and budget:
            run = run_ids[0]
            cursor.execute(some, {"run": run, "budget": budget})
            row = cursor.fetchone()
            removed += row["removed"]
            if not row["whole"]:
                break  # too long for this transaction: the rest of it in the next
            budget -= row["removed"]
            if views is not None:  # every event of the run is gone with this transaction
                cursor.execute(snapshots, (str(run_ids[0]),))
            run_ids = run_ids[1:]
    return removed, run_ids


def _closer(datastore: Any, views: Any, recorder: Any) -> Any:
    def close() -> None:
        recorder.notifier.close()  # the NOTIFY still due, while the pool is open
        if views is not None:
            views.close_listener()
        datastore.close()

    return close
