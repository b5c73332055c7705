"""Editing a store's event rows behind stagetrail's back, as someone with database access would."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from engine.store.meta import COMPACT, EVENTS_TABLE, LAYOUT, META_TABLE
from engine.store.sql import NAMES
from engine.store.sqlite.compact import TOPICS_TABLE
from tests._helpers import POSTGRES_URL


class Rows:
    """The events table of a SQLite file or a PostgreSQL schema, written by plain SQL."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = url.startswith("postgresql")

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self.postgres:
            import psycopg

            schema = self.url.split("schema=", 1)[1]
            with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
                conn.execute(f"SET search_path TO {schema}")
                yield conn
            return
        path = self.url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as lite, lite:
            yield lite

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.postgres else text

    def _compact(self) -> bool:
        """Whether a SQLite store keeps run ids as BLOBs and topics as ids (issue 26)."""
        if self.postgres:
            return False
        with self._cursor() as conn:
            row = conn.execute(
                f"SELECT value FROM {META_TABLE} WHERE key = ?", (LAYOUT,)
            ).fetchone()
        return row is not None and row[0] == COMPACT

    def _id(self, run_id: UUID) -> object:
        if self.postgres:
            return run_id
        return run_id.bytes if self._compact() else run_id.hex

    def _topic_in(self, conn: Any, topic: str) -> object:
        """What the events table holds for `topic` (a compact store: its id, added if new)."""
        if not self._compact():
            return topic
        conn.execute(f"INSERT OR IGNORE INTO {TOPICS_TABLE} (topic) VALUES (?)", (topic,))
        return conn.execute(f"SELECT id FROM {TOPICS_TABLE} WHERE topic = ?", (topic,)).fetchone()[
            0
        ]

    def _topic_out(self, conn: Any, stored: object) -> str:
        """The topic text of what the events table holds."""
        if not self._compact():
            return str(stored)
        return str(
            conn.execute(f"SELECT topic FROM {TOPICS_TABLE} WHERE id = ?", (stored,)).fetchone()[0]
        )

    def get(self, run_id: UUID, version: int) -> tuple[str, bytes]:
        """The topic and stored state of one event."""
        with self._cursor() as conn:
            row = conn.execute(
                self._sql(
                    f"SELECT topic, state FROM {EVENTS_TABLE} "
                    "WHERE originator_id = ? AND originator_version = ?"
                ),
                (self._id(run_id), version),
            ).fetchone()
            return self._topic_out(conn, row[0]), bytes(row[1])

    def put(self, run_id: UUID, version: int, topic: str, state: bytes) -> None:
        """Overwrite one event's topic and stored state."""
        with self._cursor() as conn:
            conn.execute(
                self._sql(
                    f"UPDATE {EVENTS_TABLE} SET topic = ?, state = ? "
                    "WHERE originator_id = ? AND originator_version = ?"
                ),
                (self._topic_in(conn, topic), state, self._id(run_id), version),
            )

    def edit(self, run_id: UUID, version: int, old: bytes, new: bytes) -> None:
        """Replace `old` by `new` in one event's stored bytes."""
        topic, state = self.get(run_id, version)
        assert old in state
        self.put(run_id, version, topic, state.replace(old, new))

    def delete(self, run_id: UUID, version: int) -> None:
        """Remove one event's row."""
        with self._cursor() as conn:
            conn.execute(
                self._sql(
                    f"DELETE FROM {EVENTS_TABLE} WHERE originator_id = ? AND originator_version = ?"
                ),
                (self._id(run_id), version),
            )

    def snapshots(self, run_id: UUID) -> int:
        """How many snapshots of the run's projections the store holds, of any generation."""
        with self._cursor() as conn:
            row = conn.execute(
                self._sql(f"SELECT count(*) FROM {NAMES['snapshots']} WHERE run_id = ?"),
                (str(run_id),),
            ).fetchone()
        return int(row[0])

    def swap(self, run_id: UUID, first: int, second: int) -> None:
        """Exchange two events' topics and bytes: their versions stay where they were."""
        one, two = self.get(run_id, first), self.get(run_id, second)
        self.put(run_id, first, *two)
        self.put(run_id, second, *one)

    def insert(self, run_id: UUID, version: int, topic: str, state: bytes) -> None:
        """Add a row."""
        with self._cursor() as conn:
            conn.execute(
                self._sql(
                    f"INSERT INTO {EVENTS_TABLE} (originator_id, originator_version, topic, state) "
                    "VALUES (?, ?, ?, ?)"
                ),
                (self._id(run_id), version, self._topic_in(conn, topic), state),
            )

    def strip(self, run_id: UUID, versions: range) -> None:
        """Remove the link from each of the run's `versions`, as if written before chaining."""
        from engine.store.chain import split

        for version in versions:
            topic, state = self.get(run_id, version)
            parts = split(state)
            assert parts is not None
            self.put(run_id, version, topic, parts[0])

    def everything(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Every event row and every meta row, in a fixed order (to show nothing was written)."""
        with self._cursor() as conn:
            events = conn.execute(
                f"SELECT originator_id, originator_version, topic, state FROM {EVENTS_TABLE} "
                "ORDER BY originator_id, originator_version"
            ).fetchall()
            rows = conn.execute(f"SELECT key, value FROM {META_TABLE} ORDER BY key").fetchall()
        return [tuple(e) for e in events], [tuple(r) for r in rows]

    def renumber(self, run_id: UUID, version: int, new: object) -> None:
        """Set one event's version to `new` (SQLite keeps a number that is not whole as REAL)."""
        with self._cursor() as conn:
            conn.execute(
                self._sql(
                    f"UPDATE {EVENTS_TABLE} SET originator_version = ? "
                    "WHERE originator_id = ? AND originator_version = ?"
                ),
                (new, self._id(run_id), version),
            )
