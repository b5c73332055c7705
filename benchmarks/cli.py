"""Command-line speed and memory: start-up, `stagetrail runs`, `stagetrail show`.

Run: ``python -m benchmarks.cli`` (``--quick`` for a smoke run, ``--json`` for
machine output). Every figure is the real console script in a fresh process on a
SQLite file, timed from outside (interpreter start and imports included):

1. start-up: ``stagetrail --version`` beside a bare ``python -c pass``, and what
   ``python -X importtime -c "import engine.cli"`` says the imports cost;
2. ``stagetrail runs --limit 50`` on a store of 10,000 runs (target: under 1 s),
   once right after the runs were written (the run index catches up first) and
   then as usual (the index is current);
3. ``stagetrail show`` of a 100,000-event run to a pipe: time and peak RSS of the
   process (target: under 200 MB, and flat: the same as for a 10,000-event run).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from uuid import UUID

from benchmarks._common import RESULT, WORK, arguments, report, scratch
from benchmarks._runs import Progress
from engine import Engine
from events import Event, RunFinished, RunStarted, StageCompleted, StageFailed, StageStarted

BATCH = 5000
"""Events per transaction when building the stores."""


class Sizes(NamedTuple):
    """How big each measurement is (full size, or --quick)."""

    runs: int
    long_run: int
    short_run: int
    repeats: int


FULL = Sizes(runs=10_000, long_run=100_000, short_run=10_000, repeats=5)
QUICK = Sizes(runs=300, long_run=3_000, short_run=300, repeats=2)

_PEAK = (
    "import resource, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)\n"
    "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def stagetrail() -> list[str]:
    """The console script of this environment (or its entry point through the interpreter)."""
    script = Path(sys.executable).parent / "stagetrail"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from engine.cli import main; main()"]


def wall(command: list[str]) -> float:
    """Seconds one run of `command` takes, its output discarded."""
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def peak(command: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of `command` in a fresh process, its output to a pipe."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, *command], capture_output=True, text=True, check=True
    )
    seconds, kilobytes = done.stdout.split()
    return float(seconds), int(kilobytes) / 1024


def _run_events(run_id: UUID, outcomes: int) -> Iterator[Event]:
    yield RunStarted(run_id=run_id, version=1, pipeline=WORK.name, table=WORK.to_dict())
    version = 1
    for attempt in range(1, outcomes + 1):
        yield StageStarted(run_id=run_id, version=version + 1, stage="work", attempt=attempt)
        if attempt % 10 == 0:
            yield StageFailed(
                run_id=run_id,
                version=version + 2,
                stage="work",
                attempt=attempt,
                error="cc1: fatal error: foo.h: No such file or directory",
                error_type="BuildError",
                duration=2.5,
            )
        else:
            yield StageCompleted(
                run_id=run_id,
                version=version + 2,
                stage="work",
                attempt=attempt,
                result=RESULT,
                duration=1.5,
            )
        version += 2
    yield RunFinished(run_id=run_id, version=version + 1, status="succeeded")


def append_all(engine: Engine, events: Iterator[Event], progress: Progress) -> int:
    """Append `events` `BATCH` at a time; return how many."""
    batch: list[Event] = []
    count = 0
    for event in events:
        batch.append(event)
        if len(batch) == BATCH:
            engine.store.append(batch)
            count += len(batch)
            progress(count)
            batch = []
    if batch:
        engine.store.append(batch)
        count += len(batch)
    return count


def write_runs(url: str, runs: int) -> None:
    """`runs` short runs of 2 outcomes each (6 events)."""
    events = (event for _ in range(runs) for event in _run_events(uuid.uuid4(), 2))
    with Engine(url) as engine:
        append_all(engine, events, Progress("runs store", runs * 6))


def write_long_run(url: str, events: int) -> UUID:
    """One run of about `events` events."""
    run_id = uuid.uuid4()
    with Engine(url) as engine:
        append_all(engine, _run_events(run_id, (events - 2) // 2), Progress("long run", events))
    return run_id


def import_cost() -> tuple[float, list[str]]:
    """Milliseconds ``import engine.cli`` costs by -X importtime, and the 6 costliest packages."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import engine.cli"],
        capture_output=True,
        text=True,
        check=True,
    )
    total, by_package = 0, Counter[str]()
    for line in done.stderr.splitlines():
        found = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)", line)
        if found:
            by_package[found.group(3).split(".")[0]] += int(found.group(1))
            if found.group(3) == "engine.cli":
                total = int(found.group(2))
    costliest = [f"{name} {micro / 1000:.0f} ms" for name, micro in by_package.most_common(6)]
    return total / 1000, costliest


def startup_case(sizes: Sizes) -> dict[str, object]:
    """Figure 1: the console script's start-up and import cost."""
    version = statistics.median(wall([*stagetrail(), "--version"]) for _ in range(sizes.repeats))
    bare = statistics.median(wall([sys.executable, "-c", "pass"]) for _ in range(sizes.repeats))
    imports, heaviest = import_cost()
    return {
        "case": "stagetrail --version, interpreter start included (ms)",
        "median": version * 1000,
        "python_c_pass": bare * 1000,
        "import_engine_cli": imports,
        "costliest_packages": heaviest,
    }


def runs_case(sizes: Sizes) -> list[dict[str, object]]:
    """Figure 2: ``stagetrail runs --limit 50`` on a store of many runs."""
    path = scratch("runs.db")
    url = f"sqlite:///{path}"
    write_runs(url, sizes.runs)
    command = [*stagetrail(), "runs", "--limit", "50", "--store", url]
    first = wall(command)
    warm = [wall(command) for _ in range(sizes.repeats)]
    as_json = [wall([*command, "--json"]) for _ in range(sizes.repeats)]
    shutil.rmtree(path.parent)
    label = f"stagetrail runs --limit 50, {sizes.runs:,} runs"
    return [
        {
            "case": f"{label}, first call: index catches up (s)",
            "seconds": first,
        },
        {
            "case": f"{label} (s)",
            "median": statistics.median(warm),
            "max": max(warm),
            "json_median": statistics.median(as_json),
            "target": 1.0,
            "met": max(warm) < 1.0 and max(as_json) < 1.0,
        },
    ]


def show_case(sizes: Sizes) -> list[dict[str, object]]:
    """Figure 3: ``stagetrail show`` of a long run, to a pipe: time and peak memory."""
    path = scratch("long.db")
    url = f"sqlite:///{path}"
    rows = []
    for events in (sizes.short_run, sizes.long_run):
        run_id = write_long_run(url, events)
        seconds, megabytes = peak([*stagetrail(), "show", str(run_id), "--store", url])
        json_seconds, json_megabytes = peak(
            [*stagetrail(), "show", str(run_id), "--json", "--store", url]
        )
        rows.append(
            {
                "case": f"stagetrail show, {events:,}-event run (peak RSS, MB)",
                "peak_rss": megabytes,
                "seconds": seconds,
                "events_per_second": events / seconds,
                "json_peak_rss": json_megabytes,
                "json_seconds": json_seconds,
                "target": 200,
                "met": max(megabytes, json_megabytes) < 200,
            }
        )
    shutil.rmtree(path.parent)
    return rows


def main() -> None:
    """Measure and print the command-line figures with their targets."""
    args = arguments(__doc__ or "")
    sizes = QUICK if args.quick else FULL
    began = time.perf_counter()
    os.environ.pop("STAGETRAIL_STORE", None)
    rows = [startup_case(sizes), *runs_case(sizes), *show_case(sizes)]
    report("command line (SQLite file, fresh processes)", rows, args.json)
    sys.stdout.flush()
    print(f"  total: {time.perf_counter() - began:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
