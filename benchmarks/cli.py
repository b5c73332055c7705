"""Command-line speed and memory: start-up, `stagetrail runs`, `stagetrail show`.

Run: ``python -m benchmarks.cli`` (``--quick`` for a smoke run, ``--json`` for
machine output, ``--baseline DIR`` to time a checkout of another commit beside
this one, e.g. ``git archive main | tar -x -C /tmp/base``). Every figure is a
fresh process on a SQLite file, timed from outside (interpreter start and
imports included), beside a bare ``python -c pass`` timed in the same run:

1. start-up: ``stagetrail --version`` and ``stagetrail --help`` (target: 150 ms
   each), and what ``python -X importtime -c "import engine.cli"`` says the
   imports cost;
2. ``stagetrail runs --limit 50`` on a store of 10,000 runs (target: 400 ms),
   once right after the runs were written (the run index catches up first) and
   then as usual (the index is current);
3. ``stagetrail show`` of a 1,000-event run (target: 500 ms);
4. ``stagetrail show --limit all`` of a 100,000-event run to a pipe: time and peak RSS of the
   process (target: under 200 MB, and flat: the same as for a 10,000-event run).

Each timed command is given as the console script runs it (``from engine.cli
import main; main()``), with the checkout's directory first on ``sys.path``.
Wall times are p50 and p95 of 20 runs after one warm-up run, with bytecode
caches written (as an installed program has them, whatever
``PYTHONDONTWRITEBYTECODE`` says), each run followed by a ``python -c pass``, so
that both see the same load on a shared machine (``over_p50``: the median of
the differences); a target is met at p95. ``cpu`` is the process's user+system
time, which a machine busy with other work disturbs less than the wall clock.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
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

from benchmarks._common import RESULT, WORK, report, scratch
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


FULL = Sizes(runs=10_000, long_run=100_000, short_run=10_000, repeats=20)
QUICK = Sizes(runs=300, long_run=3_000, short_run=300, repeats=2)
SHOWN_RUN = 1_000
"""Events of the run whose `show` has a time target."""

ROOT = Path(__file__).resolve().parent.parent
"""This checkout."""

_PEAK = (
    "import resource, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)\n"
    "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def stagetrail(checkout: Path = ROOT) -> list[str]:
    """The program as the console script runs it, from the code of `checkout`."""
    entry = (
        f"import sys; sys.path.insert(0, {str(checkout)!r}); from engine.cli import main; main()"
    )
    return [sys.executable, "-c", entry]


def wall(command: list[str]) -> float:
    """Seconds one run of `command` takes, its output discarded."""
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def timed(command: list[str], repeats: int) -> tuple[float, float]:
    """Median wall and median CPU (user + system) milliseconds of `command`, fresh each time."""
    walls, cpus = [], []
    wall(command)  # the first run writes the bytecode caches, as any installed program has them
    for _ in range(repeats):
        seconds, cpu = _wall_and_cpu(command)
        walls.append(seconds)
        cpus.append(cpu)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def _wall_and_cpu(command: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of `command`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = wall(command)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def p95(values: list[float]) -> float:
    """The 95th percentile of `values` (the largest when there are fewer than 20)."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


def paired(command: list[str], repeats: int) -> dict[str, float]:
    """`command` and ``python -c pass`` in turns: p50/p95 wall of each, CPU, and the excess.

    Run alternately, both see the same load of a shared machine; ``over_p50`` is
    the median of each pair's difference: what the command adds to a bare start.
    """
    bare = [sys.executable, "-c", "pass"]
    wall(command)  # the first run writes the bytecode caches, as any installed program has them
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    for _ in range(repeats):
        ours.append(_wall_and_cpu(command))
        theirs.append(_wall_and_cpu(bare))
    walls, cpus = [w * 1000 for w, _ in ours], [c * 1000 for _, c in ours]
    bare_walls, bare_cpus = [w * 1000 for w, _ in theirs], [c * 1000 for _, c in theirs]
    return {
        "median": statistics.median(walls),
        "p95": p95(walls),
        "cpu": statistics.median(cpus),
        "python_c_pass": statistics.median(bare_walls),
        "python_c_pass_p95": p95(bare_walls),
        "python_c_pass_cpu": statistics.median(bare_cpus),
        "over_p50": statistics.median(a - b for a, b in zip(walls, bare_walls, strict=True)),
    }


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


def _timed_row(
    case: str, command: list[str], sizes: Sizes, target_ms: float, baseline: Path | None
) -> dict[str, object]:
    """One timed command: p50/p95 beside `python -c pass`, its target (met at p95), a baseline's."""
    figures = paired(command, sizes.repeats)
    row: dict[str, object] = {
        "case": case,
        **figures,
        "target": target_ms,
        "met": figures["p95"] <= target_ms,
    }
    if baseline is not None:
        ours = command.index(stagetrail()[-1])
        before = [*command[:ours], stagetrail(baseline)[-1], *command[ours + 1 :]]
        row["baseline_median"], row["baseline_cpu"] = timed(before, sizes.repeats)
    return row


def startup_case(sizes: Sizes, baseline: Path | None = None) -> list[dict[str, object]]:
    """Figure 1: start-up (``--version``, ``--help``) and the import cost."""
    version = _timed_row(
        "stagetrail --version, interpreter start included (ms)",
        [*stagetrail(), "--version"],
        sizes,
        150,
        baseline,
    )
    imports, heaviest = import_cost()
    version |= {"import_engine_cli": imports, "costliest_packages": heaviest}
    helped = _timed_row(
        "stagetrail --help, interpreter start included (ms)",
        [*stagetrail(), "--help"],
        sizes,
        150,
        baseline,
    )
    return [version, helped]


def runs_case(sizes: Sizes, baseline: Path | None = None) -> list[dict[str, object]]:
    """Figure 2: ``stagetrail runs --limit 50`` on a store of many runs."""
    path = scratch("runs.db")
    url = f"sqlite:///{path}"
    write_runs(url, sizes.runs)
    command = [*stagetrail(), "runs", "--limit", "50", "--store", url]
    first = wall(command)
    label = f"stagetrail runs --limit 50, {sizes.runs:,} runs"
    row = _timed_row(f"{label} (ms)", command, sizes, 400, baseline)
    as_json = paired([*command, "--json"], sizes.repeats)
    row["json_median"], row["json_p95"] = as_json["median"], as_json["p95"]
    row["met"] = max(float(row["p95"]), as_json["p95"]) <= 400  # type: ignore[arg-type]
    shutil.rmtree(path.parent)
    return [{"case": f"{label}, first call: index catches up (s)", "seconds": first}, row]


def shown_run_case(sizes: Sizes, baseline: Path | None = None) -> dict[str, object]:
    """Figure 3: ``stagetrail show`` of a 1,000-event run (300 with --quick)."""
    path = scratch("shown.db")
    url = f"sqlite:///{path}"
    events = SHOWN_RUN if sizes is FULL else sizes.short_run
    run_id = write_long_run(url, events)
    command = [*stagetrail(), "show", str(run_id), "--store", url]
    wall(command)  # the run index catches up once, as after any write
    row = _timed_row(f"stagetrail show, {events:,}-event run (ms)", command, sizes, 500, baseline)
    shutil.rmtree(path.parent)
    return row


def show_case(sizes: Sizes) -> list[dict[str, object]]:
    """Figure 4: ``stagetrail show`` of a long run, to a pipe: time and peak memory."""
    path = scratch("long.db")
    url = f"sqlite:///{path}"
    rows = []
    for events in (sizes.short_run, sizes.long_run):
        run_id = write_long_run(url, events)
        seconds, megabytes = peak(
            [*stagetrail(), "show", str(run_id), "--limit", "all", "--store", url]
        )
        json_seconds, json_megabytes = peak(
            [*stagetrail(), "show", str(run_id), "--limit", "all", "--json", "--store", url]
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


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--baseline", type=Path, help="a checkout to time beside this one")
    return parser.parse_args()


def main() -> None:
    """Measure and print the command-line figures with their targets."""
    args = _arguments()
    sizes = QUICK if args.quick else FULL
    began = time.perf_counter()
    os.environ.pop("STAGETRAIL_STORE", None)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed program has its .pyc files
    rows = [
        *startup_case(sizes, args.baseline),
        *runs_case(sizes, args.baseline),
        shown_run_case(sizes, args.baseline),
        *show_case(sizes),
    ]
    report("command line (SQLite file, fresh processes)", rows, args.json)
    sys.stdout.flush()
    print(f"  total: {time.perf_counter() - began:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
