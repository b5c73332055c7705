"""Persistence: eventsourcing's recorders behind `Store`, one module per backend.

`memory`, `sqlite` and `postgres` each open their kind of store (its recorder and
its projection tables; `sqlite_recorder` reads a run's events from a SQLite file
with one plain SELECT); `urls` parses store URLs, `meta` keeps the store's schema
version and at-rest settings, `mapper` turns events into stored bytes,
`snapshots` keeps time-travel snapshots, `persistent` runs persistent
projections with eventsourcing's tracking records.
"""

from __future__ import annotations

from engine.store.errors import (
    ConcurrencyConflict,
    OutcomeUnknown,
    StoreError,
    StoreFull,
    StoreReadOnly,
)
from engine.store.event_store import PAGE, Store, writable
from engine.store.persistent import Projections, ProjectionStatus
from engine.store.snapshots import SNAPSHOT_INTERVAL, TimeTravel
from engine.store.urls import StoreURL, default_url, mask, parse

__all__ = [
    "ConcurrencyConflict",
    "OutcomeUnknown",
    "PAGE",
    "ProjectionStatus",
    "Projections",
    "SNAPSHOT_INTERVAL",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreReadOnly",
    "StoreURL",
    "TimeTravel",
    "default_url",
    "mask",
    "parse",
    "writable",
]
