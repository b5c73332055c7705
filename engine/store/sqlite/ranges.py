"""Reading a run's versions by range over a connection of its own: what checking a long
run's hash chain streams in worker processes (`engine.store.chain_workers`).

A worker reading its ranges itself from the store's file does both halves of the check,
the read and the hashing, beside the process that started it, where a page read there
and sent to a worker costs that process its pickling on top of the read. Each reader is
picklable (the file's path, its identity and the table's layout): a worker opens its own
read-only connection, as a reading connection of the store does (`read_only_uri`), and reads
nothing if the path no longer names the file the store opened (replaced since): the check
then reads the run through the store, as without ranges.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Generator
from typing import Any
from uuid import UUID

from engine.store.chain import StoredRow
from engine.store.errors import StoreError
from engine.store.sqlite.datastore import LOCK_TIMEOUT, read_only_uri


class RangeReader:
    """Streams the rows of a run's versions `first` to `last` from the SQLite file `path`.

    Args:
        path: the store's file, absolute (as the store opened it: a relative one would be
            resolved against the working directory of each read).
        table: its events table.
        topics: its table of topic ids (a compact store: run ids as 16 bytes, topics as ids),
            or None (run ids as hex text, topics in full).
        url: the store's URL, masked (what its errors name).
        file: the file's identity when the store opened it (`identity`).
    """

    def __init__(
        self, path: str, table: str, topics: str | None, *, url: str, file: tuple[int, int]
    ) -> None:
        self.path = path
        self.table = table
        self.topics = topics
        self.url = url
        self.file = file
        self._connection: sqlite3.Connection | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled as the file and layout alone: a connection never crosses into another
        process."""
        return {"path": self.path, "table": self.table, "topics": self.topics,
                "url": self.url, "file": self.file}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled unconnected (it connects at its first read)."""
        path, table, topics = state["path"], state["table"], state["topics"]
        self.__init__(path, table, topics, url=state["url"], file=state["file"])  # type: ignore[misc]

    def pages(
        self, run_id: UUID, first: int, last: int, size: int
    ) -> Generator[list[StoredRow], None, None]:
        """The run's rows with `first <= version <= last`, in version order, `size` a page.

        Raises:
            StoreError: a topic id the topics table does not hold, or the path names another
                file than the store opened (replaced since).
            sqlite3.Error: the read failed.
        """
        connection = self._connected()
        key: str | bytes = run_id.hex if self.topics is None else run_id.bytes
        cursor = connection.execute(
            f"SELECT originator_version, topic, state FROM {self.table} WHERE originator_id=?"
            " AND originator_version>=? AND originator_version<=? ORDER BY originator_version",
            (key, first, last),
        )
        names: dict[int, str] = {}
        while page := cursor.fetchmany(size):
            yield page if self.topics is None else self._named(page, names)

    def _named(self, page: list[Any], names: dict[int, str]) -> list[StoredRow]:
        """`page` with each topic id turned into its topic (the topics table read again for
        an id not known yet: a topic added since)."""
        try:
            return [(version, names[topic], state) for version, topic, state in page]
        except KeyError:
            assert self._connection is not None  # read by `pages`
            names.update(self._connection.execute(f"SELECT id, topic FROM {self.topics}"))
        try:
            return [(version, names[topic], state) for version, topic, state in page]
        except KeyError as error:
            raise StoreError(self.url, f"no topic has the id {error.args[0]!r}") from None

    def _connected(self) -> sqlite3.Connection:
        """Its connection, opened if not yet, to the file the store opened.

        Raises:
            StoreError: the path names another file than the store opened (it was replaced
                since): its rows are not the store's to check.
        """
        if self._connection is None:
            connection = sqlite3.connect(
                read_only_uri(self.path), uri=True, timeout=LOCK_TIMEOUT,
                isolation_level=None, check_same_thread=False,
            )  # fmt: skip
            try:
                same = identity(self.path) == self.file
            except OSError:
                same = False
            if not same:
                connection.close()
                raise StoreError(self.url, f"{self.path} is no longer the file the store opened")
            self._connection = connection
        return self._connection

    def close(self) -> None:
        """Close its connection (a later read opens another)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def identity(path: str) -> tuple[int, int]:
    """The file at `path` (its device and inode): another file there has another.

    Raises:
        OSError: no file there.
    """
    found = os.stat(path)
    return found.st_dev, found.st_ino
