"""Opening eventsourcing's recorders for each kind of store URL.

Each opener checks (or creates) the meta table before the events table, so a
half-created store is still recognised as stagetrail's on the next open.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any

import attrs
from eventsourcing.persistence import ApplicationRecorder, PersistenceError
from eventsourcing.popo import POPOApplicationRecorder
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

from engine import _meta
from engine._mapper import EventMapper
from engine._urls import StoreURL
from engine.errors import StoreError
from projections._memory_views import MemoryViews
from projections._sqlite_views import SQLiteViews
from projections._views import Views


@attrs.frozen
class Backend:
    """An open recorder, the mapper for its bytes, and how to close them."""

    recorder: ApplicationRecorder
    mapper: EventMapper
    close: Callable[[], None]
    views: Views | None = None
    views_problem: str = ""


def open_backend(url: StoreURL, *, create: bool, cipher_key: str | None) -> Backend:
    """Open (or create, when allowed) the store `url` names.

    Raises:
        StoreError: unreachable, not a stagetrail store, newer schema, wrong key.
    """
    settings = _meta.wanted(url.options, cipher_key, url.masked)
    if url.scheme == "memory":
        return Backend(POPOApplicationRecorder(), settings.mapper(), lambda: None, MemoryViews())
    if url.scheme == "sqlite":
        return _open_sqlite(url, create, settings)
    from engine._postgres import open_postgres

    return open_postgres(url, create, settings)


def _open_sqlite(url: StoreURL, create: bool, settings: _meta.AtRest) -> Backend:
    _check_sqlite_path(url, create)
    datastore = SQLiteDatastore(db_name=url.path, pool_size=2, max_overflow=8)
    try:
        with datastore.transaction(commit=True) as cursor:
            settings = _sqlite_meta(cursor, url, create, settings)
        recorder = SQLiteApplicationRecorder(datastore, events_table_name=_meta.EVENTS_TABLE)
        recorder.create_table()
    except StoreError:
        datastore.close()
        raise
    except (sqlite3.Error, PersistenceError) as error:
        datastore.close()
        raise StoreError(url.masked, f"not a stagetrail store ({error})") from error
    views, problem = prepare_views(lambda: SQLiteViews(datastore))
    return Backend(recorder, settings.mapper(), datastore.close, views, problem)


def prepare_views(make: Callable[[], Any]) -> tuple[Any, str]:
    """The store's projection views, or None and why they cannot be kept (e.g. read-only)."""
    try:
        views = make()
        views.create_table()
    except Exception as error:  # any database refusal leaves the events readable
        return None, f"{type(error).__name__}: {' '.join(str(error).split())}"
    return views, ""


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


def _sqlite_meta(cursor: Any, url: StoreURL, create: bool, settings: _meta.AtRest) -> _meta.AtRest:
    cursor.execute("SELECT name FROM sqlite_master WHERE type='table'")
    tables = {row[0] for row in cursor.fetchall()}
    if _meta.META_TABLE in tables:
        cursor.execute(f"SELECT key, value FROM {_meta.META_TABLE}")
        return _meta.settle(dict(cursor.fetchall()), settings, url.masked)
    foreign = sorted(t for t in tables if not t.startswith("sqlite_"))
    if foreign:
        raise StoreError(
            url.masked, f"not a stagetrail store: it holds other tables ({', '.join(foreign)})"
        )
    if not create:
        raise StoreError(url.masked, "no stagetrail store in this file")
    cursor.execute(
        f"CREATE TABLE IF NOT EXISTS {_meta.META_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
    )
    cursor.executemany(
        f"INSERT OR IGNORE INTO {_meta.META_TABLE} VALUES (?, ?)",
        list(_meta.new_meta(settings).items()),
    )
    return settings
