"""The SQLite backend: eventsourcing's recorder on a file, and the read side's tables beside it.

`datastore` opens the file (one kept writing connection, `writer`), `recorder`
reads a run's events with one SELECT and appends with one INSERT, `views` keeps
the projections' tables and tracking records, `open` checks and opens a store.
"""

from __future__ import annotations

from engine.store.sqlite.open import open_sqlite, writable

__all__ = ["open_sqlite", "writable"]
