"""Helpers shared by the benchmarks: timing, scratch files, the work pipeline, reporting."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import Pipeline, Run

WORK = Pipeline(
    "bench",
    initial="work",
    transitions=[
        ("work", "completed", "work"),
        ("work", "failed", "work"),
        ("work", "done", "end"),
    ],
    final=["end"],
)
"""A one-stage loop: every outcome is a real, checked transition that pushes a frame."""

RESULT = {"changed_files": 3, "summary": "ok", "scores": [0.5, 0.75]}


def record_outcomes(run: Run, count: int, per_batch: int) -> None:
    """Record `count` completed outcomes of WORK's stage into `run`, `per_batch` a batch."""
    for _ in range(count // per_batch):
        with run.batch():
            for _ in range(per_batch):
                run.stage_completed("work", RESULT, duration=1.0)


def scratch(name: str) -> Path:
    """A fresh path for a database file in a new temporary directory."""
    return Path(tempfile.mkdtemp(prefix="stagetrail-bench-")) / name


def median_rates(cases: dict[str, Callable[[], int]], repeats: int) -> dict[str, float]:
    """Each case's median rate (items/s) over `repeats` rounds, the cases interleaved.

    Interleaving puts a baseline and its rival under the same machine load.
    """
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, work in cases.items():
            count, seconds = timed(work)
            rates[name].append(count / seconds)
    return {name: statistics.median(values) for name, values in rates.items()}


def timed(work: Callable[[], int]) -> tuple[int, float]:
    """Run `work`, returning the count it reports and the seconds it took."""
    start = time.perf_counter()
    count = work()
    return count, time.perf_counter() - start


def arguments(description: str) -> argparse.Namespace:
    """Common command-line options: --quick for a smoke run, --json for machine output."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    return parser.parse_args()


def report(title: str, rows: list[dict[str, object]], as_json: bool) -> None:
    """Print result rows as a table (or JSON)."""
    if as_json:
        print(json.dumps({"benchmark": title, "results": rows}))
        return
    print(f"\n{title}")
    for row in rows:
        print("  " + "  ".join(f"{k}={_fmt(v)}" for k, v in row.items()))


def _fmt(value: object) -> str:
    return f"{value:,.2f}" if isinstance(value, float) else str(value)


class CountedWrites:
    """Count a store's writes (one call, one transaction) inside the ``with`` block.

    The store's own `write` does the work; each write's stored events are kept in
    `batches` (a copy: a run's queue is reused), and `commits` counts them.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.batches: list[list[Any]] = []

    @property
    def commits(self) -> int:
        """The writes so far."""
        return len(self.batches)

    def __enter__(self) -> CountedWrites:
        write = self.store.write

        def counted(stored: Any, **options: Any) -> Any:
            self.batches.append(list(stored))
            return write(stored, **options)

        self.store.write = counted
        return self

    def __exit__(self, *exc: object) -> None:
        del self.store.write  # the class's method again
