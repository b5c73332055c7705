"""A task coordinator that resumes after a crash without redoing work, within a budget.

Follows design 003 ("State Management & Checkpoint Analysis"): a coordinator
splits the project into features, and a feature coordinator (a child run per
feature) builds the feature's tasks. Instead of checkpoint files whose
``completedTasks`` can come out empty, every task is events: ``TaskAdded``,
``TaskStarted``, ``TaskCompleted`` with its cost (``Spent``) in the same
transaction. Each feature's child run comes from ``engine.child_run(run,
FEATURE, key=feature)``: started the first time, the same run when asked
again. The process dies half-way through a task; ``engine.resume(run_id,
tree=True)`` closes what the crash left open in the whole tree, and a second
pass finds the same child runs and skips every completed task. ``TaskTable``
across the tree gives the completed, pending and failed tasks and the budget,
each task counted once.

Run it from the repository root: ``python examples/task_coordinator.py [STORE_URL]``
(default ``sqlite:///stagetrail.db``, the store ``stagetrail show`` reads).
"""

from __future__ import annotations

import sys
from functools import partial
from typing import Any
from uuid import UUID

from engine import Engine, Pipeline, SpendingLimit, Spent, StageContext
from engine.cli.demo.simulated import SimulatedTime
from projections import TaskTable

COORDINATOR = Pipeline(
    "coordinator",
    initial="plan",
    transitions=[
        ("plan", "completed", "build"),
        ("build", "completed", "done"),
        ("build", "failed", "build"),
    ],
    final=["done"],
)
FEATURE = Pipeline(
    "feature-coordinator",
    initial="tasks",
    transitions=[("tasks", "completed", "integrated"), ("tasks", "failed", "tasks")],
    final=["integrated"],
)
FEATURES = {
    "feature-rom": ["task-001", "task-002"],
    "feature-cpu": ["task-003", "task-004", "task-005"],
    "feature-ppu": ["task-006", "task-007"],
}
TASK_COST = 0.25  # usd per task


class ProcessCrash(BaseException):
    """The process dies: nothing after it is recorded, as if it had been killed."""


class Coordinator:
    """The coordinator's stages and the feature coordinators' tasks, under one supervisor."""

    def __init__(self, engine: Engine, crash_at: str | None = None) -> None:
        time = SimulatedTime()
        self.engine, self.crash_at, self.built = engine, crash_at, list[str]()
        self.sup = engine.supervisor(
            budget=SpendingLimit(limit=2.0, unit="usd", scope="tree"),
            clock=time.clock,
            sleep=time.sleep,
        )

    def plan(self, context: StageContext) -> dict[str, Any]:
        """Add the features, all or nothing."""
        if not context.run.tasks:
            with context.run.batch():
                for feature in FEATURES:
                    context.run.add_task(feature, title=feature.removeprefix("feature-"))
        return {"features": list(FEATURES)}

    def build(self, context: StageContext) -> dict[str, Any]:
        """Build each feature in a child run of its own, then close the feature."""
        for feature, tasks in FEATURES.items():
            # The feature's child run: started the first time, found again after a restart.
            child = self.engine.child_run(context.run, FEATURE, key=feature)
            self.sup.drive(child, {"tasks": partial(self.tasks, feature=feature, tasks=tasks)})
            self.sup.task(context.run, feature, lambda child=child: {"run": str(child.id)})
        return {"built": len(FEATURES)}

    def tasks(self, context: StageContext, feature: str, tasks: list[str]) -> dict[str, Any]:
        """Run the feature's tasks; a task completed before is not run again."""
        if not context.run.tasks:
            with context.run.batch():
                for task in tasks:
                    context.run.add_task(task, parent=feature)
        return {"results": [self.sup.task(context.run, task, self.task, task) for task in tasks]}

    def task(self, task: str) -> Spent:
        """Build one task and say what it cost."""
        if task == self.crash_at:
            raise ProcessCrash(f"killed while building {task}")
        self.built.append(task)
        return Spent({"task": task, "files": 2}, TASK_COST)


def main(url: str = "sqlite:///stagetrail.db") -> list[UUID]:
    """Start a coordinator, crash it in task-005, resume the tree and finish it."""
    with Engine(url) as engine:
        run = engine.start_run(COORDINATOR, params={"project": "nes-emulator"})
        first = Coordinator(engine, crash_at="task-005")
        try:
            first.sup.drive(run, {"plan": first.plan, "build": first.build})
        except ProcessCrash as crash:
            print(f"run {run.id}: {crash} after building {first.built}")
        resumed = engine.resume(run.id, tree=True)
        second = Coordinator(engine)
        second.sup.drive(resumed, {"plan": second.plan, "build": second.build})
        table = engine.project(run.id, TaskTable, tree=True)
        print(f"resumed: built {second.built}, run ended {resumed.status}")
        for task in table.tasks:
            where = f"  {str(task.run_id)[:8]}  {task.parent_id or '-':12} {task.task_id:12}"
            print(f"{where} {task.status}, attempts: {task.attempts}")
        done, runs = len(table.completed), len(table.runs)
        print(f"{done} of {len(table.tasks)} tasks completed in {runs} runs, budget {table.budget}")
        return list(table.runs)


if __name__ == "__main__":
    main(*sys.argv[1:2])
