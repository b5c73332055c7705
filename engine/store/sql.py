"""Persistent projection storage shared by the SQLite and PostgreSQL views.

States, the run index, snapshots and eventsourcing's tracking records live in
the same database as the events. A page of folded events is saved in one
transaction with its tracking record, after locking the projection's row and
checking that nobody else moved its position: that is what makes catch-up
exactly-once even with several processes catching up at once.

Every value is stored sealed by the store's `Codec` (its JSON, compression and
cipher, as the events are); the columns queried hold ids, statuses, times and
the codec's digests of pipeline names, labels and partition keys.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from eventsourcing.persistence import IntegrityError, Tracking, TrackingRecorder

from engine.store.codec import Codec
from engine.store.errors import StoreError
from engine.store.failures import classify, is_database_error
from engine.store.meta import (
    GENERATION,
    META_TABLE,
    RESETS,
    add_counter,
    bump_counter,
    read_counter,
    read_generation,
)
from engine.store.views import PageSave, RunQuery, label_text, run_columns
from events.errors import StagetrailError
from projections.errors import PositionMoved, ProjectionReplaced

VIEWS_VERSION = 2
"""The shape of the views' tables (2: sealed values, digests, snapshots by erasure generation).

A store whose views have another shape has them dropped and created again when
opened for writing; the projections then fold again from the events.
"""

TABLES = (
    "CREATE TABLE IF NOT EXISTS {projections} (name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,"
    " last_error {blob}, updated TEXT)",
    "CREATE TABLE IF NOT EXISTS {states} (name TEXT NOT NULL, key TEXT NOT NULL,"
    " state {blob} NOT NULL, PRIMARY KEY (name, key))",
    "CREATE TABLE IF NOT EXISTS {runs} (run_id TEXT PRIMARY KEY, pipeline TEXT NOT NULL,"
    " status TEXT NOT NULL, started TEXT NOT NULL, finished TEXT, parent_run_id TEXT,"
    " data {blob} NOT NULL)",
    "CREATE INDEX IF NOT EXISTS {runs_started} ON {runs} (started DESC, run_id DESC)",
    "CREATE INDEX IF NOT EXISTS {runs_parent} ON {runs} (parent_run_id)",
    "CREATE TABLE IF NOT EXISTS {labels} (label TEXT NOT NULL, run_id TEXT NOT NULL,"
    " PRIMARY KEY (label, run_id))",
    "CREATE TABLE IF NOT EXISTS {snapshots} (run_id TEXT NOT NULL, projection TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL, generation BIGINT NOT NULL, version INTEGER NOT NULL,"
    " state {blob} NOT NULL, PRIMARY KEY (run_id, projection, fingerprint, generation, version))",
)

VIEW_TABLES = ("projections", "states", "runs", "labels", "snapshots")
"""The views' tables (their indexes go with them)."""

NAMES = {  # the views' tables, as SQLite names them (PostgreSQL qualifies them)
    "projections": "stagetrail_projections",
    "states": "stagetrail_projection_states",
    "runs": "stagetrail_runs",
    "runs_started": "stagetrail_runs_started",
    "runs_parent": "stagetrail_runs_parent",
    "labels": "stagetrail_run_labels",
    "snapshots": "stagetrail_snapshots",
    "meta": META_TABLE,
}


_P = ParamSpec("_P")
_R = TypeVar("_R")
_V = TypeVar("_V", bound="SQLViews")


def read_query(method: Callable[Concatenate[_V, _P], _R]) -> Callable[Concatenate[_V, _P], _R]:
    """A read-only query of the views, run once more when the first found its connection
    lost (`SQLViews.lost`): a read is idempotent, a write is never retried."""

    @functools.wraps(method)
    def read(self: _V, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except StoreError as error:
            if not self.lost(error.__cause__):
                raise
        return method(self, *args, **kwargs)

    return read


def _chunks(items: Sequence[Any]) -> int:
    """How many queries of `CHUNK` values read `items`."""
    return -(-len(items) // CHUNK)


CHUNK = 500
"""Most keys (or names) one query of the views reads."""

MIGRATION = "__migration__"
"""The tracking row eventsourcing's recorders mark a single-row tracking table with."""


class SQLViews(TrackingRecorder):
    """The SQL of persistent views and of their tracking records, on a datastore's transactions.

    eventsourcing's `TrackingRecorder` interface, implemented with stagetrail's own
    SQL (the tracking table is eventsourcing's single-row one, its migration marker
    included, so stores stay as they were); subclasses supply the table names, the
    tracking table's definition and the placeholder.

    Args:
        datastore: eventsourcing's datastore (or stagetrail's), whose public
            ``transaction(commit=...)`` gives a cursor with rows by column name.
        url: the store's masked URL, for errors.
    """

    names: dict[str, str]
    tracking_table: str
    tracking_definition: str
    """``CREATE TABLE IF NOT EXISTS {tracking} (...)``: eventsourcing's, to the letter."""
    placeholder = "?"
    prefix_match = "run_id>=? AND run_id<?"
    """Ids in [prefix, prefix~): a range scan of the primary key in byte order."""
    prefix_order = "run_id"
    """The order that range is read in."""

    blob_type = "BLOB"
    """The column type of sealed values."""
    codec: Codec
    """The store's serializer (set by the backend when it opens the store)."""

    def __init__(self, datastore: Any, url: str = "-") -> None:
        self.datastore = datastore
        self.url = url

    def lost(self, error: BaseException | None) -> bool:
        """Whether the database error `error` lost its connection, so that a read on another
        one may succeed (a file's database loses none)."""
        return False

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        """A transaction of the views; a database refusal is a `StoreError` (kind by cause)."""
        return self._refusing(self.datastore.transaction(commit=commit))

    def _read(self, *, statements: int = 1) -> AbstractContextManager[Any]:
        """A cursor for a read of `statements` queries, in a transaction of its own (a server's
        subclass may run a read of one query without one: it is a transaction already)."""
        return self._transaction(commit=False)

    @contextmanager
    def _refusing(self, cursors: AbstractContextManager[Any]) -> Iterator[Any]:
        """The cursor of `cursors`; a database refusal is a `StoreError` (kind by cause),
        anything else raised as it is."""
        try:
            with cursors as cursor:
                yield cursor
        except StagetrailError:
            raise
        except Exception as error:
            if not is_database_error(error):
                raise
            raise classify(self.url, error, "projection storage failed") from error

    def create_table(self) -> None:
        """Create the tracking table (marked as eventsourcing marks it) and the views' tables."""
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql(self.tracking_definition))
            cursor.execute(
                self._sql(
                    "INSERT INTO {tracking} (application_name, notification_id) VALUES (?, 1) "
                    "ON CONFLICT (application_name) DO NOTHING"
                ),
                (MIGRATION,),
            )
            self.create_views(cursor)

    def insert_tracking(self, tracking: Tracking) -> None:
        """Move `tracking.application_name` forward to `tracking.notification_id`.

        Raises:
            IntegrityError: its position is there or beyond already.
        """
        with self.datastore.transaction(commit=True) as cursor:  # its errors, as eventsourcing's
            self._write_tracking(cursor, tracking)

    @read_query
    def max_tracking_id(self, application_name: str) -> int | None:
        """The position recorded for `application_name` (None: none recorded)."""
        with self._read() as cursor:
            cursor.execute(
                self._sql(
                    "SELECT MAX(notification_id) AS id FROM {tracking} WHERE application_name=?"
                ),
                (application_name,),
            )
            row = cursor.fetchone()
            return None if row is None or row["id"] is None else int(row["id"])

    def _write_tracking(self, cursor: Any, tracking: Tracking) -> None:
        """Move a position forward inside the caller's transaction, as eventsourcing does.

        Raises:
            IntegrityError: the position is there or beyond already.
        """
        cursor.execute(
            self._sql(
                "INSERT INTO {tracking} AS t (application_name, notification_id) VALUES (?, ?) "
                "ON CONFLICT (application_name) DO UPDATE "
                "SET notification_id=excluded.notification_id "
                "WHERE t.notification_id < excluded.notification_id RETURNING notification_id"
            ),
            (tracking.application_name, tracking.notification_id),
        )
        if cursor.fetchone() is None:
            raise IntegrityError(
                f"Failed to record tracking for {tracking.application_name} "
                f"{tracking.notification_id}"
            )

    def _sql(self, template: str) -> str:
        text = template.format(tracking=self.tracking_table, blob=self.blob_type, **self.names)
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def create_views(self, cursor: Any) -> None:
        """Create the views' tables (idempotent); drop those of another shape first.

        Raises:
            StoreError: a newer stagetrail made them (this one cannot read them).
        """
        found = self._views_version(cursor)
        if found > VIEWS_VERSION:
            raise StoreError(
                self.url,
                f"its projection tables are of a newer stagetrail (views version {found}, "
                f"this one knows {VIEWS_VERSION}); upgrade stagetrail",
            )
        if found != VIEWS_VERSION:  # derived data: folded again from the events
            for table in VIEW_TABLES:
                cursor.execute(self._sql(f"DROP TABLE IF EXISTS {{{table}}}"))
        for statement in TABLES:
            cursor.execute(self._sql(statement))
        if found != VIEWS_VERSION:
            cursor.execute(
                self._sql(
                    "INSERT INTO {meta} (key, value) VALUES ('views_version', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value=excluded.value"
                ),
                (str(VIEWS_VERSION),),
            )

    def _views_version(self, cursor: Any) -> int:
        cursor.execute(self._sql("SELECT value FROM {meta} WHERE key='views_version'"))
        row = cursor.fetchone()
        return 0 if row is None else int(row["value"])

    @read_query
    def current(self) -> bool:
        """Whether the stored views have this program's shape (a read-only open cannot migrate)."""
        with self._read() as cursor:
            return self._views_version(cursor) == VIEWS_VERSION

    def register(self, name: str, fingerprint: str) -> bool:
        """Record `name` with its code's fingerprint; reset it if the code changed.

        Returns:
            True when stored state of other code was discarded.
        """
        with self._transaction(commit=True) as cursor:
            cursor.execute(self._sql("SELECT fingerprint FROM {projections} WHERE name=?"), (name,))
            row = cursor.fetchone()
            if row is not None and row["fingerprint"] == fingerprint:
                return False
            self._reset(cursor, name, fingerprint)
            return row is not None

    @read_query
    def fingerprint(self, name: str) -> str | None:
        """The code fingerprint `name`'s stored state was folded by (None: not registered)."""
        with self._read() as cursor:
            cursor.execute(self._sql("SELECT fingerprint FROM {projections} WHERE name=?"), (name,))
            row = cursor.fetchone()
            return None if row is None else str(row["fingerprint"])

    def reset(self, name: str, fingerprint: str) -> None:
        """Discard `name`'s state and move its position back to zero."""
        with self._transaction(commit=True) as cursor:
            self._reset(cursor, name, fingerprint)

    def _reset(self, cursor: Any, name: str, fingerprint: str) -> None:
        cursor.execute(
            self._sql(
                "INSERT INTO {projections} (name, fingerprint, last_error, updated) "
                "VALUES (?, ?, NULL, NULL) ON CONFLICT (name) DO UPDATE "
                "SET fingerprint=excluded.fingerprint, last_error=NULL"
            ),
            (name, fingerprint),
        )
        cursor.execute(self._sql("DELETE FROM {states} WHERE name=?"), (name,))
        bump_counter(cursor, self._sql("{meta}"), RESETS)
        if name == "run_index":
            cursor.execute(self._sql("DELETE FROM {labels}"))
            cursor.execute(self._sql("DELETE FROM {runs}"))
        cursor.execute(
            self._sql(
                "INSERT INTO {tracking} (application_name, notification_id) VALUES (?, 0) "
                "ON CONFLICT (application_name) DO UPDATE SET notification_id=0"
            ),
            (name,),
        )

    @read_query
    def resets(self) -> int:
        """How many times a projection of the store was reset (read before its position)."""
        with self._read() as cursor:
            return read_counter(cursor, self._sql("{meta}"), RESETS)

    @read_query
    def resets_and_positions(self, names: Sequence[str]) -> tuple[int, dict[str, int]]:
        """The count of resets, then each projection's position, in one read transaction."""
        with self._transaction(commit=False) as cursor:
            resets = read_counter(cursor, self._sql("{meta}"), RESETS)
            return resets, self._positions(cursor, names)

    @read_query
    def positions(self, names: Sequence[str]) -> dict[str, int]:
        """Each projection's position: the last notification id it has folded."""
        with self._read(statements=_chunks(names)) as cursor:
            return self._positions(cursor, names)

    def _positions(self, cursor: Any, names: Sequence[str]) -> dict[str, int]:
        found = dict.fromkeys(names, 0)
        chosen = list(found)
        for start in range(0, len(chosen), CHUNK):
            chunk = chosen[start : start + CHUNK]
            marks = ",".join("?" * len(chunk))
            query = (
                "SELECT application_name AS name, notification_id FROM {tracking} "
                f"WHERE application_name IN ({marks})"
            )
            cursor.execute(self._sql(query), chunk)
            for row in cursor.fetchall():
                found[row["name"]] = int(row["notification_id"] or 0)
        return found

    @read_query
    def load(self, name: str, keys: Sequence[str]) -> dict[str, Any]:
        """The stored (encoded) states of `name` for `keys`; missing keys are left out."""
        if not keys:
            return {}
        with self._read(statements=_chunks(keys)) as cursor:
            return dict(self._load(cursor, name, list(keys)))

    def _load(self, cursor: Any, name: str, keys: list[str]) -> Iterator[tuple[str, Any]]:
        unseal = self.codec.unseal
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
            marks = ",".join("?" * len(chunk))
            if name == "run_index":
                query = f"SELECT run_id AS k, data AS v FROM {{runs}} WHERE run_id IN ({marks})"
                cursor.execute(self._sql(query), chunk)
                for row in cursor.fetchall():
                    yield row["k"], unseal(row["v"])
                continue
            digests = [self.codec.digest(key) for key in chunk]
            cursor.execute(
                self._sql(f"SELECT state AS v FROM {{states}} WHERE key IN ({marks}) AND name=?"),
                (*digests, name),
            )
            for row in cursor.fetchall():
                key, state = unseal(row["v"])
                yield key, state

    def commit(self, saves: Sequence[PageSave]) -> None:
        """Save pages of several projections and their tracking records in one transaction.

        Raises:
            PositionMoved: another process advanced one of them meanwhile.
        """
        with self._transaction(commit=True) as cursor:
            # lock each projection's row before reading its position, in name order: two
            # processes committing the same projections never wait for each other crosswise
            for save in sorted(saves, key=lambda save: save.name):
                cursor.execute(
                    self._sql(
                        "UPDATE {projections} SET updated=?, last_error=NULL "
                        "WHERE name=? AND fingerprint=? RETURNING name"
                    ),
                    (datetime.now().astimezone().isoformat(), save.name, save.fingerprint),
                )
                if cursor.fetchone() is None:
                    raise ProjectionReplaced(save.name)
            current = self._positions(cursor, [save.name for save in saves])
            generation = self._generation(cursor, saves)
            resets = self._resets(cursor, saves)
            newest = self._newest(cursor)
            for save in saves:
                if save.generation not in (None, generation) or save.end > newest:
                    # read before a compaction: its ids may be given out again (SQLite)
                    raise PositionMoved(save.name, save.start, current[save.name])
                if save.resets not in (None, resets):
                    # a reset since the start was read may have folded back to the same
                    # position, and the page's states may have been loaded in between
                    raise PositionMoved(save.name, save.start, current[save.name])
                if current[save.name] != save.start:
                    raise PositionMoved(save.name, save.start, current[save.name])
                self._save_states(cursor, save)
                self._write_tracking(cursor, Tracking(save.name, save.end))

    newest_event: str | None = None
    """A query of the newest notification id, where a database may give out an erased one
    again (SQLite's rowid): no position may pass it."""

    def _newest(self, cursor: Any) -> float:
        if self.newest_event is None:
            return float("inf")
        row = cursor.execute(self.newest_event).fetchone()
        value = next(iter(row.values())) if isinstance(row, dict) else row[0]
        return int(value or 0)

    def _generation(self, cursor: Any, saves: Sequence[PageSave]) -> int | None:
        """The store's erasure generation, read only when a save carries one."""
        if all(save.generation is None for save in saves):
            return None
        return read_generation(cursor, self._sql("{meta}"))

    def _resets(self, cursor: Any, saves: Sequence[PageSave]) -> int | None:
        """The count of projection resets, read only when a save carries one."""
        if all(save.resets is None for save in saves):
            return None
        return read_counter(cursor, self._sql("{meta}"), RESETS)

    def _save_states(self, cursor: Any, save: PageSave) -> None:
        if save.name == "run_index":
            self._save_runs(cursor, save.states)
            return
        seal, digest = self.codec.seal, self.codec.digest
        cursor.executemany(
            self._sql(
                "INSERT INTO {states} (name, key, state) VALUES (?, ?, ?) "
                "ON CONFLICT (name, key) DO UPDATE SET state=excluded.state"
            ),
            [(save.name, digest(key), seal([key, state])) for key, state in save.states.items()],
        )

    def _save_runs(self, cursor: Any, runs: dict[str, Any]) -> None:
        codec = self.codec
        cursor.executemany(
            self._sql(
                "INSERT INTO {runs} (run_id, pipeline, status, started, finished, "
                "parent_run_id, data) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) "
                "DO UPDATE SET status=excluded.status, finished=excluded.finished, "
                "data=excluded.data"
            ),
            [(*run_columns(data, codec), codec.seal(data)) for data in runs.values()],
        )
        cursor.executemany(
            self._sql(
                "INSERT INTO {labels} (label, run_id) VALUES (?, ?) "
                "ON CONFLICT (label, run_id) DO NOTHING"
            ),
            [
                (codec.digest(label_text(key, value)), run_id)
                for run_id, data in runs.items()
                for key, value in data["labels"].items()
            ],
        )

    def drop_runs(self, run_ids: Sequence[str], names: Sequence[str]) -> None:
        """Delete erased runs' rows of the run index and their partitions of `names`.

        Nothing folds these runs again (their events are gone), so no page saved
        meanwhile by a follower writes the rows back.
        """
        if not run_ids:
            return
        marks = ",".join("?" * len(run_ids))
        digests = [self.codec.digest(run_id) for run_id in run_ids]
        with self._transaction(commit=True) as cursor:
            self._lock_rows(cursor, ["run_index", *names])  # as a follower's commit does
            cursor.execute(self._sql(f"DELETE FROM {{labels}} WHERE run_id IN ({marks})"), run_ids)
            cursor.execute(self._sql(f"DELETE FROM {{runs}} WHERE run_id IN ({marks})"), run_ids)
            for name in names:
                cursor.execute(
                    self._sql(f"DELETE FROM {{states}} WHERE name=? AND key IN ({marks})"),
                    (name, *digests),
                )

    def _lock_rows(self, cursor: Any, names: Sequence[str]) -> None:
        """Lock the projections' rows in name order, the order `commit` locks them in."""
        for name in sorted(set(names)):
            cursor.execute(
                self._sql("UPDATE {projections} SET updated=updated WHERE name=?"), (name,)
            )

    def record_error(self, name: str, error: str) -> None:
        """Keep the error that stopped `name` (shown by `status`)."""
        with self._transaction(commit=True) as cursor:
            cursor.execute(
                self._sql("UPDATE {projections} SET last_error=? WHERE name=?"),
                (self.codec.seal(error), name),
            )

    @read_query
    def errors(self) -> dict[str, str | None]:
        """The last error of every registered projection (None when it is healthy)."""
        with self._read() as cursor:
            cursor.execute(self._sql("SELECT name, last_error FROM {projections}"))
            rows = cursor.fetchall()
        unseal = self.codec.unseal
        return {
            row["name"]: None if row["last_error"] is None else unseal(row["last_error"])
            for row in rows
        }

    @read_query
    def states(self, name: str) -> dict[str, Any]:
        """Every stored state of `name` by key."""
        if name == "run_index":
            query, params = "SELECT data AS v FROM {runs}", []
        else:
            query, params = "SELECT state AS v FROM {states} WHERE name=?", [name]
        with self._read() as cursor:
            cursor.execute(self._sql(query), params)
            rows = cursor.fetchall()
        unseal = self.codec.unseal
        if name == "run_index":
            return {data["run_id"]: data for data in (unseal(row["v"]) for row in rows)}
        return dict(unseal(row["v"]) for row in rows)

    @read_query
    def runs(self, query: RunQuery) -> list[Any]:
        """Run index rows matching `query`, newest first."""
        where, params = query.where(self.names["labels"], self.codec)
        sql = (
            f"SELECT data FROM {{runs}}{where} ORDER BY started DESC, run_id DESC LIMIT ? OFFSET ?"
        )
        with self._read() as cursor:
            cursor.execute(self._sql(sql), (*params, query.limit, query.offset))
            rows = cursor.fetchall()
        return [self.codec.unseal(row["data"]) for row in rows]

    @read_query
    def run_ids(self, prefix: str, limit: int) -> list[str]:
        """Ids (text) of indexed runs that start with `prefix` (lower-case hex), at most `limit`."""
        sql = (
            f"SELECT run_id FROM {{runs}} WHERE {self.prefix_match} "
            f"ORDER BY {self.prefix_order} LIMIT ?"
        )
        with self._read() as cursor:  # "~" sorts after every id character
            cursor.execute(self._sql(sql), (prefix, prefix + "~", limit))
            return [str(row["run_id"]) for row in cursor.fetchall()]

    @read_query
    def snapshot(
        self, run_id: str, projection: str, fingerprint: str, generation: int, version: int
    ) -> tuple[int, bytes] | None:
        """The newest stored snapshot (version, sealed state) of `generation` up to `version`."""
        with self._read() as cursor:
            cursor.execute(
                self._sql(
                    "SELECT version, state FROM {snapshots} WHERE run_id=? AND projection=? "
                    "AND fingerprint=? AND generation=? AND version<=? "
                    "ORDER BY version DESC LIMIT 1"
                ),
                (run_id, projection, fingerprint, generation, version),
            )
            row = cursor.fetchone()
            return None if row is None else (int(row["version"]), bytes(row["state"]))

    def save_snapshots(
        self,
        run_id: str,
        projection: str,
        fingerprint: str,
        generation: int,
        states: Sequence[tuple[int, bytes]],
    ) -> None:
        """Store snapshots (version, sealed state) of a projection over one run, read in
        `generation`; nothing when runs were erased since (the run perhaps among them)."""
        try:
            with self._transaction(commit=True) as cursor:
                cursor.executemany(
                    self._sql(
                        "INSERT INTO {snapshots} (run_id, projection, fingerprint, generation, "
                        "version, state) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
                    ),
                    [
                        (run_id, projection, fingerprint, generation, version, state)
                        for version, state in states
                    ],
                )
                if self._generation_held(cursor) != generation:
                    raise _Erased
        except _Erased:
            pass  # rolled back: an erased run's data is never stored after its erasure

    generation_lock = ""
    """What makes a read of the generation wait for an erase that counts one more until it
    commits, and hold off one that has not begun until the reader's transaction ends."""

    def _generation_held(self, cursor: Any) -> int:
        """The store's erasure generation, read after this transaction's writes: an erase
        either committed before (its generation read here) or commits after, deleting
        what was written with the run's snapshots (it counts the generation first)."""
        add_counter(cursor, self._sql("{meta}"), GENERATION)  # a row to lock
        cursor.execute(
            self._sql(f"SELECT value FROM {{meta}} WHERE key='{GENERATION}'{self.generation_lock}")
        )
        row = cursor.fetchone()
        return int(row[0] if isinstance(row, tuple) else row["value"])


class _Erased(Exception):
    """Rolls back a write of run data read before an erasure (never raised out)."""
