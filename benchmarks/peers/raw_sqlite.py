"""The floor: one sqlite3 table, one INSERT + COMMIT per event, JSON payloads."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.peers.workload import STAGES, attempt

SCHEMA = (
    "CREATE TABLE events (run_id TEXT NOT NULL, version INTEGER NOT NULL, kind TEXT NOT NULL, "
    "at REAL NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, version))"
)


class RawSqlite:
    """Hand-rolled event table: what a team writes when it needs only an audit log."""

    name = "raw sqlite3"
    keeps_failures = True

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")  # WAL's safe default for a power cut
        self.conn.execute(SCHEMA)

    def record(self, runs: int) -> list[Any]:
        """Each event its own transaction, in the workload's order."""
        return [self._run() for _ in range(runs)]

    def _run(self) -> str:
        run_id, version = uuid.uuid4().hex, 0

        def append(kind: str, **data: Any) -> None:
            nonlocal version
            version += 1
            self.conn.execute("BEGIN")
            self.conn.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?)",
                (run_id, version, kind, time.time(), json.dumps(data)),
            )
            self.conn.execute("COMMIT")

        append("run_started", pipeline="review")
        for stage in STAGES:
            number = 0
            while True:
                number += 1
                append("stage_started", stage=stage, attempt=number)
                began = time.perf_counter()
                try:
                    result = attempt(stage, number)
                except Exception as error:
                    append("stage_failed", stage=stage, attempt=number, error=str(error),
                           error_type=type(error).__name__,
                           duration=time.perf_counter() - began)  # fmt: skip
                    continue
                append("stage_completed", stage=stage, attempt=number, result=result,
                       duration=time.perf_counter() - began)  # fmt: skip
                break
        append("run_finished", status="succeeded")
        return run_id

    def history(self, run_id: Any) -> list[Any]:
        """Every event of the run, its payload decoded."""
        rows = self.conn.execute(
            "SELECT version, kind, at, data FROM events WHERE run_id = ? ORDER BY version",
            (run_id,),
        )
        return [(version, kind, at, json.loads(data)) for version, kind, at, data in rows]

    def state_at(self, run_id: Any, record: int) -> Any:
        """Fold the first `record` events into (current stage, latest result per stage)."""
        rows = self.conn.execute(
            "SELECT kind, data FROM events WHERE run_id = ? AND version <= ? ORDER BY version",
            (run_id, record),
        )
        stage, results = None, {}
        for kind, data in rows:
            payload = json.loads(data)
            if kind == "stage_completed":
                results[payload["stage"]] = payload["result"]
                stage = payload["stage"]
        return stage, results

    def failures_visible(self, run_id: Any) -> bool:
        """Failed attempts are rows of their own."""
        return any(kind == "stage_failed" for _, kind, _, _ in self.history(run_id))

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()
