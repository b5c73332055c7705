"""One long run on SQLite: recording, time travel, folds, `engine.load`, memory and file size.

For each size N, one run of N events of a one-stage loop (`work --completed--> work`,
1 outcome in 7 failed), recorded in transactions of 1,000 events, beside a raw
sqlite3 table holding the same events' fields (run id, version, type, time,
payload JSON), written in the same transactions. Each step runs in a process of
its own, so its peak RSS is its own:

* record: the run recorded (seconds, peak RSS);
* first read, a fresh process right after recording (only the snapshots the
  writer kept are there): `StateStack` at N/2, at N-5 in the same process, the
  same again, a full fold of `RetryCounts` (events/s), `engine.load`, peak RSS;
* second read, another fresh process (the snapshots the first reader stored are
  there): `StateStack` at N/3 and at N-7, `engine.load`, peak RSS;
* first command, another fresh process: `Engine.for_reading` (what every read
  command and the viewer open with: the run index caught up) and the 50 newest
  runs listed (ms), peak RSS;
* raw: the same events into raw sqlite3 (seconds), reading and decoding the
  first N/2 (ms) and all N (events/s) payloads;
* file: bytes per event of the store (database and WAL) and of the raw table;
* full folds: each built-in projection folded over the whole run
  (``Projection.fold(engine.store.stream(run))``), each in a fresh process, and
  the stream read without a fold: events/s (wall clock and CPU), the process's
  peak RSS and what the fold added to the RSS of the opened engine.

Run: ``python -m benchmarks.long_runs`` (10k, 100k and 1M events: several minutes,
~1 GB of scratch files); ``--sizes 10000,100000`` to choose; ``--quick`` for a smoke run;
``--folds-of FILE`` for the full folds only, over the run of a store this benchmark
recorded (its ``run_id`` file beside it).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import RESULT, WORK, report, scratch
from projections import BUILT_INS

BATCH = 1000
"""Events per transaction, for stagetrail and raw sqlite3 alike."""
FAILED_EVERY = 7
"""One outcome in this many is a failure."""
ERROR = ("BuildError", "cc1: fatal error: foo.h: No such file or directory")
SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_500, 3_000)
RAW_SCHEMA = (
    "CREATE TABLE events (run_id TEXT NOT NULL, version INTEGER NOT NULL, topic TEXT NOT NULL,"
    " at TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, version))"
)
"""What a team writes for an audit log: the same fields, the payload as JSON text."""

TARGETS = {
    "state_fresh_ms": 100.0,
    "state_again_ms": 5.0,
    "load_ms": 200.0,
    "fold_per_s": 300_000.0,
    "rss_record_mb": 200.0,
    "rss_read_mb": 300.0,
    "bytes_vs_raw": 1.5,
}
"""The issue's targets for a 1,000,000-event run."""
READ_ONLY = "(stream only)"
"""The full-fold row of the stream read and decoded, folded into nothing."""
FOLDED = tuple(cls.__name__ for cls in BUILT_INS)
"""Every built-in projection (`projections.BUILT_INS`), by name."""


def main() -> None:
    """Measure each size in fresh processes and print one row per size."""
    args = _arguments()
    if args.child:
        print(json.dumps(CHILDREN[args.child](Path(args.path), args.events, args.projection)))
        return
    if args.folds_of:
        rows = _folds(Path(args.folds_of), _events_of(Path(args.folds_of)))
        report("Full folds of one long run on SQLite (each a fresh process)", rows, args.json)
        return
    sizes = QUICK_SIZES if args.quick else tuple(int(s) for s in args.sizes.split(","))
    paths = {size: scratch("long.db") for size in sizes}
    rows = [_measure(size, path) for size, path in paths.items()]
    if len(rows) >= 2:
        rows.append(_scaling(rows))
    for size, path in paths.items():  # after `_measure`'s readers, not to help them
        rows += _folds(path, size)
    report("One long run on SQLite (each step a fresh process); full folds", rows, args.json)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--child", choices=sorted(CHILDREN_NAMES), help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--folds-of", metavar="FILE", help="only the full folds, of this store")
    parser.add_argument("--events", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--projection", default=READ_ONLY, help=argparse.SUPPRESS)
    return parser.parse_args()


def _measure(size: int, path: Path) -> dict[str, object]:
    print(f"  {size:,} events: recording", file=sys.stderr, flush=True)
    recorded = _child("record", path, size)
    raw = _child("raw", path.with_name("raw.db"), size)
    print(f"  {size:,} events: reading", file=sys.stderr, flush=True)
    first = _child("read", path, size)
    second = _child("reread", path, size)
    command = _child("command", path, size)
    ours_bytes = _file_bytes(path)
    raw_bytes = _file_bytes(path.with_name("raw.db"))
    return {
        "events": size,
        "record_s": recorded["seconds"],
        "raw_record_s": raw["seconds"],
        "rss_record_mb": recorded["rss_mb"],
        "state_half_first_ms": first["half_ms"],
        "state_end_ms": first["end_ms"],
        "state_again_ms": first["again_ms"],
        "fold_per_s": first["fold_per_s"],
        "load_ms": first["load_ms"],
        "rss_read_mb": first["rss_mb"],
        "state_third_fresh_ms": second["third_ms"],
        "state_end_fresh_ms": second["end_ms"],
        "load_fresh_ms": second["load_ms"],
        "rss_reread_mb": second["rss_mb"],
        "first_command_ms": command["ms"],
        "rss_command_mb": command["rss_mb"],
        "raw_half_ms": raw["half_ms"],
        "raw_decode_per_s": raw["decode_per_s"],
        "bytes_per_event": ours_bytes / size,
        "raw_bytes_per_event": raw_bytes / size,
        "bytes_vs_raw": ours_bytes / raw_bytes,
    }


def _scaling(rows: list[dict[str, Any]]) -> dict[str, object]:
    """How the biggest run's reads compare with the one 10x smaller (cold time travel)."""
    big = rows[-1]
    small = rows[-2]
    return {
        "events": f"{big['events']:,} vs {small['events']:,}",
        "state_half_first_ratio": big["state_half_first_ms"] / small["state_half_first_ms"],
        "state_third_fresh_ratio": big["state_third_fresh_ms"] / small["state_third_fresh_ms"],
        "load_fresh_ratio": big["load_fresh_ms"] / small["load_fresh_ms"],
        "first_command_ratio": big["first_command_ms"] / small["first_command_ms"],
        "target": "cold time travel <= 3x the smaller run's",
    }


def _folds(path: Path, events: int) -> list[dict[str, object]]:
    """The full fold of every built-in projection over the run, each in a fresh process."""
    print(f"  {events:,} events: full folds", file=sys.stderr, flush=True)
    rows: list[dict[str, object]] = []
    for projection in (READ_ONLY, *FOLDED):
        folded = _child("fold", path, events, projection)
        rows.append({
            "events": events,
            "full_fold": projection,
            "per_s": folded["per_s"],
            "cpu_per_s": folded["cpu_per_s"],
            "rss_mb": folded["rss_mb"],
            "rss_added_mb": folded["rss_mb"] - folded["rss_opened_mb"],
            "target_per_s": TARGETS["fold_per_s"],
            "met": folded["per_s"] >= TARGETS["fold_per_s"],
        })  # fmt: skip
    return rows


def _events_of(path: Path) -> int:
    """How many events the run recorded in `path` holds."""
    from engine import Engine

    marker = path.with_name("run_id")
    try:
        run_id = uuid.UUID(marker.read_text().strip())
    except (OSError, ValueError) as error:
        problem = f"{marker}: the id of the run recorded in {path} is needed ({error})"
        raise SystemExit(problem) from None
    with Engine(f"sqlite:///{path}", create=False, read_only=True) as engine:
        last = engine.store.last(run_id)
    if last is None:
        raise SystemExit(f"{path}: no run {run_id} recorded in it")
    return last.version


def _child(name: str, path: Path, events: int, projection: str = READ_ONLY) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.long_runs", "--child", name, "--path", str(path),
               "--events", str(events), "--projection", projection]  # fmt: skip
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _file_bytes(path: Path) -> int:
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if os.path.exists(p))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _ms(work: Callable[[], object]) -> float:
    began = time.perf_counter()
    work()
    return (time.perf_counter() - began) * 1000


def _record(path: Path, events: int, _projection: str = READ_ONLY) -> dict[str, Any]:
    """Record one run of `events` events in transactions of `BATCH`."""
    from engine import Engine

    began = time.perf_counter()
    with Engine(f"sqlite:///{path}") as engine:
        run = engine.start_run(WORK)
        outcomes = events - 1
        for start in range(0, outcomes, BATCH):
            with run.batch():
                for index in range(start, min(outcomes, start + BATCH)):
                    if index % FAILED_EVERY == FAILED_EVERY - 1:
                        run.stage_failed("work", ERROR[1], error_type=ERROR[0], duration=2.5)
                    else:
                        run.stage_completed("work", RESULT, duration=1.0)
    seconds = time.perf_counter() - began
    path.with_name("run_id").write_text(str(run.id))
    return {"seconds": seconds, "rss_mb": _rss_mb()}


def _read(path: Path, events: int, _projection: str = READ_ONLY) -> dict[str, Any]:
    """The first reader of the run, in a fresh process."""
    from engine import Engine
    from projections import RetryCounts, StateStack

    run_id = path.with_name("run_id").read_text()
    with Engine(f"sqlite:///{path}", create=False) as engine:
        half = _ms(lambda: engine.project(run_id, StateStack, at=events // 2))
        end = _ms(lambda: engine.project(run_id, StateStack, at=events - 5))
        again = _ms(lambda: engine.project(run_id, StateStack, at=events - 5))
        began = time.perf_counter()
        RetryCounts().fold(engine.store.stream(uuid.UUID(run_id)))
        fold = events / (time.perf_counter() - began)
        load = _ms(lambda: engine.load(run_id))
    return {"half_ms": half, "end_ms": end, "again_ms": again, "fold_per_s": fold,
            "load_ms": load, "rss_mb": _rss_mb()}  # fmt: skip


def _reread(path: Path, events: int, _projection: str = READ_ONLY) -> dict[str, Any]:
    """Another fresh process, once the first reader has been."""
    from engine import Engine
    from projections import StateStack

    run_id = path.with_name("run_id").read_text()
    with Engine(f"sqlite:///{path}", create=False) as engine:
        third = _ms(lambda: engine.project(run_id, StateStack, at=events // 3))
        end = _ms(lambda: engine.project(run_id, StateStack, at=events - 7))
        load = _ms(lambda: engine.load(run_id))
    return {"third_ms": third, "end_ms": end, "load_ms": load, "rss_mb": _rss_mb()}


def _command(path: Path, _events: int, _projection: str = READ_ONLY) -> dict[str, Any]:
    """A read command's start on a store it has not seen: the run index caught up (over a
    long run, from its writer's summaries), then the newest runs listed."""
    from engine import Engine

    began = time.perf_counter()
    with Engine.for_reading(f"sqlite:///{path}") as engine:
        engine.runs(limit=50)
        ms = (time.perf_counter() - began) * 1000
    return {"ms": ms, "rss_mb": _rss_mb()}


def _fold(path: Path, events: int, projection: str) -> dict[str, Any]:
    """A full fold of `projection` (or the stream alone) over the run, in a fresh process."""
    import projections
    from engine import Engine

    run_id = uuid.UUID(path.with_name("run_id").read_text())
    with Engine(f"sqlite:///{path}", create=False) as engine:
        opened = _rss_mb()
        stream = engine.store.stream(run_id)
        wall, cpu = time.perf_counter(), time.process_time()
        state: object = None  # kept, as a caller keeps what it folded, while the collector settles
        if projection == READ_ONLY:
            folded = sum(1 for _ in stream)
        else:
            state = getattr(projections, projection)().fold(stream)
            folded = events
        _settled()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        del state
    assert folded == events, f"{folded} events read, {events} recorded"
    return {"per_s": events / wall, "cpu_per_s": events / cpu, "rss_mb": _rss_mb(),
            "rss_opened_mb": opened}  # fmt: skip


def _settled() -> None:
    """Run the collection a long fold leaves due, so that the fold's time counts it.

    A long fold's ticks move the state it builds into the middle generation
    (`collector_paused`), and the first automatic collection after it scans all of it:
    inside the fold when its events are not a multiple of `COLLECT_EVERY` (its last tick
    did not empty the young generation), just after it otherwise, where a caller still
    holds the state. Allocating until that collection has run (no `gc.collect`, which
    would choose the generation itself) counts it in both cases, so two folds of
    different lengths compare the same work.
    """
    done = _collections()
    kept: list[list[int]] = []
    while gc.isenabled() and _collections() == done:
        kept.append([])


def _collections() -> int:
    """Collections the cyclic collector has run in this process, all generations."""
    return sum(generation["collections"] for generation in gc.get_stats())


def _raw(path: Path, events: int, _projection: str = READ_ONLY) -> dict[str, Any]:
    """The same events' fields into one raw sqlite3 table, then read back and decoded."""
    from datetime import UTC, datetime

    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute(RAW_SCHEMA)
    run_id = uuid.uuid4().hex
    began = time.perf_counter()
    for start in range(1, events + 1, BATCH):
        rows = [_raw_row(run_id, version, datetime.now(UTC))
                for version in range(start, min(events, start + BATCH - 1) + 1)]  # fmt: skip
        connection.execute("BEGIN")
        connection.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?)", rows)
        connection.execute("COMMIT")
    seconds = time.perf_counter() - began
    query = (
        "SELECT version, topic, at, data FROM events WHERE run_id=? AND version<=? ORDER BY version"
    )
    half = _ms(lambda: [json.loads(r[3]) for r in connection.execute(query, (run_id, events // 2))])
    began = time.perf_counter()
    for row in connection.execute(query, (run_id, events)):
        json.loads(row[3])
    decode = events / (time.perf_counter() - began)
    connection.close()
    return {"seconds": seconds, "half_ms": half, "decode_per_s": decode}


def _raw_row(run_id: str, version: int, at: Any) -> tuple[object, ...]:
    if version == 1:
        return (run_id, 1, "RunStarted", at.isoformat(), json.dumps(WORK.to_dict()))
    index = version - 2
    if index % FAILED_EVERY == FAILED_EVERY - 1:
        data = {"stage": "work", "attempt": 1, "outcome": "failed", "error": ERROR[1],
                "error_type": ERROR[0], "retryable": True, "duration": 2.5}  # fmt: skip
        return (run_id, version, "StageFailed", at.isoformat(), json.dumps(data))
    data = {"stage": "work", "attempt": 1, "outcome": "completed", "result": RESULT,
            "duration": 1.0}  # fmt: skip
    return (run_id, version, "StageCompleted", at.isoformat(), json.dumps(data))


CHILDREN: dict[str, Callable[[Path, int, str], dict[str, Any]]] = {
    "record": _record,
    "fold": _fold,
    "read": _read,
    "reread": _reread,
    "command": _command,
    "raw": _raw,
}
CHILDREN_NAMES = tuple(CHILDREN)


if __name__ == "__main__":
    main()
