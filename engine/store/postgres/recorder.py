"""eventsourcing's PostgreSQL application recorder: concurrent appends that never hang nor
double, and reads of the notification log that never pass over an event committed late.

How many writers commit at once, and why followers still see one gap-free order:

- Each event row carries the id of the transaction that wrote it (``tx_id``, an
  ``xid8``, by default ``pg_current_xact_id()``).
- An append takes its transaction id and its notification ids inside one short
  section under a session advisory lock, released before the COMMIT: transaction
  ids and notification ids of appends are issued in the same order, while the
  commits themselves (the WAL flush, the slow part) run side by side.
- A reader takes only rows whose transaction is older than every append still in
  flight (``tx_id <`` `HORIZON`: ``pg_snapshot_xmin`` of its snapshot, less the
  transactions that are not appends of this store). The rows it may read are
  therefore a prefix of the notification order: any lower id belongs to a
  transaction that has ended, so it is visible or will never be.
- That bound can move back between two reads (which transactions it leaves out is
  decided when the locks are read), so rows up to the newest head the recorder has
  answered are read without it: their transactions had all ended then.

An append is one statement where the store has its append function (`install_append`,
created with the store or when an older one is first opened for writing): a call,
in its own transaction, that takes the section, inserts and leaves it. Where the role
may not create it, the append sends the statements one by one, in a pipeline.

`select_notifications` and `max_notification_id` apply that rule, so every
follower (persistent projections, the run index, ``follow``, shared circuits)
reads through it. A store written by an older release (an ``EXCLUSIVE`` lock on the
events table for every append, no ``tx_id``) is upgraded in place when first opened
for writing (`upgrade`); docs/scaling.md says why and at what cost.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    Notification,
    OperationalError,
    StoredEvent,
)
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composable, Composed, Identifier, Literal

from engine.store import meta
from engine.store.errors import AppendOutcomeUnknown, HeadMissing, StoreError
from engine.store.postgres.datastore import CONNECTION_LOST, Datastore, describe
from engine.store.postgres.notifier import Notifier
from engine.store.urls import StoreURL

_log = logging.getLogger(__name__)

PIPELINE_BYTES = 1 << 20
"""Largest append (bytes of event state) sent in psycopg's pipeline mode.

psycopg's pipeline deadlocks on large parameters: the client waits in the
pipeline sync for results while the server still waits for the rest of the
INSERT, holding the append section (every writer then blocks). Larger appends
go statement by statement, where a round trip is negligible.
"""

RETRY_SECONDS = 30.0
"""How long an append keeps retrying a lost connection before it gives up."""

TX_COLUMN = "tx_id"
"""The events table's column holding the id of the transaction that wrote the row."""

CONCURRENT_SCHEMA = 2
"""The meta table's schema version of a PostgreSQL store whose appends run concurrently.

A release that knows only version 1 (every append under the table's EXCLUSIVE
lock, followers reading every committed row) refuses to open such a store, so
old and new readers never share one.
"""

APPEND_FUNCTION = "stagetrail_append_2"
"""The store's append function: the section, the INSERT and the heads check in one call.

Numbered: a release that changes what it does creates it under another name, so
processes of both releases append side by side while a fleet is upgraded.
"""

APPEND_SIGNATURE = "(uuid[], bigint[], text[], bytea[], uuid[], bigint[], bytea[])"
"""The append function's argument types: the events' columns, then the heads' (run, version
and the SHA-256 of the bytes the writer holds, NULL where it holds none)."""

SHAPES = 16
"""Most events (and runs) of an append called with one parameter per value; larger appends
pass whole arrays. At most SHAPES² + 1 statements per connection."""

_COLUMN_TYPES = ("uuid", "bigint", "text", "bytea", "uuid", "bigint", "bytea")

RUNS_PAGE = 1000
"""Most events one query of `PostgresRecorder.select_run_pages` answers."""

SETTLE_SECONDS = 2.0
"""How long `max_notification_id` waits for older transactions to end before it answers."""

_FIRST_SETTLE_PAUSE = 0.001
_BEGIN = SQL("BEGIN")
_COMMIT = SQL("COMMIT")

HORIZON = (
    "(WITH locks AS MATERIALIZED (SELECT locktype, relation, mode, transactionid, pid "
    "FROM pg_locks), snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s) "
    "SELECT coalesce(min(x), (SELECT pg_snapshot_xmax(s) FROM snap)) "
    "FROM snap, pg_snapshot_xip(snap.s) AS x WHERE NOT EXISTS ("
    "SELECT 1 FROM locks r WHERE r.locktype = 'transactionid' AND r.transactionid = x::xid "
    "AND r.pid NOT IN (SELECT w.pid FROM locks w WHERE w.locktype = 'relation' "
    "AND w.relation = {0}::regclass AND w.mode <> 'AccessShareLock' AND w.pid IS NOT NULL)))"
)
"""The oldest transaction of the reader's snapshot that may have written to the events table.

Rows of older transactions are safe to read. It is ``pg_snapshot_xmin`` of the
snapshot, less the transactions that are still running when the locks are read
and hold no write lock on the events table: those are not appends of this store
(an append takes its table lock before its transaction id), so a long
transaction elsewhere on the server does not hold this store's followers back.
A transaction that ended between the snapshot and the lock read is kept, as any
append might have.
"""


class PostgresRecorder(PostgresApplicationRecorder):
    """eventsourcing's application recorder, with appends that never hang nor double.

    An append whose connection is lost around its commit may have been committed
    although the client saw an error. eventsourcing's recorder would send it again
    and report a conflict with itself; this one asks the database whether the
    very bytes it sent are stored at those versions, and reports success if so.
    """

    retry_seconds = RETRY_SECONDS
    settle_seconds = SETTLE_SECONDS
    recovered: dict[str, int]
    """Appends whose connection was lost, by what the check found (for the fault suite)."""

    def __init__(
        self,
        datastore: PostgresDatastore,
        *,
        events_table_name: str,
        concurrent: bool = True,
        function: bool = False,
    ) -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        self.concurrent = concurrent
        """Appends without the table lock, reads below the oldest append in flight."""
        self.function = function and concurrent
        """Each append one call of the store's append function (else statement by statement)."""
        # eventsourcing names the NOTIFY channel after the table alone, so every
        # store of the database (one per schema) would wake every other's followers.
        self.channel_name = f"stagetrail_{datastore.schema}"
        self.recovered = {"stored": 0, "absent": 0}
        self._settled = 0  # the newest head answered: every row up to it is settled
        table = (Identifier(datastore.schema), Identifier(events_table_name))
        self._table = SQL("{0}.{1}").format(*table)
        self._horizon = SQL(HORIZON).format(Literal(f'"{datastore.schema}"."{events_table_name}"'))
        timeout = SQL("SET LOCAL lock_timeout = '{0}s'").format(datastore.lock_timeout)
        notify = SQL("NOTIFY {0}").format(Identifier(self.channel_name))
        section = Literal(append_lock(datastore.schema))
        self._function_name = f'"{datastore.schema}".{APPEND_FUNCTION}'
        self._calls: dict[tuple[int, int], bytes] = {}
        self._notify = (
            SQL("SELECT set_config('synchronous_commit', 'off', true), pg_notify({0}, '')")
            .format(Literal(self.channel_name))
            .as_bytes(None)
        )
        self.notifier = Notifier(self._send_notify)
        """Wakes the followers after the appends of the function (at most one NOTIFY per
        interval); the statements' appends notify each."""
        self._unlock = SQL("SELECT pg_advisory_unlock({0})").format(section)
        if concurrent:
            # The transaction id and the notification ids taken in one short section
            # (the INSERT); the NOTIFY in a transaction of its own after the COMMIT, not
            # waiting for its flush, because NOTIFY serialises every committing
            # transaction that sent one.
            self._before_insert = [
                _BEGIN,
                timeout,
                SQL("SELECT pg_advisory_lock({0})").format(section),
            ]
            self._commit_statements = [
                _COMMIT,
                SQL("SELECT set_config('synchronous_commit', 'off', true)"),
                notify,
            ]
        else:
            # The older release's append, for a store opened read-only before its
            # upgrade: the table locked EXCLUSIVE so ids are issued in commit order.
            self._before_insert = [
                timeout,
                SQL("LOCK TABLE {0}.{1} IN EXCLUSIVE MODE").format(*table),
                notify,
            ]
            self._commit_statements = []
        # Each (run, version) of the heads arrays must be stored (with the SHA-256 of its
        # bytes given, where given) and be its run's newest, or nothing is inserted: the
        # run was erased, or its erase began, since its writer read it (see `Store.write`).
        self._insert_statement = SQL(
            "INSERT INTO {0}.{1} (originator_id, originator_version, topic, state) "
            "SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::bytea[]) "
            "WHERE NOT EXISTS (SELECT 1 FROM unnest(%s::uuid[], %s::bigint[], %s::bytea[]) "
            "AS head(run, v, digest) WHERE NOT EXISTS (SELECT 1 FROM {0}.{1} "
            "WHERE originator_id = head.run AND originator_version = head.v "
            "AND (head.digest IS NULL OR sha256(state) = head.digest)) "
            "OR EXISTS (SELECT 1 FROM {0}.{1} WHERE originator_id = head.run "
            "AND originator_version > head.v)) "
            "RETURNING notification_id"
        ).format(*table)
        self._heads_statement = SQL(
            "SELECT (SELECT notification_id FROM {0} WHERE {1} < {2} "
            "ORDER BY notification_id DESC LIMIT 1) AS safe, "
            "(SELECT max(notification_id) FROM {0}) AS newest"
        ).format(self._table, Identifier(TX_COLUMN), self._horizon)
        self._select_versions = SQL(
            "SELECT originator_version, topic, state, notification_id FROM {0}.{1} "
            "WHERE originator_id = %s AND originator_version >= %s "
            "AND originator_version <= %s"
        ).format(Identifier(datastore.schema), Identifier(events_table_name))
        self._select_rows: dict[tuple[bool, bool, bool, bool], Composed] = {}

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Append atomically; retry a lost connection without ever writing twice.

        Raises:
            IntegrityError: another writer holds one of the versions.
            AppendOutcomeUnknown: the database stayed unreachable, so whether the
                append was committed could not be learned.
            HeadMissing: a run's event of ``heads`` (see `Store.write`) is not stored;
                nothing written.
            OperationalError: the database refused the append (nothing written).
        """
        if not stored_events:
            return []
        heads: Sequence[tuple[Any, ...]] = kwargs.get("heads", ())
        states: Sequence[bytes | None] | None = kwargs.get("head_states")
        if heads:  # each head with the SHA-256 of its bytes, where known (else NULL)
            known = states or [None] * len(heads)
            digests = [None if state is None else hashlib.sha256(state).digest() for state in known]
            heads = [(*head, digest) for head, digest in zip(heads, digests, strict=True)]
        try:
            ids = self._insert_once(stored_events, heads)
        except CONNECTION_LOST as error:
            ids = self._recover(stored_events, heads, error)
        if not ids:
            raise HeadMissing(f"an event before the batch is gone: {heads}")
        return ids

    def _recover(
        self,
        stored_events: Sequence[StoredEvent],
        heads: Sequence[tuple[Any, ...]],
        error: Exception,
    ) -> Sequence[int]:
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
                self.notifier.appended(None)  # its NOTIFY may have been lost with it
                return found
            _log.debug("append retried after: %s", error)
            pause = _pause(deadline, error, pause)
            try:
                return self._insert_once(stored_events, heads)
            except IntegrityError:
                # A commit of ours that was still in flight when we looked may hold them.
                found = self._stored_ids(stored_events, deadline)
                if found:
                    return found
                raise
            except CONNECTION_LOST as lost:
                error, maybe_sent = lost, maybe_sent or _maybe_sent(lost)

    def _insert_once(
        self, stored_events: Sequence[StoredEvent], heads: Sequence[tuple[Any, ...]]
    ) -> Sequence[int]:
        """One attempt at the append, in one transaction; the events' notification ids
        (none: an event of `heads` is not stored, and nothing was inserted)."""
        columns = (
            [event.originator_id for event in stored_events],
            [event.originator_version for event in stored_events],
            [event.topic for event in stored_events],
            [event.state for event in stored_events],
            [head[0] for head in heads],
            [head[1] for head in heads],
            [head[2] for head in heads],
        )
        if self.function:
            ids = self._call_function(columns)
            if ids is not None:
                return ids
        pipelined = sum(len(event.state) for event in stored_events) <= PIPELINE_BYTES
        with self.datastore.get_connection() as conn:
            if not self.concurrent:
                with conn.transaction():
                    return self._insert(conn, columns, pipelined)
            try:
                if pipelined:
                    return self._append(conn, columns, stored_events)
                ids = self._insert(conn, columns, pipelined)
            except BaseException:
                _leave_section(conn, self._unlock)
                raise
            self._commit(conn, stored_events)
            return ids

    def _call_function(self, columns: tuple[list[Any], ...]) -> list[int] | None:
        """The append as one call of the store's function, in a transaction of its own; its
        notification ids (None: the function is gone, nothing was written).

        Raises:
            Exception: the call failed (the section is left first).
        """
        from psycopg.errors import InsufficientPrivilege, UndefinedFunction

        with self.datastore.get_connection() as conn:
            try:
                ids = self._execute_append(conn, columns)
            except (UndefinedFunction, InsufficientPrivilege) as error:
                # dropped, or EXECUTE revoked, since the store was opened: nothing written
                # (a role that may not insert fails the same way statement by statement)
                _log.warning(
                    "the store's append function is unusable (%s): appending statement-wise", error
                )
                _leave_section(conn, self._unlock)
                self.function = False
                return None
            except BaseException:
                _leave_section(conn, self._unlock)
                raise
            self.notifier.appended(conn)
        return ids

    def _execute_append(self, conn: Any, columns: tuple[list[Any], ...]) -> list[int]:
        """One call of the append function (committed once it returns in autocommit)."""
        shape = (len(columns[0]), len(columns[4]))
        if max(shape) <= SHAPES:  # each value a parameter: psycopg dumps lists slowly
            params: Any = [value for column in columns for value in column]
        else:
            shape, params = (-1, -1), columns
        statement = self._calls.get(shape) or self._call_statement(shape)
        row = conn.execute(statement, params, prepare=True).fetchone()
        return list(row["ids"] or ())

    def _call_statement(self, shape: tuple[int, int]) -> bytes:
        """The call for `shape` (events, heads): arrays of parameters; (-1, -1): whole arrays."""
        events, heads = shape
        if events < 0:
            arrays = [f"%s::{kind}[]" for kind in _COLUMN_TYPES]
        else:
            arrays = [
                f"ARRAY[{', '.join(['%s'] * count)}]::{kind}[]"
                for count, kind in zip([events] * 4 + [heads] * 3, _COLUMN_TYPES, strict=True)
            ]
        statement = f"SELECT {self._function_name}({', '.join(arrays)}) AS ids".encode()
        self._calls[shape] = statement
        return statement

    def _send_notify(self, conn: Any) -> None:
        """One NOTIFY, in a transaction of its own that waits for no flush."""
        if conn is not None:
            conn.execute(self._notify, prepare=True)
            return
        with self.datastore.get_connection() as own:
            own.execute(self._notify, prepare=True)

    def _append(
        self, conn: Any, columns: tuple[list[Any], ...], stored_events: Sequence[StoredEvent]
    ) -> list[int]:
        """The INSERT, then the COMMIT and the NOTIFY, in one pipeline: two round trips.

        Raises:
            Exception: the INSERT or the COMMIT failed (a failed NOTIFY is only logged).
        """
        import psycopg

        inserted: list[int] | None = None
        failure: psycopg.Error | None = None
        try:
            with conn.pipeline() as pipeline, conn.cursor() as curs:
                try:  # a Sync after the INSERT: every result in, a round trip
                    inserted = self._execute_insert(curs, columns, pipeline.sync)
                    for statement in self._commit_statements:
                        conn.execute(statement, prepare=statement is not _COMMIT)
                except psycopg.Error as error:  # raised once the pipeline is left: psycopg warns
                    failure = error
        except psycopg.Error as error:  # the pipeline's Sync: the COMMIT's or the NOTIFY's
            failure = failure or error
        if failure is None and inserted is not None:
            return inserted
        if inserted is None or failure is None:
            raise failure or RuntimeError("the append's INSERT answered nothing")
        self._after_failed_commit(conn, stored_events, failure)
        return inserted

    def _insert(self, conn: Any, columns: tuple[list[Any], ...], pipelined: bool) -> list[int]:
        """The append's INSERT (in its transaction, not committed); its notification ids."""
        if not pipelined:
            with conn.cursor() as curs:
                return self._execute_insert(curs, columns)
        failure: Exception | None = None
        with conn.pipeline() as pipeline, conn.cursor() as curs:
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
            curs.execute(statement, prepare=statement is not _BEGIN)
        curs.execute(self._insert_statement, columns, prepare=True)
        if self.concurrent:  # sent with the INSERT: the section lasts one round trip
            curs.connection.execute(self._unlock, prepare=True)
        if sync is not None:
            sync()  # a version conflict raises here, as IntegrityError, not at the commit
        return [row["notification_id"] for row in curs.fetchall()]

    def _commit(self, conn: Any, stored_events: Sequence[StoredEvent]) -> None:
        """COMMIT, then wake the followers, in one round trip.

        Raises:
            Exception: the COMMIT failed (a failed NOTIFY after it is only logged).
        """
        import psycopg

        failure: psycopg.Error | None = None
        with conn.pipeline():
            try:
                for statement in self._commit_statements:
                    conn.execute(statement, prepare=statement is not _COMMIT)
            except psycopg.Error as error:
                failure = error
        if failure is not None:
            self._after_failed_commit(conn, stored_events, failure)

    def _after_failed_commit(
        self, conn: Any, stored_events: Sequence[StoredEvent], failure: Exception
    ) -> None:
        """Whether the COMMIT landed although the round trip failed: the store says.

        Raises:
            failure: the connection broke, or the append is not stored.
        """
        if conn.broken:  # the datastore raises it as lost: `insert_events` asks the store
            raise failure
        if self._compare(stored_events):  # the COMMIT landed; the NOTIFY failed
            _log.warning("NOTIFY after an append failed: %s", failure)
            return
        raise failure

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """Notifications from `start` (to `stop`), in order, none after one still in flight."""
        conditions: list[Composable] = []
        params: list[Any] = []
        if start is not None:
            conditions.append(
                SQL("notification_id >= %s" if inclusive_of_start else "notification_id > %s")
            )
            params.append(start)
        if stop is not None:
            conditions.append(SQL("notification_id <= %s"))
            params.append(stop)
        if topics:
            conditions.append(SQL("topic = ANY(%s)"))
            params.append(list(topics))
        if self.concurrent:  # below a head answered, every transaction has ended
            conditions.append(
                SQL("(notification_id <= %s OR {0} < {1})").format(
                    Identifier(TX_COLUMN), self._horizon
                )
            )
            params.append(self._settled)
        statement = SQL(
            "SELECT notification_id, originator_id, originator_version, topic, state FROM {0}"
        ).format(self._table)
        if conditions:
            statement += SQL(" WHERE ") + SQL(" AND ").join(conditions)
        statement += SQL(" ORDER BY notification_id LIMIT %s")
        params.append(limit)
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(statement, params, prepare=True)
            return [
                Notification(
                    id=row["notification_id"],
                    originator_id=row["originator_id"],
                    originator_version=row["originator_version"],
                    topic=row["topic"],
                    state=bytes(row["state"]),
                )
                for row in curs.fetchall()
            ]

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_rows(
        self,
        run_id: UUID,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> list[tuple[int, str, bytes]]:
        """`select_events`' rows as plain (version, topic, state) tuples, the SQLite
        recorder's `select_rows` query: the lean read, in binary format, where
        `select_events` builds a dict and a `StoredEvent` per row and reads each state as
        hex text."""
        shape = (gt is not None, lte is not None, desc, limit is not None)
        statement = self._select_rows.get(shape) or self._rows_statement(shape)
        params = [run_id, *(p for p in (gt, lte, limit) if p is not None)]
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row, binary=True) as curs,
        ):
            curs.execute(statement, params, prepare=True)
            return curs.fetchall()

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def notification_id(self, run_id: UUID, version: int) -> int | None:
        """The notification id of the run's event `version` (None: not stored)."""
        statement = SQL(
            "SELECT notification_id FROM {0} WHERE originator_id = %s AND originator_version = %s"
        ).format(self._table)
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row) as curs,
        ):
            row = curs.execute(statement, (run_id, version), prepare=True).fetchone()
            return None if row is None else int(row[0])

    def select_runs(self, run_ids: Sequence[UUID]) -> list[StoredEvent]:
        """Every stored event of the runs `run_ids`, by run and version (the runs a page of
        notifications deletes: `Projections` forgets them), read `RUNS_PAGE` events a query."""
        return [stored for page in self.select_run_pages(run_ids) for stored in page]

    def select_run_pages(
        self, run_ids: Sequence[UUID], *, page: int | None = None
    ) -> Iterator[list[StoredEvent]]:
        """`select_runs`' events a page (at most `page`, default `RUNS_PAGE`, events) at a time,
        so however long the runs no query answers more: a caller stops where it has enough."""
        size = page or RUNS_PAGE
        after: tuple[UUID, int] | None = None
        while True:
            rows = self._run_page(list(run_ids), after, size)
            if rows:
                yield rows
            if len(rows) < size:
                return
            last = rows[-1]
            after = (_as_uuid(last.originator_id), last.originator_version)

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def _run_page(
        self, run_ids: list[UUID], after: tuple[UUID, int] | None, size: int
    ) -> list[StoredEvent]:
        """The runs' events after (run, version) `after`, by run and version, at most `size`."""
        if after is None:
            where, params = SQL(""), [run_ids, size]
        else:
            where = SQL(" AND (originator_id, originator_version) > (%s, %s)")
            params = [run_ids, after[0], after[1], size]
        statement = SQL(
            "SELECT originator_id, originator_version, topic, state FROM {0} "
            "WHERE originator_id = ANY(%s){1} ORDER BY originator_id, originator_version LIMIT %s"
        ).format(self._table, where)
        with (
            self.datastore.get_connection() as conn,
            conn.cursor(row_factory=tuple_row, binary=True) as curs,
        ):
            curs.execute(statement, params)
            return [StoredEvent(run, version, topic, state) for run, version, topic, state in curs]

    def _rows_statement(self, shape: tuple[bool, bool, bool, bool]) -> Composed:
        """The SELECT of `select_rows` for one shape of query (kept: each is prepared once)."""
        gt, lte, desc, limit = shape
        text = (
            "SELECT originator_version, topic, state FROM {0} WHERE originator_id = %s"
            + (" AND originator_version > %s" if gt else "")
            + (" AND originator_version <= %s" if lte else "")
            + f" ORDER BY originator_version {'DESC' if desc else 'ASC'}"
            + (" LIMIT %s" if limit else "")
        )
        statement = self._select_rows[shape] = SQL(text).format(self._table)
        return statement

    def max_notification_id(self) -> int | None:
        """The newest notification id safe to read, covering every commit made before the call.

        A commit is safe to read once every transaction older than it has ended:
        usually at once, or after the appends still in flight (one round trip
        each). The wait is bounded (`settle_seconds`): a long transaction elsewhere
        on the server holds followers back (see docs/scaling.md), and then the
        newest safe id is answered rather than waiting for it.
        """
        if not self.concurrent:
            locked: int | None = super().max_notification_id()
            return locked
        heads: tuple[int | None, int | None] = self._heads()
        safe, newest = heads
        slept, pause = 0.0, _FIRST_SETTLE_PAUSE  # slept time counted: clocks may be frozen
        while (safe or 0) < (newest or 0) and slept < self.settle_seconds:
            time.sleep(pause)
            slept, pause = slept + pause, min(pause * 2, 0.05)
            heads = self._heads()
            safe = heads[0]
        # The horizon is no bound that only grows (a transaction that ended between a
        # reader's snapshot and its look at the locks counts as an append in flight):
        # what a head covered stays readable, whatever a later horizon says.
        self._settled = max(self._settled, safe or 0)
        return safe

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def _heads(self) -> tuple[int | None, int | None]:
        """The newest notification id safe to read, and the newest committed one."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            row: Any = curs.execute(self._heads_statement, prepare=True).fetchone()
            return row["safe"], row["newest"]

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


def _as_uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))


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


def append_lock(schema: str) -> int:
    """The advisory lock key (a signed 64-bit int) of the appends' short section in `schema`."""
    digest = hashlib.sha256(f"stagetrail:append:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _leave_section(conn: Any, unlock: Composable) -> None:
    """After a failed append: release the section's lock if this session still holds it.

    A session advisory lock outlives the transaction that took it; a connection
    given back to the pool holding it would stop every other writer. One that
    cannot even be asked is closed, and the server releases the lock with it.
    """
    if conn.closed:
        return
    try:
        conn.rollback()
        conn.execute(unlock)
        conn.rollback()
    except Exception:  # a broken connection: closing it ends the session and its locks
        conn.close()


def upgrade(conn: Any, schema: str, meta_table: str) -> bool:
    """Make the store's appends concurrent, in place; whether it was upgraded just now.

    Rows already stored get transaction id 0: all were committed, in id order,
    under the old EXCLUSIVE lock, so they precede every new row for readers too.
    Adding a column with a constant default rewrites no row. Run under the
    store's creation lock, in one transaction with the meta table's new version.
    """
    table = SQL("{0}.{1}").format(Identifier(schema), Identifier(meta.EVENTS_TABLE))
    if has_tx_column(conn, schema):
        return False
    with conn.transaction():
        conn.execute(
            SQL("ALTER TABLE {0} ADD COLUMN {1} xid8 NOT NULL DEFAULT '0'").format(
                table, Identifier(TX_COLUMN)
            )
        )
        conn.execute(
            SQL("ALTER TABLE {0} ALTER COLUMN {1} SET DEFAULT pg_current_xact_id()").format(
                table, Identifier(TX_COLUMN)
            )
        )
        conn.execute(
            SQL("UPDATE {0} SET value = %s WHERE key = 'schema_version'").format(
                Identifier(schema, meta_table)
            ),
            (str(CONCURRENT_SCHEMA),),
        )
    return True


APPEND_BODY = """
CREATE FUNCTION {function}(ids uuid[], versions bigint[], topics text[], states bytea[],
    head_ids uuid[], head_versions bigint[], head_digests bytea[]) RETURNS bigint[]
LANGUAGE plpgsql SET lock_timeout = 0 AS $append$
DECLARE inserted bigint[];
BEGIN
    PERFORM pg_advisory_lock({section});
    WITH rows AS (
        INSERT INTO {table} (originator_id, originator_version, topic, state)
        SELECT * FROM unnest(ids, versions, topics, states)
        WHERE NOT EXISTS (SELECT 1 FROM unnest(head_ids, head_versions, head_digests)
            AS head(run, v, digest) WHERE NOT EXISTS (SELECT 1 FROM {table}
                WHERE originator_id = head.run AND originator_version = head.v
                AND (head.digest IS NULL OR sha256(state) = head.digest))
            OR EXISTS (SELECT 1 FROM {table}
                WHERE originator_id = head.run AND originator_version > head.v))
        RETURNING notification_id)
    SELECT array_agg(notification_id ORDER BY notification_id) INTO inserted FROM rows;
    PERFORM pg_advisory_unlock({section});
    RETURN inserted;
END
$append$
"""
"""The append function: the statements' append (section, transaction id and notification
ids in it, heads checked in the INSERT: stored, their runs' newest, with the SHA-256 of
the bytes given where given), one round trip and one statement for the client.

An error inside leaves the section held: the caller leaves it (`_leave_section`), as the
statements' append does. The lock timeout is the statements' one (0: wait).
"""


def install_append(conn: Any, schema: str) -> bool:
    """Create the store's append function unless it exists; whether the store has it.

    Run under the store's creation lock. A role that may not create it appends
    statement by statement (the same section and rows, more round trips).

    Raises:
        psycopg.Error: the database failed otherwise.
    """
    from psycopg.errors import InsufficientPrivilege

    function = SQL("{0}.{1}").format(Identifier(schema), Identifier(APPEND_FUNCTION))
    usable = _append_function(conn, schema)
    if usable is not None:  # EXECUTE revoked from this role: statement by statement
        return usable
    body = SQL(APPEND_BODY).format(
        function=function,
        table=SQL("{0}.{1}").format(Identifier(schema), Identifier(meta.EVENTS_TABLE)),
        section=Literal(append_lock(schema)),
    )
    try:
        conn.execute(body)
    except InsufficientPrivilege:
        return False
    return True


def has_append_function(conn: Any, schema: str) -> bool:
    """Whether the store has its append function (`install_append`)."""
    return _append_function(conn, schema) is not None


def _append_function(conn: Any, schema: str) -> bool | None:
    """Whether this role may and should call the store's append function (None: the store
    has none).

    Only a function owned by this role or by the events table's owner is called: it runs
    with the caller's rights, and any role with CREATE on the schema could have made it.
    """
    row = conn.execute(
        "SELECT has_function_privilege(f.p, 'EXECUTE') AND proc.proowner IN ("
        "(SELECT relowner FROM pg_class WHERE oid = to_regclass(%s)), "
        "(SELECT oid FROM pg_roles WHERE rolname = current_user)) "
        "FROM (SELECT to_regprocedure(%s) AS p) f LEFT JOIN pg_proc proc ON proc.oid = f.p",
        (f'"{schema}"."{meta.EVENTS_TABLE}"', f'"{schema}".{APPEND_FUNCTION}{APPEND_SIGNATURE}'),
    ).fetchone()
    return None if row[0] is None else bool(row[0])


def has_tx_column(conn: Any, schema: str) -> bool:
    """Whether the store's events carry their transaction id (its appends are concurrent)."""
    row = conn.execute(
        "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s "
        "AND NOT attisdropped",
        (f'"{schema}"."{meta.EVENTS_TABLE}"', TX_COLUMN),
    ).fetchone()
    return row is not None


def make_recorder(
    url: StoreURL,
    datastore: Datastore,
    has_events: bool,
    *,
    concurrent: bool = True,
    function: bool = False,
) -> PostgresRecorder:
    """The store's recorder, its events table created unless it `has_events` already."""
    import psycopg
    from eventsourcing.persistence import PersistenceError

    try:
        recorder = PostgresRecorder(
            datastore,
            events_table_name=meta.EVENTS_TABLE,
            concurrent=concurrent,
            function=function,
        )
        if not has_events:  # a read-only role can open a store it could not create
            recorder.create_table()
    except (psycopg.Error, PersistenceError) as error:
        datastore.close()
        raise StoreError(url.masked, f"cannot prepare the store: {describe(error, url)}") from None
    return recorder
