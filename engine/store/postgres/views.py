"""The PostgreSQL tables of the read side: tracking records, the views' tables, LISTEN/NOTIFY."""

from __future__ import annotations

import contextlib
import logging
import threading
from contextlib import AbstractContextManager
from typing import Any

from psycopg.sql import SQL, Identifier

from engine.store.postgres.datastore import Datastore, lost
from engine.store.sql import NAMES, SQLViews

TRACKING_TABLE = "stagetrail_tracking"
_log = logging.getLogger(__name__)
_INDEXES = ("runs_started", "runs_parent")


class PostgresViews(SQLViews):
    """eventsourcing's tracking recorder interface and the views' tables, in the store's schema."""

    placeholder = "%s"
    blob_type = "BYTEA"
    prefix_match = 'run_id COLLATE "C">=? AND run_id COLLATE "C"<?'
    """Byte order, whatever the database's collation (which may skip the hyphens)."""
    prefix_order = 'run_id COLLATE "C"'
    """The order of the byte-order index, so a prefix lookup reads only its range."""
    generation_lock = " FOR SHARE"
    """An erase locks the generation's row first (`meta.bump_generation`)."""

    tracking_definition = (  # eventsourcing's, as it created the table before
        "CREATE TABLE IF NOT EXISTS {tracking} (application_name text, notification_id bigint, "
        "PRIMARY KEY (application_name))WITH (    autovacuum_enabled = true,"
        "    autovacuum_vacuum_threshold = 100000000,    autovacuum_vacuum_scale_factor = 0.5,"
        "    autovacuum_analyze_threshold = 1000,    autovacuum_analyze_scale_factor = 0.01)"
    )

    def __init__(self, datastore: Datastore, channel: str, url: str = "-") -> None:
        super().__init__(datastore, url)
        schema = datastore.schema
        self.names = {
            key: table if key in _INDEXES else f'"{schema}"."{table}"'
            for key, table in NAMES.items()
        }
        self.tracking_table = f'"{schema}"."{TRACKING_TABLE}"'
        self._channel = channel
        self._listener: Any = None

    def _read(self, *, statements: int = 1) -> AbstractContextManager[Any]:
        """A read of one query outside a transaction (one round trip, not three); of more, in a
        transaction of its own."""
        if statements > 1:
            return self._transaction(commit=False)
        # the pool's connections are in autocommit: a query out of a transaction is one
        return self._refusing(self.datastore.cursor())

    def lost(self, error: BaseException | None) -> bool:
        """Whether `error` lost its connection (a pooled one terminated, or the server
        restarted since): a read is then run once more, on a live one."""
        return lost(error)

    def create_views(self, cursor: Any) -> None:
        """Create the views' tables and the run ids' byte-order index (idempotent)."""
        super().create_views(cursor)
        # The primary key sorts by the database's collation; prefixes need byte order.
        index = f"CREATE INDEX IF NOT EXISTS stagetrail_runs_id_bytes ON {self.names['runs']}"
        cursor.execute(f'{index} ((run_id COLLATE "C"))')

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
            # closed before draining: while open, the generator holds the connection's lock
            with contextlib.closing(self._listener.notifies(timeout=timeout)) as received:
                woken = next(received, None) is not None
            if woken:
                # those received already too: the caller's read covers their appends, and
                # each left queued would wake it again for nothing
                for _ in self._listener.notifies(timeout=0):
                    pass
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
