from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from engine import ConcurrencyConflict, Engine, Outcome, RetryPolicy, StageContext, StageGaveUp
from engine.cli.demo.code_review import BuildException
from engine.commit.group import shared_exists
from engine.errors import RuleViolation
from tests._helpers import REVIEW
from tests.supervise._helpers import LOOP, FakeTime, failing, kinds, of_type


@pytest.fixture
def fake() -> FakeTime:
    """A fake clock and sleep."""
    return FakeTime()


def supervise(engine: Engine, fake: FakeTime, **settings: Any) -> Any:
    return engine.supervisor(sleep=fake.sleep, clock=fake.clock, **settings)


class TestTimeout:
    def test_an_attempt_longer_than_the_timeout_fails_as_timeout(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """By the injected clock, a too-long attempt is StageFailed('Timeout') and retried."""
        run = engine.start_run(LOOP)
        durations = iter([10.0, 1.0])

        def slow() -> str:
            fake.advance(next(durations))
            return "late"

        sup = supervise(engine, fake, retry=RetryPolicy(timeout=5, delay=0))
        assert sup.execute(run, "work", slow) == "late"
        failed = of_type(engine, run, "StageFailed")[0]
        assert (failed.error_type, failed.duration) == ("Timeout", 10.0)  # type: ignore[attr-defined]
        assert "timeout of 5 s" in failed.error  # type: ignore[attr-defined]

    def test_a_hanging_function_is_abandoned_at_the_timeout(self, engine: Engine) -> None:
        """A sync function that never returns is given up on after its timeout (a real wait)."""
        run = engine.start_run(LOOP)
        release = threading.Event()
        sup = engine.supervisor(retry=RetryPolicy(timeout=0.05, max_retries=0))
        try:
            with pytest.raises(StageGaveUp) as raised:
                sup.execute(run, "work", release.wait)
        finally:
            release.set()
        assert raised.value.error_type == "Timeout"
        assert of_type(engine, run, "StageFailed")[0].error_type == "Timeout"  # type: ignore[attr-defined]

    def test_an_abandoned_attempt_cannot_record_any_more(self, engine: Engine) -> None:
        """What a sync function records after its timeout is refused; the history stays whole."""
        run = engine.start_run(LOOP)
        release = threading.Event()
        late: dict[str, Any] = {}

        def slow() -> None:
            late["thread"] = threading.current_thread()
            release.wait()
            try:
                run.note("late", "written after the timeout")
            except RuleViolation as refused:
                late["error"] = refused

        sup = engine.supervisor(retry=RetryPolicy(timeout=0.05, max_retries=0))
        with pytest.raises(StageGaveUp):
            sup.execute(run, "work", slow)
        release.set()
        late["thread"].join(timeout=30)  # set before the 50 ms timeout could pass
        assert late["error"].rule == "abandoned"
        notes = [e.key for e in of_type(engine, run, "NoteAdded")]  # type: ignore[attr-defined]
        assert notes == ["gave_up"]
        assert run.note("after", 1).version == run.version  # the main thread still records

    def test_errors_inside_the_timeout_thread_are_the_attempts_errors(
        self, engine: Engine, fake: FakeTime
    ) -> None:
        """An exception raised by a function run under a timeout is recorded as itself."""
        run = engine.start_run(LOOP)
        sup = supervise(engine, fake, retry=RetryPolicy(timeout=30, delay=0))
        assert sup.execute(run, "work", failing(1, OSError("disk"))) == "ok"
        assert of_type(engine, run, "StageFailed")[0].error_type == "OSError"  # type: ignore[attr-defined]


class TestAsync:
    def test_execute_async_retries_an_async_function(self, engine: Engine, fake: FakeTime) -> None:
        """An async stage function is awaited; failures are retried with the injected sleep."""
        run = engine.start_run(LOOP)
        calls = {"n": 0}

        async def work(x: int) -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ConnectionError("reset")
            return x * 2

        sup = supervise(engine, fake, retry=RetryPolicy(delay=4))
        assert asyncio.run(sup.execute_async(run, "work", work, 21)) == 42
        assert fake.sleeps == [4]
        assert kinds(engine, run).count("StageFailed") == 1

    def test_an_async_timeout_cancels_the_attempt(self, engine: Engine) -> None:
        """An awaited attempt longer than its timeout is cancelled and recorded as Timeout."""
        run = engine.start_run(LOOP)
        cancelled = {"yes": False}

        async def hang() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled["yes"] = True
                raise

        sup = engine.supervisor(retry=RetryPolicy(timeout=0.02, max_retries=0))
        with pytest.raises(StageGaveUp):
            asyncio.run(sup.execute_async(run, "work", hang))
        assert cancelled["yes"]
        assert of_type(engine, run, "StageFailed")[0].error_type == "Timeout"  # type: ignore[attr-defined]

    def test_a_timeout_error_of_the_function_is_its_own_error(self, engine: Engine) -> None:
        """An async function raising TimeoutError itself is that error, not the policy's timeout."""

        async def fetch() -> None:
            raise TimeoutError("upstream read timed out")

        for policy in (RetryPolicy(max_retries=0), RetryPolicy(max_retries=0, timeout=60)):
            run = engine.start_run(LOOP)
            with pytest.raises(StageGaveUp):
                asyncio.run(engine.supervisor(retry=policy).execute_async(run, "work", fetch))
            (failure,) = of_type(engine, run, "StageFailed")
            assert failure.error_type == "TimeoutError"  # type: ignore[attr-defined]
            assert failure.error == "upstream read timed out"  # type: ignore[attr-defined]

    def test_drive_async_with_an_async_sleep(self, engine: Engine) -> None:
        """drive_async follows the table; an async injected sleep is awaited."""
        run = engine.start_run(LOOP)
        slept: list[float] = []

        async def sleep(seconds: float) -> None:
            slept.append(seconds)

        calls = {"n": 0}

        async def work(context: StageContext) -> Outcome:
            calls["n"] += 1
            if calls["n"] == 1:
                raise ValueError("flaky")
            return Outcome("partial")

        async def check(context: StageContext) -> str:
            return "fine"

        sup = engine.supervisor(sleep=sleep, retry=RetryPolicy(delay=0.5))
        asyncio.run(sup.drive_async(run, {"work": work, "check": check}))
        assert slept == [0.5]
        assert run.status == "succeeded"

    def test_drive_async_gives_up_and_finishes_failed(self, engine: Engine, fake: FakeTime) -> None:
        """A stage that gives up under drive_async finishes the run failed."""
        run = engine.start_run(LOOP)

        async def broken(context: StageContext) -> None:
            raise BuildException("nope")

        sup = supervise(engine, fake, retry=RetryPolicy(max_retries=0))
        with pytest.raises(StageGaveUp):
            asyncio.run(sup.drive_async(run, {"work": broken}))
        assert run.status == "failed"

    def test_cancelling_the_caller_cancels_the_attempt(self, engine: Engine) -> None:
        """When the task awaiting execute_async is cancelled, the stage function is too."""
        run = engine.start_run(LOOP)
        seen = {"started": False, "cancelled": False}

        async def work() -> None:
            seen["started"] = True
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen["cancelled"] = True
                raise

        async def main() -> None:
            caller = asyncio.ensure_future(engine.supervisor().execute_async(run, "work", work))
            while not seen["started"]:
                await asyncio.sleep(0)
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            await asyncio.sleep(0)  # one turn of the loop for the attempt to take its cancel
            assert seen["cancelled"]  # now, not at asyncio.run's clean-up

        asyncio.run(main())
        assert run.machine.open_attempt == 1  # no outcome: resume() records it as Interrupted


SHARED_STAGES = ("project_analysis", "code_review", "developer", "testing")


def shared_stages(engine: Engine, seen: list[tuple[int, int]]) -> dict[str, Any]:
    """Async stage functions: `developer` fails once per run; each notes what is stored."""

    async def stage(context: StageContext) -> dict[str, int]:
        stored = engine.events(context.run.id)[-1].version
        seen.append((context.run.version, stored))
        await asyncio.sleep(0)  # the other runs move meanwhile
        if context.stage == "developer" and context.attempt == 1:
            raise BuildException("red")
        return {"attempt": context.attempt}

    return dict.fromkeys(SHARED_STAGES, stage)


class TestSharedCommits:
    def test_concurrent_runs_share_transactions_and_record_the_same(self, engine: Engine) -> None:
        """Ten runs driven at once record what one run records alone, in fewer commits."""
        seen: list[tuple[int, int]] = []
        alone = engine.supervisor(retry=RetryPolicy(delay=0))
        first = engine.start_run(REVIEW)
        asyncio.run(alone.drive_async(first, shared_stages(engine, seen)))
        sup = engine.supervisor(retry=RetryPolicy(delay=0), shared_commits=True)
        runs = [engine.start_run(REVIEW) for _ in range(10)]

        async def drive_all() -> tuple[int, int]:
            stages = shared_stages(engine, seen)
            await asyncio.gather(*(sup.drive_async(run, stages) for run in runs))
            committer = sup.committer(engine.store)
            return committer.commits, committer.batches

        commits, batches = asyncio.run(drive_all())
        assert all(run.status == "succeeded" for run in runs)
        assert {tuple(kinds(engine, run)) for run in runs} == {tuple(kinds(engine, first))}
        # Five calls; before the first nothing is held (project_analysis records no start);
        # the last outcome goes with RunFinished.
        assert batches == 10 * 5
        assert commits < batches / 5

    def test_every_batch_is_durable_before_the_next_call(self, engine: Engine) -> None:
        """When a stage function runs, the store holds all its run has recorded."""
        seen: list[tuple[int, int]] = []
        sup = engine.supervisor(retry=RetryPolicy(delay=0), shared_commits=True)
        runs = [engine.start_run(REVIEW) for _ in range(5)]

        async def drive_all() -> int:
            stages = shared_stages(engine, seen)
            await asyncio.gather(*(sup.drive_async(run, stages) for run in runs))
            return sup.committer(engine.store).batches

        assert asyncio.run(drive_all()) == 5 * 5  # every group went through the committer
        assert len(seen) == 5 * 5
        assert all(recorded == stored for recorded, stored in seen)

    def test_a_conflict_in_one_run_leaves_the_others_alone(self, engine: Engine) -> None:
        """Another writer's event in one run fails that run's drive; the rest finish."""
        sup = engine.supervisor(retry=RetryPolicy(delay=0), shared_commits=True)
        runs = [engine.start_run(REVIEW) for _ in range(4)]
        engine.load(runs[2].id).note("intruder", True)
        stages = shared_stages(engine, [])

        async def drive_all() -> list[Any]:
            drives = (sup.drive_async(run, stages) for run in runs)
            return await asyncio.gather(*drives, return_exceptions=True)

        outcomes = asyncio.run(drive_all())
        assert isinstance(outcomes[2], ConcurrencyConflict)
        assert [run.status for i, run in enumerate(runs) if i != 2] == ["succeeded"] * 3
        assert engine.events(runs[2].id)[-1].key == "intruder"  # type: ignore[attr-defined]

    def test_off_by_default_the_runs_commit_on_their_own(self, engine: Engine) -> None:
        """Without shared_commits no committer is made: each run writes on the loop's thread."""
        sup = engine.supervisor(retry=RetryPolicy(delay=0))
        run = engine.start_run(REVIEW)

        async def drive() -> bool:
            await sup.drive_async(run, shared_stages(engine, []))
            return shared_exists(engine.store)

        assert not asyncio.run(drive())
        assert run.status == "succeeded"

    @pytest.mark.parametrize("steps", [1, 3, 6, 10])
    def test_a_cancelled_drive_keeps_every_outcome(self, engine: Engine, steps: int) -> None:
        """A drive cancelled anywhere has all it recorded on disk; resuming finishes the run."""
        sup = engine.supervisor(retry=RetryPolicy(delay=0), shared_commits=True)
        runs = [engine.start_run(REVIEW) for _ in range(3)]
        stages = shared_stages(engine, [])

        async def cancel_the_second() -> list[Any]:
            drives = [asyncio.ensure_future(sup.drive_async(run, stages)) for run in runs]
            for _ in range(steps):
                await asyncio.sleep(0)
            drives[1].cancel()
            return await asyncio.gather(*drives, return_exceptions=True)

        outcomes = asyncio.run(cancel_the_second())
        cancelled = runs[1]
        assert isinstance(outcomes[1], asyncio.CancelledError)  # far from done at any step
        assert engine.events(cancelled.id)[-1].version == cancelled.version
        resumed = engine.resume(cancelled.id)
        again = engine.supervisor(retry=RetryPolicy(delay=0))
        asyncio.run(again.drive_async(resumed, stages))
        assert [engine.load(run.id).status for run in runs] == ["succeeded"] * 3
