"""The review workload every system records, identically (issue 14).

Five stages in order; ``developer`` fails twice and succeeds on its 3rd attempt,
``testing`` fails once and succeeds on its 2nd: 8 attempts per run, 3 of them
failures. A success returns a ~550-byte JSON result.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

STAGES = ("project_analysis", "code_review", "developer", "testing", "deploy")
FAILURES = {"developer": 2, "testing": 1}
"""How many times each stage fails before it succeeds."""
ATTEMPTS = len(STAGES) + sum(FAILURES.values())
"""Stage attempts per run (8)."""

RESULT: dict[str, Any] = {
    "score": 0.87,
    "issues": [
        {"file": f"src/module_{n}.py", "line": 10 * n + 3, "severity": "minor", "rule": f"R{n}0"}
        for n in range(1, 6)
    ],
    "suggestion": ("Split the parser into a tokenizer and a recursive-descent stage; " * 4)[:200],
}
"""What every successful attempt returns."""
RESULT_BYTES = len(json.dumps(RESULT))


class StageError(Exception):
    """The error a failing attempt raises."""


def attempt(stage: str, number: int) -> dict[str, Any]:
    """One attempt (1-based) of `stage`: raises while the stage still has failures to give."""
    if number <= FAILURES.get(stage, 0):
        raise StageError(f"{stage}: attempt {number} failed (tests red)")
    return RESULT


class System(Protocol):
    """One contender: records runs into a fresh SQLite file, then answers the read questions."""

    name: str
    keeps_failures: bool

    def record(self, runs: int) -> list[Any]:
        """Record `runs` runs of the workload; return their ids."""

    def history(self, run_id: Any) -> list[Any]:
        """One run's full history, decoded."""

    def state_at(self, run_id: Any, record: int) -> Any:
        """The run's state as of its `record`-th record."""

    def failures_visible(self, run_id: Any) -> bool:
        """Whether the history shows the run's failed attempts."""

    def close(self) -> None:
        """Release connections (the file stays for measuring)."""


def file_size(path: Path) -> int:
    """The database's size after a WAL checkpoint (the WAL folded into the main file)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def row_count(path: Path) -> int:
    """Rows in every table of the database (indexes and sqlite's own tables excluded)."""
    conn = sqlite3.connect(path)
    try:
        tables = [
            name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
        ]  # fmt: skip
        return sum(conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables)
    finally:
        conn.close()


Factory = Callable[[Path], System]
"""Builds a system on a fresh database file."""
