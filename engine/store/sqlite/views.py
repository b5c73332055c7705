"""The SQLite tables of the read side: eventsourcing's tracking recorder and the views' tables."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from eventsourcing.persistence import IntegrityError, Tracking
from eventsourcing.sqlite import SQLiteCursor, SQLiteDatastore, SQLiteTrackingRecorder

from engine.store.sql import NAMES, SQLViews


class SQLiteViews(SQLiteTrackingRecorder, SQLViews):
    """eventsourcing's SQLite tracking recorder, extended with the views' tables."""

    names = NAMES
    tracking_table = "tracking"  # eventsourcing's SQLite recorder fixes this name

    def __init__(self, datastore: SQLiteDatastore, url: str = "-") -> None:
        super().__init__(datastore)
        self.url = url

    def create_table(self) -> None:
        """Create the tracking and views tables, even while another process does too."""
        try:
            super().create_table()
        except IntegrityError:
            # Both saw no tracking table and both recorded its migration marker: the
            # other was first. Looking again finds its tables and adds nothing.
            super().create_table()

    def _create_table(self, c: SQLiteCursor) -> None:
        super()._create_table(c)
        self.create_views(c)

    def _database_transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _insert_tracking_row(self, cursor: Any, tracking: Tracking) -> None:
        self._insert_tracking(cursor, tracking)

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """SQLite has no notifications: wait out the poll interval (or until stopped)."""
        stop.wait(timeout)
        return False
