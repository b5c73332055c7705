"""Append throughput and memory: stagetrail's Run vs raw sqlite3 and plain eventsourcing.

Run: ``python -m benchmarks.append`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from uuid import uuid4

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from benchmarks._common import RESULT, WORK, arguments, median_rates, report, scratch
from engine import Engine
from engine.store.meta import AtRest
from events import StageCompleted

RAW_TABLE = (
    "CREATE TABLE stored_events (originator_id TEXT, originator_version INTEGER, "
    "topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version))"
)
RAW_INSERT = "INSERT INTO stored_events VALUES (?, ?, ?, ?)"


def serialized_rows(count: int) -> list[tuple[str, int, str, bytes]]:
    """The rows stagetrail would write for `count` outcomes, serialised up front."""
    mapper, run_id = AtRest().mapper(), uuid4()
    rows = []
    for version in range(1, count + 1):
        outcome = StageCompleted(
            run_id=run_id,
            version=version,
            stage="work",
            attempt=version,
            result=RESULT,
            duration=1.0,
        )
        stored = mapper.to_stored_event(outcome)
        rows.append((run_id.hex, version, stored.topic, stored.state))
    return rows


def raw_connection() -> sqlite3.Connection:
    """A plain sqlite3 connection with the same durability settings (WAL, FULL sync)."""
    conn = sqlite3.connect(scratch("raw.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(RAW_TABLE)
    return conn


def raw_single(rows: list[tuple[str, int, str, bytes]]) -> int:
    conn = raw_connection()
    for row in rows:
        conn.execute("BEGIN")
        conn.execute(RAW_INSERT, row)
        conn.execute("COMMIT")
    conn.close()
    return len(rows)


def raw_batched(rows: list[tuple[str, int, str, bytes]], size: int) -> int:
    conn = raw_connection()
    for start in range(0, len(rows), size):
        conn.execute("BEGIN")
        conn.executemany(RAW_INSERT, rows[start : start + size])
        conn.execute("COMMIT")
    conn.close()
    return len(rows)


def stagetrail_single(count: int) -> int:
    with Engine(f"sqlite:///{scratch('st.db')}") as engine:
        run = engine.start_run(WORK)
        for _ in range(count):
            run.stage_completed("work", RESULT, duration=1.0)
    return count


def stagetrail_batched(count: int, size: int) -> int:
    with Engine(f"sqlite:///{scratch('st.db')}") as engine:
        run = engine.start_run(WORK)
        for _ in range(count // size):
            with run.batch():
                for _ in range(size):
                    run.stage_completed("work", RESULT, duration=1.0)
    return count


class Work(Aggregate):
    """The plain-eventsourcing equivalent of a run."""

    @event("Completed")
    def complete(
        self, stage: str, attempt: int, outcome: str, result: Any, duration: float
    ) -> None:
        """One stage outcome."""


def eventsourcing_single(count: int) -> int:
    app: Application[Any] = Application(
        env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(scratch("es.db"))}
    )
    work = Work()
    app.save(work)
    for attempt in range(1, count + 1):
        work.complete("work", attempt, "completed", RESULT, 1.0)
        app.save(work)
    app.close()
    return count


def task_events_rate(existing: int, measured: int = 1000) -> float:
    """Task events/s (memory store) for `measured` new tasks in a run already holding `existing`."""
    with Engine("memory://") as engine:
        run = engine.start_run(WORK)
        with run.batch():
            for index in range(existing):
                run.add_task(f"old-{index}")
        start = time.perf_counter()
        with run.batch():
            for index in range(measured):
                run.add_task(f"new-{index}")
                run.task_started(f"new-{index}")
                run.task_completed(f"new-{index}")
        return 3 * measured / (time.perf_counter() - start)


TASKS_CHILD = """
import sys
from benchmarks.append import task_events_rate
print(task_events_rate(int(sys.argv[1])))
"""


def isolated_task_rate(existing: int) -> float:
    """`task_events_rate` in a fresh process: this process's heap history must not weigh in."""
    rates = [float(_child(TASKS_CHILD, str(existing))[0]) for _ in range(3)]
    return sorted(rates)[1]


APPEND_CHILD = """
import resource, sys
from benchmarks._common import WORK, RESULT
from engine import Engine
count, path = int(sys.argv[1]), sys.argv[2]
with Engine("sqlite:///" + path) as engine:
    run = engine.start_run(WORK)
    for _ in range(count // 1000):
        with run.batch():
            for _ in range(1000):
                run.stage_completed("work", RESULT, duration=1.0)
print(run.id, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""

LOAD_CHILD = """
import resource, sys
from engine import Engine
count, path, run_id = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with Engine("sqlite:///" + path) as engine:
    loaded = engine.load(run_id)
    assert loaded.version == count + 1 and loaded.machine.depth == count
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _child(source: str, *args: str) -> list[str]:
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", source, *args], cwd=root, capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def peak_rss_mb(count: int) -> tuple[int, int]:
    """Peak RSS (MB) of a fresh process appending `count` outcomes, and of one loading them."""
    path = str(scratch("mem.db"))
    run_id, appended = _child(APPEND_CHILD, str(count), path)
    (loaded,) = _child(LOAD_CHILD, str(count), path, run_id)
    return int(appended), int(loaded)


def main() -> None:
    """Measure and print the append figures as ratios against the baselines."""
    args = arguments(__doc__ or "")
    single, batched, repeats = (100, 2000, 1) if args.quick else (1000, 50_000, 5)
    rows = serialized_rows(max(single, batched))
    durable = median_rates(
        {
            "raw": lambda: raw_single(rows[:single]),
            "ours": lambda: stagetrail_single(single),
            "plain": lambda: eventsourcing_single(single),
        },
        repeats,
    )
    raw, ours, plain = durable["raw"], durable["ours"], durable["plain"]
    many = median_rates(
        {
            "raw": lambda: raw_batched(rows[:batched], 100),
            "ours": lambda: stagetrail_batched(batched, 100),
        },
        repeats,
    )
    raw_many, ours_many = many["raw"], many["ours"]
    many_tasks = 5_000 if args.quick else 100_000
    few_rate, many_rate = isolated_task_rate(100), isolated_task_rate(many_tasks)
    million = 20_000 if args.quick else 1_000_000
    rss_append, rss_load = peak_rss_mb(million)
    report(
        "append (events/s, SQLite file, WAL, synchronous=FULL)",
        [
            {
                "case": "durable single append",
                "stagetrail": ours,
                "raw_sqlite3": raw,
                "eventsourcing_save": plain,
                "ratio_vs_raw": ours / raw,
                "target_vs_raw": 0.5,
                "ratio_vs_eventsourcing": ours / plain,
                "target_vs_eventsourcing": 1.0,
            },
            {
                "case": "batched append, 100/transaction",
                "stagetrail": ours_many,
                "raw_executemany": raw_many,
                "ratio_vs_raw": ours_many / raw_many,
                "target_vs_raw": 0.33,
            },
            {
                "case": f"task events/s with 100 vs {many_tasks:,} tasks in the run",
                "few_tasks": few_rate,
                "many_tasks": many_rate,
                "ratio": many_rate / few_rate,
            },
            {
                "case": f"peak RSS appending {million:,} events to one run (MB)",
                "append": rss_append,
                "load_in_new_process": rss_load,
                "target": 200,
            },
        ],
        args.json,
    )


if __name__ == "__main__":
    main()
