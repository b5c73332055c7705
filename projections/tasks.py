"""The task table: every task's status across a task hierarchy and across runs.

A `TaskTable` may fold a parent run together with its child runs, so tasks are
keyed by `(run_id, task_id)`. Tasks live in hash-trie maps and an insertion-order
persistent list: a task event costs the same with 100 or 100,000 tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

import attrs

from events import (
    INTERRUPTED,
    JSON,
    BudgetSpent,
    RunStarted,
    TaskAdded,
    TaskCompleted,
    TaskFailed,
    TaskStarted,
)
from events.values import evolve
from projections.base import Projection, on
from projections.immutable import PList, PMap

TASK_STATUSES = ("pending", "active", "completed", "failed")
"""The statuses a task may have."""

Key = tuple[UUID, str]
"""A task's identity: (run_id, task_id)."""


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Task:
    """One task: where it sits in the hierarchy, its status, its last outcome, its failures.

    `failures` counts every `TaskFailed`; `interruptions` those a crash cut short.
    """

    run_id: UUID
    task_id: str
    parent_id: str | None = None
    title: str = ""
    status: str = "pending"
    result: JSON = None
    error: str | None = None
    error_type: str | None = None
    attempts: int = 0
    failures: int = 0
    interruptions: int = 0

    @property
    def key(self) -> Key:
        """The task's identity in a table: (run_id, task_id)."""
        return (self.run_id, self.task_id)


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Tasks:
    """Every task seen, the budget spent and the runs folded."""

    table: PMap[Key, Task] = attrs.field(factory=PMap)
    order: PList[Key] = attrs.field(factory=PList)
    runs_by_task: PMap[str, tuple[UUID, ...]] = attrs.field(factory=PMap)
    children_by_parent: PMap[str, PList[Key]] = attrs.field(factory=PMap)
    budget: Mapping[str, float] = attrs.field(factory=dict)
    run_set: PMap[UUID, bool] = attrs.field(factory=PMap)
    run_list: PList[UUID] = attrs.field(factory=PList)

    def task(self, task_id: str, run_id: UUID | None = None) -> Task:
        """The task `task_id` (of run `run_id`; optional when only one run has it).

        Raises:
            KeyError: no such task, or several runs have it and `run_id` is not given.
        """
        if run_id is not None:
            found = self.table.get((run_id, task_id))
            if found is None:
                raise KeyError(f"no task {task_id!r} in run {run_id}")
            return found
        runs = self.runs_by_task.get(task_id, ())
        if not runs:
            raise KeyError(f"no task {task_id!r}")
        if len(runs) > 1:
            raise KeyError(f"task {task_id!r} is in {len(runs)} runs; give its run_id")
        return self.table[(runs[0], task_id)]

    @property
    def tasks(self) -> tuple[Task, ...]:
        """Every task, in the order they were added."""
        return tuple(self.table[key] for key in self.order)

    def with_status(self, status: str) -> tuple[Task, ...]:
        """The tasks whose status is `status`, in the order they were added."""
        return tuple(task for task in self.tasks if task.status == status)

    @property
    def completed(self) -> tuple[Task, ...]:
        """The completed tasks, in the order they were added."""
        return self.with_status("completed")

    @property
    def pending(self) -> tuple[Task, ...]:
        """The tasks not started yet, in the order they were added."""
        return self.with_status("pending")

    @property
    def active(self) -> tuple[Task, ...]:
        """The tasks being worked on, in the order they were added."""
        return self.with_status("active")

    @property
    def failed(self) -> tuple[Task, ...]:
        """The tasks whose latest outcome is a failure, in the order they were added."""
        return self.with_status("failed")

    def children(self, task_id: str, run_id: UUID | None = None) -> tuple[Task, ...]:
        """The tasks added under `task_id` (in any run, or in `run_id`), in order added."""
        keys = self.children_by_parent.get(task_id, PList())
        return tuple(self.table[key] for key in keys if run_id is None or key[0] == run_id)

    @property
    def runs(self) -> tuple[UUID, ...]:
        """The ids of the runs whose events were folded, in the order first seen."""
        return self.run_list.to_tuple()

    def seen(self, run_id: UUID) -> Tasks:
        """The table with `run_id` among its runs."""
        if run_id in self.run_set:
            return self
        return evolve(
            self, run_set=self.run_set.set(run_id, True), run_list=self.run_list.push(run_id)
        )

    def added(self, task: Task) -> Tasks:
        """The table with a new `task` (unchanged if it is there already)."""
        if task.key in self.table:
            return self
        parent = task.parent_id
        return evolve(
            self,
            table=self.table.set(task.key, task),
            order=self.order.push(task.key),
            runs_by_task=self.runs_by_task.set(
                task.task_id, (*self.runs_by_task.get(task.task_id, ()), task.run_id)
            ),
            children_by_parent=(
                self.children_by_parent
                if parent is None
                else self.children_by_parent.set(
                    parent, self.children_by_parent.get(parent, PList()).push(task.key)
                )
            ),
        )

    def changed(self, key: Key, **changes: Any) -> Tasks:
        """The table with the task `key` changed (unchanged if there is no such task)."""
        task = self.table.get(key)
        if task is None:
            return self
        return evolve(self, table=self.table.set(key, evolve(task, **changes)))


class TaskTable(Projection[Tasks]):
    """Tasks by status across the hierarchy and child runs, and the budget spent."""

    def initial(self) -> Tasks:
        """No tasks, no budget, no runs."""
        return Tasks()

    @on(RunStarted)
    def started(self, state: Tasks, event: RunStarted) -> Tasks:
        """Note the run."""
        return state.seen(event.run_id)

    @on(TaskAdded)
    def task_added(self, state: Tasks, event: TaskAdded) -> Tasks:
        """Add a pending task (a second add of the same task is ignored)."""
        task = Task(event.run_id, event.task_id, event.parent_id, event.title)
        return state.seen(event.run_id).added(task)

    @on(TaskStarted)
    def task_started(self, state: Tasks, event: TaskStarted) -> Tasks:
        """Mark the task active and count the attempt (unknown tasks are skipped)."""
        key = _key(event)
        task = state.table.get(key)
        attempts = 1 if task is None else task.attempts + 1
        return state.seen(event.run_id).changed(key, status="active", attempts=attempts)

    @on(TaskCompleted)
    def task_completed(self, state: Tasks, event: TaskCompleted) -> Tasks:
        """Mark the task completed with its result."""
        return state.seen(event.run_id).changed(
            _key(event), status="completed", result=event.result, error=None, error_type=None
        )

    @on(TaskFailed)
    def task_failed(self, state: Tasks, event: TaskFailed) -> Tasks:
        """Mark the task failed with its error; count the failure (and an interruption)."""
        key = _key(event)
        task = state.table.get(key)
        failures, interruptions = (0, 0) if task is None else (task.failures, task.interruptions)
        return state.seen(event.run_id).changed(
            key,
            status="failed",
            result=None,
            error=event.error,
            error_type=event.error_type,
            failures=failures + 1,
            interruptions=interruptions + (event.error_type == INTERRUPTED),
        )

    @on(BudgetSpent)
    def spent(self, state: Tasks, event: BudgetSpent) -> Tasks:
        """Add the amount to its unit's total."""
        budget = {**state.budget, event.unit: state.budget.get(event.unit, 0.0) + event.amount}
        return evolve(state.seen(event.run_id), budget=budget)

    def encode(self, state: Tasks) -> JSON:
        """Tasks in the order added, the budget and the runs, as JSON."""
        return {
            "tasks": [_encode_task(task) for task in state.tasks],
            "budget": dict(state.budget),
            "runs": [str(run_id) for run_id in state.run_list],
        }

    def decode(self, data: JSON) -> Tasks:
        """The table `encode` turned into `data`."""
        state = Tasks()
        for run_id in data["runs"]:
            state = state.seen(UUID(run_id))
        for task in data["tasks"]:
            state = state.added(Task(**{**task, "run_id": UUID(task["run_id"])}))
        return evolve(state, budget=data["budget"])


def _key(event: TaskStarted | TaskCompleted | TaskFailed) -> Key:
    return (event.run_id, event.task_id)


def _encode_task(task: Task) -> dict[str, JSON]:
    data: dict[str, JSON] = attrs.asdict(task, recurse=False)
    data["run_id"] = str(task.run_id)
    return data
