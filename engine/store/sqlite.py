"""The SQLite backend: eventsourcing's recorder on a file, and the views beside the events."""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

from eventsourcing.persistence import PersistenceError, Tracking
from eventsourcing.sqlite import (
    SQLiteApplicationRecorder,
    SQLiteCursor,
    SQLiteDatastore,
    SQLiteTrackingRecorder,
)

from engine.store import meta
from engine.store.backend import Backend, prepare_views
from engine.store.errors import StoreError
from engine.store.sql import NAMES, SQLViews
from engine.store.urls import StoreURL


class SQLiteViews(SQLiteTrackingRecorder, SQLViews):
    """eventsourcing's SQLite tracking recorder, extended with the views' tables."""

    names = NAMES
    tracking_table = "tracking"  # eventsourcing's SQLite recorder fixes this name

    def __init__(self, datastore: SQLiteDatastore) -> None:
        super().__init__(datastore)

    def _create_table(self, c: SQLiteCursor) -> None:
        super()._create_table(c)
        self.create_views(c)

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _insert_tracking_row(self, cursor: Any, tracking: Tracking) -> None:
        self._insert_tracking(cursor, tracking)

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """SQLite has no notifications: wait out the poll interval (or until stopped)."""
        stop.wait(timeout)
        return False


def open_sqlite(url: StoreURL, create: bool, settings: meta.AtRest) -> Backend:
    """Open (or create, when allowed) the SQLite store file `url` names.

    Raises:
        StoreError: no such file (and not allowed to create it), or not a stagetrail store.
    """
    _check_sqlite_path(url, create)
    datastore = SQLiteDatastore(db_name=url.path, pool_size=2, max_overflow=8)
    try:
        with datastore.transaction(commit=True) as cursor:
            settings = _sqlite_meta(cursor, url, create, settings)
        recorder = SQLiteApplicationRecorder(datastore, events_table_name=meta.EVENTS_TABLE)
        recorder.create_table()
    except StoreError:
        datastore.close()
        raise
    except (sqlite3.Error, PersistenceError) as error:
        datastore.close()
        raise StoreError(url.masked, f"not a stagetrail store ({error})") from error
    views, problem = prepare_views(lambda: SQLiteViews(datastore))
    erase = functools.partial(erase_runs, datastore, views is not None)
    return Backend(recorder, settings.mapper(), datastore.close, views, problem, erase)


def erase_runs(datastore: SQLiteDatastore, has_views: bool, run_ids: Sequence[UUID]) -> int:
    """Delete the runs' events and snapshots in one transaction; return the events deleted."""
    removed = 0
    with datastore.transaction(commit=True) as cursor:
        for run_id in run_ids:
            cursor.execute(f"DELETE FROM {meta.EVENTS_TABLE} WHERE originator_id=?", (run_id.hex,))
            removed += cursor.sqlite_cursor.rowcount
            if has_views:
                cursor.execute(f"DELETE FROM {NAMES['snapshots']} WHERE run_id=?", (str(run_id),))
    return removed


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


def _sqlite_meta(cursor: Any, url: StoreURL, create: bool, settings: meta.AtRest) -> meta.AtRest:
    cursor.execute("SELECT name FROM sqlite_master WHERE type='table'")
    tables = {row[0] for row in cursor.fetchall()}
    if meta.META_TABLE in tables:
        cursor.execute(f"SELECT key, value FROM {meta.META_TABLE}")
        return meta.settle(dict(cursor.fetchall()), settings, url.masked)
    foreign = sorted(t for t in tables if not t.startswith("sqlite_"))
    if foreign:
        raise StoreError(
            url.masked, f"not a stagetrail store: it holds other tables ({', '.join(foreign)})"
        )
    if not create:
        raise StoreError(url.masked, "no stagetrail store in this file")
    cursor.execute(
        f"CREATE TABLE IF NOT EXISTS {meta.META_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
    )
    cursor.executemany(
        f"INSERT OR IGNORE INTO {meta.META_TABLE} VALUES (?, ?)",
        list(meta.new_meta(settings).items()),
    )
    return settings
