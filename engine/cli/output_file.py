"""Files a command writes: never one it did not create unless told to, never the store.

`stagetrail report --html FILE` is the command that writes a file (the others
write to stdout). `written_file` checks the target before any work is done and
writes it whole or not at all: the content goes to a temporary file beside the
target, which then takes the target's name. An existing file is replaced only
with ``--force``; the store the command reads (its database file, or the WAL,
shared-memory and journal files SQLite keeps beside it) never, whatever the flags.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from engine.cli.common import BadOption
from engine.store import default_url, parse

_SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")
"""The files SQLite keeps for a database: the file itself, its WAL, shared memory, journal."""


def store_files(store: str | None) -> list[str]:
    """The files the store `store` (None: the default store) is kept in; none for a server.

    Raises:
        StoreError: `store` is not a store URL.
    """
    url = parse(store or default_url())
    if url.scheme == "sqlite":
        database = url.path
    elif url.scheme == "eventsourcing" and url.options.get("SQLITE_DBNAME"):
        database = url.options["SQLITE_DBNAME"]
    else:
        return []
    if database == ":memory:" or database.startswith("file:"):
        return []
    return [database + suffix for suffix in _SQLITE_COMPANIONS]


def _same_file(path: str, other: str) -> bool:
    """Whether `path` and `other` name one file: the same resolved path, or the same inode."""
    if os.path.realpath(path) == os.path.realpath(other):
        return True
    try:
        return os.path.samefile(path, other)
    except OSError:  # either does not exist
        return False


def check_target(option: str, path: str, store: str | None, *, force: bool) -> None:
    """Refuse `path` as an output file: the store's own files always, an existing file without
    `force`, a directory or a missing directory always.

    Raises:
        BadOption: `path` may not be written.
    """
    for kept in store_files(store):
        if _same_file(path, kept):
            raise BadOption(
                option, path, "is the store this command reads; write the file elsewhere"
            )
    if os.path.isdir(path):
        raise BadOption(option, path, "is a directory; name a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise BadOption(option, path, f"no directory {parent}")
    if os.path.lexists(path) and not force:
        raise BadOption(option, path, "the file exists; give --force to replace it")


@contextmanager
def written_file(option: str, path: str, store: str | None, *, force: bool) -> Iterator[str]:
    """A temporary path to write; on success it becomes `path`, checked by `check_target`.

    Without `force` the file is put in place only if `path` is still free, so a
    file that appeared meanwhile is not replaced either. On an error the
    temporary file is removed and `path` is left as it was.

    Raises:
        BadOption: `path` may not be written (checked before and after).
    """
    check_target(option, path, store, force=force)
    directory = os.path.dirname(os.path.abspath(path))
    temporary = _new_file(directory)
    try:
        yield temporary
        check_target(option, path, store, force=force)
        _put_in_place(option, temporary, path, force=force)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def _new_file(directory: str) -> str:
    """A new empty file in `directory`, with the permissions the umask gives (as `open` would)."""
    while True:
        temporary = os.path.join(directory, f".stagetrail-{secrets.token_hex(8)}.tmp")
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return temporary


def _put_in_place(option: str, temporary: str, path: str, *, force: bool) -> None:
    """Give `temporary` the name `path`; without `force` only if nothing has it (no race)."""
    if force:
        os.replace(temporary, path)  # a symlink at `path` is replaced, not its target
        return
    try:
        os.link(temporary, path)  # fails if `path` exists, atomically
    except FileExistsError:
        raise BadOption(option, path, "the file exists; give --force to replace it") from None
    except OSError:  # a file system without hard links: the check above stands
        os.replace(temporary, path)
