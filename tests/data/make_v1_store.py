"""Writes `v1_store.db`: a SQLite store as the first released event schema wrote it.

Every event is stored in its oldest class version, without a ``class_version``
key, exactly as version 1 of each class looked (the upcasters in `events/`
say what changed since):

- `RunStarted` v1: no ``labels``, no ``forked_from``;
- `StageFailed` v1: no ``details``;
- `ProgressObserved` v1: every signal in each event, None meaning "none" (no
  failing test, not functional).

The file is written with eventsourcing's SQLite recorder and literal state
dicts, not with stagetrail's event classes, so later changes to those classes
cannot change what this store holds. Run it from the repository root to
regenerate the file (the output is deterministic)::

    python tests/data/make_v1_store.py
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

TARGET = Path(__file__).with_name("v1_store.db")

REVIEW_RUN = UUID("00000000-0000-4000-8000-00000000000a")
"""A finished code review: retries, a failed test sent back, a rollback, progress, budget."""
CHILD_RUN = UUID("00000000-0000-4000-8000-00000000000b")
"""A child run of the review with tasks and a breaker, finished failed."""
OPEN_RUN = UUID("00000000-0000-4000-8000-00000000000c")
"""A run whose process died inside an attempt of `developer`, with a task active."""

TABLE = {
    "name": "code-review",
    "initial": "project_analysis",
    "final": ["done", "aborted"],
    "states": ["project_analysis", "code_review", "developer", "testing", "done", "aborted"],
    "transitions": [
        ["project_analysis", "completed", "code_review"],
        ["code_review", "completed", "developer"],
        ["developer", "failed", "developer"],
        ["developer", "completed", "testing"],
        ["testing", "failed", "developer"],
        ["testing", "completed", "done"],
        ["*", "aborted", "aborted"],
    ],
}
"""The README's code-review table, as `Pipeline.to_dict` wrote it in the first release."""

POLICY = {"max_retries": 3, "delay": 1.0, "backoff": 2.0, "max_delay": 60.0, "jitter": 0.0}


def stamp(second: int) -> str:
    """A fixed, timezone-aware time: the file must not change from one generation to the next."""
    return f"2026-01-05T09:{second // 60:02d}:{second % 60:02d}+00:00"


def review_run() -> list[tuple[str, dict[str, Any]]]:
    """The finished review's events in v1 shapes: (type name, state without class_version)."""
    return [
        ("RunStarted", {"pipeline": "code-review", "table": TABLE, "params": {"card": "C-1"},
                        "parent_run_id": None}),
        ("StageStarted", {"stage": "project_analysis", "attempt": 1}),
        ("StageCompleted", {"stage": "project_analysis", "attempt": 1, "outcome": "completed",
                            "result": {"project_type": "python"}, "duration": 5.2}),
        ("StageCompleted", {"stage": "code_review", "attempt": 1, "outcome": "completed",
                            "result": {"critical": 3}, "duration": 31.0}),
        ("StageStarted", {"stage": "developer", "attempt": 1}),
        ("StageFailed", {"stage": "developer", "attempt": 1, "outcome": "failed",
                         "error": "cc1: parser.c: error", "error_type": "BuildException",
                         "retryable": True, "duration": 40.0}),
        ("RetryScheduled", {"stage": "developer", "attempt": 2, "delay": 1.0,
                            "reason": "BuildException, attempt 1 of 4", "policy": POLICY}),
        ("ProgressObserved", {"changed_files": 2, "diagnostics_signature": None,
                              "test_signature": "test_parser", "functional_ok": None}),
        ("StageStarted", {"stage": "developer", "attempt": 2}),
        ("StageFailed", {"stage": "developer", "attempt": 2, "outcome": "failed",
                         "error": "cc1: parser.c: error", "error_type": "BuildException",
                         "retryable": True, "duration": 38.0}),
        ("StageCompleted", {"stage": "developer", "attempt": 3, "outcome": "completed",
                            "result": {"changed_files": 3}, "duration": 50.0}),
        ("StageFailed", {"stage": "testing", "attempt": 1, "outcome": "failed",
                         "error": "test_empty failed", "error_type": "TestFailure",
                         "retryable": True, "duration": 9.5}),
        ("StateRolledBack", {"steps": 1, "reason": "flaky test"}),
        ("NoteAdded", {"key": "strategy", "value": ["rerun", {"flaky": True}]}),
        ("BudgetSpent", {"amount": 0.25, "unit": "usd"}),
        ("ProgressObserved", {"changed_files": ["parser.c"], "diagnostics_signature": "",
                              "test_signature": None, "functional_ok": True}),
        ("StageCompleted", {"stage": "testing", "attempt": 2, "outcome": "completed",
                            "result": {"passed": 42}, "duration": 12.0}),
        ("RunFinished", {"status": "succeeded", "reason": "reached final state 'done'"}),
    ]  # fmt: skip


def child_run() -> list[tuple[str, dict[str, Any]]]:
    """The child run's events: tasks, a tripped breaker, an abort."""
    return [
        ("RunStarted", {"pipeline": "code-review", "table": TABLE, "params": {},
                        "parent_run_id": str(REVIEW_RUN)}),
        ("TaskAdded", {"task_id": "feature-1", "parent_id": None, "title": "parser"}),
        ("TaskAdded", {"task_id": "task-1", "parent_id": "feature-1", "title": "lexer"}),
        ("TaskStarted", {"task_id": "task-1"}),
        ("TaskFailed", {"task_id": "task-1", "error": "timeout", "error_type": "Timeout"}),
        ("TaskStarted", {"task_id": "task-1"}),
        ("TaskCompleted", {"task_id": "task-1", "result": {"tokens": 1200}}),
        ("BudgetSpent", {"amount": 1200.0, "unit": "tokens"}),
        ("CircuitOpened", {"stage": "project_analysis", "reason": "3 failures in a row"}),
        ("CircuitHalfOpened", {"stage": "project_analysis", "reason": "reset timeout passed"}),
        ("CircuitClosed", {"stage": "project_analysis", "reason": "trial call succeeded"}),
        ("StageFailed", {"stage": "project_analysis", "attempt": 1, "outcome": "aborted",
                         "error": "repository unreachable", "error_type": "OSError",
                         "retryable": False, "duration": 0.5}),
        ("RunFinished", {"status": "failed", "reason": {"rule": "gave_up"}}),
    ]  # fmt: skip


def open_run() -> list[tuple[str, dict[str, Any]]]:
    """A run left by a dead process: an attempt of `developer` open, a task active."""
    return [
        ("RunStarted", {"pipeline": "code-review", "table": TABLE, "params": {"card": "C-3"},
                        "parent_run_id": None}),
        ("StageCompleted", {"stage": "project_analysis", "attempt": 1, "outcome": "completed",
                            "result": None, "duration": 1.0}),
        ("StageCompleted", {"stage": "code_review", "attempt": 1, "outcome": "completed",
                            "result": {"critical": 0}, "duration": 2.0}),
        ("StageStarted", {"stage": "developer", "attempt": 1}),
        ("TaskAdded", {"task_id": "t-1", "parent_id": None, "title": ""}),
        ("TaskStarted", {"task_id": "t-1"}),
    ]  # fmt: skip


def stored(run_id: UUID, events: list[tuple[str, dict[str, Any]]], first: int) -> list[StoredEvent]:
    """The run's events as eventsourcing stores them: topic, compact UTF-8 JSON state."""
    rows = []
    for version, (name, state) in enumerate(events, start=1):
        body = {**state, "timestamp": stamp(first + version)}
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf8")
        rows.append(StoredEvent(run_id, version, f"stagetrail:{name}", data))
    return rows


def write(path: Path) -> None:
    """Write the store file at `path` (replacing it): meta table, then the events."""
    if path.exists():
        path.unlink()
    datastore = SQLiteDatastore(db_name=str(path))
    try:
        with datastore.transaction(commit=True) as cursor:
            cursor.execute(
                "CREATE TABLE stagetrail_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            meta = [("schema_version", "1"), ("compressor", "none"), ("cipher", "none")]
            cursor.executemany("INSERT INTO stagetrail_meta VALUES (?, ?)", meta)
        recorder = SQLiteApplicationRecorder(datastore, events_table_name="stagetrail_events")
        recorder.create_table()
        recorder.insert_events(stored(REVIEW_RUN, review_run(), 0))
        recorder.insert_events(stored(CHILD_RUN, child_run(), 100))
        recorder.insert_events(stored(OPEN_RUN, open_run(), 200))
    finally:
        datastore.close()
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal
        connection.execute("VACUUM")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else TARGET)
    print(f"wrote {os.path.relpath(TARGET if len(sys.argv) < 2 else sys.argv[1])}")
