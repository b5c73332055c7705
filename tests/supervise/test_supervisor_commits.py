"""Group commits: what the supervisor decides between two calls shares one transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from benchmarks._common import CountedWrites
from engine import ConcurrencyConflict, Engine, Pipeline, RetryPolicy, Run
from engine.errors import RuleViolation
from engine.supervise import StageContext
from events import StageStarted
from tests.supervise._helpers import FakeTime

BUILD = Pipeline(
    "build",
    initial="plan",
    transitions=[
        ("plan", "completed", "build"),
        ("plan", "failed", "plan"),
        ("build", "failed", "build"),
        ("build", "completed", "done"),
    ],
    final=["done"],
)
"""A plan stage, then a build stage that retries itself."""


class Writes:
    """Records the event kinds of every write the store is asked for (the real store writes)."""

    def __init__(self, engine: Engine) -> None:
        self.kinds: list[list[str]] = []
        store, write = engine.store, engine.store.write

        def spy(stored: Sequence[Any], **options: Any) -> list[int]:
            self.kinds.append([event.topic.split(":")[-1] for event in stored])
            return write(stored, **options)

        store.write = spy  # type: ignore[method-assign]


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


@pytest.fixture
def writes(engine: Engine) -> Writes:
    return Writes(engine)


def build_failing(times: int) -> dict[str, Any]:
    """Stage functions: plan succeeds, build fails `times` times, then succeeds."""

    def build(context: StageContext) -> str:
        if context.attempt <= times:
            raise RuntimeError(f"build {context.attempt} failed")
        return "built"

    return {"plan": lambda context: "planned", "build": build}


class TestGroupCommits:
    def test_an_outcome_its_decision_and_the_next_start_share_one_write(
        self, engine: Engine, writes: Writes, fake: FakeTime
    ) -> None:
        """drive writes an outcome, its decision and the next start together (last: the finish)."""
        run = engine.start_run(BUILD)
        sup = engine.supervisor(retry=RetryPolicy(delay=0), clock=fake.clock, sleep=fake.sleep)
        sup.drive(run, build_failing(2))
        assert writes.kinds[1:] == [
            ["StageStarted"],
            ["StageCompleted", "StageStarted"],
            ["StageFailed", "RetryScheduled", "StageStarted"],
            ["StageFailed", "RetryScheduled", "StageStarted"],
            ["StageCompleted", "RunFinished"],
        ]
        assert run.status == "succeeded"
        assert engine.verify(run.id).ok

    def test_a_grouped_start_names_the_version_its_transaction_began_with(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """committed_with is the first version of the start's transaction, None when alone."""
        run = engine.start_run(BUILD)
        sup = engine.supervisor(retry=RetryPolicy(delay=0), clock=fake.clock, sleep=fake.sleep)
        sup.drive(run, build_failing(1))
        starts = [e for e in engine.events(run.id) if isinstance(e, StageStarted)]
        assert [(s.stage, s.attempt, s.version, s.committed_with) for s in starts] == [
            ("plan", 1, 2, None),
            ("build", 1, 4, 3),
            ("build", 2, 7, 5),
        ]

    def test_each_on_its_own_when_group_commits_is_off(
        self, engine: Engine, writes: Writes, fake: FakeTime
    ) -> None:
        """group_commits=False writes every event alone, a failure with its decision."""
        run = engine.start_run(BUILD)
        sup = engine.supervisor(
            retry=RetryPolicy(delay=0), group_commits=False, clock=fake.clock, sleep=fake.sleep
        )
        sup.drive(run, build_failing(1))
        assert writes.kinds[1:] == [
            ["StageStarted"], ["StageCompleted"], ["StageStarted"],
            ["StageFailed", "RetryScheduled"], ["StageStarted"], ["StageCompleted"],
            ["RunFinished"],
        ]  # fmt: skip
        assert all(s.committed_with is None for s in engine.events(run.id)
                   if isinstance(s, StageStarted))  # fmt: skip

    def test_a_wait_begins_after_the_failure_is_written(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """Before a retry's delay the failure and its decision are in the store."""
        run = engine.start_run(BUILD)
        seen: list[list[str]] = []

        def sleep(seconds: float) -> None:
            seen.append([type(e).__name__ for e in engine.events(run.id)][-2:])
            fake.sleep(seconds)

        sup = engine.supervisor(retry=RetryPolicy(delay=5), clock=fake.clock, sleep=sleep)
        sup.drive(run, build_failing(1))
        assert seen == [["StageFailed", "RetryScheduled"]]

    def test_the_stage_function_sees_everything_recorded_before_its_call(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """A function reads its own started attempt and the outcome before it from the store."""
        run = engine.start_run(BUILD)
        seen: list[list[str]] = []

        def build(context: StageContext) -> str:
            seen.append([type(e).__name__ for e in engine.events(run.id)][-2:])
            return "built"

        sup = engine.supervisor(clock=fake.clock, sleep=fake.sleep)
        sup.drive(run, {"plan": lambda context: "planned", "build": build})
        assert seen == [["StageCompleted", "StageStarted"]]

    def test_what_the_function_records_is_written_when_it_records_it(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """A note recorded by a stage function is durable before the function returns."""
        run = engine.start_run(BUILD)
        stored: list[bool] = []

        def plan(context: StageContext) -> str:
            note = context.run.note("plan", "small steps")
            stored.append(len(engine.events(run.id)) == note.version)
            return "planned"

        sup = engine.supervisor(clock=fake.clock, sleep=fake.sleep)
        sup.drive(run, {"plan": plan, "build": lambda context: "built"})
        assert stored == [True]

    def test_a_conflicting_write_leaves_the_run_as_the_store_holds_it(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """Another writer's append makes the grouped write fail whole; refresh and drive finish."""
        run = engine.start_run(BUILD)

        def plan(context: StageContext) -> str:
            engine.load(run.id).note("other", "writer")  # not through `run`: a conflict
            return "planned"

        sup = engine.supervisor(clock=fake.clock, sleep=fake.sleep)
        with pytest.raises(ConcurrencyConflict):
            sup.drive(run, {"plan": plan, "build": lambda context: "built"})
        kinds = [type(e).__name__ for e in engine.events(run.id)]
        assert kinds == ["RunStarted", "StageStarted", "NoteAdded"]
        assert run.version == 2
        run.refresh()
        sup.drive(run, {"plan": lambda context: "again", "build": lambda context: "built"})
        assert run.status == "succeeded"
        assert engine.verify(run.id).ok

    def test_async_drive_groups_an_outcome_with_the_next_start(
        self, engine: Engine, writes: Writes, fake: FakeTime
    ) -> None:
        """drive_async writes what it decides between two awaits together."""
        run = engine.start_run(BUILD)

        async def plan(context: StageContext) -> str:
            return "planned"

        async def build(context: StageContext) -> str:
            return "built"

        sup = engine.supervisor(clock=fake.clock, sleep=fake.sleep)
        asyncio.run(sup.drive_async(run, {"plan": plan, "build": build}))
        assert writes.kinds[1:] == [
            ["StageStarted"], ["StageCompleted", "StageStarted"], ["StageCompleted", "RunFinished"],
        ]  # fmt: skip

    def test_execute_writes_a_retry_with_the_failure(
        self, engine: Engine, writes: Writes, fake: FakeTime
    ) -> None:
        """execute groups a failure, its retry and the next start; its result is durable."""
        run: Run = engine.start_run(BUILD)
        sup = engine.supervisor(retry=RetryPolicy(delay=0), clock=fake.clock, sleep=fake.sleep)
        calls: Iterator[Exception | str] = iter([RuntimeError("no"), "planned"])

        def plan() -> str:
            value = next(calls)
            if isinstance(value, Exception):
                raise value
            return value

        assert sup.execute(run, "plan", plan) == "planned"
        assert writes.kinds[1:] == [
            ["StageStarted"], ["StageFailed", "RetryScheduled", "StageStarted"], ["StageCompleted"],
        ]  # fmt: skip
        assert len(engine.events(run.id)) == run.version


class TestBoundaries:
    @pytest.mark.parametrize("driver", ["drive", "drive_async"])
    def test_a_real_and_an_injected_sleep_commit_the_same_groups(
        self, engine: Engine, driver: str
    ) -> None:
        """With zero delays, the real sleep and an injected one give the same transactions."""
        groups: list[list[list[str]]] = []
        for sleep in (None, FakeTime().sleep):
            run = engine.start_run(BUILD)
            settings: dict[str, Any] = {} if sleep is None else {"sleep": sleep}
            sup = engine.supervisor(retry=RetryPolicy(delay=0), **settings)
            with CountedWrites(engine.store) as counted:
                if driver == "drive":
                    sup.drive(run, build_failing(2))
                else:
                    asyncio.run(sup.drive_async(run, async_stages(build_failing(2))))
            groups.append([[e.topic.split(":")[-1] for e in batch] for batch in counted.batches])
            assert run.status == "succeeded"
        assert groups[0] == groups[1]
        assert groups[0] == [
            ["StageStarted"],
            ["StageCompleted", "StageStarted"],
            ["StageFailed", "RetryScheduled", "StageStarted"],
            ["StageFailed", "RetryScheduled", "StageStarted"],
            ["StageCompleted", "RunFinished"],
        ]


class TestFoldGap:
    def test_a_version_gap_in_the_supervisors_fold_raises(self, engine: Engine) -> None:
        """The supervisor's fold of a run refuses an event that is not the next version."""
        run = engine.start_run(BUILD)
        sup = engine.supervisor(retry=RetryPolicy(delay=0))
        watch = sup.watch(run)
        skipped = engine.load(run.id)
        skipped.note("a", 1)
        ahead = skipped.note("b", 2)  # version 3, while the fold is at 1
        with pytest.raises(RuleViolation, match="at version 1 and was given version 3"):
            watch.recorded(ahead)

    def test_events_of_another_writer_reach_the_fold_through_refresh(self, engine: Engine) -> None:
        """After refresh, the fold has folded what another writer stored, in order."""
        run = engine.start_run(BUILD)
        sup = engine.supervisor(retry=RetryPolicy(delay=0))
        watch = sup.watch(run)
        engine.load(run.id).stage_failed("plan", "by another writer")
        run.refresh()
        assert (watch.version, watch.last_failure("plan")) == (2, ("Error", "by another writer"))


def async_stages(stages: dict[str, Any]) -> dict[str, Any]:
    """The same stage functions, as coroutines."""

    def wrap(fn: Any) -> Any:
        async def stage(context: StageContext) -> Any:
            return fn(context)

        return stage

    return {name: wrap(fn) for name, fn in stages.items()}
