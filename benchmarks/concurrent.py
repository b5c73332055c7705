"""Concurrent runs in one event loop: `drive_async` with shared commits against each run alone.

The review workload of `benchmarks.compare` (8 attempts per run, 3 of them
failures), with async stage functions that yield to the loop once, driven N
runs at a time by `asyncio.gather` into a SQLite file at its default
durability. ``each``: every run commits on its own, on the loop's thread
(the default). ``shared``: `Supervisor(shared_commits=True)`, the batches
ready together are one transaction. Both record the same events, and every
batch is on disk before its run's next call; the rounds alternate.

Run: ``python -m benchmarks.concurrent`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from benchmarks._common import CountedWrites, arguments, report, scratch
from benchmarks.peers.stagetrail_runs import REVIEW
from benchmarks.peers.workload import STAGES, attempt
from engine import Engine, RetryPolicy, StageContext


async def stage_function(context: StageContext) -> Any:
    """One attempt of the workload, after yielding to the loop as an async call would."""
    await asyncio.sleep(0)
    return attempt(context.stage, context.attempt)


STAGE_FUNCTIONS = dict.fromkeys(STAGES, stage_function)


def drive(engine: Engine, runs: int, *, shared: bool) -> tuple[float, int]:
    """Start `runs` runs, then drive them at once: the seconds and the commits, both together."""
    sup = engine.supervisor(
        retry=RetryPolicy(max_retries=3, delay=0.0, jitter=0.0), shared_commits=shared
    )
    with CountedWrites(engine.store) as writes:
        began = time.perf_counter()
        started = [engine.start_run(REVIEW) for _ in range(runs)]
        asyncio.run(_drive_all(sup, started))
        seconds = time.perf_counter() - began
    assert all(run.status == "succeeded" for run in started)
    return seconds, writes.commits


async def _drive_all(sup: Any, runs: list[Any]) -> None:
    await asyncio.gather(*(sup.drive_async(run, STAGE_FUNCTIONS) for run in runs))


def measure(concurrency: int, rounds: int, total: int) -> dict[str, object]:
    """Runs/s each way at `concurrency` runs at once (medians over `rounds`), and commits/run."""
    rates: dict[str, list[float]] = {"each": [], "shared": []}
    commits: dict[str, list[float]] = {"each": [], "shared": []}
    with Engine(f"sqlite:///{scratch('concurrent.db')}") as engine:
        for _ in range(rounds):
            for case in ("each", "shared"):
                seconds, written = 0.0, 0
                for _ in range(max(1, total // concurrency)):
                    took, count = drive(engine, concurrency, shared=case == "shared")
                    seconds, written = seconds + took, written + count
                done = max(1, total // concurrency) * concurrency
                rates[case].append(done / seconds)
                commits[case].append(written / done)
    each, shared = (statistics.median(rates[case]) for case in ("each", "shared"))
    return {
        "runs_at_once": concurrency,
        "each_runs_per_s": round(each, 1),
        "shared_runs_per_s": round(shared, 1),
        "speedup": round(shared / each, 2),
        "commits_per_run_each": round(statistics.median(commits["each"]), 2),
        "commits_per_run_shared": round(statistics.median(commits["shared"]), 2),
    }


def main() -> None:
    args = arguments(__doc__ or "")
    rounds, total = (1, 20) if args.quick else (5, 600)
    rows = [measure(concurrency, rounds, total) for concurrency in (1, 10, 100)]
    report("concurrent runs in one event loop (drive_async, SQLite file)", rows, args.json)


if __name__ == "__main__":
    main()
