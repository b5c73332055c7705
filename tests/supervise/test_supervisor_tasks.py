from __future__ import annotations

import asyncio

import pytest

from engine import Engine, RetryPolicy, SpendingLimit, Spent, StageGaveUp
from engine.errors import RunStopped
from projections import TaskTable
from tests.supervise._helpers import LOOP, FakeTime, failing, kinds, of_type


class TestTask:
    def test_adds_starts_and_completes_a_new_task(self, engine: Engine) -> None:
        """A new task is added, started and completed with the function's result."""
        run = engine.start_run(LOOP)
        sup = engine.supervisor()
        assert sup.task(run, "t-1", lambda n: {"built": n}, 3) == {"built": 3}
        assert kinds(engine, run)[1:] == ["TaskAdded", "TaskStarted", "TaskCompleted"]
        assert dict(run.tasks) == {"t-1": "completed"}

    def test_a_completed_task_is_skipped_with_its_recorded_result(self, store_url: str) -> None:
        """A task completed earlier is not run again, even by a new engine; its result returns."""
        with Engine(store_url) as engine:
            run = engine.start_run(LOOP)
            engine.supervisor().task(run, "t-1", lambda: {"v": 1})
            never = failing(9, AssertionError("ran twice"))
            assert engine.supervisor().task(run, "t-1", never) == {"v": 1}
            assert never.calls["n"] == 0  # type: ignore[attr-defined]
            if store_url != "memory://":
                with Engine(store_url) as restarted:
                    again = restarted.load(run.id)
                    assert restarted.supervisor().task(again, "t-1", never) == {"v": 1}
                    assert never.calls["n"] == 0  # type: ignore[attr-defined]

    def test_a_task_added_with_a_parent_keeps_it(self, engine: Engine) -> None:
        """Tasks added under a feature keep their parent; the supervisor runs them as they are."""
        run = engine.start_run(LOOP)
        run.add_task("feature-1", title="Parser")
        run.add_task("task-1", parent="feature-1", title="tokenizer")
        engine.supervisor().task(run, "task-1", lambda: "ok")
        table = engine.project(run.id, TaskTable)
        assert [t.task_id for t in table.children("feature-1")] == ["task-1"]
        assert [t.task_id for t in table.completed] == ["task-1"]
        assert [t.task_id for t in table.pending] == ["feature-1"]

    def test_failures_are_retried_with_recorded_decisions(self, engine: Engine) -> None:
        """A failing task is TaskFailed, RetryScheduled (stage 'task:<id>'), started again."""
        run = engine.start_run(LOOP)
        fake = FakeTime()
        sup = engine.supervisor(retry=RetryPolicy(delay=2), sleep=fake.sleep, clock=fake.clock)
        assert sup.task(run, "t-1", failing(2, OSError("flaky"))) == "ok"
        assert kinds(engine, run)[1:] == [
            "TaskAdded", "TaskStarted", "TaskFailed", "RetryScheduled", "TaskStarted",
            "TaskFailed", "RetryScheduled", "TaskStarted", "TaskCompleted",
        ]  # fmt: skip
        retry = of_type(engine, run, "RetryScheduled")[1]
        assert (retry.stage, retry.attempt, retry.delay) == ("task:t-1", 3, 4.0)  # type: ignore[attr-defined]
        assert fake.sleeps == [2, 4]
        table = engine.project(run.id, TaskTable)
        assert table.task("t-1").attempts == 3

    def test_gives_up_on_a_task(self, engine: Engine) -> None:
        """A task failing past max_retries raises StageGaveUp ('task:<id>'); it stays failed."""
        run = engine.start_run(LOOP)
        sup = engine.supervisor(retry=RetryPolicy(max_retries=1, delay=0))
        with pytest.raises(StageGaveUp) as raised:
            sup.task(run, "t-9", failing(5, ValueError("bad input")))
        assert (raised.value.stage, raised.value.attempts) == ("task:t-9", 2)
        assert run.tasks["t-9"] == "failed"
        assert of_type(engine, run, "NoteAdded")[-1].value["stage"] == "task:t-9"  # type: ignore[attr-defined]

    def test_a_task_policy_by_task_id_or_stage(self, engine: Engine) -> None:
        """policies may name a task id; else the current stage's policy applies."""
        run = engine.start_run(LOOP)
        sup = engine.supervisor(
            policies={
                "t-1": RetryPolicy(max_retries=0),
                "work": RetryPolicy(max_retries=5, delay=0),
            }
        )
        with pytest.raises(StageGaveUp):
            sup.task(run, "t-1", failing(1, ValueError("x")))
        assert sup.task(run, "t-2", failing(3, ValueError("x"))) == "ok"

    def test_a_timed_out_task_is_recorded_as_timeout(self, engine: Engine) -> None:
        """A task longer than its timeout (by the injected clock) fails with error_type Timeout."""
        run = engine.start_run(LOOP)
        fake = FakeTime()

        def slow() -> str:
            fake.advance(100)
            return "late"

        sup = engine.supervisor(retry=RetryPolicy(timeout=10, max_retries=0), clock=fake.clock)
        with pytest.raises(StageGaveUp):
            sup.task(run, "t-1", slow)
        assert of_type(engine, run, "TaskFailed")[0].error_type == "Timeout"  # type: ignore[attr-defined]

    def test_spent_is_recorded_with_the_completion(self, engine: Engine) -> None:
        """Returning Spent records BudgetSpent and TaskCompleted together and returns the result."""
        run = engine.start_run(LOOP)
        sup = engine.supervisor()
        assert sup.task(run, "t-1", lambda: Spent({"tokens": 900}, 0.25)) == {"tokens": 900}
        assert sup.task(run, "t-2", lambda: Spent(None, 0.5, "usd")) is None
        assert kinds(engine, run)[-2:] == ["BudgetSpent", "TaskCompleted"]
        assert engine.project(run.id, TaskTable).budget == {"usd": 0.75}

    def test_task_async(self, engine: Engine) -> None:
        """An async task function is awaited and retried."""
        run = engine.start_run(LOOP)
        calls = {"n": 0}

        async def fetch() -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ConnectionError("reset")
            return 7

        sup = engine.supervisor(retry=RetryPolicy(delay=0))
        assert asyncio.run(sup.task_async(run, "t-1", fetch)) == 7
        assert run.tasks["t-1"] == "completed"

    def test_child_runs_and_the_task_tree(self, engine: Engine) -> None:
        """Tasks of child runs (parent_run_id) show in the parent's TaskTable over the tree."""
        parent = engine.start_run(LOOP)
        sup = engine.supervisor()
        sup.task(parent, "feature-1", lambda: Spent("planned", 1.0))
        child = engine.start_run(LOOP, parent=parent)
        child.add_task("task-1", parent="feature-1")
        sup.task(child, "task-1", lambda: Spent("built", 2.0))
        child.add_task("task-2", parent="feature-1")
        tree = engine.project(parent.id, TaskTable, tree=True)
        assert {t.task_id for t in tree.completed} == {"feature-1", "task-1"}
        assert [t.task_id for t in tree.pending] == ["task-2"]
        assert tree.budget == {"usd": 3.0}


class TestSpendingLimit:
    def test_work_past_the_limit_is_refused_and_the_run_finishes_with_why(
        self, engine: Engine
    ) -> None:
        """With SpendingLimit(1.0), the task after spending reaches it is not run; run failed."""
        run = engine.start_run(LOOP)
        sup = engine.supervisor(budget=SpendingLimit(limit=1.0, unit="usd"))
        sup.task(run, "t-1", lambda: Spent("draft", 0.6))
        sup.task(run, "t-2", lambda: Spent("review", 0.5))
        never = failing(0, RuntimeError("unused"))
        with pytest.raises(RunStopped) as stopped:
            sup.task(run, "t-3", never)
        assert never.calls["n"] == 0  # type: ignore[attr-defined]
        assert run.status == "failed"
        reason = stopped.value.reason
        assert (reason["rule"], reason["spent"], reason["limit"]) == ("budget", 1.1, 1.0)
        assert reason["detected"] == "spent 1.1 usd of a 1 usd limit"
        assert of_type(engine, run, "RunFinished")[0].reason == reason  # type: ignore[attr-defined]

    def test_other_units_do_not_count(self, engine: Engine) -> None:
        """Spending in another unit leaves a usd limit untouched."""
        run = engine.start_run(LOOP)
        run.spend(5_000, "tokens")
        sup = engine.supervisor(budget=SpendingLimit(limit=1.0))
        assert sup.execute(run, "work", lambda: "done") == "done"
        assert run.status == "running"

    def test_a_tree_limit_counts_what_the_whole_tree_spent(self, engine: Engine) -> None:
        """scope="tree": spending by the parent and a sibling child stops work in another child."""
        root = engine.start_run(LOOP)
        first, second = (engine.start_run(LOOP, parent=root) for _ in range(2))
        sup = engine.supervisor(budget=SpendingLimit(limit=1.0, scope="tree"))
        sup.task(root, "plan", lambda: Spent("plan", 0.25))
        sup.task(first, "t-1", lambda: Spent("built", 0.5))
        sup.task(second, "t-2", lambda: Spent("built", 0.25))
        never = failing(0, RuntimeError("unused"))
        with pytest.raises(RunStopped) as stopped:
            sup.task(second, "t-3", never)
        assert never.calls["n"] == 0  # type: ignore[attr-defined]
        assert (second.status, first.status, root.status) == ("failed", "running", "running")
        assert stopped.value.reason["detected"] == "spent 1 usd by the run's tree of a 1 usd limit"
        assert stopped.value.reason["scope"] == "tree"

    def test_a_run_limit_ignores_the_rest_of_the_tree(self, engine: Engine) -> None:
        """scope="run" (the default): a child's limit counts only the child's own spending."""
        root = engine.start_run(LOOP)
        root.spend(5.0)
        child = engine.start_run(LOOP, parent=root)
        sup = engine.supervisor(budget=SpendingLimit(limit=1.0))
        assert sup.task(child, "t-1", lambda: Spent("built", 0.5)) == "built"

    def test_a_scope_must_be_run_or_tree(self) -> None:
        """SpendingLimit(scope=...) refuses anything but "run" and "tree", naming the field."""
        with pytest.raises(ValueError, match="scope must be 'run' or 'tree', got 'pipeline'"):
            SpendingLimit(limit=1.0, scope="pipeline")

    @pytest.mark.parametrize("limit", [0, -1.0, float("inf"), "1"])
    def test_a_limit_must_be_a_positive_number(self, limit: object) -> None:
        """SpendingLimit(limit=...) refuses zero, negatives, infinity and non-numbers."""
        with pytest.raises(ValueError, match="limit must be a finite number > 0"):
            SpendingLimit(limit=limit)  # type: ignore[arg-type]
