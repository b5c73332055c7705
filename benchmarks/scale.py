"""Scale-out: total events/s and follower lag with 1, 2, 4, 8 and 16 writer processes.

Each writer is a `benchmarks.fleet` worker supervising runs of the code-review
pipeline (failures, retries, give-ups) to their end, every event durable in its
own transaction (a failure and its decision share one). One follower process
folds `RunIndex` and `FailurePatterns` with `Projections.follow` meanwhile
(LISTEN/NOTIFY on PostgreSQL, polling every 0.2 s on SQLite) and samples its
lag (head minus its position, in events) four times a second.

The store is created before the processes start: this measures appending, not
creating. The baseline of each curve is its own 1-writer row (`speedup`). On
PostgreSQL each point also measures, just before it and from as many processes,
raw psycopg one-row ``INSERT`` + ``COMMIT`` into a table shaped like the events
table, without a lock (`raw_commits_per_s`, the ceiling: `vs_raw` is stagetrail's
events/s over it) and under the table's ``EXCLUSIVE`` lock the older release took
(`raw_locked_commits_per_s`); and the store's append path alone, engines
appending one note per transaction (`note_appends_per_s`, `appends_vs_raw`).

Run: ``python -m benchmarks.scale`` (``--quick`` for a smoke run). PostgreSQL is
``$STAGETRAIL_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``),
each measurement in a fresh schema dropped afterwards; without a server only
SQLite is measured.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from benchmarks._common import arguments, report, scratch
from benchmarks.fleet import start
from engine import Engine

POSTGRES = os.environ.get("STAGETRAIL_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
WRITERS = (1, 2, 4, 8, 16)
RUNS = 100
"""Runs per writer (about 13 events each)."""
RAW_SECONDS = 3.0
"""How long each raw baseline process commits."""


@contextmanager
def sqlite_store() -> Iterator[str]:
    """A new SQLite store file."""
    yield f"sqlite:///{scratch('scale.db')}"


@contextmanager
def postgres_store() -> Iterator[str]:
    """A new PostgreSQL schema, dropped afterwards."""
    import psycopg
    from psycopg import sql

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{POSTGRES}?schema={schema}"
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def postgres_reachable() -> bool:
    """Whether the benchmark's PostgreSQL answers."""
    try:
        import psycopg

        psycopg.connect(POSTGRES, connect_timeout=3).close()
    except Exception:  # not installed, or no server: SQLite only
        return False
    return True


def measure(url: str, writers: int, runs: int) -> dict[str, Any]:
    """One point of the curve: `writers` workers and one follower on the store at `url`."""
    Engine(url).close()  # created up front: this measures appending, not creating
    follower = start("follower", url)
    workers = [start("worker", url, "--index", str(i), "--runs", str(runs)) for i in range(writers)]
    outputs = [worker.communicate() for worker in workers]
    outputs.append(follower.communicate("finish\n"))
    for process, (_, err) in zip((*workers, follower), outputs, strict=True):
        if process.returncode:
            raise RuntimeError(f"a fleet process failed on {url}:\n{err}")
    written = [json.loads(out) for out, _ in outputs[:-1]]
    followed = json.loads(outputs[-1][0])
    began = min(report["began"] for report in written)
    ended = max(report["ended"] for report in written)
    events = sum(report["events"] for report in written)
    return {
        "writers": writers,
        "events": events,
        "seconds": ended - began,
        "events_per_s": events / (ended - began),
        "max_lag": followed["max_lag"],
        "mean_lag": followed["mean_lag"],
        "catch_up_s": followed["catch_up_seconds"],
    }


def raw_commits(url: str, processes: int, seconds: float, *, locked: bool) -> float:
    """Commits/s of `processes` raw psycopg writers, one row per transaction, for `seconds`."""
    import psycopg
    from psycopg import sql

    schema = url.rsplit("schema=", 1)[1]
    table = sql.Identifier(schema, "raw_events")
    with psycopg.connect(POSTGRES, autocommit=True) as conn:
        like = sql.Identifier(schema, "stagetrail_events")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(table, like))
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    args = (table.as_string(None), seconds, locked, results, context.Barrier(processes))
    workers = [context.Process(target=raw_writer, args=args) for _ in range(processes)]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=120 + seconds) for _ in workers]
    for worker in workers:
        worker.join()
    began = min(report[0] for report in reports)
    ended = max(report[1] for report in reports)
    return float(sum(report[2] for report in reports) / (ended - began))


def raw_writer(table: str, seconds: float, locked: bool, results: Any, barrier: Any) -> None:
    """One raw writer: one-row INSERT + COMMIT (under the EXCLUSIVE lock if `locked`)."""
    import psycopg

    insert = (
        f"INSERT INTO {table} (originator_id, originator_version, topic, state) "
        "VALUES (%s, 1, 'raw', %s)"
    )
    state = b"x" * 300  # about a stagetrail event's size
    with psycopg.connect(POSTGRES) as conn:
        barrier.wait()  # all connected: the rate is of committing, not of starting
        count, began = 0, time.time()
        while time.time() - began < seconds:
            if locked:
                conn.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE", prepare=True)
            conn.execute(insert, (uuid.uuid4(), state), prepare=True)
            conn.commit()
            count += 1
        results.put((began, time.time(), count))


def note_appends(url: str, processes: int, seconds: float) -> float:
    """Appends/s of `processes` engines each adding notes to a run of its own for `seconds`.

    The store's append path alone (no supervision), beside `raw_commits`.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    barrier = context.Barrier(processes)
    workers = [
        context.Process(target=note_writer, args=(url, seconds, results, barrier))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=120 + seconds) for _ in workers]
    for worker in workers:
        worker.join()
    began = min(report[0] for report in reports)
    ended = max(report[1] for report in reports)
    return float(sum(report[2] for report in reports) / (ended - began))


def note_writer(url: str, seconds: float, results: Any, barrier: Any) -> None:
    """One engine appending one note per transaction to its own run."""
    from benchmarks._common import WORK

    with Engine(url) as engine:
        run = engine.start_run(WORK)
        barrier.wait()  # all opened: the rate is of appending, not of starting
        count, began = 0, time.time()
        while time.time() - began < seconds:
            run.note("n", count)
            count += 1
        results.put((began, time.time(), count))


def curve(backend: str, writers: tuple[int, ...], runs: int) -> list[dict[str, Any]]:
    """The rows of one backend, each with its speedup over the 1-writer row."""
    store = postgres_store if backend == "postgresql" else sqlite_store
    rows = []
    seconds = RAW_SECONDS if runs >= RUNS else 0.5
    for count in writers:
        with store() as url:
            row = {"case": f"{backend}, {count} writer(s)", **measure(url, count, runs)}
            if backend == "postgresql":
                row["raw_commits_per_s"] = raw_commits(url, count, seconds, locked=False)
                row["raw_locked_commits_per_s"] = raw_commits(url, count, seconds, locked=True)
                row["vs_raw"] = row["events_per_s"] / row["raw_commits_per_s"]
                row["note_appends_per_s"] = note_appends(url, count, seconds)
                row["appends_vs_raw"] = row["note_appends_per_s"] / row["raw_commits_per_s"]
            rows.append(row)
    for row in rows:
        row["speedup"] = row["events_per_s"] / rows[0]["events_per_s"]
    return rows


def main() -> None:
    """Measure both curves (SQLite only without PostgreSQL) and print them."""
    options = arguments(__doc__.splitlines()[0])
    writers, runs = ((1, 2), 10) if options.quick else (WRITERS, RUNS)
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = curve("sqlite", writers, runs)
    if postgres_reachable():
        rows += curve("postgresql", writers, runs)
    machine: dict[str, Any] = {
        "case": "machine",
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    report("scale-out: writer processes, events/s, follower lag", [*rows, machine], options.json)


if __name__ == "__main__":
    main()
