"""Projection speed: on-demand folds, time travel, persistent rebuilds, the run index.

Run: ``python -m benchmarks.projections`` (``--quick`` for a smoke run, ``--json``
for machine output). Every figure is measured on a SQLite file, printed beside a
baseline measured in the same process, with its target and whether it is met:

1. folding one run into `StateStack` vs reading and decoding the same events
   through eventsourcing's `EventStore` (our mapper);
2. time travel (`engine.project(..., at=v)`) to random points of a long run, warm
   (same engine) and cold (a fresh `Engine` per query: only stored snapshots help),
   beside folding from the first event;
3. rebuilding the persistent `RunIndex` and `FailurePatterns` in one pass vs a raw
   ``sqlite3`` scan that only ``json.loads`` every event;
4. ``engine.runs(limit=100)`` vs answering the same question by folding every run.

Progress of the long phases goes to stderr.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import NamedTuple
from uuid import UUID

from benchmarks._common import WORK, arguments, report, scratch, timed
from benchmarks._runs import (
    PIPELINES,
    TEAMS,
    Progress,
    index_step,
    outcome_step,
    record,
    travel_step,
)
from engine import Engine
from engine.store.meta import EVENTS_TABLE
from engine.store.sql import NAMES
from projections import FailurePatterns, RetryCounts, RunIndex, RunSummary, StateStack


class Sizes(NamedTuple):
    """How big each measurement is (full size, or --quick)."""

    fold_events: int
    fold_rounds: int
    travel_events: int
    warm_queries: int
    cold_queries: int
    runs: int
    events_per_run: int
    rebuild_rounds: int
    runs_calls: int


FULL = Sizes(20_000, 5, 100_000, 200, 30, 10_000, 100, 2, 50)
QUICK = Sizes(2_000, 3, 10_000, 200, 30, 500, 40, 1, 50)


def forget_snapshots(path: Path) -> None:
    """Delete every stored snapshot (the engines on `path` must be closed)."""
    with sqlite3.connect(path) as conn:
        conn.execute(f"DELETE FROM {NAMES['snapshots']}")
    conn.close()


def snapshot_megabytes(path: Path) -> float:
    """The size of the stored snapshots' states, in MB."""
    conn = sqlite3.connect(path)
    query = f"SELECT COALESCE(SUM(LENGTH(state)), 0) FROM {NAMES['snapshots']}"
    (size,) = conn.execute(query).fetchone()
    conn.close()
    return float(size) / 1e6


def milliseconds(seconds: list[float]) -> float:
    """The median of `seconds`, in milliseconds."""
    return statistics.median(seconds) * 1000


def fold_case(sizes: Sizes) -> dict[str, object]:
    """Figure 1: `StateStack().fold` over one run vs reading and decoding its events."""
    count = sizes.fold_events
    path = scratch("fold.db")
    url = f"sqlite:///{path}"
    with Engine(url) as engine:
        run = engine.start_run(WORK)
        record(run, count - 1, outcome_step)
        run_id, depth = run.id, run.machine.depth
    rates: dict[str, list[float]] = {"read": [], "fold": [], "project": []}
    with Engine(url) as engine:

        def read() -> int:
            return len(list(engine.store.stream(run_id)))

        def fold() -> int:
            stack = StateStack().fold(engine.store.stream(run_id))
            assert stack.depth == depth
            return count

        for _ in range(sizes.fold_rounds):
            for name, work in (("read", read), ("fold", fold)):
                done, seconds = timed(work)
                rates[name].append(done / seconds)
            rates["project"].append(count / fresh_project(path, run_id, depth))
    shutil.rmtree(path.parent)
    read_rate, fold_rate = (statistics.median(rates[name]) for name in ("read", "fold"))
    project_rate = statistics.median(rates["project"])
    return {
        "case": f"on-demand fold of one {count:,}-event run (events/s)",
        "fold": fold_rate,
        "read_decode": read_rate,
        "ratio": fold_rate / read_rate,
        "target": 0.8,
        "met": fold_rate / read_rate >= 0.8,
        "engine_project_fresh": project_rate,
        "project_ratio": project_rate / read_rate,
        "depth": depth,
    }


def fresh_project(path: Path, run_id: UUID, depth: int) -> float:
    """Seconds `engine.project(run_id, StateStack)` takes on a fresh engine, no snapshots."""
    forget_snapshots(path)
    with Engine(f"sqlite:///{path}") as engine:
        start = time.perf_counter()
        stack = engine.project(run_id, StateStack)
        seconds = time.perf_counter() - start
    assert stack.depth == depth
    return seconds


def travel(engine: Engine, run_id: UUID, version: int) -> float:
    """Seconds `engine.project` takes to answer `StateStack` after event `version`."""
    start = time.perf_counter()
    stack = engine.project(run_id, StateStack, at=version)
    seconds = time.perf_counter() - start
    assert stack.top is None or stack.top.version <= version
    return seconds


def fold_from_zero(engine: Engine, run_id: UUID, version: int) -> float:
    """Seconds folding events 1..`version` into `StateStack` takes, without snapshots."""
    start = time.perf_counter()
    StateStack().fold(engine.store.stream(run_id, lte=version))
    return time.perf_counter() - start


def travel_case(sizes: Sizes) -> list[dict[str, object]]:
    """Figure 2: time travel to random points of a long run, warm and cold."""
    count = sizes.travel_events
    path = scratch("travel.db")
    url = f"sqlite:///{path}"
    chooser = random.Random(7)
    with Engine(url) as engine:
        run = engine.start_run(WORK)
        record(run, count - 1, travel_step)
        run_id, depth = run.id, run.machine.depth
        print(f"  time travel: run of {count:,} events written", file=sys.stderr, flush=True)
        _, first = timed(lambda: engine.project(run_id, StateStack).depth)
        engine.project(run_id, RetryCounts)  # its snapshots, for the cold small-state queries
        print(f"  time travel: first query took {first:.1f} s", file=sys.stderr, flush=True)
        warm = []
        for _ in range(sizes.warm_queries):
            warm.append(travel(engine, run_id, chooser.randint(1, count)))
        from_zero = []
        for _ in range(3):
            from_zero.append(fold_from_zero(engine, run_id, chooser.randint(1, count)))
    cold, cold_small = [], []
    for _ in range(sizes.cold_queries):
        version = chooser.randint(1, count)
        with Engine(url) as fresh:  # opening it is not timed: only the query is
            cold.append(travel(fresh, run_id, version))
        with Engine(url) as fresh:
            cold_small.append(timed(partial(_retries, fresh, run_id, version))[1])
    stored = snapshot_megabytes(path)
    shutil.rmtree(path.parent)
    shape = f"{count:,}-event run, depth {depth:,} at the end"
    return [
        {
            "case": f"time travel, warm: {sizes.warm_queries} random points of a {shape} (ms)",
            "median": milliseconds(warm),
            "p90": statistics.quantiles(warm, n=10)[-1] * 1000,
            "target": 20,
            "met": milliseconds(warm) <= 20,
            "fold_from_zero": milliseconds(from_zero),
            "first_query_at_head": first * 1000,
        },
        {
            "case": f"time travel, cold: {sizes.cold_queries} queries, a fresh Engine each (ms)",
            "median": milliseconds(cold),
            "p90": statistics.quantiles(cold, n=10)[-1] * 1000,
            "target": 20,
            "met": milliseconds(cold) <= 20,
            "fold_from_zero": milliseconds(from_zero),
            "stored_snapshots_mb": stored,
            "depth": depth,
        },
        {
            "case": f"time travel, cold, RetryCounts (a small state): {sizes.cold_queries} "
            "queries, a fresh Engine each (ms)",
            "median": milliseconds(cold_small),
            "p90": statistics.quantiles(cold_small, n=10)[-1] * 1000,
            "target": 20,
            "met": milliseconds(cold_small) <= 20,
        },
    ]


def _retries(engine: Engine, run_id: UUID, version: int) -> int:
    """Answer `RetryCounts` after event `version` (the first query of this engine)."""
    counts = engine.project(run_id, RetryCounts, at=version)
    return int(counts.total_attempts)


def write_runs(path: Path, sizes: Sizes) -> list[UUID]:
    """Fill `path` with `sizes.runs` runs of `sizes.events_per_run` events; return their ids."""
    progress = Progress("write runs", sizes.runs)
    run_ids = []
    with Engine(f"sqlite:///{path}") as engine:
        for number in range(sizes.runs):
            run = engine.start_run(
                PIPELINES[number % len(PIPELINES)],
                params={"card": f"C-{number}"},
                labels={"team": TEAMS[number % len(TEAMS)], "env": "ci"},
            )
            count = sizes.events_per_run - 1
            record(run, count, index_step(number, count))
            run_ids.append(run.id)
            progress(number + 1)
    return run_ids


def raw_scan(path: Path) -> int:
    """Read every event's state with raw sqlite3 and ``json.loads`` it; return the count."""
    conn = sqlite3.connect(path)
    count = 0
    for (state,) in conn.execute(f"SELECT state FROM {EVENTS_TABLE} ORDER BY rowid"):
        json.loads(state)
        count += 1
    conn.close()
    return count


def rebuild(path: Path, total: int) -> int:
    """Rebuild `RunIndex` and `FailurePatterns` from zero in one pass (a fresh engine)."""
    names = [RunIndex.name, FailurePatterns.name]
    with Engine(f"sqlite:///{path}") as engine:
        projections = engine.projections
        for name in names:
            projections.views.reset(name, projections.projection(name).identity())
        folded = projections.catch_up(names, on_progress=Progress("rebuild", total).projection)
    assert folded == dict.fromkeys(names, total), folded
    return total


def rebuild_case(path: Path, sizes: Sizes) -> dict[str, object]:
    """Figure 3: the one-pass rebuild of both persistent projections vs a raw scan."""
    total = sizes.runs * sizes.events_per_run
    rates: dict[str, list[float]] = {"raw": [], "rebuild": []}
    seconds = []
    for _ in range(sizes.rebuild_rounds):
        count, took = timed(lambda: raw_scan(path))
        assert count == total, count
        rates["raw"].append(count / took)
        count, took = timed(lambda: rebuild(path, total))
        rates["rebuild"].append(count / took)
        seconds.append(took)
    raw, ours = statistics.median(rates["raw"]), statistics.median(rates["rebuild"])
    return {
        "case": (
            f"rebuild run_index + failure_patterns, {sizes.runs:,} runs x "
            f"{sizes.events_per_run} = {total:,} events (events/s)"
        ),
        "rebuild": ours,
        "raw_sqlite3_json": raw,
        "ratio": ours / raw,
        "target": 0.3,
        "met": ours / raw >= 0.3,
        "rebuild_seconds": statistics.median(seconds),
    }


def scan_newest(engine: Engine, run_ids: list[UUID], limit: int) -> list[UUID]:
    """The `limit` newest runs, found by folding every run's events into `RunIndex`."""
    index = RunIndex()
    summaries: list[RunSummary] = []
    for run_id in run_ids:
        summary = index.fold(engine.events(run_id))
        assert summary is not None
        summaries.append(summary)
    summaries.sort(key=lambda s: (s.started, str(s.run_id)), reverse=True)
    return [summary.run_id for summary in summaries[:limit]]


def runs_case(path: Path, run_ids: list[UUID], sizes: Sizes) -> dict[str, object]:
    """Figure 4: ``engine.runs(limit=100)`` (index caught up each call) vs scanning events."""
    with Engine(f"sqlite:///{path}") as engine:
        engine.runs(limit=100)
        calls = [timed(lambda: len(engine.runs(limit=100)))[1] for _ in range(sizes.runs_calls)]
        newest = [summary.run_id for summary in engine.runs(limit=100)]
        print("  runs: scanning every run's events", file=sys.stderr, flush=True)
        start = time.perf_counter()
        scanned = scan_newest(engine, run_ids, 100)
        scan_seconds = time.perf_counter() - start
    return {
        "case": f"engine.runs(limit=100) over {sizes.runs:,} runs (ms)",
        "median": milliseconds(calls),
        "target": 50,
        "met": milliseconds(calls) <= 50,
        "event_scan": scan_seconds * 1000,
        "same_answer": scanned == newest,
    }


def main() -> None:
    """Measure and print the projection figures with their baselines and targets."""
    args = arguments(__doc__ or "")
    sizes = QUICK if args.quick else FULL
    began = time.perf_counter()
    rows = [fold_case(sizes), *travel_case(sizes)]
    path = scratch("runs.db")
    run_ids = write_runs(path, sizes)
    rows.append(rebuild_case(path, sizes))
    rows.append(runs_case(path, run_ids, sizes))
    shutil.rmtree(path.parent)
    report("projections (SQLite file)", rows, args.json)
    sys.stdout.flush()
    print(f"  total: {time.perf_counter() - began:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
