"""What a retry budget counts: routed failures, crashes, rolled-back failures, the run."""

from __future__ import annotations

from typing import Any

import pytest

from engine import Engine, Outcome, Pipeline, RetryPolicy, StageContext, StageGaveUp
from tests.supervise._helpers import LOOP, FakeTime, failing, kinds, of_type

TESTING = Pipeline(
    "testing-retrying",
    initial="testing",
    transitions=[
        ("testing", "completed", "done"),
        ("testing", "failed", "retrying"),
        ("retrying", "again", "testing"),
        ("retrying", "give_up", "aborted"),
    ],
    final=["done", "aborted"],
)
"""A failure of testing goes to a stage that decides whether to try again."""


def supervise(engine: Engine, **policy: Any) -> Any:
    """A supervisor with a fake clock and the given retry policy settings."""
    fake = FakeTime()
    return engine.supervisor(retry=RetryPolicy(delay=0, **policy), sleep=fake.sleep)


def interrupted(engine: Engine, run: Any, times: int, task: str | None = None) -> Any:
    """Simulate `times` crashes mid-attempt (of the current stage, or of `task`), each resumed."""
    for _ in range(times):
        if task is None:
            run.stage_started(run.state)
        else:
            run.task_started(task)
        run = engine.resume(run.id)
    return run


class TestRoutedFailures:
    def test_the_stage_a_failure_is_routed_to_decides(self, engine: Engine) -> None:
        """With max_retries=1, two routed failures of testing both reach retrying, which ends it."""
        visits: list[int] = []

        def retrying(context: StageContext) -> Outcome:
            visits.append(len(visits) + 1)
            return Outcome("again" if len(visits) < 2 else "give_up")

        run = engine.start_run(TESTING)
        stages = {"testing": failing(99, AssertionError("regression")), "retrying": retrying}
        supervise(engine, max_retries=1).drive(run, stages)
        assert visits == [1, 2]
        assert (run.state, run.status) == ("aborted", "failed")
        assert "gave_up" not in [n.key for n in of_type(engine, run, "NoteAdded")]  # type: ignore[attr-defined]

    def test_routed_failures_still_end_a_loop_by_default(self, engine: Engine) -> None:
        """count_routed=True (default): testing's budget, spent by routed failures, ends a loop."""
        run = engine.start_run(TESTING)
        stages = {
            "testing": failing(99, AssertionError("regression")),
            "retrying": lambda context: Outcome("again"),
        }
        with pytest.raises(StageGaveUp) as raised:
            supervise(engine, max_retries=2).drive(run, stages)
        assert raised.value.cause == "budget_spent"
        assert kinds(engine, run).count("StageFailed") == 3

    def test_count_routed_false_leaves_the_loop_to_the_table(self, engine: Engine) -> None:
        """count_routed=False: routed failures spend nothing; only the table ends the loop."""
        rounds = iter(["again"] * 5 + ["give_up"])
        run = engine.start_run(TESTING)
        stages = {
            "testing": failing(99, AssertionError("regression")),
            "retrying": lambda context: Outcome(next(rounds)),
        }
        supervise(engine, max_retries=1, count_routed=False).drive(run, stages)
        assert run.state == "aborted"
        assert kinds(engine, run).count("StageFailed") == 6


class TestInterruptions:
    def test_a_stage_cut_short_by_crashes_is_not_spent(self, engine: Engine) -> None:
        """Four crashes of an attempt (Interrupted) leave a max_retries=3 budget whole."""
        run = interrupted(engine, engine.start_run(LOOP), 4)
        assert kinds(engine, run).count("StageFailed") == 4
        assert supervise(engine, max_retries=3).execute(run, "work", lambda: "built") == "built"

    def test_count_interrupted_spends_the_budget_on_crashes(self, engine: Engine) -> None:
        """count_interrupted=True: the same four crashes spend the budget; nothing is called."""
        run = interrupted(engine, engine.start_run(LOOP), 4)
        never = failing(0, RuntimeError("unused"))
        with pytest.raises(StageGaveUp, match="4 failures in a row"):
            supervise(engine, max_retries=3, count_interrupted=True).execute(run, "work", never)
        assert never.calls["n"] == 0  # type: ignore[attr-defined]

    def test_a_task_killed_four_times_still_runs_on_resume(self, engine: Engine) -> None:
        """A coordinator killed 4 times mid-task runs the task again, not `failed` for good."""
        run = engine.start_run(LOOP)
        run.add_task("t-1")
        run = interrupted(engine, run, 4, task="t-1")
        assert supervise(engine, max_retries=3).task(run, "t-1", lambda: "done") == "done"
        assert run.tasks["t-1"] == "completed"


class TestRollbacks:
    def fail_then_roll_back(self, engine: Engine, failures: int) -> Any:
        """A run whose `work` failed `failures` times, all then rolled back."""
        run = engine.start_run(LOOP)
        for _ in range(failures):
            run.stage_failed("work", "flaky")
        run.rollback(failures, "the inputs were wrong")
        return run

    def test_rolled_back_failures_are_forgotten(self, engine: Engine) -> None:
        """Three failures taken off the stack leave a max_retries=2 budget whole."""
        run = self.fail_then_roll_back(engine, 3)
        assert supervise(engine, max_retries=2).execute(run, "work", lambda: "ok") == "ok"

    def test_forget_rolled_back_false_keeps_counting_them(self, engine: Engine) -> None:
        """forget_rolled_back=False: the rolled-back failures still spend the budget."""
        run = self.fail_then_roll_back(engine, 3)
        with pytest.raises(StageGaveUp, match="3 failures in a row"):
            supervise(engine, max_retries=2, forget_rolled_back=False).execute(
                run, "work", lambda: "ok"
            )

    def test_a_rolled_back_completion_brings_back_the_failures_before_it(
        self, engine: Engine
    ) -> None:
        """Rolling back a completion restores the streak it had reset."""
        run = engine.start_run(LOOP)
        run.stage_failed("work", "one")
        run.stage_failed("work", "two")
        run.stage_completed("work", outcome="partial")
        run.rollback(1, "the check was skipped")
        with pytest.raises(StageGaveUp, match="2 failures in a row"):
            supervise(engine, max_retries=1).execute(run, "work", lambda: "ok")


class TestRunWideBudget:
    def test_budget_run_counts_every_stage(self, engine: Engine) -> None:
        """budget="run": failures of work and of check together spend max_retries."""
        run = engine.start_run(LOOP)
        run.stage_failed("work", "w1")
        run.stage_completed("work", outcome="partial")
        run.stage_failed("check", "c1")  # back to work
        sup = supervise(engine, max_retries=2, budget="run", count_routed=True)
        assert sup.execute(run, "work", lambda: Outcome("partial")) is None
        with pytest.raises(StageGaveUp) as routed:
            sup.execute(run, "check", failing(9, AssertionError("still broken")))
        assert routed.value.cause == "routed"
        with pytest.raises(StageGaveUp, match="3 failures in the run"):
            sup.execute(run, "work", lambda: "ok")
        assert kinds(engine, run).count("StageFailed") == 3

    def test_the_choices_are_recorded_with_each_decision(self, engine: Engine) -> None:
        """Every RetryScheduled carries the budget choices of the policy that decided it."""
        run = engine.start_run(LOOP)
        supervise(engine, max_retries=2).execute(run, "work", failing(1, ValueError("x")))
        policy = of_type(engine, run, "RetryScheduled")[0].policy  # type: ignore[attr-defined]
        assert (policy["budget"], policy["count_routed"]) == ("stage", True)
        assert (policy["count_interrupted"], policy["forget_rolled_back"]) == (False, True)

    def test_an_unknown_budget_is_refused(self) -> None:
        """budget must be "stage" or "run"; anything else names the field."""
        with pytest.raises(ValueError, match="budget must be 'stage' or 'run'"):
            RetryPolicy(budget="week")


class TestReviewFindings:
    def test_rolled_back_failures_after_a_rolled_back_completion_still_count(
        self, engine: Engine
    ) -> None:
        """forget_rolled_back=False: undoing a completion keeps the failures undone after it."""
        run = engine.start_run(LOOP)
        run.stage_failed("work", "F1")
        run.stage_completed("work", outcome="partial")
        run.stage_failed("check", "routed back to work")
        run.stage_failed("work", "F2")
        run.rollback(3, "all of it")
        assert run.state == "work"
        with pytest.raises(StageGaveUp, match="2 failures in a row"):
            supervise(engine, max_retries=1, forget_rolled_back=False).execute(
                run, "work", lambda: "ok"
            )

    def test_a_mapped_outcome_without_a_row_records_failed(self, engine: Engine) -> None:
        """An outcomes= mapping the table has no row for falls back to "failed": no open attempt."""
        run = engine.start_run(LOOP)
        policy = {"outcomes": {KeyError: "error_occurred"}, "max_retries": 0}
        with pytest.raises(StageGaveUp):
            supervise(engine, **policy).execute(run, "work", failing(1, KeyError("k")))
        failed = of_type(engine, run, "StageFailed")[0]
        assert failed.outcome == "failed"  # type: ignore[attr-defined]
        assert run.machine.open_attempt is None

    def test_a_task_retry_names_its_real_attempt_after_crashes(self, engine: Engine) -> None:
        """After two interrupted attempts, the retry of the third failure is attempt 4."""
        run = engine.start_run(LOOP)
        run.add_task("t-1")
        run = interrupted(engine, run, 2, task="t-1")
        sup = supervise(engine, max_retries=3)
        assert sup.task(run, "t-1", failing(1, RuntimeError("flaky"), "done")) == "done"
        retry = of_type(engine, run, "RetryScheduled")[0]
        assert retry.attempt == 4  # type: ignore[attr-defined]

    def test_no_attempt_is_opened_that_an_unmapped_error_could_not_close(
        self, engine: Engine
    ) -> None:
        """Without a "failed" row, only a catch-all mapping opens attempts; others stay closed."""
        table = Pipeline(
            "mapped-only",
            initial="call",
            transitions=[("call", "error_occurred", "call"), ("call", "completed", "done")],
            final=["done"],
        )
        narrow = engine.start_run(table)
        sup = supervise(engine, outcomes={KeyError: "error_occurred"}, max_retries=0)
        with pytest.raises(StageGaveUp) as raised:
            sup.execute(narrow, "call", failing(1, ValueError("unmapped")))
        assert raised.value.cause == "no_failure_row"
        assert narrow.machine.open_attempt is None
        assert "StageStarted" not in kinds(engine, narrow)
        broad = engine.start_run(table)
        sup = supervise(engine, outcomes={Exception: "error_occurred"})
        assert sup.execute(broad, "call", failing(1, ValueError("mapped"), "ok")) == "ok"
        assert kinds(engine, broad).count("StageStarted") == 2
