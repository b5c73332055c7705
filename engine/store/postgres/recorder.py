"""eventsourcing's PostgreSQL application recorder, with appends that never hang nor double."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from eventsourcing.persistence import IntegrityError, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg.sql import SQL, Identifier

from engine.store import meta
from engine.store.errors import AppendOutcomeUnknown, StoreError
from engine.store.postgres.datastore import CONNECTION_LOST, Datastore, describe
from engine.store.urls import StoreURL

_log = logging.getLogger(__name__)

PIPELINE_BYTES = 1 << 20
"""Largest append (bytes of event state) sent in psycopg's pipeline mode.

psycopg's pipeline deadlocks on large parameters: the client waits in the
pipeline sync for results while the server still waits for the rest of the
INSERT, holding the events table's EXCLUSIVE lock (every writer then blocks).
Larger appends go statement by statement, where a round trip is negligible.
"""

RETRY_SECONDS = 30.0
"""How long an append keeps retrying a lost connection before it gives up."""


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
        table = (Identifier(datastore.schema), Identifier(events_table_name))
        # The append's statements, stagetrail's own: the table locked EXCLUSIVE so ids
        # are issued in commit order (followers never pass over a gap filled later).
        self._before_insert = [
            SQL("SET LOCAL lock_timeout = '{0}s'").format(datastore.lock_timeout),
            SQL("LOCK TABLE {0}.{1} IN EXCLUSIVE MODE").format(*table),
            SQL("NOTIFY {0}").format(Identifier(self.channel_name)),
        ]
        self._insert = SQL(
            "INSERT INTO {0}.{1} (originator_id, originator_version, topic, state) "
            "SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::bytea[]) "
            "RETURNING notification_id"
        ).format(*table)
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
        except CONNECTION_LOST as error:
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
                return self._insert_once(stored_events)
            except IntegrityError:
                # A commit of ours that was still in flight when we looked may hold them.
                found = self._stored_ids(stored_events, deadline)
                if found:
                    return found
                raise
            except CONNECTION_LOST as lost:
                error, maybe_sent = lost, maybe_sent or _maybe_sent(lost)

    def _insert_once(self, stored_events: Sequence[StoredEvent]) -> Sequence[int]:
        """One attempt at the append, in one transaction; the events' notification ids."""
        columns = (
            [event.originator_id for event in stored_events],
            [event.originator_version for event in stored_events],
            [event.topic for event in stored_events],
            [event.state for event in stored_events],
        )
        pipelined = sum(len(event.state) for event in stored_events) <= PIPELINE_BYTES
        with self.datastore.get_connection() as conn:
            if not pipelined:
                with conn.transaction(), conn.cursor() as curs:
                    return self._execute_insert(curs, columns)
            failure: Exception | None = None
            with conn.pipeline() as pipeline, conn.transaction(), conn.cursor() as curs:
                try:
                    ids = self._execute_insert(curs, columns, pipeline.sync)
                except Exception as error:  # raised once the pipeline is left: psycopg warns
                    failure = error
            if failure is not None:
                raise failure
            return ids

    def _execute_insert(
        self, curs: Any, columns: tuple[list[Any], ...], sync: Callable[[], None] | None = None
    ) -> list[int]:
        for statement in self._before_insert:
            curs.execute(statement, prepare=True)
        curs.execute(self._insert, columns, prepare=True)
        if sync is not None:
            sync()  # a version conflict raises here, as IntegrityError, not at the commit
        return [row["notification_id"] for row in curs.fetchall()]

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
            except CONNECTION_LOST as lost:
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


def make_recorder(url: StoreURL, datastore: Datastore, has_events: bool) -> PostgresRecorder:
    """The store's recorder, its events table created unless it `has_events` already."""
    import psycopg
    from eventsourcing.persistence import PersistenceError

    try:
        recorder = PostgresRecorder(datastore, events_table_name=meta.EVENTS_TABLE)
        if not has_events:  # a read-only role can open a store it could not create
            recorder.create_table()
    except (psycopg.Error, PersistenceError) as error:
        datastore.close()
        raise StoreError(url.masked, f"cannot prepare the store: {describe(error, url)}") from None
    return recorder
