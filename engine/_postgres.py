"""Opening a PostgreSQL store: a probe connection for clear errors, then the pool."""

from __future__ import annotations

import re
from typing import Any

from engine import _meta
from engine._backends import Backend
from engine._urls import LIBPQ_OPTIONS, StoreURL
from engine.errors import StoreError

# Lower case only: eventsourcing creates its composite type under the folded name.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,50}")


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
    conn: Any, url: StoreURL, create: bool, settings: _meta.AtRest
) -> tuple[_meta.AtRest, bool]:
    """Check or create the meta table; return the settings and whether events exist."""
    from psycopg import sql

    schema = _schema(url)
    meta = sql.Identifier(schema, _meta.META_TABLE)
    has_meta, has_events = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL, to_regclass(%s) IS NOT NULL",
        (f"{schema}.{_meta.META_TABLE}", f"{schema}.{_meta.EVENTS_TABLE}"),
    ).fetchone()
    if has_meta:
        rows = conn.execute(sql.SQL("SELECT key, value FROM {}").format(meta)).fetchall()
        return _meta.settle(dict(rows), settings, url.masked), has_events
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


def _create_meta(conn: Any, schema: str, settings: _meta.AtRest) -> None:
    from psycopg import sql

    meta = sql.Identifier(schema, _meta.META_TABLE)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            ).format(meta)
        )
        for key, value in _meta.new_meta(settings).items():
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (%s, %s) ON CONFLICT (key) DO NOTHING").format(meta),
                (key, value),
            )


def open_postgres(url: StoreURL, create: bool, settings: _meta.AtRest) -> Backend:
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
        recorder = PostgresApplicationRecorder(datastore, events_table_name=_meta.EVENTS_TABLE)
        if not has_events:  # a read-only role can open a store it could not create
            recorder.create_table()
    except (psycopg.Error, PersistenceError) as error:
        datastore.close()
        raise StoreError(url.masked, f"cannot prepare the store: {_describe(error, url)}") from None
    from engine._backends import prepare_views
    from projections._postgres_views import PostgresViews

    views, problem = prepare_views(lambda: PostgresViews(datastore, recorder.channel_name))
    return Backend(recorder, settings.mapper(), _closer(datastore, views), views, problem)


def _closer(datastore: Any, views: Any) -> Any:
    def close() -> None:
        if views is not None:
            views.close_listener()
        datastore.close()

    return close
