"""Online retention: compact 10 % of a store while 4 writer processes append.

A store (a SQLite file, and a PostgreSQL schema when the server answers) holds N
finished runs of the review pipeline (5 events each), one in ten cancelled.
Four writer processes append runs; their throughput is measured for a few
seconds alone, then while `engine.retain(status=cancelled, apply=True)` deletes
and compacts the cancelled tenth, then alone again. Reported: the fill's time,
the writers' runs/s alone (before and after) and during the compaction, the drop
(during against the mean of before and after: on a shared host the rate alone
drifts over a compaction's minutes), the compaction's time (wall clock and the
compacting process's CPU time), and whether every persistent projection then
equals a rebuild.

The fill appends copies of two recorded runs (one succeeded, one cancelled), each
copy a new run id and the current time, `FILL_RUNS` runs per transaction through
`Store.append` (each event serialised and linked as any append), then catches the
projections up: a transaction or two per run would spend the fill's hour in fsyncs.

Run: ``python -m benchmarks.retain`` (``--quick`` for a smoke run; ``--runs N``;
``--only sqlite`` or ``--only postgresql``).

``--latency`` measures instead how long appends wait for a compaction on
PostgreSQL: `LONG_RUNS` deleted runs of `LONG_EVENTS` events each are erased
while one writer process appends one event per transaction; reported are the
writer's slowest append alone and during the compaction.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import time
import uuid
from collections.abc import Iterator
from typing import Any

import attrs

from benchmarks._common import report, scratch
from benchmarks.scale import postgres_reachable, postgres_store
from engine import Engine, RetentionRule
from engine.cli.demo.code_review import REVIEW
from events import Event, utc_now

WRITERS = 4
LONG_RUNS = 20
LONG_EVENTS = 2000
FILL_RUNS = 200
"""Runs appended per transaction by the fill (1,000 events)."""


def record(engine: Engine, status: str) -> None:
    """One finished run of 5 events in one transaction."""
    run = engine.start_run(REVIEW, params={"card": "C"})
    with run.batch():
        run.stage_completed("project_analysis")
        run.stage_completed("code_review")
        run.stage_failed("developer", error="broke")
        run.finish(status)


def recorded_runs() -> dict[str, list[Event]]:
    """The events of one recorded run of each status the store holds."""
    with Engine("memory://") as engine:
        for status in ("cancelled", "succeeded"):
            record(engine, status)
        return {s.status: engine.events(s.run_id) for s in engine.runs(limit=2)}


def fill(url: str, runs: int) -> float:
    """`runs` runs, every tenth cancelled, with the projections caught up; the seconds."""
    began, models = time.perf_counter(), recorded_runs()
    with Engine(url) as engine:
        pending: list[Event] = []
        for index in range(runs):
            model = models["cancelled" if index % 10 == 0 else "succeeded"]
            run_id, now = uuid.uuid4(), utc_now()
            pending += (attrs.evolve(e, run_id=run_id, timestamp=now) for e in model)
            if (index + 1) % FILL_RUNS == 0 or index + 1 == runs:
                engine.store.append(pending)
                pending = []
        engine.projections.catch_up()
    return time.perf_counter() - began


def writer(url: str, stop: Any, count: Any) -> None:
    """Append succeeded runs until `stop`, counting them."""
    with Engine(url) as engine:
        while not stop.is_set():
            record(engine, "succeeded")
            with count.get_lock():
                count.value += 1


def rate(count: Any, seconds: float) -> float:
    """Runs/s the writers appended over the next `seconds`."""
    first: int = count.value
    began = time.perf_counter()
    time.sleep(seconds)
    appended: int = count.value - first
    return appended / (time.perf_counter() - began)


def measure(url: str, runs: int, window: float) -> dict[str, object]:
    """Writers' rate alone and during compaction, compaction time, projections vs a rebuild."""
    filled = fill(url, runs)
    context = multiprocessing.get_context("spawn")
    stop, count = context.Event(), context.Value("i", 0)
    procs = [context.Process(target=writer, args=(url, stop, count)) for _ in range(WRITERS)]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + 60
        while count.value < 2 * WRITERS and time.monotonic() < deadline:
            time.sleep(0.05)  # the writers start up (a spawned interpreter imports the engine)
        before = rate(count, window)
        with Engine(url) as compactor:
            first, began, cpu = count.value, time.perf_counter(), time.process_time()
            done = compactor.retain(RetentionRule(status={"cancelled"}), apply=True)
            took, cpu = time.perf_counter() - began, time.process_time() - cpu
            during = (count.value - first) / took
        alone_after = rate(count, window)
    finally:
        stop.set()
        for proc in procs:
            proc.join()
    with Engine(url) as check:
        check.projections.catch_up()
        after = {name: check.projections.states(name) for name in check.projections.names}
        for name in check.projections.names:
            check.projections.rebuild(name)
        rebuilt = {name: check.projections.states(name) for name in check.projections.names}
    assert done.compacted is not None
    return {
        "store": url.split(":", 1)[0],
        "runs": runs,
        "fill_s": round(filled, 1),
        "erased": len(done.runs),
        "writers": WRITERS,
        "alone_before_runs_per_s": round(before, 1),
        "alone_after_runs_per_s": round(alone_after, 1),
        "during_runs_per_s": round(during, 1),
        "drop": round(1 - 2 * during / (before + alone_after), 3) if before + alone_after else None,
        "compaction_s": round(took, 2),
        "compaction_cpu_s": round(cpu, 2),
        "rebuilt": list(done.compacted.rebuilt),
        "projections_equal_rebuild": after == rebuilt,
    }


def long_runs(url: str, runs: int, length: int) -> None:
    """`runs` runs of `length` events each, deleted, the projections caught up."""
    with Engine(url) as engine:
        for _ in range(runs):
            run = engine.start_run(REVIEW, params={"card": "C"})
            with run.batch():
                for index in range(length - 2):
                    run.note(f"n{index}", index)
            run.finish("deleted")
        engine.projections.catch_up()


def appender(url: str, stop: Any, phase: Any, slowest: Any) -> None:
    """Append one event per transaction until `stop`, keeping the slowest per `phase`."""
    with Engine(url) as engine:
        run = engine.start_run(REVIEW, params={"card": "W"})
        index = 0
        while not stop.is_set():
            began = time.perf_counter()
            run.note(f"w{index}", index)
            took, index = time.perf_counter() - began, index + 1
            with slowest.get_lock():
                slowest[phase.value] = max(slowest[phase.value], took)


def latency(url: str, runs: int, length: int, window: float) -> dict[str, object]:
    """The slowest append alone, then during the compaction of `runs` long deleted runs."""
    long_runs(url, runs, length)
    context = multiprocessing.get_context("spawn")
    stop, phase, slowest = context.Event(), context.Value("i", 0), context.Array("d", 3)
    proc = context.Process(target=appender, args=(url, stop, phase, slowest))
    proc.start()
    try:
        deadline = time.monotonic() + 60
        while slowest[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the writer starts up (a spawned interpreter imports the engine)
        time.sleep(1)
        with slowest.get_lock():
            slowest[0], phase.value = 0.0, 1  # phase 0 held the start-up; 1: alone
        time.sleep(window)
        with Engine(url) as compactor:
            phase.value = 2
            began = time.perf_counter()
            done = compactor.compact()
            took = time.perf_counter() - began
    finally:
        stop.set()
        proc.join()
    return {
        "store": url.split(":", 1)[0],
        "runs_erased": len(done.runs),
        "events_erased": done.events,
        "compaction_s": round(took, 2),
        "slowest_append_alone_ms": round(slowest[1] * 1000, 1),
        "slowest_append_during_ms": round(slowest[2] * 1000, 1),
    }


@contextlib.contextmanager
def sqlite_store() -> Iterator[str]:
    """A new SQLite store file."""
    yield f"sqlite:///{scratch('retain.db')}"


def parse() -> argparse.Namespace:
    """--quick, --json, --runs and --only."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--runs", type=int, default=100_000, help="runs in the store")
    parser.add_argument("--only", choices=["sqlite", "postgresql"], help="one store only")
    parser.add_argument(
        "--latency", action="store_true", help="appends' wait for a PostgreSQL compaction"
    )
    return parser.parse_args()


def main() -> None:
    """Measure and print online retention on each store."""
    args = parse()
    runs = 300 if args.quick else args.runs
    window = 0.5 if args.quick else 10.0
    if args.latency:
        with postgres_store() as url:
            rows = [latency(url, 2 if args.quick else LONG_RUNS, LONG_EVENTS, window)]
        report("appends during a PostgreSQL compaction (1 writer)", rows, args.json)
        return
    stores = {"sqlite": sqlite_store, "postgresql": postgres_store}
    if args.only is None and not postgres_reachable():
        del stores["postgresql"]
    rows = []
    for name, store in stores.items():
        if args.only in (None, name):
            with store() as url:
                rows.append(measure(url, runs, window))
    report("online retention (4 writer processes)", rows, args.json)


if __name__ == "__main__":
    main()
