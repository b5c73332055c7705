"""stagetrail against the systems a team would pick instead, on one review workload (issue 14).

Every system records the same runs (5 stages, 8 attempts, 3 failures, ~550-byte
results) into a fresh SQLite file at its default durability, then answers the
same read questions. Repetitions are interleaved (the systems' order rotates)
and every ratio is taken within a repetition, then the median is reported.

Run: ``python -m benchmarks.compare`` (``--quick`` for a smoke run; ``--only``
to pick systems; peers that are not installed are skipped: ``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.peers.workload import ATTEMPTS, RESULT_BYTES, System, file_size, row_count

SYSTEMS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "raw": ("benchmarks.peers.raw_sqlite", "RawSqlite", {}),
    "eventsourcing": ("benchmarks.peers.plain_eventsourcing", "PlainEventsourcing", {}),
    "langgraph-retry": ("benchmarks.peers.langgraph_saver", "LangGraphSaver", {"variant": "retry"}),
    "langgraph-loop": ("benchmarks.peers.langgraph_saver", "LangGraphSaver", {"variant": "loop"}),
    "dbos-retry": ("benchmarks.peers.dbos_steps", "DbosSteps", {"variant": "retry"}),
    "dbos-loop": ("benchmarks.peers.dbos_steps", "DbosSteps", {"variant": "loop"}),
    "stagetrail-run": ("benchmarks.peers.stagetrail_runs", "Stagetrail", {"variant": "Run"}),
    "stagetrail-drive": (
        "benchmarks.peers.stagetrail_runs", "Stagetrail", {"variant": "Supervisor.drive"},
    ),
    "stagetrail-drive-each": (
        "benchmarks.peers.stagetrail_runs", "Stagetrail",
        {"variant": "Supervisor.drive", "group_commits": False},
    ),
}  # fmt: skip
"""Each system's key: (module, class, arguments)."""

IMPORTS = {
    "raw": "import sqlite3, json",
    "eventsourcing": "import eventsourcing.application, eventsourcing.sqlite",
    "langgraph-retry": "import langgraph.graph, langgraph.checkpoint.sqlite",
    "dbos-retry": "import dbos",
    "stagetrail-run": "import engine",
}
"""What a process imports to use each system (variants share their family's figure)."""

DISTRIBUTIONS = ("eventsourcing", "langgraph", "langgraph-checkpoint-sqlite", "dbos", "stagetrail")
SAMPLE = 50
"""Runs per repetition whose history and past state are timed."""
RECORD = 4
"""Point-in-time state is asked as of this record of a run."""


def factory(key: str) -> Callable[[Path], System] | None:
    """The system's constructor, or None when its library is not installed."""
    module, name, kwargs = SYSTEMS[key]
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError:
        return None
    return lambda path: cls(path, **kwargs)


def empty_size(build: Callable[[Path], System]) -> tuple[int, int]:
    """Bytes and rows of a database the system set up but recorded nothing in."""
    path = Path(tempfile.mkdtemp(prefix="stagetrail-compare-")) / "empty.db"
    build(path).close()
    return file_size(path), row_count(path)


def measure(key: str, build: Callable[[Path], System], runs: int) -> dict[str, Any]:
    """One repetition of one system: record `runs` runs, then time the reads."""
    empty_bytes, empty_rows = empty_size(build)
    path = Path(tempfile.mkdtemp(prefix="stagetrail-compare-")) / f"{key}.db"
    system = build(path)
    try:
        gc.collect()
        began = time.perf_counter()
        ids = system.record(runs)
        seconds = time.perf_counter() - began
        sample = random.Random(7).sample(ids, min(SAMPLE, len(ids)))
        history = _median_ms(lambda run_id: system.history(run_id), sample)
        locate = getattr(system, "locate", lambda run_id, record: run_id)
        handles = [locate(run_id, RECORD) for run_id in sample]
        state = _median_ms(lambda handle: system.state_at(handle, RECORD), handles)
        visible = system.failures_visible(ids[0])
    finally:
        system.close()
    return {
        "system": system.name, "runs_s": runs / seconds, "attempts_s": runs * ATTEMPTS / seconds,
        "bytes_run": (file_size(path) - empty_bytes) / runs,
        "records_run": (row_count(path) - empty_rows) / runs,
        "history_ms": history, "state_ms": state, "failures_visible": visible,
    }  # fmt: skip


def _median_ms(work: Callable[[Any], Any], items: list[Any]) -> float:
    times = []
    for item in items:
        began = time.perf_counter()
        work(item)
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def import_ms(statement: str, repeats: int) -> float:
    """Median ms a fresh interpreter takes for `statement`, minus one doing nothing."""

    def once(code: str) -> float:
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        return time.perf_counter() - began

    costs = [(once(statement) - once("pass")) * 1000 for _ in range(repeats)]
    return statistics.median(costs)


def compare(keys: list[str], runs: int, repetitions: int) -> list[dict[str, Any]]:
    """Every system's medians and its ratios to raw sqlite3, taken within each repetition."""
    builds = {key: build for key in keys if (build := factory(key)) is not None}
    rounds: dict[str, list[dict[str, Any]]] = {key: [] for key in builds}
    for repetition in range(repetitions):
        order = list(builds)
        order = order[repetition % len(order) :] + order[: repetition % len(order)]
        for key in order:
            print(f"  repetition {repetition + 1}: {key}", file=sys.stderr, flush=True)
            rounds[key].append(measure(key, builds[key], runs))
    summaries = [_summary(key, rounds[key], rounds.get("raw")) for key in builds]
    drive = rounds.get("stagetrail-drive")
    for summary in summaries:
        summary["rounds"] = rounds[summary["key"]]
        if drive is not None:  # how many times faster the supervised stagetrail records
            summary["drive_speedup"] = statistics.median(
                ours["runs_s"] / theirs["runs_s"]
                for ours, theirs in zip(drive, rounds[summary["key"]], strict=True)
            )
    return summaries


def _summary(
    key: str, rows: list[dict[str, Any]], raw: list[dict[str, Any]] | None
) -> dict[str, Any]:
    numbers = ("runs_s", "attempts_s", "bytes_run", "records_run", "history_ms", "state_ms")
    summary: dict[str, Any] = {"key": key, "system": rows[0]["system"]}
    summary.update({name: statistics.median(row[name] for row in rows) for name in numbers})
    summary["failures_visible"] = all(row["failures_visible"] for row in rows)
    if raw is not None:
        for name, inverse in (("runs_s", True), ("bytes_run", False), ("history_ms", False),
                              ("state_ms", False)):  # fmt: skip
            ratios = [
                (base[name] / row[name]) if inverse else (row[name] / base[name])
                for row, base in zip(rows, raw, strict=True)
            ]
            summary[f"{name}_vs_raw"] = statistics.median(ratios)
    return summary


def environment() -> dict[str, Any]:
    """The versions, machine and date the figures belong to."""
    versions: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": datetime.now(UTC).isoformat(timespec="minutes"),
        "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        "machine": f"{platform.machine()}, {_cores()} cores, {platform.system()}",
        "versions": versions, "result_bytes": RESULT_BYTES,
    }  # fmt: skip


def _cores() -> int:
    import os

    return os.cpu_count() or 0


COLUMNS = (
    ("system", "system", "{}"), ("runs/s", "runs_s", "{:,.1f}"),
    ("attempts/s", "attempts_s", "{:,.0f}"), ("slowdown vs raw", "runs_s_vs_raw", "{:.2f}x"),
    ("bytes/run", "bytes_run", "{:,.0f}"), ("bytes vs raw", "bytes_run_vs_raw", "{:.2f}x"),
    ("records/run", "records_run", "{:.1f}"), ("history (ms)", "history_ms", "{:.3f}"),
    ("vs raw", "history_ms_vs_raw", "{:.1f}x"), ("state @4 (ms)", "state_ms", "{:.3f}"),
    ("vs raw", "state_ms_vs_raw", "{:.1f}x"), ("failures kept", "failures_visible", "{}"),
    ("import (ms)", "import_ms", "{:.0f}"), ("drive is faster by", "drive_speedup", "{:.2f}x"),
)  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    """The results as one Markdown table."""
    lines = ["| " + " | ".join(title for title, _, _ in COLUMNS) + " |",
             "| --- |" + " ---: |" * (len(COLUMNS) - 1)]  # fmt: skip
    for row in rows:
        cells = []
        for _, name, form in COLUMNS:
            value = row.get(name)
            cells.append("—" if value is None else
                         ("yes" if value is True else "**no**" if value is False
                          else form.format(value)))  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment_of(report: dict[str, Any]) -> dict[str, Any]:
    """The report's environment section."""
    return report["environment"]  # type: ignore[no-any-return]


def main() -> None:
    """Measure every installed system and print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny counts, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--only", nargs="+", choices=list(SYSTEMS), help="systems to measure")
    parser.add_argument("--runs", type=int, help="runs per repetition (default 500)")
    parser.add_argument("--repetitions", type=int, help="repetitions (default 3)")
    args = parser.parse_args()
    keys = args.only or list(SYSTEMS)
    if "raw" not in keys:
        keys.insert(0, "raw")  # every ratio needs the floor
    runs = args.runs or (5 if args.quick else 500)
    repetitions = args.repetitions or (1 if args.quick else 3)
    rows = compare(keys, runs, repetitions)
    for row in rows:
        family = next((k for k in IMPORTS if row["key"].split("-")[0] == k.split("-")[0]), None)
        row["import_ms"] = None if args.quick or family is None else import_ms(IMPORTS[family], 5)
    report: dict[str, Any] = {
        "environment": environment(), "runs": runs, "repetitions": repetitions, "results": rows,
    }  # fmt: skip
    if args.json:
        print(json.dumps(report))
        return
    env = environment_of(report)
    print(f"\n{runs} runs x {repetitions} repetitions, {env['date']}, Python {env['python']}, "
          f"SQLite {env['sqlite']}, {env['machine']}")  # fmt: skip
    print(", ".join(f"{name} {version}" for name, version in env["versions"].items() if version))
    print(table(rows))


if __name__ == "__main__":
    main()
