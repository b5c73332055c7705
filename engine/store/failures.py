"""What a database's refusal means: driver errors turned into actionable `StoreError`s.

eventsourcing wraps sqlite3's and psycopg's errors in its own classes, keeping
the driver's error as the cause; the error code there says whether the store is
read-only, full, or out of reach, and so what the user can do about it.
"""

from __future__ import annotations

import sqlite3

from eventsourcing.persistence import PersistenceError

from engine.store.errors import StoreError, StoreFull, StoreReadOnly

_SQLITE_READ_ONLY = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_CANTOPEN}
_SQLITE_FULL = {sqlite3.SQLITE_FULL}
READ_ONLY_TRANSACTION = "25006"
"""PostgreSQL's read_only_sql_transaction: a standby, or default_transaction_read_only on."""
_PG_READ_ONLY = {READ_ONLY_TRANSACTION, "42501"}  # and insufficient_privilege
_PG_FULL = {"53100", "54000"}  # disk_full, program_limit_exceeded


def driver_error(error: BaseException) -> BaseException:
    """The driver's own error under eventsourcing's wrapping (or `error` itself)."""
    seen = error
    while seen.__cause__ is not None and not _is_driver(seen):
        seen = seen.__cause__
    return seen if _is_driver(seen) else error


def _is_driver(error: BaseException) -> bool:
    return isinstance(error, sqlite3.Error) or type(error).__module__.startswith("psycopg")


def is_database_error(error: BaseException) -> bool:
    """Whether `error` is a database's (eventsourcing's wrapping, sqlite3's, psycopg's)."""
    return isinstance(error, PersistenceError) or _is_driver(error)


def describe(error: BaseException) -> str:
    """The error's message on one line."""
    return " ".join(str(error).split()) or type(error).__name__


def classify(url: str, error: BaseException, doing: str) -> StoreError:
    """A `StoreError` (or the subclass its cause calls for) for a failed `doing`.

    Args:
        url: the masked store URL.
        error: what the recorder or driver raised.
        doing: what failed, e.g. ``"append failed, nothing written"``.
    """
    cause = driver_error(error)
    text = describe(cause)
    sqlite_code = _code(cause, "sqlite_errorcode")
    primary = sqlite_code & 0xFF if isinstance(sqlite_code, int) else None  # extended codes
    if _code(cause, "sqlstate") == READ_ONLY_TRANSACTION:
        return StoreReadOnly(
            url,
            f"{doing}: the PostgreSQL server is read-only for this session ({text}): a "
            "standby, or default_transaction_read_only on for the server, the database or "
            "the role; write to the primary, or turn that setting off",
        )
    if primary in _SQLITE_READ_ONLY or _code(cause, "sqlstate") in _PG_READ_ONLY:
        return StoreReadOnly(
            url,
            f"{doing}: the store is read-only for this user ({text}); check the file's and "
            "its directory's permissions, or the database role, or use a writable server",
        )
    if primary in _SQLITE_FULL or _code(cause, "sqlstate") in _PG_FULL:
        return StoreFull(
            url,
            f"{doing}: the disk or the database is full ({text}); free space and try again",
        )
    return StoreError(url, f"{doing}: {text}")


def _code(error: BaseException, attribute: str) -> object:
    return getattr(error, attribute, None)
