"""Where a supervised run's time goes: the fsync floor, SQLite's commits, the CPU (issue 14).

For the review workload of `benchmarks.compare`, driven by `Supervisor.drive`
into a SQLite file, it measures on this machine:

- ``fdatasync``: one ``pwrite`` + ``fdatasync`` of an already written region (as
  a recycled WAL is written), median, at several sizes: the disk's price of a
  durable commit, whatever SQLite does;
- the commits a run makes (the store's writes, counted) and their floor,
  commits times ``fdatasync``;
- a run as shipped (WAL, ``synchronous=FULL``), and the same run with the
  writing connection at ``synchronous=OFF``: **for this measurement only**, to
  see the CPU a run costs without its fsyncs (stagetrail never turns it off);
- the CPU the shipped run uses (process time, the kernel's work in each
  ``fdatasync`` included), against the CPU of the run without its fsyncs;
- the shipped run's own commits (the same batches, the same bytes) replayed
  through a bare ``sqlite3`` connection with SQLite's defaults (as stagetrail's
  own connection has them): its commits with no stagetrail code between them,
  the floor a run cannot beat;
- LangGraph's loop variant per run, when LangGraph is installed, what four
  times faster would mean, and the ratio if stagetrail cost only its replayed
  commits.

Run: ``python -m benchmarks.floor`` (``--quick`` for a smoke run), ~30 s.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import statistics
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from benchmarks._common import CountedWrites, arguments, report, scratch
from benchmarks.peers.stagetrail_runs import Stagetrail

SIZES = (512, 4096, 32768)


def fdatasync_us(size: int, count: int) -> float:
    """Median µs of writing `size` bytes over old data and syncing them."""
    path = scratch("sync.bin")
    region = 64 * 32768
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"\0" * region)
        os.fsync(fd)
        data, took = b"y" * size, []
        for n in range(count):
            began = time.perf_counter()
            os.pwrite(fd, data, (n * 32768) % region)
            os.fdatasync(fd)
            took.append(time.perf_counter() - began)
    finally:
        os.close(fd)
    return statistics.median(took) * 1e6


class Supervised:
    """A supervised run's time per run as shipped (or with its fsyncs off), its CPU, its commits.

    `batches` holds every write's stored events, the first `warm_commits` before the timing;
    `schema` and `table` are the recorder's own events table (its ``CREATE`` statements, its name).
    """

    def __init__(self, runs: int, *, fsync: bool) -> None:
        system = Stagetrail(scratch("floor.db"), "Supervisor.drive")
        recorder: Any = system.engine.store.recorder  # the SQLite recorder: a writer, a table
        self.schema: list[str] = list(recorder.create_table_statements)
        self.table: str = recorder.events_table_name
        topic_ids = getattr(recorder, "topic_ids", None)  # a compact store's (issue 26)
        self.row = functools.partial(_row, recorder.run_key, topic_ids)
        try:
            if not fsync:
                writer = recorder.writer
                writer.acquire().cursor().execute("PRAGMA synchronous=OFF")  # measurement only
                writer.release()
            with CountedWrites(system.engine.store) as writes:
                system.record(max(50, runs // 4))  # past the WAL's growth
                self.warm_commits = writes.commits
                began, cpu = time.perf_counter(), time.process_time()
                system.record(runs)
                took, used = time.perf_counter() - began, time.process_time() - cpu
        finally:
            system.close()
        self.ms, self.cpu_ms = took / runs * 1e3, used / runs * 1e3
        self.commits = (writes.commits - self.warm_commits) / runs
        self.batches, self.runs = writes.batches, runs


def replayed_ms(shipped: Supervised) -> float:
    """Ms per run of `shipped`'s batches written again by bare sqlite3 (WAL, its default sync).

    Each batch is one multi-row ``INSERT``, its own transaction, into the recorder's
    own events table, as stagetrail writes it; the warm-up's batches are not timed.
    """
    table, warm = shipped.table, shipped.warm_commits
    statements = [
        (_insert(table, len(batch)), [v for e in batch for v in shipped.row(e)])
        for batch in shipped.batches
    ]
    connection = sqlite3.connect(scratch("replay.db"), isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        for create in shipped.schema:
            connection.execute(create)
        for sql, params in statements[:warm]:
            connection.execute(sql, params)
        began = time.perf_counter()
        for sql, params in statements[warm:]:
            connection.execute(sql, params)
        return (time.perf_counter() - began) / shipped.runs * 1e3
    finally:
        connection.close()


def _row(
    key: Callable[[UUID], object], topic_ids: dict[str, int] | None, event: StoredEvent
) -> tuple[object, ...]:
    """The row the recorder writes for `event`: its run key, version, topic (or topic id)."""
    run_id = event.originator_id
    topic = event.topic if topic_ids is None else topic_ids[event.topic]
    return (key(run_id if isinstance(run_id, UUID) else UUID(run_id)), event.originator_version,
            topic, event.state)  # fmt: skip


def _insert(table: str, rows: int) -> str:
    return f"INSERT INTO {table} VALUES " + ",".join(["(?,?,?,?)"] * rows)


def langgraph_loop_ms(runs: int) -> float | None:
    """Ms per run of LangGraph's loop variant, or None when LangGraph is not installed."""
    try:
        from benchmarks.peers.langgraph_saver import LangGraphSaver
    except ImportError:
        return None
    system = LangGraphSaver(scratch("lg.db"), "loop")
    try:
        system.record(max(10, runs // 10))
        began = time.perf_counter()
        system.record(runs)
        return (time.perf_counter() - began) / runs * 1e3
    finally:
        system.close()


def main() -> None:
    args = arguments(__doc__ or "")
    syncs, runs = (50, 40) if args.quick else (1500, 600)
    rows: list[dict[str, object]] = [
        {"case": f"fdatasync of {size:,} B over written data (µs)",
         "median": round(fdatasync_us(size, syncs), 1)}
        for size in SIZES
    ]  # fmt: skip
    floor_us = rows[1]["median"]
    shipped, cpu = Supervised(runs, fsync=True), Supervised(runs, fsync=False)
    replayed = replayed_ms(shipped)
    floor = shipped.commits * float(floor_us) / 1e3  # type: ignore[arg-type]
    rows.append({
        "case": "a supervised review run (ms)", "shipped": round(shipped.ms, 3),
        "without_fsync": round(cpu.ms, 3), "cpu_shipped": round(shipped.cpu_ms, 3),
        "commits": round(shipped.commits, 2), "fsync_floor": round(floor, 3),
        "commits_replayed": round(replayed, 3),
        "commits_share": round((shipped.ms - cpu.ms) / shipped.ms, 2),
    })  # fmt: skip
    other = None if args.quick else langgraph_loop_ms(max(100, runs // 3))
    if other is not None:
        rows.append({
            "case": "LangGraph-loop run (ms)", "per_run": round(other, 3),
            "ratio_now": round(other / shipped.ms, 2), "four_times_needs": round(other / 4, 3),
            "ceiling_at_zero_cpu": round(other / replayed, 2),
        })  # fmt: skip
    title = "where a supervised run's time goes (SQLite file, WAL, synchronous=FULL)"
    report(title, rows, args.json)


if __name__ == "__main__":
    main()
