"""LangGraph on stagetrail: `StagetrailSaver` over SQLite vs LangGraph's own `SqliteSaver`.

The same graph on both, in one process, repetitions interleaved: five nodes in a
row, each adding a text result to the state (an agent's reply: words drawn at
random, so it compresses as prose does); the third node fails three times per
run. Two ways to retry it, each measured: each failure ends an invoke and the
next invoke retries it (``invokes``), or LangGraph's own `RetryPolicy` retries
it inside one invoke (``RetryPolicy``; stagetrail records each retried attempt
as a `StageFailed` and a `RetryScheduled`, which `SqliteSaver` never sees).
Stagetrail's side is the plain one-argument swap, ``StagetrailSaver(engine)``.
Figures: super-steps per second, bytes per run at two reply sizes (the file's
size over the runs, and what the runs added to an empty store, as
`benchmarks.compare` counts) and ``get_state_history`` time; and, beside the
speed, the process's CPU time per super-step (every thread's: LangGraph runs
nodes and saves on a pool), which a loaded host sways far less than the wall
clock.

Run: ``python -m benchmarks.langgraph`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import operator
import random
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

from benchmarks._common import arguments, report, scratch, timed
from engine import Engine
from engine.integrations.langgraph import StagetrailSaver

NODES = ("research", "plan", "build", "test", "review")
FLAKY = "build"
FAILURES = 3
WORDS = [
    "agent",
    "build",
    "test",
    "plan",
    "review",
    "code",
    "error",
    "fix",
    "module",
    "function",
    "value",
    "state",
    "graph",
    "node",
]
REPLY = 1024
"""Bytes of text each node adds to the state by default (about 250 tokens of a model's reply)."""


class Work(TypedDict, total=False):
    topic: str
    log: Annotated[list[str], operator.add]
    research: dict[str, Any]
    plan: dict[str, Any]
    build: dict[str, Any]
    test: dict[str, Any]
    review: dict[str, Any]


class FlakyBuild(RuntimeError):
    """The flaky node's failure."""


def reply(size: int, rng: random.Random) -> str:
    """`size` characters of words drawn at random: text that compresses as prose does."""
    text = ""
    while len(text) < size:
        text += rng.choice(WORDS) + " "
    return text[:size]


def node(name: str, failures: dict[str, int], size: int) -> Callable[[Work], Any]:
    """A node that adds its reply; the flaky one fails `FAILURES` times per thread first."""
    rng = random.Random(name)

    def run(state: Work) -> Any:
        if name == FLAKY:
            seen = failures.get(state["topic"], 0)
            if seen < FAILURES:
                failures[state["topic"]] = seen + 1
                raise FlakyBuild(f"{name} failed (attempt {seen + 1})")
        return {"log": [name], name: {"text": reply(size, rng), "step": len(state["log"])}}

    return run


RETRY = RetryPolicy(
    max_attempts=FAILURES + 1, initial_interval=0.0, jitter=False, retry_on=FlakyBuild
)
"""The policy of the ``RetryPolicy`` mode: the flaky node's failures retried at once."""
MODE = {"retry": False}
"""Whether the graphs built now retry the flaky node with `RETRY` (else by invoking again)."""


def builder(failures: dict[str, int], size: int) -> StateGraph[Work]:
    graph = StateGraph(Work)
    for name in NODES:
        policy = RETRY if MODE["retry"] and name == FLAKY else None
        graph.add_node(name, node(name, failures, size), retry_policy=policy)  # type: ignore[call-overload, arg-type, unused-ignore]
    for source, dest in zip((START, *NODES), (*NODES, END), strict=True):
        graph.add_edge(source, dest)
    return graph


def run_thread(graph: Any, thread_id: str) -> int:
    """Invoke a thread until it ends; the super-steps it took (node attempts)."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    first: Work | None = {"topic": thread_id, "log": []}
    for _ in range(1 if MODE["retry"] else FAILURES + 1):
        try:
            graph.invoke(first, config, durability="sync")
            return len(NODES) + FAILURES
        except FlakyBuild:
            first = None
    raise AssertionError("the flaky node never succeeded")


Make = Callable[[Path, StateGraph[Work]], BaseCheckpointSaver[Any]]
Figures = dict[str, float]
"""A figure per saver."""


class Side:
    """One saver on its own SQLite file, with its compiled graph and the threads it ran."""

    def __init__(self, name: str, make: Make, size: int = REPLY) -> None:
        self.name = name
        self.path = scratch(f"{name}.db")
        self.failures: dict[str, int] = {}
        graph = builder(self.failures, size)
        self.graph = graph.compile(checkpointer=make(self.path, graph))
        self.threads: list[str] = []

    def runs(self, count: int) -> int:
        steps = 0
        for _ in range(count):
            thread_id = f"{self.name}-{len(self.threads)}"
            self.threads.append(thread_id)
            steps += run_thread(self.graph, thread_id)
        return steps

    def history(self, thread_id: str) -> int:
        config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        return len(list(self.graph.get_state_history(config)))

    def bytes_on_disk(self) -> int:
        """The database's size on disk, its WAL folded in."""
        conn = sqlite3.connect(self.path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        files = [self.path, *self.path.parent.glob(self.path.name + "-*")]
        return sum(f.stat().st_size for f in files if f.exists())

    def bytes_per_run(self) -> float:
        """The database's size on disk (WAL folded in) divided by the runs it holds."""
        return self.bytes_on_disk() / len(self.threads)


def sqlite_saver(path: Path, graph: StateGraph[Work]) -> BaseCheckpointSaver[Any]:
    return SqliteSaver(sqlite3.connect(path, check_same_thread=False))


def stagetrail_saver(path: Path, graph: StateGraph[Work]) -> BaseCheckpointSaver[Any]:
    """The plain one-argument swap: the saver learns the graph from its invocations."""
    return StagetrailSaver(Engine(f"sqlite:///{path}"))


def compressed_saver(path: Path, graph: StateGraph[Work]) -> BaseCheckpointSaver[Any]:
    """`StagetrailSaver` on a store created with eventsourcing's zlib compression."""
    return StagetrailSaver(Engine(f"sqlite:///{path}?compress=zlib"))


def history_seconds(sides: dict[str, Side], sample: int) -> dict[str, float]:
    """Median seconds of one ``get_state_history`` per side, the sides interleaved per thread."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for index in range(sample):
        for name, side in sides.items():
            thread_id = side.threads[index]
            count, seconds = timed(lambda s=side, t=thread_id: s.history(t))  # type: ignore[misc]
            assert count == len(NODES) + 2, count
            times[name].append(seconds)
    return {name: statistics.median(values) for name, values in times.items()}


def sizes(runs: int, size: int, ours: Make = stagetrail_saver) -> tuple[Figures, Figures]:
    """Bytes per run of `SqliteSaver` and `ours` after `runs` runs with `size`-byte replies.

    Returns:
        The file's size divided by the runs, and what the runs added to an empty
        store of the same saver, divided by the runs (as `benchmarks.compare` counts).
    """
    on_disk, added = {}, {}
    for name, make in (("SqliteSaver", sqlite_saver), ("StagetrailSaver", ours)):
        side = Side(f"size-{name}", make, size)
        getattr(side.graph.checkpointer, "setup", lambda: None)()  # SqliteSaver's tables
        empty = side.bytes_on_disk()
        side.runs(runs)
        on_disk[name] = side.bytes_per_run()
        added[name] = (side.bytes_on_disk() - empty) / runs
    return on_disk, added


def row(case: str, figures: dict[str, float], target: float, higher: bool) -> dict[str, object]:
    base, ours = figures["SqliteSaver"], figures["StagetrailSaver"]
    ratio = ours / base
    return {
        "case": case,
        "SqliteSaver": base,
        "StagetrailSaver": ours,
        "ratio": ratio,
        "target": f"{'>=' if higher else '<='} {target}",
        "met": ratio >= target if higher else ratio <= target,
    }


def main() -> None:
    args = arguments(__doc__ or "")
    rows = []
    for retry in (False, True):
        MODE["retry"] = retry
        suffix = ", retried by RetryPolicy" if retry else ""
        rows += [{**row, "case": f"{row['case']}{suffix}"} for row in measure(args.quick)]
    runs = 6 if args.quick else 200
    title = f"LangGraph savers on SQLite, plain StagetrailSaver(engine) ({runs} runs each)"
    report(title, rows, args.json)


def measure(quick: bool) -> list[dict[str, object]]:
    """Every figure with the flaky node retried one way (`MODE`): retried by invokes, or
    by LangGraph's `RetryPolicy` inside one invoke."""
    runs, repeats, sample = (3, 2, 3) if quick else (40, 5, 40)
    sides = {
        "SqliteSaver": Side("sqlite", sqlite_saver),
        "StagetrailSaver": Side("stagetrail", stagetrail_saver),
    }
    work = {name: (lambda s=side: s.runs(runs)) for name, side in sides.items()}
    rates, cpu = rates_and_cpu(work, repeats)  # type: ignore[arg-type]
    history = {k: v * 1000 for k, v in history_seconds(sides, sample).items()}
    rows = [row("super-steps/s", rates, 0.8, higher=True)]
    for size in (REPLY, 256):
        # As many runs per store as the speed figure: an empty store's pages (more
        # tables on our side) would otherwise weigh five times as much in a run's share.
        on_disk, added = sizes(runs * repeats, size)
        target = 0.5 if size == REPLY else 0.6
        rows.append(row(f"bytes on disk per run, {size} B replies", on_disk, target, False))
        rows.append(row(f"bytes a run adds, {size} B replies", added, target, False))
        zlib, zlib_added = sizes(runs * repeats, size, compressed_saver)
        rows.append(row(f"same, store with ?compress=zlib, {size} B replies", zlib, 0.5, False))
        zlib_case = f"added, store with ?compress=zlib, {size} B replies"
        rows.append(row(zlib_case, zlib_added, 0.5, False))
    # The speed target in CPU: 0.8x the super-steps is 1.25x the time per super-step.
    rows.append(row("process CPU per super-step (ms)", cpu, 1.25, higher=False))
    rows.append(row("get_state_history of a run (ms)", history, 1.0, higher=False))
    return rows


def rates_and_cpu(cases: dict[str, Callable[[], int]], repeats: int) -> tuple[Figures, Figures]:
    """Each case's median super-steps/s and median process CPU ms per super-step, over
    `repeats` rounds, the cases interleaved (a baseline and its rival under the same load)."""
    rates: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, work in cases.items():
            began = time.process_time()
            steps, seconds = timed(work)
            cpu[name].append((time.process_time() - began) * 1000 / steps)
            rates[name].append(steps / seconds)
    median = statistics.median
    return (
        {name: median(values) for name, values in rates.items()},
        {name: median(values) for name, values in cpu.items()},
    )


if __name__ == "__main__":
    main()
