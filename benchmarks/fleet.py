"""A fleet of writer and follower processes on one store, for the scale suite and benchmark.

A *worker* supervises runs of the README's code-review pipeline to their end:
the developer stage fails a few times (sometimes too often, and the run gives
up), the testing stage sometimes fails and sends the run back to the developer.
It prints one JSON line: every run it recorded with its final version, and its
events and times. A *follower* folds the persistent projections (`RunIndex`,
`FailurePatterns`) with `Projections.follow` while the workers write, samples
its lag, and, told ``finish`` on stdin, waits until it is caught up and prints
one JSON line.

Run one by hand: ``python -m benchmarks.fleet worker URL --index 0 --runs 200``,
``python -m benchmarks.fleet follower URL``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import Engine, Outcome, RetryPolicy, Run, StageContext, StageGaveUp

ROOT = Path(__file__).resolve().parent.parent
RETRY = RetryPolicy(max_retries=3, delay=0.0, jitter=0.0, timeout=None)
"""Three retries, no waiting: the fleet measures the store, not sleeps."""
ERRORS = (
    ("BuildError", "cc1: fatal error: foo.h: No such file or directory"),
    ("LinkError", "undefined reference to `main'"),
    ("TimeoutError", "stage exceeded its 600 s timeout"),
)


class BuildFailure(Exception):
    """A developer attempt that did not build."""


class FailingTest(Exception):
    """A testing attempt that found a failing test."""


def plan(worker: int, number: int) -> tuple[int, bool]:
    """How run `number` of `worker` goes: developer failures (4 gives up), a failed test."""
    rng = random.Random(worker * 1_000_003 + number)
    return rng.choice((0, 0, 1, 1, 2, 3, 4)), rng.random() < 0.3


def stages(worker: int, number: int) -> dict[str, Callable[[StageContext], Any]]:
    """The stage functions of one run, failing as `plan` says."""
    failures, flaky_test = plan(worker, number)
    calls = {"developer": 0, "testing": 0}

    def developer(context: StageContext) -> Any:
        calls["developer"] += 1
        if calls["developer"] <= failures:
            error_type, error = ERRORS[(number + calls["developer"]) % len(ERRORS)]
            raise BuildFailure(f"{error_type}: {error}")
        return {"changed_files": 1 + number % 5, "attempt": context.attempt}

    def testing(context: StageContext) -> Any:
        calls["testing"] += 1
        if flaky_test and calls["testing"] == 1:
            raise FailingTest("test_parser.py::test_empty failed")
        return Outcome("completed", {"passed": 40 + number % 7})

    return {
        "project_analysis": lambda context: {"project_type": "python", "worker": worker},
        "code_review": lambda context: {"critical": number % 4},
        "developer": developer,
        "testing": testing,
    }


def drive_one(engine: Engine, worker: int, number: int) -> Run:
    """Start run `number` of `worker` and supervise it to a final state."""
    from engine.cli.demo.code_review import REVIEW

    run = engine.start_run(
        REVIEW, params={"worker": worker, "n": number}, labels={"worker": str(worker)}
    )
    supervisor = engine.supervisor(retry=RETRY, sleep=lambda seconds: None)
    with contextlib.suppress(StageGaveUp):  # drive finished the run as failed first
        supervisor.drive(run, stages(worker, number))
    return run


def work(url: str, worker: int, runs: int) -> dict[str, Any]:
    """Supervise `runs` runs in the store at `url`; what was recorded, and when."""
    opened = time.time()
    with Engine(url) as engine:
        began = time.time()
        recorded: dict[str, tuple[int, str | None]] = {}
        for number in range(runs):
            run = drive_one(engine, worker, number)
            recorded[str(run.id)] = (run.version, run.status)
        ended = time.time()
    events = sum(version for version, _ in recorded.values())
    return {"worker": worker, "runs": recorded, "events": events, "opened": opened,
            "began": began, "ended": ended}  # fmt: skip


class Lag:
    """The follower's lag (head minus its slowest projection), sampled while it follows."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.samples: list[int] = []

    def sample(self) -> int:
        """The current lag of the slowest registered projection."""
        lag = max(status.lag for status in self.engine.projections.status())
        self.samples.append(lag)
        return lag


def follow(url: str, *, interval: float = 0.25, timeout: float = 120.0) -> dict[str, Any]:
    """Follow until told ``finish`` on stdin, then until caught up; what the lag was."""
    with Engine(url) as engine:
        stop = threading.Event()
        follower = threading.Thread(
            target=engine.projections.follow, args=(stop,), kwargs={"timeout": 0.2}
        )
        follower.start()
        told = threading.Event()
        threading.Thread(target=_wait_for_line, args=(told,), daemon=True).start()
        lag = Lag(engine)
        while not told.wait(interval):
            lag.sample()
        finished_at = time.time()
        deadline = finished_at + timeout
        while lag.sample() > 0 and time.time() < deadline:
            time.sleep(0.05)
        caught_up = time.time()
        stop.set()
        follower.join()
        status = [[s.name, s.position, s.head, s.lag, s.last_error]
                  for s in engine.projections.status()]  # fmt: skip
    during = lag.samples[:-1] or [0]
    return {"max_lag": max(during), "mean_lag": sum(during) / len(during),
            "catch_up_seconds": caught_up - finished_at, "status": status}  # fmt: skip


def _wait_for_line(told: threading.Event) -> None:
    sys.stdin.readline()
    told.set()


def start(role: str, url: str, *args: str) -> subprocess.Popen[str]:
    """Start a worker or follower process from the repository root."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.fleet", role, url, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def main() -> None:
    """Run one worker or follower, printing its JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("worker", "follower"))
    parser.add_argument("url")
    parser.add_argument("--index", type=int, default=0, help="the worker's number")
    parser.add_argument("--runs", type=int, default=200, help="runs the worker records")
    options = parser.parse_args()
    if options.role == "worker":
        print(json.dumps(work(options.url, options.index, options.runs)), flush=True)
    else:
        print(json.dumps(follow(options.url)), flush=True)


if __name__ == "__main__":
    main()
