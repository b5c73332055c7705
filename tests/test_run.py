from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from freezegun import freeze_time

from engine import ConcurrencyConflict, Engine, InvalidTransition, Run
from engine.errors import (
    AttemptError,
    InvalidPayload,
    InvalidRollback,
    RunAlreadyFinished,
    TaskError,
)
from events import (
    NoteAdded,
    RunFinished,
    StageCompleted,
    StageFailed,
    StageStarted,
    StateRolledBack,
)
from tests._helpers import EXPECTED, REVIEW

# How to reach each state of REVIEW from its initial state.
PATHS = {
    "project_analysis": [],
    "code_review": ["completed"],
    "developer": ["completed", "completed"],
    "testing": ["completed", "completed", "completed"],
    "done": ["completed", "completed", "completed", "completed"],
    "aborted": ["aborted"],
}
OUTCOMES = ["completed", "failed", "aborted", "needs_refactor"]


def record(run: Run, outcome: str) -> None:
    if outcome == "failed":
        run.stage_failed(run.state, "it broke")
    else:
        run.stage_completed(run.state, outcome=outcome)


def reach(engine: Engine, state: str) -> Run:
    run = engine.start_run(REVIEW)
    for outcome in PATHS[state]:
        record(run, outcome)
    assert run.state == state
    return run


class TestTransitions:
    @pytest.mark.parametrize("state", list(PATHS))
    @pytest.mark.parametrize("outcome", OUTCOMES)
    def test_every_state_outcome_pair(self, engine: Engine, state: str, outcome: str) -> None:
        """A legal pair moves the machine and is stored; an illegal one stores nothing."""
        run = reach(engine, state)
        before = engine.events(run.id)
        expected = EXPECTED.get((state, outcome))
        if expected is None:
            with pytest.raises(InvalidTransition) as caught:
                record(run, outcome)
            assert (caught.value.state, caught.value.outcome) == (state, outcome)
            assert caught.value.allowed == REVIEW.allowed(state)
            assert engine.events(run.id) == before
            assert run.state == state
        else:
            record(run, outcome)
            assert run.state == expected
            assert len(engine.events(run.id)) == len(before) + 1
        assert engine.load(run.id).state == run.state

    def test_invalid_transition_message_lists_allowed_outcomes(self, engine: Engine) -> None:
        """The error names the state, the outcome, and what is allowed there."""
        run = reach(engine, "testing")
        with pytest.raises(InvalidTransition) as caught:
            run.stage_completed("testing", outcome="needs_refactor")
        message = str(caught.value)
        assert "'needs_refactor'" in message
        assert "'testing'" in message
        assert "'aborted', 'completed', 'failed'" in message

    def test_outcome_of_a_stage_that_is_not_current_is_refused(self, engine: Engine) -> None:
        """Naming another stage than the current state raises and stores nothing."""
        run = reach(engine, "developer")
        with pytest.raises(InvalidTransition, match="not the current state 'developer'"):
            run.stage_completed("testing")
        assert (run.version, len(engine.events(run.id))) == (3, 3)

    def test_allowed_outcomes_follow_the_current_state(self, engine: Engine) -> None:
        """The table's outcomes for where the run is now follow `run.state`."""
        run = reach(engine, "testing")
        assert run.pipeline.allowed(run.state) == ("aborted", "completed", "failed")
        run.stage_completed("testing")
        assert run.pipeline.allowed(run.state) == ()

    def test_named_outcomes_follow_their_rows(self, engine: Engine) -> None:
        """A failure with a named outcome follows that outcome's row."""
        run = reach(engine, "developer")
        event = run.stage_failed("developer", RuntimeError("stop"), outcome="aborted")
        assert (event.outcome, event.error_type, run.state) == (
            "aborted",
            "RuntimeError",
            "aborted",
        )


class TestAttempts:
    def test_attempts_are_numbered_per_stage_from_one(self, engine: Engine) -> None:
        """Each outcome closes one attempt; numbers grow per stage across the run."""
        run = reach(engine, "developer")
        first = run.stage_failed("developer", "x")
        started = run.stage_started("developer")
        second = run.stage_completed("developer")
        assert (first.attempt, started.attempt, second.attempt) == (1, 2, 2)
        assert run.machine.attempts["developer"] == 2
        back = run.stage_failed("testing", "tests red")
        assert (back.attempt, run.stage_started("developer").attempt) == (1, 3)

    def test_stage_started_must_name_the_current_state(self, engine: Engine) -> None:
        """Starting a stage that is not current raises AttemptError and stores nothing."""
        run = reach(engine, "code_review")
        with pytest.raises(AttemptError, match="current state is 'code_review'"):
            run.stage_started("developer")
        assert (run.version, len(engine.events(run.id))) == (2, 2)

    def test_an_open_attempt_cannot_be_started_again(self, engine: Engine) -> None:
        """A second StageStarted before an outcome is refused."""
        run = reach(engine, "code_review")
        run.stage_started("code_review")
        with pytest.raises(AttemptError, match="still open"):
            run.stage_started("code_review")
        assert run.machine.open_attempt == 1
        assert len(engine.events(run.id)) == 3

    def test_no_stage_starts_in_a_final_state(self, engine: Engine) -> None:
        """StageStarted in a final state is refused."""
        run = reach(engine, "done")
        with pytest.raises(AttemptError, match="final state"):
            run.stage_started("done")
        assert len(engine.events(run.id)) == run.version == 5

    def test_duration_defaults_to_time_since_stage_started(self, engine: Engine) -> None:
        """Without a duration, an outcome measures from its StageStarted."""
        with freeze_time("2026-03-01 10:00:00") as clock:
            run = reach(engine, "code_review")
            run.stage_started("code_review")
            clock.tick(12.5)
            event = run.stage_completed("code_review")
        assert event.duration == 12.5

    def test_duration_without_stage_started_is_zero(self, engine: Engine) -> None:
        """An outcome recorded without StageStarted opens and closes its attempt in no time."""
        run = reach(engine, "code_review")
        assert run.stage_completed("code_review").duration == 0.0


class TestRollback:
    def test_rollback_returns_to_the_state_before_the_undone_outcomes(self, engine: Engine) -> None:
        """rollback(k) pops k outcomes; the state is the one before the oldest popped."""
        run = reach(engine, "testing")
        run.rollback(2, reason="bad review")
        assert (run.state, run.machine.depth) == ("code_review", 1)
        run.stage_completed("code_review")
        assert run.state == "developer"
        assert engine.load(run.id).machine == run.machine

    def test_rollback_of_a_self_loop_stays_in_the_stage(self, engine: Engine) -> None:
        """Undoing developer's own failure leaves the machine in developer."""
        run = reach(engine, "developer")
        run.stage_failed("developer", "x")
        run.rollback()
        assert (run.state, run.machine.depth) == ("developer", 2)

    def test_rollback_deeper_than_the_stack_is_refused(self, engine: Engine) -> None:
        """StateRolledBack(steps=k) needs k outcomes on the stack; nothing is stored."""
        run = reach(engine, "developer")
        with pytest.raises(InvalidRollback, match="only 2 outcome"):
            run.rollback(3)
        assert [type(e) for e in engine.events(run.id)][-1] is StageCompleted

    def test_rollback_with_an_open_attempt_is_refused(self, engine: Engine) -> None:
        """An open attempt must get its outcome before the stack moves."""
        run = reach(engine, "developer")
        run.stage_started("developer")
        with pytest.raises(InvalidRollback, match="is open"):
            run.rollback()
        assert len(engine.events(run.id)) == run.version == 4

    def test_rollback_steps_must_be_positive(self, engine: Engine) -> None:
        """rollback(0) is refused as an invalid field."""
        run = reach(engine, "developer")
        with pytest.raises(ValueError, match="'steps'"):
            run.rollback(0)


class TestTasks:
    def test_task_lifecycle(self, engine: Engine) -> None:
        """Tasks go pending, active, failed, active, completed; status is kept per task."""
        run = engine.start_run(REVIEW)
        run.add_task("feature-3", title="Parser")
        run.add_task("task-7", parent="feature-3")
        run.task_started("task-7")
        run.task_failed("task-7", ValueError("bad input"))
        run.task_started("task-7")
        run.task_completed("task-7", result={"lines": 10})
        assert dict(run.tasks) == {"feature-3": "pending", "task-7": "completed"}
        assert engine.load(run.id).tasks == run.tasks

    @pytest.mark.parametrize(
        ("steps", "message"),
        [
            (["start"], "no such task"),
            (["add", "add"], "already added"),
            (["add", "start", "start"], "TaskStarted for a task that is active"),
            (["add", "complete", "fail"], "TaskFailed for a task that is completed"),
            (["add", "complete", "start"], "TaskStarted for a task that is completed"),
        ],
    )
    def test_task_events_must_fit_the_status(
        self, engine: Engine, steps: list[str], message: str
    ) -> None:
        """An impossible task event raises TaskError and stores nothing."""
        run = engine.start_run(REVIEW)
        actions: dict[str, Callable[[], object]] = {
            "add": lambda: run.add_task("t"),
            "start": lambda: run.task_started("t"),
            "complete": lambda: run.task_completed("t"),
            "fail": lambda: run.task_failed("t", "x"),
        }
        for step in steps[:-1]:
            actions[step]()
        version = run.version
        with pytest.raises(TaskError, match=message):
            actions[steps[-1]]()
        assert len(engine.events(run.id)) == version


class TestTaskMap:
    def test_tasks_is_the_runs_immutable_map_not_a_copy(self, engine: Engine) -> None:
        """`run.tasks` returns the run's own immutable map (no copy per read), kept current."""
        run = engine.start_run(REVIEW)
        run.add_task("t-1")
        before = run.tasks
        assert isinstance(before, Mapping)
        assert not isinstance(before, dict)
        assert not hasattr(before, "__setitem__")
        assert run.tasks is before is run.machine.tasks
        run.add_task("t-2")
        assert dict(run.tasks) == {"t-1": "pending", "t-2": "pending"}
        assert dict(before) == {"t-1": "pending"}  # an earlier read is a snapshot


class TestFinish:
    def test_nothing_follows_run_finished(self, engine: Engine) -> None:
        """After finish, every recording method raises RunAlreadyFinished."""
        run = reach(engine, "done")
        run.finish("succeeded")
        for attempt in (
            lambda: run.note("k", 1),
            lambda: run.finish("failed"),
            lambda: run.spend(1.0),
            lambda: run.add_task("t"),
        ):
            with pytest.raises(RunAlreadyFinished, match="already finished"):
                attempt()
        assert type(engine.events(run.id)[-1]) is RunFinished
        assert engine.load(run.id).status == "succeeded"

    def test_unknown_status_is_refused(self, engine: Engine) -> None:
        """finish() only takes the documented run statuses."""
        run = engine.start_run(REVIEW)
        with pytest.raises(ValueError, match="'status'"):
            run.finish("done")
        assert run.status == "running"

    def test_structured_reason(self, engine: Engine) -> None:
        """A finish reason may be structured JSON."""
        run = engine.start_run(REVIEW)
        run.finish("aborted_stuck", reason={"loop": "same error", "steps": 12})
        assert engine.events(run.id)[-1].reason == {"loop": "same error", "steps": 12}  # type: ignore[attr-defined]


class TestBadInput:
    def test_non_json_result_is_refused_and_nothing_written(self, engine: Engine) -> None:
        """A result holding bytes raises InvalidPayload naming the field; nothing is stored."""
        run = reach(engine, "developer")
        with pytest.raises(InvalidPayload, match="'result'"):
            run.stage_completed("developer", result={"log": b"\x00"})
        assert (run.version, len(engine.events(run.id))) == (3, 3)

    @pytest.mark.parametrize(
        "value", ["lone \udcff surrogate", 10**5000], ids=["surrogate", "huge-int"]
    )
    def test_values_json_cannot_store_are_refused(self, engine: Engine, value: object) -> None:
        """A lone surrogate or a 5000-digit int is refused by the call, naming the field."""
        run = engine.start_run(REVIEW)
        with pytest.raises(InvalidPayload, match=r"'value'.*cannot be stored as JSON"):
            run.note("k", value)
        assert (run.version, len(engine.events(run.id))) == (1, 1)

    def test_an_unstorable_value_in_a_batch_is_refused_at_the_call(self, engine: Engine) -> None:
        """Inside a batch the bad call raises at once; the batch's other events still commit."""
        run = engine.start_run(REVIEW)
        with run.batch():
            run.note("good", 1)
            with pytest.raises(InvalidPayload):
                run.note("bad", "\udcff")
            run.note("also good", 2)
        assert [e.key for e in engine.events(run.id)[1:]] == ["good", "also good"]  # type: ignore[attr-defined]

    def test_undecodable_error_messages_are_escaped(self, engine: Engine) -> None:
        """An exception naming an undecodable file is recorded with the byte escaped."""
        run = reach(engine, "developer")
        event = run.stage_failed("developer", OSError("cannot open caf\udce9.txt"))
        assert event.error == "cannot open caf\\udce9.txt"
        assert engine.events(run.id)[-1] == event

    def test_nul_in_an_error_message_is_escaped(self, engine: Engine) -> None:
        """A NUL in an exception's message is recorded as the text \\x00: the failure is kept."""
        run = reach(engine, "developer")
        event = run.stage_failed("developer", ValueError("bad byte \x00 in input"))
        assert event.error == "bad byte \\x00 in input"
        assert engine.events(run.id)[-1] == event

    def test_non_json_params_are_refused(self, engine: Engine) -> None:
        """start_run with a set in params raises InvalidPayload and records no run."""
        before = engine.store.recorder.max_notification_id()
        with pytest.raises(InvalidPayload, match="'params'"):
            engine.start_run(REVIEW, params={"cards": {"C-1"}})
        assert engine.store.recorder.max_notification_id() == before

    def test_dicts_shaped_like_eventsourcing_transcodings_survive(self, engine: Engine) -> None:
        """A value {"_type_": ..., "_data_": ...} reads back as that dict, not as a transcoding."""
        run = engine.start_run(REVIEW)
        run.note("k", {"_type_": "uuid_hex", "_data_": "not a uuid"})
        assert engine.events(run.id)[-1].value == {"_type_": "uuid_hex", "_data_": "not a uuid"}  # type: ignore[attr-defined]
        assert engine.load(run.id).version == 2

    def test_every_event_payload_survives_the_store(self, engine: Engine) -> None:
        """Notes, budget, progress and errors read back exactly as recorded."""
        run = reach(engine, "developer")
        recorded = [
            run.note("strategy", {"tried": ["a", "b"], "depth": 2.5}),
            run.spend(0.25, "usd"),
            run.observe_progress(["a.py"], test_signature="t1", functional_ok=False),
            run.stage_failed("developer", KeyError("k"), retryable=False, duration=1.0),
        ]
        assert engine.events(run.id)[-4:] == recorded


class TestBatch:
    def test_batch_is_written_at_once(self, engine: Engine) -> None:
        """Inside a batch nothing is stored; at exit all events are."""
        run = engine.start_run(REVIEW)
        with run.batch():
            run.stage_completed("project_analysis")
            run.note("k", "v")
            assert len(engine.events(run.id)) == 1
            assert run.version == 3
        assert [e.version for e in engine.events(run.id)] == [1, 2, 3]

    def test_an_exception_in_the_block_writes_nothing(self, engine: Engine) -> None:
        """A batch whose block raises leaves store and run as before."""
        run = engine.start_run(REVIEW)
        with pytest.raises(RuntimeError), run.batch():
            run.stage_completed("project_analysis")
            raise RuntimeError("crash mid-batch")
        assert (run.state, run.version, len(engine.events(run.id))) == ("project_analysis", 1, 1)

    def test_an_illegal_event_in_the_block_writes_nothing(self, engine: Engine) -> None:
        """One refused outcome inside a batch discards the whole batch."""
        run = engine.start_run(REVIEW)
        with pytest.raises(InvalidTransition), run.batch():
            run.stage_completed("project_analysis")
            run.stage_completed("code_review", outcome="teleport")
        assert len(engine.events(run.id)) == 1
        assert run.state == "project_analysis"

    def test_nested_batches_join_the_outer_one(self, engine: Engine) -> None:
        """An inner batch is written with the outer batch, not before."""
        run = engine.start_run(REVIEW)
        with run.batch():
            with run.batch():
                run.note("a", 1)
            assert len(engine.events(run.id)) == 1
            run.note("b", 2)
        assert len(engine.events(run.id)) == 3

    def test_a_failed_inner_batch_drops_only_its_own_events(self, engine: Engine) -> None:
        """An inner batch that raises is undone; the outer batch commits the rest."""
        run = engine.start_run(REVIEW)
        with run.batch():
            run.note("outer", 1)
            with pytest.raises(RuntimeError), run.batch():
                run.stage_completed("project_analysis")
                raise RuntimeError("inner step failed")
            assert run.state == "project_analysis"
            run.note("outer", 2)
        stored = engine.events(run.id)[1:]
        assert [(type(e), e.value) for e in stored] == [(NoteAdded, 1), (NoteAdded, 2)]  # type: ignore[attr-defined]
        assert run.version == 3

    def test_a_conflicting_batch_writes_nothing(self, engine: Engine) -> None:
        """A batch that loses a race is refused whole, and the run rolls back."""
        run = engine.start_run(REVIEW)
        other = engine.load(run.id)
        other.note("winner", True)
        with pytest.raises(ConcurrencyConflict), run.batch():
            run.note("a", 1)
            run.note("b", 2)
        assert [type(e) for e in engine.events(run.id)][1:] == [NoteAdded]
        assert run.version == 1


class TestConcurrency:
    def test_the_second_writer_gets_a_conflict(self, engine: Engine) -> None:
        """Two writers at the same version: one wins, the other gets ConcurrencyConflict."""
        first = engine.start_run(REVIEW)
        second = engine.load(first.id)
        first.stage_completed("project_analysis", result={"by": "first"})
        with pytest.raises(ConcurrencyConflict) as caught:
            second.stage_completed("project_analysis", result={"by": "second"})
        assert (caught.value.run_id, caught.value.version) == (first.id, 2)
        stored = engine.events(first.id)
        assert [e.version for e in stored] == [1, 2]
        assert stored[1].result == {"by": "first"}  # type: ignore[attr-defined]

    def test_refresh_then_retry_succeeds(self, engine: Engine) -> None:
        """After refresh() the loser sees the winner's events and can append after them."""
        first = engine.start_run(REVIEW)
        second = engine.load(first.id)
        first.stage_completed("project_analysis")
        with pytest.raises(ConcurrencyConflict):
            second.stage_completed("project_analysis")
        second.refresh()
        assert second.state == "code_review"
        second.stage_completed("code_review")
        assert [e.version for e in engine.events(first.id)] == [1, 2, 3]

    def test_two_engines_on_one_file(self, sqlite_url: str) -> None:
        """Writers in two engines over one SQLite file conflict instead of overwriting."""
        with Engine(sqlite_url) as one, Engine(sqlite_url) as two:
            run = one.start_run(REVIEW)
            twin = two.load(run.id)
            twin.note("first", 1)
            with pytest.raises(ConcurrencyConflict):
                run.note("second", 2)
            assert [e.version for e in one.events(run.id)] == [1, 2]


class TestTime:
    def test_timestamps_never_go_backwards(self, engine: Engine) -> None:
        """If the clock steps back, events keep the previous timestamp instead."""
        with freeze_time("2026-03-01 10:00:00") as clock:
            run = engine.start_run(REVIEW)
            clock.move_to("2026-03-01 09:00:00")
            event = run.note("k", 1)
        assert event.timestamp == datetime(2026, 3, 1, 10, tzinfo=UTC)

    def test_events_carry_aware_utc_timestamps(self, engine: Engine) -> None:
        """Recorded events are stamped with the (frozen) current time in UTC."""
        with freeze_time("2026-03-01 10:00:00"):
            run = engine.start_run(REVIEW)
            started = run.stage_started("project_analysis")
        assert started.timestamp == datetime(2026, 3, 1, 10, tzinfo=UTC)
        assert engine.events(run.id)[1] == started
        assert isinstance(started, StageStarted)


def test_failed_event_records_exception_type_and_message(engine: Engine) -> None:
    """stage_failed(exc) stores the exception's class name and message."""

    class BuildException(Exception):
        pass

    run = reach(engine, "developer")
    event = run.stage_failed("developer", BuildException("linker error"))
    assert isinstance(event, StageFailed)
    assert (event.error, event.error_type, event.retryable) == (
        "linker error",
        "BuildException",
        True,
    )


def test_rolled_back_event_is_stored(engine: Engine) -> None:
    """rollback() returns and stores a StateRolledBack with its reason."""
    run = reach(engine, "developer")
    event = run.rollback(1, reason="bad review")
    assert engine.events(run.id)[-1] == event
    assert isinstance(event, StateRolledBack)


def test_refresh_inside_a_batch_is_refused(engine: Engine) -> None:
    """refresh() in a batch would mix pending and stored events: it raises instead."""
    run = engine.start_run(REVIEW)
    with run.batch():
        run.note("k", 1)
        with pytest.raises(ValueError, match="inside a batch"):
            run.refresh()
    assert run.version == 2


class TestSurface:
    def test_run_has_at_most_23_public_names(self, engine: Engine) -> None:
        """Run's public names (methods, properties, `pipeline`) stay within 23 (with `params`)."""
        run = engine.start_run(REVIEW)
        names = {n for n in dir(run) if not n.startswith("_")}
        assert len(names) <= 23, sorted(names)
        assert not names & {"held", "flush", "flush_async", "released", "stamped_by", "newest"}


class TestAsyncBatch:
    def test_an_async_batch_is_written_whole_at_its_end(self, engine: Engine) -> None:
        """`async with run.batch()` writes its events in one transaction as the block ends."""
        run = engine.start_run(REVIEW)

        async def record_two() -> int:
            async with run.batch():
                run.note("a", 1)
                run.note("b", 2)
                stored = len(engine.events(run.id))
            return stored

        assert asyncio.run(record_two()) == 1  # nothing was written inside the block
        assert [e.version for e in engine.events(run.id)] == [1, 2, 3]
        assert run.version == 3

    def test_an_async_batch_that_raises_writes_nothing(self, engine: Engine) -> None:
        """An async batch whose block raises is taken back whole, as a sync one."""
        run = engine.start_run(REVIEW)

        async def fail() -> None:
            async with run.batch():
                run.stage_completed("project_analysis")
                raise RuntimeError("stop")

        with pytest.raises(RuntimeError):
            asyncio.run(fail())
        assert (run.version, run.state, len(engine.events(run.id))) == (1, "project_analysis", 1)

    def test_the_commit_does_not_block_the_event_loop(self, engine: Engine) -> None:
        """While an async batch's transaction is on its way, another coroutine runs."""
        run = engine.start_run(REVIEW)
        gate, write = threading.Event(), engine.store.write

        def gated(stored: Any, **options: Any) -> Any:
            assert gate.wait(30), "the loop was blocked: the other coroutine never ran"
            return write(stored, **options)

        engine.store.write = gated  # type: ignore[method-assign]

        async def main() -> list[str]:
            order: list[str] = []

            async def other() -> None:
                order.append("other ran")
                gate.set()  # only a loop that is not blocked gets here

            task = asyncio.ensure_future(other())
            async with run.batch():
                run.note("k", "v")
            order.append("committed")
            await task
            return order

        assert asyncio.run(main()) == ["other ran", "committed"]
        assert [e.version for e in engine.events(run.id)] == [1, 2]

    def test_a_conflicting_async_batch_writes_nothing(self, engine: Engine) -> None:
        """An async batch that loses a race is refused whole; the run is as the store holds it."""
        run = engine.start_run(REVIEW)
        engine.load(run.id).note("winner", True)

        async def lose() -> None:
            async with run.batch():
                run.note("a", 1)

        with pytest.raises(ConcurrencyConflict):
            asyncio.run(lose())
        assert run.version == 1
        assert [type(e) for e in engine.events(run.id)][1:] == [NoteAdded]
