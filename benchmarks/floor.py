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
- LangGraph's loop variant per run, when LangGraph is installed, and what four
  times faster would mean.

Run: ``python -m benchmarks.floor`` (``--quick`` for a smoke run), ~30 s.
"""

from __future__ import annotations

import os
import statistics
import time

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


def supervised_ms(runs: int, *, fsync: bool) -> tuple[float, float]:
    """Ms per supervised run in a warmed store (as shipped, or with its fsyncs off), commits/run."""
    system = Stagetrail(scratch("floor.db"), "Supervisor.drive")
    try:
        if not fsync:
            writer = system.engine.store.recorder.writer  # type: ignore[attr-defined]
            writer.acquire().cursor().execute("PRAGMA synchronous=OFF")  # measurement only
            writer.release()
        system.record(max(50, runs // 4))  # past the WAL's growth
        with CountedWrites(system.engine.store) as writes:
            began = time.perf_counter()
            system.record(runs)
            took = time.perf_counter() - began
        return took / runs * 1e3, writes.commits / runs
    finally:
        system.close()


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
    shipped, commits = supervised_ms(runs, fsync=True)
    cpu, _ = supervised_ms(runs, fsync=False)
    floor = commits * float(floor_us) / 1e3  # type: ignore[arg-type]
    rows.append({
        "case": "a supervised review run (ms)", "shipped": round(shipped, 3),
        "without_fsync": round(cpu, 3), "commits": round(commits, 2),
        "fsync_floor": round(floor, 3), "commits_share": round((shipped - cpu) / shipped, 2),
    })  # fmt: skip
    other = None if args.quick else langgraph_loop_ms(max(100, runs // 3))
    if other is not None:
        rows.append({
            "case": "LangGraph-loop run (ms)", "per_run": round(other, 3),
            "ratio_now": round(other / shipped, 2), "four_times_needs": round(other / 4, 3),
            "ceiling_at_zero_cpu": round(other / floor, 2),
        })  # fmt: skip
    title = "where a supervised run's time goes (SQLite file, WAL, synchronous=FULL)"
    report(title, rows, args.json)


if __name__ == "__main__":
    main()
