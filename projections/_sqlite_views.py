"""Persistent views in the SQLite store file, beside the events."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Any

from eventsourcing.persistence import Tracking
from eventsourcing.sqlite import SQLiteCursor, SQLiteDatastore, SQLiteTrackingRecorder

from projections._sql_views import SQLViews

NAMES = {
    "projections": "stagetrail_projections",
    "states": "stagetrail_projection_states",
    "runs": "stagetrail_runs",
    "runs_started": "stagetrail_runs_started",
    "runs_parent": "stagetrail_runs_parent",
    "labels": "stagetrail_run_labels",
    "snapshots": "stagetrail_snapshots",
}


class SQLiteViews(SQLiteTrackingRecorder, SQLViews):
    """eventsourcing's SQLite tracking recorder, extended with the views' tables."""

    names = NAMES
    tracking_table = "tracking"  # eventsourcing's SQLite recorder fixes this name

    def __init__(self, datastore: SQLiteDatastore) -> None:
        super().__init__(datastore)

    def _create_table(self, c: SQLiteCursor) -> None:
        super()._create_table(c)
        self.create_views(c)

    def _transaction(self, *, commit: bool) -> AbstractContextManager[Any]:
        return self.datastore.transaction(commit=commit)

    def _insert_tracking_row(self, cursor: Any, tracking: Tracking) -> None:
        self._insert_tracking(cursor, tracking)

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """SQLite has no notifications: wait out the poll interval (or until stopped)."""
        stop.wait(timeout)
        return False
