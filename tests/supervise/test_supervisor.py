from __future__ import annotations

from typing import Any

import pytest

from engine import (
    CircuitBreaker,
    Engine,
    Outcome,
    Pipeline,
    ProgressPolicy,
    RetryPolicy,
    Run,
    StageContext,
    StageGaveUp,
)
from engine.cli.demo.code_review import REVIEW, BuildException
from engine.errors import (
    GIVE_UP_CAUSES,
    AttemptError,
    InvalidArgument,
    InvalidPayload,
    RuleViolation,
    RunAlreadyFinished,
    StageNotDriven,
)
from engine.supervise import FINISHED
from events import RetryScheduled
from tests.supervise._helpers import LOOP, FakeTime, failing, kinds, of_type


@pytest.fixture
def fake() -> FakeTime:
    """A fake clock and sleep."""
    return FakeTime()


def supervise(engine: Engine, fake: FakeTime, **settings: Any) -> Any:
    return engine.supervisor(sleep=fake.sleep, clock=fake.clock, **settings)


class TestExecute:
    def test_records_start_and_completion_with_the_measured_duration(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """A completed attempt is StageStarted then StageCompleted with result and duration."""
        run = engine.start_run(LOOP)

        def work(card: str) -> dict[str, str]:
            fake.advance(2.5)
            return {"card": card}

        assert supervise(engine, fake).execute(run, "work", work, card="C-1") == {"card": "C-1"}
        assert kinds(engine, run) == ["RunStarted", "StageStarted", "StageCompleted"]
        done = of_type(engine, run, "StageCompleted")[0]
        assert (done.result, done.duration, done.outcome, done.attempt) == (  # type: ignore[attr-defined]
            {"card": "C-1"}, 2.5, "completed", 1,
        )  # fmt: skip
        assert run.state == "done"

    def test_an_outcome_names_the_transition(self, engine: Engine, fake: FakeTime) -> None:
        """A function returning Outcome("partial", r) records that outcome and returns r."""
        run = engine.start_run(LOOP)
        result = supervise(engine, fake).execute(run, "work", lambda: Outcome("partial", [1]))
        assert result == [1]
        assert run.state == "check"
        assert of_type(engine, run, "StageCompleted")[0].outcome == "partial"  # type: ignore[attr-defined]

    def test_failures_are_recorded_then_retried_with_backoff(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """Each failure is a StageFailed, then a RetryScheduled whose delay the sleep receives."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(max_retries=3, delay=1.5, backoff=2.0))
        assert sup.execute(run, "work", failing(2, BuildException("cc: error"))) == "ok"
        assert kinds(engine, run)[1:] == [
            "StageStarted", "StageFailed", "RetryScheduled",
            "StageStarted", "StageFailed", "RetryScheduled",
            "StageStarted", "StageCompleted",
        ]  # fmt: skip
        failed = of_type(engine, run, "StageFailed")[0]
        assert (failed.error, failed.error_type, failed.retryable) == (  # type: ignore[attr-defined]
            "cc: error", "BuildException", True,
        )  # fmt: skip
        retries = of_type(engine, run, "RetryScheduled")
        assert [r.delay for r in retries] == [1.5, 3.0] == fake.sleeps  # type: ignore[attr-defined]
        assert [r.attempt for r in retries] == [2, 3]  # type: ignore[attr-defined]
        assert retries[0].reason == "retry 1 of 3 after BuildException: cc: error"  # type: ignore[attr-defined]
        assert retries[0].policy["chosen_by"] == "default"  # type: ignore[attr-defined]
        assert retries[0].policy["max_retries"] == 3  # type: ignore[attr-defined]

    def test_gives_up_after_max_retries(self, engine: Engine, fake: FakeTime) -> None:
        """After max_retries retries the supervisor records its decision and raises StageGaveUp."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(max_retries=2, delay=0))
        with pytest.raises(StageGaveUp) as raised:
            sup.execute(run, "work", failing(9, BuildException("boom")))
        gave_up = raised.value
        assert (gave_up.run_id, gave_up.stage, gave_up.attempts) == (run.id, "work", 3)
        assert gave_up.error_type == "BuildException"
        assert isinstance(gave_up.__cause__, BuildException)
        assert "max_retries=2" in str(gave_up)
        note = of_type(engine, run, "NoteAdded")[-1]
        assert note.key == "gave_up"  # type: ignore[attr-defined]
        assert note.value["attempts"] == 3  # type: ignore[attr-defined]
        assert note.value["policy"]["max_retries"] == 2  # type: ignore[attr-defined]
        assert len(of_type(engine, run, "RetryScheduled")) == 2
        assert run.status == "running"  # execute leaves the run to its caller

    def test_zero_retries_gives_up_at_the_first_failure(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """max_retries=0 makes one attempt."""
        run = engine.start_run(LOOP)
        with pytest.raises(StageGaveUp):
            supervise(engine, fake, retry=RetryPolicy(max_retries=0)).execute(
                run, "work", failing(1, ValueError("x"))
            )
        assert kinds(engine, run).count("StageStarted") == 1

    def test_give_up_on_is_never_retried(self, engine: Engine, fake: FakeTime) -> None:
        """An error type in give_up_on is recorded as not retryable and not retried."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(give_up_on=(PermissionError,)))
        with pytest.raises(StageGaveUp, match="PermissionError is not retried"):
            sup.execute(run, "work", failing(1, PermissionError("denied")))
        assert of_type(engine, run, "StageFailed")[0].retryable is False  # type: ignore[attr-defined]
        assert fake.sleeps == []

    def test_retry_on_limits_what_is_retried(self, engine: Engine, fake: FakeTime) -> None:
        """An error outside retry_on is not retried; one inside is."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(retry_on=(ConnectionError,), delay=0))
        assert sup.execute(run, "work", failing(1, ConnectionError("reset"))) == "ok"
        other = engine.start_run(LOOP)
        with pytest.raises(StageGaveUp):
            sup.execute(other, "work", failing(1, KeyError("k")))

    def test_retries_count_across_calls(self, engine: Engine, fake: FakeTime) -> None:
        """The budget is the stage's failures in a row: a second call is refused, not reset."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(max_retries=2, delay=0))
        with pytest.raises(StageGaveUp):
            sup.execute(run, "work", failing(3, ValueError("x")))
        again = failing(1, ValueError("x"))
        with pytest.raises(StageGaveUp, match="the retry budget is spent") as raised:
            sup.execute(run, "work", again)
        assert again.calls["n"] == 0  # type: ignore[attr-defined]  # refused without a call
        assert raised.value.attempts == 3
        assert (raised.value.error_type, raised.value.error) == ("ValueError", "x")
        assert kinds(engine, run).count("StageStarted") == 3

    def test_a_failure_the_table_sends_elsewhere_is_not_retried_here(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """When 'failed' leads elsewhere, execute records it and raises, naming that state."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake)
        sup.execute(run, "work", lambda: Outcome("partial"))
        with pytest.raises(StageGaveUp, match="moved the failed stage on to 'work'") as raised:
            sup.execute(run, "check", failing(1, AssertionError("regression")))
        assert (raised.value.attempts, raised.value.error) == (1, "regression")
        assert run.state == "work"
        assert of_type(engine, run, "RetryScheduled") == []

    def test_a_stage_without_a_failed_row_is_noted_not_retried(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """A stage without a 'failed' row gets no StageStarted; its error becomes a note."""
        run = engine.start_run(REVIEW)
        sup = supervise(engine, fake)
        assert sup.execute(run, "project_analysis", lambda: {"t": "py"}) == {"t": "py"}
        with pytest.raises(StageGaveUp, match="no 'failed' row"):
            sup.execute(run, "code_review", failing(1, RuntimeError("llm down")))
        assert kinds(engine, run) == ["RunStarted", "StageCompleted", "NoteAdded"]
        assert run.state == "code_review"

    def test_refuses_a_stage_that_is_not_current(self, engine: Engine, fake: FakeTime) -> None:
        """Executing a stage other than the current state raises before anything is recorded."""
        run = engine.start_run(LOOP)
        with pytest.raises(AttemptError, match="current state is 'work'"):
            supervise(engine, fake).execute(run, "check", lambda: None)
        assert run.version == 1

    def test_refuses_a_finished_run(self, engine: Engine, fake: FakeTime) -> None:
        """A finished run cannot be executed on."""
        run = engine.start_run(LOOP)
        run.finish("cancelled")
        with pytest.raises(RunAlreadyFinished):
            supervise(engine, fake).execute(run, "work", lambda: None)

    def test_refuses_to_run_inside_a_batch(self, engine: Engine, fake: FakeTime) -> None:
        """The supervisor's records are durable one by one; inside run.batch() it refuses."""
        run = engine.start_run(LOOP)
        with pytest.raises(RuleViolation, match=r"outside run\.batch"), run.batch():
            supervise(engine, fake).execute(run, "work", lambda: None)
        assert run.version == 1

    def test_events_the_function_records_are_seen(self, engine: Engine, fake: FakeTime) -> None:
        """Events a stage function appends itself are folded in; attempts stay consistent."""
        run = engine.start_run(LOOP)
        calls = {"n": 0}

        def work() -> str:
            calls["n"] += 1
            run.note("try", calls["n"])
            if calls["n"] == 1:
                raise ValueError("first")
            return "second"

        assert (
            supervise(engine, fake, retry=RetryPolicy(delay=0)).execute(run, "work", work)
            == "second"
        )
        assert of_type(engine, run, "StageCompleted")[0].attempt == 2  # type: ignore[attr-defined]


def adapt_developer(context: StageContext) -> RetryPolicy:
    """More retries and a longer timeout when the review found many critical issues."""
    review: Any = context.stack.latest_result("code_review")
    critical = review["critical"]
    if critical > 5:
        return RetryPolicy(max_retries=5, delay=0, timeout=1200)
    return RetryPolicy(max_retries=1, delay=0, timeout=600)


class TestAdaptivePolicies:
    def _reviewed(self, engine: Engine, critical: int) -> Any:
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis")
        run.stage_completed("code_review", {"critical": critical})
        return run

    @pytest.mark.parametrize(("critical", "retries"), [(9, 5), (2, 1)])
    def test_a_callable_policy_reads_the_runs_projections(
        self, engine: Engine, fake: FakeTime, critical: int, retries: int
    ) -> None:
        """The policy function sees the review's result and its choice is recorded by name."""
        run = self._reviewed(engine, critical)
        sup = supervise(engine, fake, policies={"developer": adapt_developer})
        assert sup.execute(run, "developer", failing(1, BuildException("x"))) == "ok"
        policy = of_type(engine, run, "RetryScheduled")[0].policy  # type: ignore[attr-defined]
        assert policy["max_retries"] == retries
        assert policy["chosen_by"] == "adapt_developer"

    def test_a_per_stage_policy_object(self, engine: Engine, fake: FakeTime) -> None:
        """A RetryPolicy under the stage's name applies to that stage only."""
        run = self._reviewed(engine, 1)
        sup = supervise(engine, fake, policies={"developer": RetryPolicy(max_retries=0)})
        with pytest.raises(StageGaveUp):
            sup.execute(run, "developer", failing(1, BuildException("x")))
        note = of_type(engine, run, "NoteAdded")[-1]
        assert note.value["policy"]["chosen_by"] == "policies['developer']"  # type: ignore[attr-defined]

    def test_a_policy_function_must_return_a_policy(self, engine: Engine, fake: FakeTime) -> None:
        """A policy function returning something else is a TypeError naming it."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, policies={"work": lambda context: 3})
        with pytest.raises(TypeError, match="returned int, not a RetryPolicy"):
            sup.execute(run, "work", lambda: None)

    def test_policies_are_checked_when_the_supervisor_is_built(self, engine: Engine) -> None:
        """A policy that is neither a RetryPolicy nor callable is refused at once."""
        with pytest.raises(InvalidArgument, match="'work' maps to a int"):
            engine.supervisor(policies={"work": 3})


class TestDrive:
    def test_follows_the_table_to_a_final_state_and_finishes(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """drive calls each stage's function with a StageContext, in table order, then finishes."""
        run = engine.start_run(REVIEW)
        seen: list[str] = []

        def stage(result: Any) -> Any:
            def fn(context: StageContext) -> Any:
                seen.append(context.stage)
                return result

            return fn

        testing = failing(1, AssertionError("test_x"), {"passed": 3})
        stages = {
            "project_analysis": stage({"t": "py"}),
            "code_review": stage({"critical": 1}),
            "developer": stage({"files": 2}),
            "testing": testing,
        }
        sup = supervise(engine, fake, retry=RetryPolicy(delay=0))
        assert sup.drive(run, stages) is run
        assert seen == ["project_analysis", "code_review", "developer", "developer"]
        assert testing.calls["n"] == 2  # type: ignore[attr-defined]
        assert (run.state, run.status) == ("done", "succeeded")
        assert of_type(engine, run, "RunFinished")[0].reason == "reached final state 'done'"  # type: ignore[attr-defined]

    def test_an_aborted_final_state_finishes_failed(self, engine: Engine, fake: FakeTime) -> None:
        """Reaching a final state named 'aborted' finishes the run failed (statuses overrides)."""
        run = engine.start_run(LOOP)
        supervise(engine, fake).drive(run, {"work": lambda c: Outcome("aborted")})
        assert run.status == "failed"
        other = engine.start_run(LOOP)
        supervise(engine, fake).drive(
            other, {"work": lambda c: Outcome("aborted")}, statuses={"aborted": "cancelled"}
        )
        assert other.status == "cancelled"

    def test_a_stage_giving_up_finishes_the_run_failed(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """When a stage gives up, drive finishes the run as failed with a structured reason."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(max_retries=1, delay=0))
        with pytest.raises(StageGaveUp):
            sup.drive(run, {"work": failing(5, BuildException("link error"))})
        assert run.status == "failed"
        reason = of_type(engine, run, "RunFinished")[0].reason  # type: ignore[attr-defined]
        assert reason["rule"] == "gave_up"
        assert (reason["stage"], reason["attempts"], reason["error"]) == ("work", 2, "link error")

    def test_a_loop_between_stages_gives_up_on_the_failing_stage(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """check failing back to work again and again gives up after check's retry budget."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(max_retries=2, delay=0))
        stages = {"work": lambda c: Outcome("partial"), "check": failing(9, AssertionError("no"))}
        with pytest.raises(StageGaveUp) as raised:
            sup.drive(run, stages)
        assert (raised.value.stage, raised.value.attempts) == ("check", 3)
        assert run.status == "failed"

    def test_a_stage_without_a_function_is_refused(self, engine: Engine, fake: FakeTime) -> None:
        """Reaching a stage with no function raises StageNotDriven and records nothing for it."""
        run = engine.start_run(LOOP)
        with pytest.raises(StageNotDriven, match="stage 'check', which has no function"):
            supervise(engine, fake).drive(run, {"work": lambda c: Outcome("partial")})
        assert run.state == "check"
        assert run.status == "running"

    def test_a_misspelt_stage_name_is_refused_up_front(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """A name close to a stage without a function is refused before anything runs."""
        run = engine.start_run(LOOP)
        with pytest.raises(InvalidArgument, match=r"'wrok' is not a state .* did you mean 'work'"):
            supervise(engine, fake).drive(run, {"wrok": lambda c: None})
        assert run.version == 1

    def test_drive_continues_a_run_that_is_under_way(self, engine: Engine, fake: FakeTime) -> None:
        """drive starts from the run's current state: earlier stages are not called."""
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis")
        run.stage_completed("code_review", {"critical": 0})
        never = failing(99, AssertionError("must not run"))
        stages = {"project_analysis": never, "code_review": never,
                  "developer": lambda c: 1, "testing": lambda c: 2}  # fmt: skip
        supervise(engine, fake).drive(run, stages)
        assert never.calls["n"] == 0  # type: ignore[attr-defined]
        assert run.status == "succeeded"

    def test_the_context_gives_params_and_attempts(self, engine: Engine, fake: FakeTime) -> None:
        """A stage function reads the run's params and its attempt number from the context."""
        run = engine.start_run(LOOP, params={"card": "C-9"})
        seen: list[tuple[Any, int]] = []

        def work(context: StageContext) -> None:
            seen.append((context.params["card"], context.attempt))
            if len(seen) < 2:
                raise ValueError("again")

        supervise(engine, fake, retry=RetryPolicy(delay=0)).drive(run, {"work": work})
        assert seen == [("C-9", 1), ("C-9", 2)]
        assert "StageContext(run=" in repr(StageContext(engine, run, "work"))

    def test_each_attempt_gets_a_fresh_context(self, engine: Engine, fake: FakeTime) -> None:
        """A retried stage function sees its earlier failures in the context's projections."""
        run = engine.start_run(LOOP)
        seen: list[tuple[int, int, int]] = []

        def work(context: StageContext) -> None:
            seen.append(
                (context.attempt, context.failures.consecutive("work"), context.stack.depth)
            )
            if len(seen) < 3:
                raise ValueError("again")

        supervise(engine, fake, retry=RetryPolicy(delay=0)).drive(run, {"work": work})
        assert seen == [(1, 0, 0), (2, 1, 1), (3, 2, 2)]


class TestAtomicDecisions:
    def test_a_failure_is_never_written_without_its_decision(
        self, engine: Engine, fake: FakeTime, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """If recording the retry decision fails, the failure is not written either."""
        run = engine.start_run(LOOP)

        record = Run.record

        def crash(self: Run, kind: Any, **payload: Any) -> Any:
            if kind is RetryScheduled:
                raise RuntimeError("process died while deciding")
            return record(self, kind, **payload)

        monkeypatch.setattr(Run, "record", crash)
        with pytest.raises(RuntimeError, match="died while deciding"):
            supervise(engine, fake).execute(run, "work", failing(1, ValueError("x")))
        assert kinds(engine, run) == ["RunStarted", "StageStarted"]
        monkeypatch.undo()
        resumed = engine.resume(run.id)
        assert of_type(engine, run, "StageFailed")[0].error_type == "Interrupted"  # type: ignore[attr-defined]
        assert resumed.state == "work"

    def test_a_task_budget_spent_refuses_the_next_call(self, engine: Engine) -> None:
        """A task that gave up is refused, without a call, until the policy allows more."""
        run = engine.start_run(LOOP)
        sup = engine.supervisor(retry=RetryPolicy(max_retries=0))
        with pytest.raises(StageGaveUp):
            sup.task(run, "t-1", failing(1, OSError("disk")))
        again = failing(0, OSError())
        with pytest.raises(StageGaveUp, match="budget is spent") as raised:
            sup.task(run, "t-1", again)
        assert again.calls["n"] == 0  # type: ignore[attr-defined]
        assert (raised.value.error_type, raised.value.error) == ("OSError", "disk")
        relaxed = engine.supervisor(retry=RetryPolicy(max_retries=3))
        assert relaxed.task(run, "t-1", again) == "ok"


TOOLS = Pipeline(
    "tools",
    initial="round",
    transitions=[
        ("round", "tool_call", "round"),
        ("round", "error_occurred", "recover"),
        ("round", "failed", "round"),
        ("round", "answered", "done"),
        ("recover", "completed", "round"),
        ("recover", "failed", "aborted"),
    ],
    final=["done", "aborted"],
)


class ToolError(Exception):
    """A tool call failed."""


class TestFailureOutcomes:
    def test_a_mapped_error_records_its_outcome_and_the_table_routes_it(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """RetryPolicy(outcomes={ToolError: "error_occurred"}) routes a tool error to recover."""
        run = engine.start_run(TOOLS)
        policy = RetryPolicy(outcomes={ToolError: "error_occurred"})
        sup = supervise(engine, fake, retry=policy)
        with pytest.raises(StageGaveUp) as raised:
            sup.execute(run, "round", failing(1, ToolError("search timed out")))
        assert raised.value.cause == "routed"
        failed = of_type(engine, run, "StageFailed")[0]
        assert failed.outcome == "error_occurred"  # type: ignore[attr-defined]
        assert run.state == "recover"

    @pytest.mark.parametrize("breaker", [None, CircuitBreaker(fail_max=None)], ids=["none", "kept"])
    def test_a_routed_give_up_counts_the_failures_in_a_row(
        self, engine: Engine, fake: FakeTime, breaker: CircuitBreaker | None
    ) -> None:
        """StageGaveUp.attempts of a routed failure counts the stage's failures in a row.

        With no breaker the watch keeps no circuits and folds them from the store,
        the routed failure (still held) included; a breaker's watch keeps them.
        """
        run = engine.start_run(TOOLS)
        run.stage_completed("round", outcome="tool_call")
        run.stage_failed("round", "one")
        run.stage_failed("round", "two")
        policy = RetryPolicy(outcomes={ToolError: "error_occurred"})
        sup = supervise(engine, fake, retry=policy, breaker=breaker)
        with pytest.raises(StageGaveUp) as raised:
            sup.execute(run, "round", failing(1, ToolError("search timed out")))
        assert (raised.value.cause, raised.value.attempts) == ("routed", 3)
        assert engine.load(run.id).version == run.version  # nothing left held

    def test_other_errors_still_record_failed_and_retry(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """An error the map does not name records "failed" and is retried as before."""
        run = engine.start_run(TOOLS)
        sup = supervise(engine, fake, retry=RetryPolicy(outcomes={ToolError: "error_occurred"}))
        answer = Outcome("answered", "42")
        assert sup.execute(run, "round", failing(1, RuntimeError("flaky"), answer)) == "42"
        assert [e.outcome for e in of_type(engine, run, "StageFailed")] == ["failed"]  # type: ignore[attr-defined]
        assert run.state == "done"


class TestGiveUpCauses:
    def test_each_cause_is_named(self, engine: Engine, fake: FakeTime) -> None:
        """StageGaveUp.cause tells a spent budget, an unretried error, no row, a route, an end."""
        causes = []
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(max_retries=1, delay=0))
        with pytest.raises(StageGaveUp) as spent:
            sup.execute(run, "work", failing(9, ValueError("x")))
        causes.append(spent.value.cause)
        strict = supervise(engine, fake, retry=RetryPolicy(give_up_on=PermissionError))
        with pytest.raises(StageGaveUp) as never:
            strict.execute(engine.start_run(LOOP), "work", failing(1, PermissionError("no")))
        causes.append(never.value.cause)
        review = engine.start_run(REVIEW)
        sup.execute(review, "project_analysis", lambda: {})
        with pytest.raises(StageGaveUp) as no_row:
            sup.execute(review, "code_review", failing(1, RuntimeError("llm down")))
        causes.append(no_row.value.cause)
        tools = engine.start_run(TOOLS)
        mapped = supervise(engine, fake, retry=RetryPolicy(outcomes={ToolError: "error_occurred"}))
        with pytest.raises(StageGaveUp) as routed:
            mapped.execute(tools, "round", failing(1, ToolError("t")))
        causes.append(routed.value.cause)
        with pytest.raises(StageGaveUp) as ended:
            mapped.execute(tools, "recover", failing(1, RuntimeError("r")))
        causes.append(ended.value.cause)
        assert causes == [
            "budget_spent",
            "not_retryable",
            "no_failure_row",
            "routed",
            "final_state",
        ]
        assert set(causes) == set(GIVE_UP_CAUSES)
        notes = [e.value for e in of_type(engine, run, "NoteAdded")]  # type: ignore[attr-defined]
        assert notes[-1]["cause"] == "budget_spent"


class FailingTests(Exception):
    """Tests failed; `details` names them."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(f"{len(names)} tests failed")
        self.details = {"failing": names}


class TestFailureDetails:
    def test_an_exceptions_details_are_recorded_with_its_failure(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """A stage function's exception with a `details` attribute records it in StageFailed."""
        run = engine.start_run(LOOP)
        error = FailingTests(["test_empty", "test_unicode"])
        assert supervise(engine, fake).execute(run, "work", failing(1, error)) == "ok"
        failed = of_type(engine, run, "StageFailed")[0]
        assert failed.details == {"failing": ["test_empty", "test_unicode"]}  # type: ignore[attr-defined]
        assert failed.error == "2 tests failed"  # type: ignore[attr-defined]

    def test_by_hand_details_must_be_strict_json(self, engine: Engine) -> None:
        """stage_failed(details=...) refuses a value JSON cannot hold, naming the field."""
        run = engine.start_run(LOOP)
        with pytest.raises(InvalidPayload, match="details"):
            run.stage_failed("work", "boom", details={"tests": {"a", "b"}})
        assert run.version == 1
        recorded = run.stage_failed("work", "boom", details=["test_empty"])
        assert engine.events(run.id)[-1] == recorded


class TestStep:
    def test_step_moves_one_stage_and_returns_its_result(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """step runs the current state's function to its outcome; a caller may roll it back."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake)
        stages = {"work": lambda context: Outcome("partial", {"n": 1}), "check": lambda c: "ok"}
        assert sup.step(run, stages) == {"n": 1}
        assert run.state == "check"
        run.rollback(1, "not good enough")
        assert sup.step(run, stages) == {"n": 1}
        assert sup.step(run, stages) == "ok"
        assert run.state == "done"
        assert run.status == "running"
        assert sup.step(run, stages) is FINISHED
        assert run.status == "succeeded"

    def test_step_on_a_stopped_run_returns_none(self, engine: Engine, fake: FakeTime) -> None:
        """A step a progress policy stops returns None, and the run is finished."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, progress=ProgressPolicy(max_steps=1))
        stages = {"work": lambda context: Outcome("partial", "half"), "check": lambda c: "ok"}
        assert sup.step(run, stages) == "half"
        assert sup.step(run, stages) is None
        assert run.status == "aborted_stuck"
