from __future__ import annotations

from typing import Any

import pytest

from engine import Engine, Outcome, Pipeline, ProgressPolicy, RetryPolicy, StageContext
from engine.errors import RunStopped
from tests.supervise._helpers import POLL, FakeTime, kinds, of_type


def agent(observations: list[dict[str, Any]], error: Exception | None = None) -> Any:
    """A stage function that records one observation per call, then fails or completes."""
    calls = {"n": 0}

    def step(context: StageContext) -> str:
        observation = observations[min(calls["n"], len(observations) - 1)]
        calls["n"] += 1
        context.run.observe_progress(**observation)
        if error is not None:
            raise error
        return f"step {calls['n']}"

    step.calls = calls  # type: ignore[attr-defined]
    return step


NO_CHANGE = {"changed_files": 0, "test_signature": "test_parse::empty FAILED"}


def stopped(engine: Engine, run: Any) -> dict[str, Any]:
    finish = of_type(engine, run, "RunFinished")[0]
    return finish.reason  # type: ignore[attr-defined,no-any-return]


def drive(engine: Engine, run: Any, policy: ProgressPolicy, step: Any) -> Any:
    sup = engine.supervisor(
        progress=policy, retry=RetryPolicy(max_retries=100, delay=0), sleep=FakeTime().sleep
    )
    return sup.drive(run, {"step": step})


class TestStuckRules:
    def test_no_progress_stops_the_run_as_stuck(self, engine: Engine) -> None:
        """Under strict, 3 observations without change finish the run aborted_stuck."""
        run = engine.start_run(POLL)
        step = agent([{"changed_files": 2, "test_signature": "a"}, NO_CHANGE])
        drive(engine, run, ProgressPolicy.strict(max_same_error=None), step)
        assert run.status == "aborted_stuck"
        reason = stopped(engine, run)
        assert reason["rule"] == "no_progress"
        assert reason["consecutive_no_ops"] == 3
        assert reason["limit"] == 3
        assert reason["steps"] == 5  # the 2nd step changed the test signature: progress
        assert "3 observations in a row without a changed file" in reason["detected"]
        assert reason["policy"]["max_consecutive_no_ops"] == 3
        assert step.calls["n"] == 5

    def test_the_same_error_again_and_again(self, engine: Engine) -> None:
        """The same test signature max_same_error times stops the run, quoting the failures."""
        run = engine.start_run(POLL)
        changing = [{"changed_files": n + 1, "test_signature": "t::x FAILED"} for n in range(9)]
        step = agent(changing, error=AssertionError("t::x FAILED"))
        drive(engine, run, ProgressPolicy.strict(), step)
        reason = stopped(engine, run)
        assert (run.status, reason["rule"], reason["same_error_count"]) == (
            "aborted_stuck", "same_error", 3,
        )  # fmt: skip
        assert reason["last_test_signature"] == "t::x FAILED"
        assert reason["last_failures"][-1] == ["step", "AssertionError", "t::x FAILED"]
        assert len(reason["last_failures"]) == 3
        assert "the same test failure 't::x FAILED' 3 times" in reason["detected"]

    def test_max_steps(self, engine: Engine) -> None:
        """max_steps outcomes stop a run that keeps changing things."""
        run = engine.start_run(POLL)
        step = agent([{"changed_files": 1, "test_signature": None}])
        drive(engine, run, ProgressPolicy(max_steps=5), step)
        reason = stopped(engine, run)
        assert (reason["rule"], reason["steps"], step.calls["n"]) == ("max_steps", 5, 5)

    def test_progress_keeps_the_run_going(self, engine: Engine) -> None:
        """Observations that change something never stop the run; it ends by its own outcome."""
        run = engine.start_run(POLL)
        calls = {"n": 0}

        def step(context: StageContext) -> Any:
            calls["n"] += 1
            context.run.observe_progress(calls["n"], test_signature=f"sig-{calls['n']}")
            from engine import Outcome

            return Outcome("finished") if calls["n"] == 20 else None

        drive(engine, run, ProgressPolicy.strict(), step)
        assert (run.status, calls["n"]) == ("succeeded", 20)

    def test_execute_raises_run_stopped(self, engine: Engine) -> None:
        """execute raises RunStopped with the status and reason once the run is finished."""
        run = engine.start_run(POLL)
        sup = engine.supervisor(progress=ProgressPolicy(max_steps=1))
        sup.execute(run, "step", lambda: None)
        with pytest.raises(RunStopped) as raised:
            sup.execute(run, "step", lambda: None)
        assert raised.value.status == "aborted_stuck"
        assert raised.value.reason["rule"] == "max_steps"
        assert run.status == "aborted_stuck"


class TestProfiles:
    @pytest.mark.parametrize(
        ("profile", "functional_ok", "status"),
        [
            ("strict", True, "aborted_stuck"),
            ("strict", False, "aborted_stuck"),
            ("lenient", True, "done_partial"),
            ("lenient", False, "aborted_stuck"),
            ("lenient", None, "aborted_stuck"),
        ],
    )
    def test_only_lenient_accepts_partial_success(
        self, engine: Engine, profile: str, functional_ok: bool | None, status: str
    ) -> None:
        """A loop without progress ends done_partial only under lenient with functional_ok."""
        run = engine.start_run(POLL)
        observation = {**NO_CHANGE, "functional_ok": functional_ok}
        policy = getattr(ProgressPolicy, profile)(max_same_error=None)
        drive(engine, run, policy, agent([observation]))
        assert run.status == status
        assert stopped(engine, run)["rule"] == "no_progress"

    @pytest.mark.parametrize(("profile", "no_ops"), [("strict", 3), ("lenient", 6)])
    def test_lenient_allows_more_attempts(self, engine: Engine, profile: str, no_ops: int) -> None:
        """lenient tolerates twice as many no-op steps as strict before it stops."""
        run = engine.start_run(POLL)
        step = agent([NO_CHANGE])
        drive(engine, run, getattr(ProgressPolicy, profile)(max_same_error=None), step)
        assert step.calls["n"] == no_ops + 1  # the first sighting of a signature is progress


SPLIT = Pipeline(
    "split-observers",
    initial="code",
    transitions=[
        ("code", "completed", "verify"),
        ("verify", "tests_failing", "code"),
        ("verify", "completed", "done"),
    ],
    final=["done"],
)
"""A coder and a verifier that each report only what they see, as the progress design has it."""


class TestSplitObservations:
    def test_a_coder_and_a_verifier_reporting_apart_are_caught_stuck(self, engine: Engine) -> None:
        """Separate no-change and same-failure reports still stop the loop after 3 failures."""

        def code(context: StageContext) -> str:
            context.run.observe_progress(changed_files=0)
            return "patched"

        def verify(context: StageContext) -> Outcome:
            context.run.observe_progress(test_signature="test_parse::empty FAILED")
            return Outcome("tests_failing")

        run = engine.start_run(SPLIT)
        sup = engine.supervisor(progress=ProgressPolicy.strict(), sleep=FakeTime().sleep)
        sup.drive(run, {"code": code, "verify": verify})
        assert run.status == "aborted_stuck"
        reason = stopped(engine, run)
        assert reason["rule"] == "same_error"
        assert reason["steps"] == 6
        assert "3 times in a row" in reason["detected"]


HANDLED = Pipeline(
    "handled",
    initial="iterate",
    transitions=[
        ("iterate", "tests_failing", "iterate"),
        ("iterate", "completed", "done"),
        ("*", "stuck", "stuck_handler"),
        ("*", "partial", "partial_review"),
        ("stuck_handler", "completed", "aborted"),
        ("partial_review", "completed", "done"),
    ],
    final=["done", "aborted"],
)
"""A loop whose stuck and partial verdicts go to handler stages of the table."""

SAME_FAILURE: dict[str, Any] = {"changed_files": 0, "test_signature": "test_parse::empty FAILED"}


def looping(context: StageContext) -> Outcome:
    """An agent step that changes nothing and keeps failing the same test."""
    context.run.observe_progress(**SAME_FAILURE)
    return Outcome("tests_failing")


class TestStuckHandler:
    def test_a_stuck_verdict_runs_the_tables_handler_before_finishing(self, engine: Engine) -> None:
        """("*", "stuck", handler) sends the verdict to the handler; the run ends aborted_stuck."""
        handled: list[Any] = []

        def snitch(context: StageContext) -> dict[str, str]:
            verdict = context.stack.top
            handled.append(verdict.result if verdict else None)
            context.run.note("diagnosis", "the same test fails after every patch")
            return {"ticket": "OPS-7"}

        run = engine.start_run(HANDLED)
        sup = engine.supervisor(progress=ProgressPolicy.strict(), sleep=FakeTime().sleep)
        sup.drive(run, {"iterate": looping, "stuck_handler": snitch})
        assert run.status == "aborted_stuck"
        assert run.state == "aborted"
        names = kinds(engine, run)
        verdict_at = names.index("NoteAdded")
        assert names[verdict_at : verdict_at + 2] == ["NoteAdded", "StageCompleted"]
        routed = of_type(engine, run, "StageCompleted")[-2]
        assert (routed.stage, routed.outcome) == ("iterate", "stuck")  # type: ignore[attr-defined]
        assert handled[0]["rule"] == "same_error"
        reason = stopped(engine, run)
        assert reason["rule"] == "same_error"
        assert reason["final_state"] == "aborted"
        notes = [e.key for e in of_type(engine, run, "NoteAdded")]  # type: ignore[attr-defined]
        assert notes == ["progress_verdict", "diagnosis"]

    def test_a_partial_verdict_goes_to_its_own_handler(self, engine: Engine) -> None:
        """Under lenient, a functional loop without progress goes to "partial": done_partial."""

        def functional(context: StageContext) -> Outcome:
            context.run.observe_progress(changed_files=0, functional_ok=True)
            return Outcome("tests_failing")

        run = engine.start_run(HANDLED)
        policy = ProgressPolicy.lenient(max_consecutive_no_ops=2)
        sup = engine.supervisor(progress=policy, sleep=FakeTime().sleep)
        sup.drive(run, {"iterate": functional, "partial_review": lambda context: "reviewed"})
        assert (run.status, run.state) == ("done_partial", "done")
        assert stopped(engine, run)["rule"] == "no_progress"

    def test_execute_says_where_the_verdict_went(self, engine: Engine) -> None:
        """execute raises RunStopped naming the handler state; the run is not finished yet."""
        run = engine.start_run(HANDLED)
        sup = engine.supervisor(progress=ProgressPolicy.strict(), sleep=FakeTime().sleep)
        with pytest.raises(RunStopped) as raised:
            for _ in range(10):
                sup.execute(run, "iterate", looping, context_for(engine, run))
        assert raised.value.routed_to == "stuck_handler"
        assert run.status == "running"
        assert run.state == "stuck_handler"
        assert "routed it to 'stuck_handler'" in str(raised.value)

    def test_a_table_without_the_row_still_finishes_at_once(self, engine: Engine) -> None:
        """Without a "stuck" row the verdict finishes the run, as before."""
        run = engine.start_run(POLL)
        step = agent([SAME_FAILURE])
        drive(engine, run, ProgressPolicy.strict(), step)
        assert run.status == "aborted_stuck"
        assert "NoteAdded" not in kinds(engine, run)


def context_for(engine: Engine, run: Any) -> StageContext:
    """A stage context for a function called through `execute`."""
    return StageContext(engine, run, run.state)


class TestHandlerLoops:
    def test_a_handler_sending_the_run_back_is_stopped_by_max_steps(self, engine: Engine) -> None:
        """After a routed verdict only max_steps applies; it ends the run with the first verdict."""
        table = Pipeline(
            "retrying-handler",
            initial="iterate",
            transitions=[
                ("iterate", "tests_failing", "iterate"),
                ("iterate", "completed", "done"),
                ("*", "stuck", "stuck_handler"),
                ("stuck_handler", "retry", "iterate"),
                ("stuck_handler", "completed", "aborted"),
            ],
            final=["done", "aborted"],
        )
        run = engine.start_run(table)
        sup = engine.supervisor(
            progress=ProgressPolicy.strict(max_steps=20), sleep=FakeTime().sleep
        )
        handler = {"stuck_handler": lambda context: Outcome("retry")}
        sup.drive(run, {"iterate": looping, **handler})
        assert (run.status, run.state) == ("aborted_stuck", "iterate")
        reason = stopped(engine, run)
        assert reason["rule"] == "same_error"  # the verdict that was routed, not the second stop
        assert reason["then"].startswith("20 steps taken without finishing (max_steps=20)")
        notes = [e.key for e in of_type(engine, run, "NoteAdded")]  # type: ignore[attr-defined]
        assert notes == ["progress_verdict"]
