"""The persistence seam: eventsourcing's public interfaces only, and nothing private reached."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import (
    ApplicationRecorder,
    IntegrityError,
    Tracking,
    TrackingRecorder,
)

from engine import Engine
from engine.store.sqlite.datastore import Datastore
from tests._helpers import REVIEW

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    path
    for package in ("engine", "events", "projections")
    for path in sorted((ROOT / package).rglob("*.py"))
]
FORBIDDEN = {
    "__wrapped__": "calls a decorated function past its decorator",
    "c_make_encoder": "CPython's private JSON encoder",
    "c_make_scanner": "CPython's private JSON scanner",
    r"gc\.disable\(\)": "switches the collector off for every thread",
    "is_journal_mode_wal": "an attribute of eventsourcing's connection pool",
    r"slots=False": "an event or state value keeping a __dict__",
    r"def _(create_table|insert_tracking|database_transaction|insert_events)\b": "a hook",
    r"\b(super\(\)|\w+ApplicationRecorder)\._[a-z]": "a private method",
    r"_insert_stored_events|_fetch_ids_after_insert_events|_insert_tracking_row": "a private hook",
}


class TestSeam:
    @pytest.mark.parametrize("pattern", sorted(FORBIDDEN))
    def test_no_source_reaches_into_a_private_part(self, pattern: str) -> None:
        """No module uses a private part of eventsourcing, of CPython or of the collector."""
        found = [
            f"{path.relative_to(ROOT)}:{number}"
            for path in SOURCES
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if re.search(pattern, line)
        ]
        assert found == [], f"{FORBIDDEN[pattern]}: {found}"

    def test_every_backend_implements_eventsourcings_public_interfaces(
        self, store_url: str
    ) -> None:
        """The recorder is an ApplicationRecorder and the views a TrackingRecorder, everywhere."""
        with Engine(store_url) as engine:
            assert isinstance(engine.store.recorder, ApplicationRecorder)
            assert isinstance(engine.store.views, TrackingRecorder)

    def test_tracking_positions_go_through_the_public_interface(self, store_url: str) -> None:
        """insert_tracking moves a position forward, max_tracking_id reads it, a step back fails."""
        with Engine(store_url) as engine:
            views: Any = engine.store.views
            assert isinstance(views, TrackingRecorder)
            assert views.max_tracking_id("seam") is None
            views.insert_tracking(Tracking("seam", 3))
            assert views.max_tracking_id("seam") == 3
            assert views.has_tracking_id("seam", 2)
            with pytest.raises(IntegrityError, match="seam 3"):
                views.insert_tracking(Tracking("seam", 3))

    def test_eventsourcings_sqlite_pool_never_connects(self, sqlite_url: str) -> None:
        """Appends, reads and catch-ups use stagetrail's connections, never eventsourcing's pool."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(REVIEW)
            run.note("k", 1)
            engine.projections.catch_up()
            assert engine.runs()
            assert len(engine.events(run.id)) == 2
            datastore = engine.store.views.datastore  # type: ignore[union-attr]
            assert isinstance(datastore, Datastore)
            assert datastore.pool.num_in_pool == datastore.pool.num_in_use == 0

    def test_a_read_only_open_leaves_the_journal_mode(self, tmp_path: Path) -> None:
        """A file in rollback-journal mode opened read-only stays in that mode."""
        path = tmp_path / "s.db"
        with Engine(f"sqlite:///{path}") as engine:
            engine.start_run(REVIEW).note("k", 1)
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA journal_mode=DELETE")
        conn.close()
        with Engine(f"sqlite:///{path}", read_only=True) as engine:
            assert len(engine.runs()) == 1
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        conn.close()
