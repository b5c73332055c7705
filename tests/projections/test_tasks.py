from __future__ import annotations

import json
import uuid

import pytest

from events import (
    INTERRUPTED,
    JSON,
    BudgetSpent,
    Event,
    RunStarted,
    TaskAdded,
    TaskCompleted,
    TaskFailed,
    TaskStarted,
)
from projections.tasks import Task, Tasks, TaskTable
from tests._helpers import REVIEW

PARENT = uuid.UUID(int=10)
CHILD = uuid.UUID(int=11)
PROJECTION = TaskTable()


def add(
    version: int, task_id: str, parent: str | None = None, run: uuid.UUID = PARENT
) -> TaskAdded:
    return TaskAdded(run_id=run, version=version, task_id=task_id, parent_id=parent, title=task_id)


def begin(version: int, task_id: str, run: uuid.UUID = PARENT) -> TaskStarted:
    return TaskStarted(run_id=run, version=version, task_id=task_id)


def complete(
    version: int, task_id: str, result: JSON = None, run: uuid.UUID = PARENT
) -> TaskCompleted:
    return TaskCompleted(run_id=run, version=version, task_id=task_id, result=result)


def failed(version: int, task_id: str, run: uuid.UUID = PARENT) -> TaskFailed:
    return TaskFailed(
        run_id=run, version=version, task_id=task_id, error="no", error_type="IOError"
    )


def spend(version: int, amount: float, unit: str, run: uuid.UUID = PARENT) -> BudgetSpent:
    return BudgetSpent(run_id=run, version=version, amount=amount, unit=unit)


def fold(*events: Event) -> Tasks:
    return PROJECTION.fold(events)


def roundtrip(state: Tasks) -> Tasks:
    return PROJECTION.decode(json.loads(json.dumps(PROJECTION.encode(state), allow_nan=False)))


def ids(tasks: tuple[Task, ...]) -> list[str]:
    return [task.task_id for task in tasks]


HIERARCHY = (
    RunStarted(run_id=PARENT, version=1, pipeline="code-review", table=REVIEW.to_dict()),
    add(2, "feature"),
    add(3, "t1", "feature"),
    add(4, "t2", "feature"),
    add(5, "t3", "feature"),
    begin(6, "t1"),
    complete(7, "t1", {"ok": 1}),
    begin(8, "t2"),
    failed(9, "t2"),
    begin(10, "t3"),
)


class TestTaskTable:
    def test_added_task_is_pending(self) -> None:
        """TaskAdded records a pending task with its parent, title and no attempts."""
        task = fold(add(2, "t1", "f")).task("t1")
        assert task == Task(PARENT, "t1", "f", "t1", "pending", None, None, None, 0)

    def test_lifecycle(self) -> None:
        """Start, failure, restart and completion move the status and count attempts."""
        state = fold(add(2, "t"), begin(3, "t"), failed(4, "t"))
        task = state.task("t")
        assert (task.status, task.attempts, task.error, task.error_type) == (
            "failed",
            1,
            "no",
            "IOError",
        )
        state = PROJECTION.fold([begin(5, "t"), complete(6, "t", [1, 2])], state)
        task = state.task("t")
        assert (task.status, task.attempts, task.result) == ("completed", 2, [1, 2])
        assert (task.error, task.error_type) == (None, None)

    def test_started_task_is_active(self) -> None:
        """A started task without an outcome is active."""
        assert fold(add(2, "t"), begin(3, "t")).task("t").status == "active"

    def test_lists_by_status_in_order_added(self) -> None:
        """completed, pending, active and failed list tasks in the order they were added."""
        state = PROJECTION.fold([add(11, "t0"), complete(12, "t0")], fold(*HIERARCHY))
        assert ids(state.completed) == ["t1", "t0"]
        assert ids(state.pending) == ["feature"]
        assert ids(state.active) == ["t3"]
        assert ids(state.failed) == ["t2"]
        assert ids(state.tasks) == ["feature", "t1", "t2", "t3", "t0"]

    def test_unknown_tasks_skipped(self) -> None:
        """Start, completion or failure of a task never added is skipped without raising."""
        state = fold(add(2, "t"))
        after = PROJECTION.fold([begin(3, "x"), complete(4, "y"), failed(5, "z")], state)
        assert after == state
        with pytest.raises(KeyError):
            after.task("x")

    def test_duplicate_add_ignored(self) -> None:
        """A second TaskAdded of the same task in the same run leaves the first one."""
        state = fold(add(2, "t", "p1"), begin(3, "t"), add(4, "t", "p2"))
        assert state.task("t").parent_id == "p1"
        assert state.task("t").status == "active"
        assert len(state.tasks) == 1

    def test_missing_task_raises_naming_it(self) -> None:
        """task() of an unknown id raises KeyError naming the task."""
        with pytest.raises(KeyError, match="ghost"):
            fold(add(2, "t")).task("ghost")
        with pytest.raises(KeyError, match="t"):
            fold(add(2, "t")).task("t", CHILD)

    def test_same_id_in_two_runs(self) -> None:
        """The same task id in two runs are two tasks; task() needs the run_id to choose."""
        state = fold(add(2, "t"), add(2, "t", run=CHILD), complete(3, "t", run=CHILD))
        with pytest.raises(KeyError, match="give its run_id"):
            state.task("t")
        assert state.task("t", PARENT).status == "pending"
        assert state.task("t", CHILD).status == "completed"
        assert len(state.tasks) == 2

    def test_children(self) -> None:
        """children() lists the tasks added under a parent, in order, across runs or in one."""
        state = PROJECTION.fold(
            [add(2, "c1", "feature", run=CHILD), add(3, "c0", "other", run=CHILD)],
            fold(*HIERARCHY),
        )
        assert ids(state.children("feature")) == ["t1", "t2", "t3", "c1"]
        assert ids(state.children("feature", CHILD)) == ["c1"]
        assert state.children("t1") == ()

    def test_budget(self) -> None:
        """BudgetSpent amounts add up per unit, across runs."""
        state = fold(spend(2, 0.5, "usd"), spend(3, 100, "tokens"), spend(2, 0.25, "usd", CHILD))
        assert state.budget == {"usd": 0.75, "tokens": 100.0}

    def test_runs_in_order_seen(self) -> None:
        """runs lists each run whose events were folded once, in the order first seen."""
        state = fold(*HIERARCHY, spend(2, 1.0, "usd", CHILD), add(3, "x", run=CHILD))
        assert state.runs == (PARENT, CHILD)

    def test_earlier_state_unchanged(self) -> None:
        """A task event leaves an earlier state's tasks as they were."""
        before = fold(add(2, "t"))
        PROJECTION.apply(before, begin(3, "t"))
        assert before.task("t").status == "pending"

    def test_roundtrip(self) -> None:
        """Tasks of two runs, budget and runs survive encode, strict JSON and decode."""
        state = PROJECTION.fold(
            [add(2, "t1", "feature", CHILD), failed(3, "t1", CHILD), spend(4, 1.5, "usd", CHILD)],
            fold(*HIERARCHY),
        )
        decoded = roundtrip(state)
        assert decoded == state
        assert decoded.tasks == state.tasks
        assert ids(decoded.children("feature")) == ["t1", "t2", "t3", "t1"]
        assert decoded.runs == (PARENT, CHILD)
        assert roundtrip(fold()) == fold()

    def test_decoded_state_folds_on(self) -> None:
        """A decoded table keeps its indexes, so later events find their tasks."""
        decoded = roundtrip(fold(*HIERARCHY))
        after = PROJECTION.apply(decoded, complete(11, "t3"))
        assert ids(after.completed) == ["t1", "t3"]
        assert after.task("t3").attempts == 1


class TestTaskFailures:
    def test_failures_and_interruptions_are_counted(self) -> None:
        """Every TaskFailed counts a failure; an Interrupted one counts an interruption too."""
        cut = TaskFailed(
            run_id=PARENT, version=4, task_id="a", error="killed", error_type=INTERRUPTED
        )
        state = fold(add(1, "a"), begin(2, "a"), failed(3, "a"), cut, begin(5, "a"))
        task = state.task("a")
        assert (task.failures, task.interruptions, task.attempts) == (2, 1, 2)
        assert roundtrip(state).task("a") == task
