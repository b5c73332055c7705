"""Online retention: compact 10 % of a store while 4 writer processes append.

A SQLite file holds N finished runs of the review pipeline (5 events each), one
in ten cancelled. Four writer processes append runs; their throughput is
measured for a few seconds alone, then while `engine.retain(status=cancelled,
apply=True)` deletes and compacts the cancelled tenth. Reported: the writers'
runs/s alone and during the compaction (and the drop), the compaction's time,
and whether every persistent projection then equals a rebuild.

Run: ``python -m benchmarks.retain`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from benchmarks._common import arguments, report, scratch
from engine import Engine, RetentionRule
from engine.cli.demo.code_review import REVIEW

WRITERS = 4


def record(engine: Engine, status: str) -> None:
    """One finished run of 5 events in one transaction."""
    run = engine.start_run(REVIEW, params={"card": "C"})
    with run.batch():
        run.stage_completed("project_analysis")
        run.stage_completed("code_review")
        run.stage_failed("developer", error="broke")
        run.finish(status)


def fill(url: str, runs: int) -> None:
    """`runs` runs, every tenth cancelled, with the run index caught up."""
    with Engine(url) as engine:
        for index in range(runs):
            record(engine, "cancelled" if index % 10 == 0 else "succeeded")
        engine.projections.catch_up()


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


def measure(runs: int, window: float) -> dict[str, object]:
    """Writers' rate alone and during compaction, compaction time, projections vs a rebuild."""
    url = f"sqlite:///{scratch('retain.db')}"
    fill(url, runs)
    context = multiprocessing.get_context("spawn")
    stop, count = context.Event(), context.Value("i", 0)
    procs = [context.Process(target=writer, args=(url, stop, count)) for _ in range(WRITERS)]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + 60
        while count.value < 2 * WRITERS and time.monotonic() < deadline:
            time.sleep(0.05)  # the writers start up (a spawned interpreter imports the engine)
        alone = rate(count, window)
        with Engine(url) as compactor:
            first, began = count.value, time.perf_counter()
            done = compactor.retain(RetentionRule(status={"cancelled"}), apply=True)
            took = time.perf_counter() - began
            during = (count.value - first) / took
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
        "runs": runs,
        "erased": len(done.runs),
        "writers": WRITERS,
        "alone_runs_per_s": round(alone, 1),
        "during_runs_per_s": round(during, 1),
        "drop": round(1 - during / alone, 3) if alone else None,
        "compaction_s": round(took, 2),
        "rebuilt": list(done.compacted.rebuilt),
        "projections_equal_rebuild": after == rebuilt,
    }


def main() -> None:
    parser_args = arguments(__doc__ or "")
    runs = 300 if parser_args.quick else 20_000
    window = 0.5 if parser_args.quick else 3.0
    report(
        "online retention (SQLite file, 4 writer processes)",
        [measure(runs, window)],
        parser_args.json,
    )


if __name__ == "__main__":
    main()
