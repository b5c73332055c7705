"""The run shapes the projection benchmark records, and its progress reporting."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from benchmarks._common import RESULT, WORK
from engine import Pipeline, Run

Step = Callable[[Run, int], object]
"""Records the event at position `i` (0-based, after `RunStarted`) of a run."""

BATCH = 1000
"""Events per transaction when building the stores."""

ERRORS = (
    ("BuildError", "cc1: fatal error: foo.h: No such file or directory"),
    ("AssertionError", "test_parse: expected 3, got 4"),
    ("TimeoutError", "stage exceeded its 600 s timeout"),
)
"""The failures the runs record: (error_type, error)."""

PIPELINES = tuple(
    Pipeline(name, initial=WORK.initial, transitions=WORK.rows, final=WORK.final)
    for name in ("bench-build", "bench-review", "bench-deploy")
)
"""The many-runs store spreads its runs over these (same table, so `FailurePatterns` has
one partition per pipeline)."""

TEAMS = ("core", "infra", "web", "data")


class Progress:
    """Prints ``label: 10% (...)`` to stderr each time another tenth of `total` is done."""

    def __init__(self, label: str, total: int) -> None:
        self.label = label
        self.total = total
        self.tenths = 0
        self.start = time.perf_counter()

    def __call__(self, done: int) -> None:
        """Report `done` units of work finished."""
        while self.tenths < 10 and done * 10 >= (self.tenths + 1) * self.total:
            self.tenths += 1
            elapsed = time.perf_counter() - self.start
            print(
                f"  {self.label}: {self.tenths * 10}% ({done:,}/{self.total:,}, {elapsed:.1f} s)",
                file=sys.stderr,
                flush=True,
            )

    def projection(self, name: str, position: int, head: int) -> None:
        """`Projections.catch_up`'s on_progress: a projection reached `position` of `head`."""
        self(position)


def record(run: Run, count: int, step: Step) -> None:
    """Append `count` events made by `step` to `run`, `BATCH` per transaction."""
    for start in range(0, count, BATCH):
        with run.batch():
            for index in range(start, min(count, start + BATCH)):
                step(run, index)


def fail(run: Run, kind: int) -> None:
    """Record a failed attempt with one of the `ERRORS`."""
    error_type, error = ERRORS[kind % len(ERRORS)]
    run.stage_failed("work", error, error_type=error_type, duration=2.5)


def outcome_step(run: Run, index: int) -> None:
    """Outcomes of one long loop: 1 in 10 fails, a note every 25 events."""
    if index % 25 == 24:
        run.note("strategy", {"tried": index, "next": "smaller diff"})
    elif index % 10 == 9:
        fail(run, index)
    else:
        run.stage_completed("work", RESULT, duration=1.0)


TRAVEL_CYCLE = 12
"""Events per cycle of the time-travel run: 8 completed, 2 failed, a note, a rollback of 5."""


def travel_step(run: Run, index: int) -> None:
    """A retry loop that keeps undoing half its outcomes (depth grows 5 per 12 events)."""
    position = index % TRAVEL_CYCLE
    if position == 10:
        run.note("strategy", {"cycle": index // TRAVEL_CYCLE, "plan": "retry with a smaller diff"})
    elif position == 11:
        run.rollback(5, reason="review rejected the last changes")
    elif position in (3, 7):
        fail(run, index)
    else:
        run.stage_completed("work", RESULT, duration=1.0)


def index_step(number: int, count: int) -> Step:
    """The events of run `number` of the many-runs store, `count` of them after `RunStarted`.

    7 runs in 10 end with a ``done`` outcome and succeed, 2 fail, 1 is still running;
    1 outcome in 8 is a failure, a note every 20 events, a rollback of 2 every 30.
    """
    last, kind = count - 1, number % 10

    def step(run: Run, index: int) -> None:
        if index == last and kind != 9:
            status = "succeeded" if kind < 7 else "failed"
            run.finish(status, reason="" if kind < 7 else "gave up after repeated failures")
        elif index == last - 1 and kind < 7:
            run.stage_completed("work", RESULT, outcome="done", duration=1.0)
        elif index % 8 == 5:
            fail(run, number + index)
        elif index % 20 == 19:
            run.note("learned", {"pattern": ERRORS[number % len(ERRORS)][0]})
        elif index % 30 == 29:
            run.rollback(2, reason="retry from an earlier result")
        else:
            run.stage_completed("work", RESULT, duration=1.0)

    return step
