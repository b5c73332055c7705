"""Supervised tasks at scale: the cost of `Supervisor.task` as a run's task table grows.

For each size N (100, 1,000, 10,000, 100,000) one run of a pipeline whose single
stage coordinates tasks records N no-op tasks through ``sup.task(run, f"task-{i}",
noop)`` on the memory store (no I/O: the engine's own CPU cost). Each call is
timed alone; the figure is the median over the last 10% of the loop, so it is the
marginal cost of a task added when the run already holds about N tasks, and a
cost that grows with the task table shows. Small sizes are repeated on fresh
runs and their samples pooled, to steady the median; three rounds over all sizes,
interleaved, and each size's figure is its best round (other load only adds).

Target: the 100,000-task figure <= 1.5 times the 100-task figure (flat: O(1) per
task). A SQLite-file figure (each event a durable commit) at 100 and 1,000 tasks
is printed for reference, without a target.

Run: ``python -m benchmarks.tasks`` (about 25 seconds; ``--quick`` for sizes 100
and 1,000 only, a few seconds; ``--json`` for machine output).
"""

from __future__ import annotations

import gc
import statistics
import time

from benchmarks._common import arguments, report, scratch
from engine import Engine, Pipeline

TARGET = 1.5
SIZES = (100, 1_000, 10_000, 100_000)
QUICK_SIZES = (100, 1_000)
SQLITE_SIZES = (100, 1_000)
SAMPLES = {"memory": 500, "sqlite": 100}
"""At least this many timed tasks per size and store in a round: small sizes repeat runs."""
ROUNDS = {"memory": 3, "sqlite": 1}
"""Rounds over every size, interleaved; a size's figure is its best round (noise only adds)."""

COORDINATOR = Pipeline(
    "bench-tasks",
    initial="coordinate",
    transitions=[("coordinate", "completed", "done"), ("coordinate", "failed", "coordinate")],
    final=["done"],
)
"""One stage that coordinates the tasks; the tasks are recorded while it is current."""


def noop() -> None:
    """The task function: nothing to do."""


def task_costs(url: str, tasks: int) -> list[float]:
    """Seconds of each of the last 10% of `tasks` supervised no-op tasks in one new run."""
    with Engine(url) as engine:
        run = engine.start_run(COORDINATOR)
        sup = engine.supervisor()
        clock = time.perf_counter
        costs = []
        for i in range(tasks):
            began = clock()
            sup.task(run, f"task-{i}", noop)
            costs.append(clock() - began)
        assert run.version == 1 + 3 * tasks  # TaskAdded, TaskStarted, TaskCompleted each
    return costs[-max(1, tasks // 10) :]


def round_median(store: str, tasks: int) -> float:
    """Median µs per task over the last 10% of the tasks of each run in one round."""
    samples: list[float] = []
    gc.collect()  # the garbage of the round before is not collected on this one's time
    while len(samples) < SAMPLES[store]:
        url = "memory://" if store == "memory" else f"sqlite:///{scratch('tasks.db')}"
        samples.extend(task_costs(url, tasks))
    return statistics.median(samples) * 1e6


def measure(store: str, sizes: tuple[int, ...]) -> list[dict[str, object]]:
    """One row per size: its best round's median µs per task, and every round's."""
    rounds: dict[int, list[float]] = {tasks: [] for tasks in sizes}
    for _ in range(ROUNDS[store]):
        for tasks in sizes:
            rounds[tasks].append(round_median(store, tasks))
    name = {"memory": "memory", "sqlite": "SQLite file, durable"}[store]
    return [{"case": f"supervised task at {tasks:,} tasks ({name})", "tasks": tasks,
             "store": store, "us_per_task": min(medians),
             "rounds": [round(median, 1) for median in medians]}
            for tasks, medians in rounds.items()]  # fmt: skip


def main() -> None:
    args = arguments(__doc__ or "")
    sizes = QUICK_SIZES if args.quick else SIZES
    rows = measure("memory", sizes) + measure("sqlite", SQLITE_SIZES)
    first, last = rows[0]["us_per_task"], rows[len(sizes) - 1]["us_per_task"]
    ratio = float(last) / float(first)  # type: ignore[arg-type]
    rows.append({
        "case": f"flatness: µs per task at {sizes[-1]:,} / at {sizes[0]:,} tasks (memory)",
        "ratio": round(ratio, 3), "target": f"<= {TARGET}x",
        "met": ratio <= TARGET if sizes == SIZES else None,
    })  # fmt: skip
    title = "supervised tasks (µs per task: median of the last 10% of each run, best round)"
    report(title, rows, args.json)


if __name__ == "__main__":
    main()
