"""Persistence: eventsourcing's recorders behind `Store`, one package per backend.

`memory`, `sqlite/` and `postgres/` each open their kind of store: its recorder
for the events and its tables for the read side (`views`, with their SQL in
`sql`). `urls` parses store URLs, `meta` keeps the store's schema version and
at-rest settings, `mapper` turns events into stored bytes and `codec` everything
else the store keeps, with the mapper's compressor and cipher.
The runtime that fills the read side's tables is `engine.readside`.
"""

from __future__ import annotations

from engine.store.codec import Codec
from engine.store.errors import (
    ConcurrencyConflict,
    OutcomeUnknown,
    StoreError,
    StoreFull,
    StoreReadOnly,
)
from engine.store.event_store import PAGE, Store, writable
from engine.store.urls import StoreURL, default_url, mask, parse

__all__ = [
    "Codec",
    "ConcurrencyConflict",
    "OutcomeUnknown",
    "PAGE",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreReadOnly",
    "StoreURL",
    "default_url",
    "mask",
    "parse",
    "writable",
]
