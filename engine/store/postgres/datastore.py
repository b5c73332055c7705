"""Connecting to PostgreSQL: a probe connection for clear errors, eventsourcing's pool."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from eventsourcing.persistence import InterfaceError, OperationalError
from eventsourcing.postgres import PostgresDatastore

from engine.store.errors import StoreError
from engine.store.urls import LIBPQ_OPTIONS, StoreURL

# Lower case only: eventsourcing creates its composite type under the folded name.
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,50}")

CONNECTION_LOST = (OperationalError, InterfaceError)

_T = TypeVar("_T")

_SESSION_ENDED = {"57P01", "57P02", "57P03", "57P05"}
"""The session ended by the server: admin_shutdown (``pg_terminate_backend``, a fast
shutdown), crash_shutdown, cannot_connect_now, idle_session_timeout (a pooled
connection idle longer than the server's ``idle_session_timeout``)."""


def lost(error: BaseException | None) -> bool:
    """Whether `error` (eventsourcing's wrapping) says a connection was lost on its way or in
    use: not that the pool could hand out none (the server down: a retry would wait as
    long), nor a statement the server refused on a live one (a timeout, a lock not had)."""
    from psycopg_pool import PoolTimeout

    if not isinstance(error, CONNECTION_LOST) or isinstance(error.__cause__, PoolTimeout):
        return False
    state = getattr(error.__cause__, "sqlstate", None)
    return state is None or state.startswith("08") or state in _SESSION_ENDED


def read_retried(read: Callable[[], _T]) -> _T:
    """`read()`, run once more if its connection was found lost: a read is idempotent, and
    the datastore has closed that connection and checked the idle ones, so the second runs
    on a live one. Only for reads: a write retried could be applied twice."""
    try:
        return read()
    except CONNECTION_LOST as error:
        if not lost(error):
            raise
    return read()


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
        except CONNECTION_LOST:
            with contextlib.suppress(Exception):  # the server may still be down
                self.pool.check()
            raise

    @contextlib.contextmanager
    def transaction(self, *, commit: bool = False) -> Iterator[Any]:
        """A transaction's cursor (see `PostgresDatastore.transaction`); without `commit`, a
        READ ONLY one, ended by COMMIT unless it fails.

        eventsourcing ends a read by ROLLBACK, and psycopg forgets every statement it
        has prepared on the connection at a ROLLBACK (it may have undone a PREPARE): each
        read then cost a ``DEALLOCATE ALL`` and the next statements were parsed and planned
        again. A READ ONLY transaction writes no table but a temporary one, so its COMMIT
        keeps what a ROLLBACK would, and the prepared statements (what else would outlive
        it, a session's SET, a temporary table's rows, an ANALYZE, no read does).
        """
        from psycopg import pq

        if commit:
            with super().transaction(commit=True) as cursor:
                yield cursor
            return
        with self.get_connection() as conn:
            conn.read_only = True
            try:
                with conn.transaction():
                    yield conn.cursor()
            finally:
                if not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE:
                    conn.read_only = None


def make_datastore(url: StoreURL, *, pool_size: int = 2, max_overflow: int = 8) -> Datastore:
    """eventsourcing's pooled datastore for the store `url` names (its schema, libpq options),
    of `pool_size` connections kept and `max_overflow` more at most."""
    datastore = Datastore(
        dbname=url.dbname,
        host=url.host,
        port=url.port,
        user=url.user,
        password=url.password,
        schema=schema_of(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        connect_timeout=float(timeout_of(url)),
    )
    # eventsourcing's datastore knows no libpq options; its pool passes these on.
    datastore.pool.kwargs.update(connection_options(url))  # type: ignore[union-attr]
    return datastore


def connection_options(url: StoreURL) -> dict[str, Any]:
    """libpq settings passed through from the URL (sslmode, application_name, ...)."""
    return {key: value for key, value in url.options.items() if key in LIBPQ_OPTIONS}


def connect(url: StoreURL) -> Any:
    """A probe connection (autocommit), or a `StoreError` that says why there is none."""
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
            connect_timeout=timeout_of(url),
            **connection_options(url),
        )
    except psycopg.Error as error:
        raise StoreError(
            url.masked, f"cannot connect to PostgreSQL: {describe(error, url)}"
        ) from None


def timeout_of(url: StoreURL) -> int:
    """The URL's ``connect_timeout`` in whole seconds (default 5)."""
    text = url.options.get("connect_timeout", "5")
    if not text.isdigit() or int(text) < 1:
        raise StoreError(url.masked, f"connect_timeout={text!r} must be a whole number of seconds")
    return int(text)


def describe(error: Exception, url: StoreURL) -> str:
    """A driver error on one line, the password masked."""
    text = " ".join(str(error).split())
    return text.replace(url.password, "***") if url.password else text


def schema_of(url: StoreURL) -> str:
    """The store's schema (``schema=`` option, default ``public``), checked."""
    schema = url.options.get("schema", "public")
    if not IDENTIFIER.fullmatch(schema):
        raise StoreError(url.masked, f"schema {schema!r} must be lower-case letters, digits and _")
    return schema
