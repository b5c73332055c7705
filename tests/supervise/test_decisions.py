"""The decision generator yields commands and does no I/O; the drivers perform them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from engine import CircuitBreaker, Engine, RetryPolicy
from engine.run import unit_of
from engine.supervise import SpendingLimit
from engine.supervise.commands import (
    Attempted,
    Call,
    Ended,
    PipelineCircuits,
    Read,
    Record,
    RunHistory,
)
from engine.supervise.perform import record
from events import RetryScheduled, StageCompleted, StageFailed, StageStarted
from tests.supervise._helpers import LOOP, POLL, FakeTime


class Writes:
    """Counts the writes the store is asked for (the real store writes)."""

    def __init__(self, engine: Engine) -> None:
        self.count = 0
        store, write = engine.store, engine.store.write

        def counted(stored: Sequence[Any], **options: Any) -> list[int]:
            self.count += 1
            return write(stored, **options)

        store.write = counted  # type: ignore[method-assign]


class TestGenerator:
    def test_it_yields_commands_and_writes_nothing_itself(self, engine: Engine) -> None:
        """Driven by hand, the generator asks for reads, records and calls; only Records write."""
        run = engine.start_run(LOOP)
        sup = engine.supervisor(retry=RetryPolicy(delay=0.5))
        writes = Writes(engine)
        unit_of(run).begin()  # grouped, as the drivers group: a Record waits for a commit point
        loop = sup.decisions.stage(run, "work")
        seen: list[Any] = []
        command = next(loop)
        answers: list[Exception] = [ValueError("red")]
        while True:
            seen.append(command)
            before = (writes.count, run.version)
            if isinstance(command, Read):
                answer: Any = sup.reader.answer(command.question)
            elif isinstance(command, Record):
                record(run, command)
                answer = None
            elif isinstance(command, Call):
                error = answers.pop(0) if answers else None
                answer = Ended(error=error) if error is not None else Ended(value="done")
            else:
                answer = None
            if not isinstance(command, Record):
                assert (writes.count, run.version) == before  # nothing recorded by the generator
            try:
                command = loop.send(answer)
            except StopIteration as done:
                result = done.value
                break
        unit_of(run).end()
        assert isinstance(seen[0], Read)
        assert isinstance(seen[0].question, RunHistory)
        records = [c for c in seen if isinstance(c, Record)]
        assert [[kind for kind, _ in r.events] for r in records] == [
            [StageStarted],
            [StageFailed, RetryScheduled],
            [StageStarted],
            [StageCompleted],
        ]
        assert records[1].together
        assert result == Attempted("done")
        assert writes.count == 1  # the grouping's end: the generator wrote nothing
        assert [type(e) for e in engine.events(run.id)][-1] is StageCompleted

    def test_an_attempt_is_one_frozen_value(self, engine: Engine) -> None:
        """Per-attempt facts travel as one frozen Attempt (stage, policy, chooser, circuit)."""
        run = engine.start_run(LOOP)
        policy = RetryPolicy(max_retries=1)
        sup = engine.supervisor(policies={"work": policy})
        loop = sup.decisions._attempt(run, "work", "work", None)
        with pytest.raises(StopIteration) as done:
            next(loop)
        attempt = done.value.value
        assert (attempt.stage, attempt.policy, attempt.chosen_by) == (
            "work",
            policy,
            "policies['work']",
        )
        with pytest.raises(AttributeError):
            attempt.stage = "other"


class TestHistory:
    def test_a_run_just_begun_is_driven_without_reading_it_back(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """The handle that began a run holds its first events: the first fold reads nothing."""
        run = engine.start_run(POLL)
        reads: list[int] = []
        stream = engine.store.stream

        def counted(run_id: Any, **bounds: Any) -> Any:
            reads.append(1)
            return stream(run_id, **bounds)

        engine.store.stream = counted  # type: ignore[method-assign]
        sup = engine.supervisor(sleep=fake.sleep, clock=fake.clock)
        assert sup.execute(run, "step", lambda: "done") == "done"
        assert reads == []
        loaded = engine.load(run.id)
        reads.clear()
        sup.execute(loaded, "step", lambda: "again")
        assert reads == [1]  # a handle that did not begin the run: its history is read
        assert [e.version for e in engine.events(run.id)] == [1, 2, 3, 4, 5]


class TestPipelineBreaker:
    def test_an_admit_reads_only_the_events_since_the_last(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """Three admits read each new notification once, not the whole store again."""
        breaker = CircuitBreaker(fail_max=5, reset_timeout=300, scope="pipeline")
        sup = engine.supervisor(breaker=breaker, clock=fake.clock, sleep=fake.sleep)
        for _ in range(3):  # history before the supervisor's first admit
            engine.start_run(POLL).stage_failed("step", "old")
        run = engine.start_run(POLL)
        reads = []
        for _ in range(3):
            sup.execute(run, "step", lambda: "ok")
            reads.append(sup.reader.circuits.read)
        # The first admit starts from the persistent projection, caught up once; each
        # later one reads the one breaker event written since (the attempt's outcome).
        assert reads == [0, 1, 2]
        circuits = sup.reader.answer(PipelineCircuits(run))
        assert circuits["step"].recent == (True, True, True, False, False, False)

    def test_a_run_sees_its_own_pending_events_without_a_commit(self, engine: Engine) -> None:
        """The pipeline's circuits include the run's recorded, uncommitted outcomes."""
        sup = engine.supervisor(breaker=CircuitBreaker(scope="pipeline"))
        run = engine.start_run(POLL)
        writes = Writes(engine)
        with run.batch():
            run.stage_failed("step", "pending")
            circuits = sup.reader.answer(PipelineCircuits(run))
        assert circuits["step"].consecutive == 1
        assert writes.count == 1  # the batch's own commit only


class TestAsyncReads:
    def test_drive_async_reads_the_store_off_the_event_loop(self, engine: Engine) -> None:
        """A run's history, a tree budget's and a pipeline breaker's reads run in a thread."""
        sup = engine.supervisor(
            retry=RetryPolicy(delay=0),
            breaker=CircuitBreaker(scope="pipeline"),
            budget=SpendingLimit(limit=100.0, scope="tree"),
        )
        threads: list[tuple[str, bool]] = []
        answer = sup.reader.answer

        def watched(question: Any) -> Any:
            kind = type(question).__name__
            threads.append((kind, threading.current_thread() is threading.main_thread()))
            return answer(question)

        sup.reader.answer = watched  # type: ignore[method-assign]
        run = engine.load(engine.start_run(LOOP).id)  # a handle that must read its history

        async def work(context: Any) -> str:
            return "done"

        asyncio.run(sup.drive_async(run, {"work": work}))
        assert run.status == "succeeded"
        off_loop = {kind: not on_main for kind, on_main in threads}
        assert off_loop == {"RunHistory": True, "TreeSpending": True, "PipelineCircuits": True}


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()
