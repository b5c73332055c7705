"""Persistence: eventsourcing's recorders behind `Store`, one package per backend.

`memory`, `sqlite/` and `postgres/` each open their kind of store: its recorder
for the events and its tables for the read side (`views`, with their SQL in
`sql`). `urls` parses store URLs (`shards` a layout of several stores), `meta`
keeps the store's schema version and at-rest settings, `mapper` turns events
into stored bytes and `codec` everything else the store keeps, with the
mapper's compressor and cipher.
The runtime that fills the read side's tables is `engine.readside`.

Each name is imported from its module on first use: `engine.store.errors` or
`engine.store.urls` alone do not load the backends.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.store.codec import Codec
    from engine.store.errors import (
        ChainKeyMismatch,
        ConcurrencyConflict,
        OutcomeUnknown,
        StoreError,
        StoreFull,
        StoreReadOnly,
    )
    from engine.store.event_store import PAGE, Store, writable
    from engine.store.sqlite.upgrade import Upgraded, upgrade_copy, upgrade_in_place
    from engine.store.urls import StoreURL, default_url, mask, parse

__all__ = [
    "ChainKeyMismatch",
    "Codec",
    "ConcurrencyConflict",
    "OutcomeUnknown",
    "PAGE",
    "RunBeingErased",
    "RunErased",
    "RunErasedWhileRead",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreReadOnly",
    "StoreURL",
    "Upgraded",
    "default_url",
    "mask",
    "parse",
    "upgrade_copy",
    "upgrade_in_place",
    "writable",
]

_HOMES = {
    "Codec": "engine.store.codec",
    **dict.fromkeys(
        [
            "ChainKeyMismatch",
            "ConcurrencyConflict",
            "OutcomeUnknown",
            "RunBeingErased",
            "RunErased",
            "RunErasedWhileRead",
            "StoreError",
            "StoreFull",
            "StoreReadOnly",
        ],
        "engine.store.errors",
    ),
    **dict.fromkeys(["PAGE", "Store", "writable"], "engine.store.event_store"),
    **dict.fromkeys(["StoreURL", "default_url", "mask", "parse"], "engine.store.urls"),
    **dict.fromkeys(
        ["Upgraded", "upgrade_copy", "upgrade_in_place"], "engine.store.sqlite.upgrade"
    ),
}


def __getattr__(name: str) -> Any:
    """A name of `__all__`, imported from its module on first use (then kept here)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
