"""The SQLite tables of the read side: the tracking records and the views' tables."""

from __future__ import annotations

import threading

from engine.store.meta import EVENTS_TABLE
from engine.store.sql import NAMES, SQLViews
from engine.store.sqlite.datastore import Datastore


class SQLiteViews(SQLViews):
    """eventsourcing's tracking recorder interface and the views' tables, in the SQLite file."""

    names = NAMES
    tracking_table = "tracking"  # the name eventsourcing's SQLite recorder gave the table
    tracking_definition = (
        "CREATE TABLE IF NOT EXISTS {tracking} (application_name TEXT, notification_id INTEGER, "
        "PRIMARY KEY (application_name)) WITHOUT ROWID"
    )

    newest_event = f"SELECT MAX(rowid) AS newest FROM {EVENTS_TABLE}"

    def __init__(self, datastore: Datastore, url: str = "-") -> None:
        super().__init__(datastore, url)

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """SQLite has no notifications: wait out the poll interval (or until stopped)."""
        stop.wait(timeout)
        return False
