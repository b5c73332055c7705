"""The PostgreSQL backend (the `postgres` extra): one store per schema, many writers.

`datastore` connects (a probe connection for clear errors, eventsourcing's pool),
`recorder` appends without ever doubling an event after a lost connection,
`notifier` wakes the followers after appends (at most one NOTIFY per interval),
`views` keeps the read side's tables and waits on LISTEN/NOTIFY, `open` checks
or creates a store under an advisory lock.
"""

from __future__ import annotations

from engine.store.postgres.open import open_postgres, writable

__all__ = ["open_postgres", "writable"]
