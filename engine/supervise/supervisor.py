"""The supervisor: runs stage and task functions and records what they did and what it decided.

Every attempt, retry, breaker trip and stuck verdict is an event of the run,
so a restarted process (or an auditor) sees exactly what happened and why.
The rules live in `engine.supervise.decisions`, a generator that does no I/O; this
module's drivers perform what it yields: record, read, call, await and sleep.
"""

from __future__ import annotations

import difflib
import inspect
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from engine.commit import GroupCommitter, UnitOfWork, shared
from engine.errors import AttemptTimeout, InvalidArgument, RunStopped, StageGaveUp, StageNotDriven
from engine.run import Run, abandon, unit_of
from engine.store import Store
from engine.supervise.commands import (
    Attempted,
    Call,
    Command,
    Ended,
    GiveUpAnswer,
    Pause,
    PolicyAnswer,
    Read,
    Record,
    RunHistory,
    Step,
)
from engine.supervise.context import StageContext
from engine.supervise.decisions import Decisions, GiveUpHook, PolicyChoice
from engine.supervise.perform import Reader, held_history, record
from engine.supervise.policies import CircuitBreaker, ProgressPolicy, RetryPolicy, SpendingLimit
from engine.supervise.reader import RunReader
from engine.supervise.watch import RunWatch
from events import JSON

FAILED_FINALS = {"failed": "failed", "aborted": "failed", "cancelled": "cancelled"}
"""The status `drive` finishes with in these final states; any other final state succeeds."""


class Supervisor:
    """Runs stage functions under retry, breaker and progress policies; records every decision.

    Build one with `Engine.supervisor(...)`.

    Args:
        retry: the default `RetryPolicy` (default: 3 retries, 1 s doubling up to 60 s).
        policies: per stage (or task id) a `RetryPolicy`, or a function given the
            `StageContext` that returns the policy for the next attempt.
        breaker: a `CircuitBreaker` per stage (default: none).
        progress: a `ProgressPolicy` evaluated before each attempt (default: none).
        budget: a `SpendingLimit`: once the run's `BudgetSpent` in its unit reach the
            limit, the next attempt (stage or task) is refused and the run finishes
            ``failed`` with a ``budget`` reason, or goes to the handler stage of the
            table's ``over_budget`` row (default: none).
        on_give_up: in `drive` and `step`, a function given the `StageContext` and the
            `StageGaveUp` of a stage that gave up: it returns a `Rollback` to undo
            outcomes and go on from the state they leave, or None to finish the run
            ``failed`` (the default, and what happens without a hook).
        group_commits: write what is decided between two calls of your code in one
            transaction (default): an attempt's outcome, its decision and the start of
            the next attempt, or the last outcome and `RunFinished`. Each is durable
            before the next call or wait begins, so resuming after a crash still
            records every interrupted attempt; a grouped start names the version its
            transaction began with (`StageStarted.committed_with`). False writes each
            event (a failure with its decision) in a transaction of its own.
        shared_commits: in the async drivers (`drive_async`, `execute_async`), let the
            runs driven concurrently in one event loop share their transactions: what
            several runs hold at about the same moment is one commit, written in a
            worker thread while the loop goes on (`GroupCommitter`). Each run's batch
            is still durable before its next call; off by default (each run commits
            on its own, on the loop's thread).
        sleep: waits between attempts (default `time.sleep`; `asyncio.sleep` when async).
        clock: seconds since the epoch; it stamps every event the supervisor records and
            measures durations, timeouts and the breaker's reset (one clock for all).
        rng: the random source of the jitter.
    """

    def __init__(
        self,
        engine: RunReader,
        *,
        retry: RetryPolicy | None = None,
        policies: Mapping[str, PolicyChoice] | None = None,
        breaker: CircuitBreaker | None = None,
        progress: ProgressPolicy | None = None,
        budget: SpendingLimit | None = None,
        on_give_up: GiveUpHook | None = None,
        group_commits: bool = True,
        shared_commits: bool = False,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.engine = engine
        self.group_commits = group_commits
        self.shared_commits = shared_commits
        # Looked up at each call, not bound now, so freezegun's clock reaches them.
        self.sleep: Callable[[float], Any] = sleep or _real_sleep
        self.clock: Callable[[], float] = clock or _real_clock
        self.reader = Reader(engine)
        self.decisions = Decisions(
            retry=retry or RetryPolicy(),
            policies=_checked_policies(policies or {}),
            breaker=breaker,
            progress=progress,
            spending=budget,
            on_give_up=on_give_up,
            clock=self.clock,
            rng=rng or random.Random(),
        )

    def execute(
        self, run: Run, stage: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run `fn(*args, **kwargs)` as attempts of `stage` until one completes.

        Returns:
            The result recorded in `StageCompleted` (an `Outcome`'s `result`).

        Raises:
            StageGaveUp: the policy stopped retrying, or the table sent the failure elsewhere.
            CircuitOpen: the stage's breaker is open (or tripped now).
            RunStopped: the progress policy finished the run as stuck or partial.
        """
        with unit_of(run).stamped(self._now), self._holding(run):
            loop = self.decisions.stage(run, stage)
            return self._result(run, stage, self._drive_sync(run, loop, fn, args, kwargs))

    async def execute_async(
        self, run: Run, stage: str, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> Any:
        """`execute` for an async stage function (a timeout cancels the attempt)."""
        with unit_of(run).stamped(self._now), self._holding(run):
            loop = self.decisions.stage(run, stage)
            attempted = await self._drive_async(run, loop, fn, args, kwargs)
            await self._commit(run)  # the outcome, off the loop with shared_commits
            return self._result(run, stage, attempted)

    def task(
        self, run: Run, task_id: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run `fn(*args, **kwargs)` as task `task_id` (added if new) with retries.

        A task already completed in the run is not run again: its recorded result is
        returned. Return `Spent(result, amount, unit)` to record the cost atomically.

        Raises:
            StageGaveUp: the policy stopped retrying the task.
        """
        with unit_of(run).stamped(self._now):
            return self._drive_sync(run, self.decisions.task(run, task_id), fn, args, kwargs)

    async def task_async(
        self, run: Run, task_id: str, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> Any:
        """`task` for an async task function."""
        with unit_of(run).stamped(self._now):
            return await self._drive_async(run, self.decisions.task(run, task_id), fn, args, kwargs)

    def drive(
        self,
        run: Run,
        stages: Mapping[str, Callable[[StageContext], Any]],
        *,
        statuses: Mapping[str, str] | None = None,
    ) -> Run:
        """Follow the run's table from its state to a final state, then finish the run.

        Each stage's function is called with a `StageContext`. A run stopped by the
        progress policy is returned finished (``aborted_stuck`` / ``done_partial``).

        Args:
            statuses: the finish status per final state (default: `FAILED_FINALS`, else
                ``succeeded``).

        Raises:
            StageNotDriven: the run reached a stage without a function.
            StageGaveUp: a stage gave up; the run is finished as ``failed`` first.
            CircuitOpen: a stage's breaker is open; the run stays where it is.
        """
        _check_stages(run, stages)
        # Grouped: an outcome shares a transaction with what follows it.
        with unit_of(run).stamped(self._now), self._holding(run):
            while self._step(run, stages, statuses) is not _FINISHED:
                pass
        return run

    def step(
        self,
        run: Run,
        stages: Mapping[str, Callable[[StageContext], Any]],
        *,
        statuses: Mapping[str, str] | None = None,
    ) -> Any:
        """One move of `drive`: the current state's stage to its outcome, retries included.

        For a caller that looks at each outcome before the next (and may roll it
        back): ``while run.status == "running": result = sup.step(run, stages)``. On a
        final state it finishes the run, as `drive` does.

        Returns:
            The stage's result (None when its failure moved the run on, or a policy
            stopped it), or `FINISHED` when the run was already in a final state.

        Raises:
            As `drive`.
        """
        _check_stages(run, stages)
        with unit_of(run).stamped(self._now), self._holding(run):
            return self._step(run, stages, statuses)

    def _step(
        self,
        run: Run,
        stages: Mapping[str, Callable[[StageContext], Any]],
        statuses: Mapping[str, str] | None,
    ) -> Any:
        """`step` inside the caller's stamping and holding blocks, the stages checked."""
        fn = self._next(run, stages, statuses)
        if fn is None:
            return _FINISHED
        loop = self.decisions.driven(run, run.state)
        result = None  # stays None when a policy stops the run (`_ending` swallows it)
        with self._ending(run):
            attempted = self._drive_sync(run, loop, self._with_context(run, fn), (), {})
            result = None if attempted.routed else attempted.result
        return result

    async def drive_async(
        self,
        run: Run,
        stages: Mapping[str, Callable[[StageContext], Awaitable[Any]]],
        *,
        statuses: Mapping[str, str] | None = None,
    ) -> Run:
        """`drive` with async stage functions."""
        _check_stages(run, stages)
        with unit_of(run).stamped(self._now), self._holding(run):
            while (fn := self._next(run, stages, statuses)) is not None:
                loop = self.decisions.driven(run, run.state)
                with self._ending(run):
                    await self._drive_async(run, loop, self._with_context(run, fn), (), {})
            await self._commit(run)  # the last outcome and RunFinished, off the loop if shared
        return run

    def _now(self) -> datetime:
        """The supervisor's clock as an event timestamp: one clock for all it writes and reads."""
        return datetime.fromtimestamp(self.clock(), UTC)

    def _with_context(self, run: Run, fn: Callable[[StageContext], Any]) -> Callable[[], Any]:
        """`fn` called with a new `StageContext` per attempt, so each sees the ones before."""
        stage = run.state
        return lambda: fn(StageContext(self.engine, run, stage))

    def _next(
        self, run: Run, stages: Mapping[str, Callable[..., Any]], statuses: Mapping[str, str] | None
    ) -> Callable[..., Any] | None:
        if run.machine.status is not None:
            return None
        state = run.state
        if run.pipeline.is_final(state):
            status, reason = self._final_status(run, state, statuses)
            run.finish(status, reason)
            self.decisions.forget(run)
            return None
        if state not in stages:
            raise StageNotDriven(run.id, state, stages)
        return stages[state]

    def _final_status(
        self, run: Run, state: str, statuses: Mapping[str, str] | None
    ) -> tuple[str, JSON]:
        """How a driven run that reached `state` finishes: a routed verdict decides first."""
        if statuses and state in statuses:
            return statuses[state], f"reached final state {state!r}"
        verdict = self.watch(run).verdict
        if verdict is not None:
            reason = verdict["reason"]
            handled = {**reason, "final_state": state} if isinstance(reason, dict) else reason
            return str(verdict["status"]), handled
        return FAILED_FINALS.get(state, "succeeded"), f"reached final state {state!r}"

    def _ending(self, run: Run) -> _Ending:
        """How a stage may end a driven run: giving up finishes it failed; a stop is final."""
        return _Ending(self, run)

    def _holding(self, run: Run) -> _GroupCommit:
        """Group what is recorded in the block until a commit point (`group_commits`)."""
        return _GroupCommit(self, run)

    def watch(self, run: Run) -> RunWatch:
        """The supervisor's fold of `run` (read from the store if it has none yet)."""
        watch: RunWatch = self._drive_sync(run, self.decisions.watched(run), _no_call, (), {})
        return watch

    def _drive_sync(
        self,
        run: Run,
        loop: Step,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        work = unit_of(run)
        try:
            command = next(loop)
            while True:
                answer: Any = None
                if isinstance(command, Record):
                    record(run, command)
                elif isinstance(command, Call):
                    with work.calling():  # a commit point: what was recorded is durable first
                        answer = self._call(fn, args, kwargs, command.timeout)
                elif isinstance(command, Read):
                    answer = self._read(run, command)
                else:
                    if command.seconds > 0:
                        work.commit()  # a crash while waiting keeps the failure and its decision
                    self.sleep(command.seconds)
                command = loop.send(answer)
        except StopIteration as done:
            return done.value

    def _read(self, run: Run, command: Read) -> Any:
        question = command.question
        if not isinstance(question, PolicyAnswer | GiveUpAnswer):
            return self.reader.answer(question)
        with unit_of(run).calling():  # the caller's code: what the run recorded is stored
            return question.ask(StageContext(self.engine, question.run, question.stage))

    async def _drive_async(
        self,
        run: Run,
        loop: Step,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        work = unit_of(run)
        try:
            command: Command = next(loop)
            while True:
                answer: Any = None
                if isinstance(command, Record):
                    record(run, command)
                elif isinstance(command, Read):
                    answer = await self._read_async(run, command)
                elif isinstance(command, Pause) and command.seconds <= 0:
                    pass  # no wait: not a commit point, as in `drive`
                else:
                    # Other coroutines run while this one awaits: nothing is left pending.
                    await self._commit(run)
                    with work.calling():
                        if isinstance(command, Call):
                            answer = await self._call_async(fn, args, kwargs, command.timeout)
                        else:
                            await self._pause(command.seconds)
                command = loop.send(answer)
        except StopIteration as done:
            return done.value

    async def _read_async(self, run: Run, command: Read) -> Any:
        """A `Read` in a worker thread, so the loop never waits on the store or a policy.

        A run's history that its handle holds (it began the run) is answered at once,
        with no read and no thread: runs started together keep the step they share
        commits in.
        """
        import asyncio

        question = command.question
        if isinstance(question, RunHistory) and (held := held_history(question.run)) is not None:
            return held
        if not isinstance(question, PolicyAnswer | GiveUpAnswer):
            return await asyncio.to_thread(self.reader.answer, question)
        await self._commit(run)
        with unit_of(run).calling():  # the caller's code: what the run recorded is stored
            context = StageContext(self.engine, question.run, question.stage)
            return await _awaited(await asyncio.to_thread(question.ask, context))

    async def _commit(self, run: Run) -> None:
        """With `shared_commits`, commit what the run recorded through its loop's committer."""
        if self.shared_commits:
            await unit_of(run).commit_async(shared(unit_of(run).store))

    def committer(self, store: Store) -> GroupCommitter:
        """The committer `shared_commits` writes `store` through in the running event loop.

        Its `commits` and `batches` say how many transactions the loop's runs shared.
        """
        return shared(store)

    def _call(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> Ended:
        began = self.clock()
        try:
            value = fn(*args, **kwargs) if timeout is None else _within(timeout, fn, args, kwargs)
        except Exception as error:
            return Ended(error=error, duration=self._since(began))
        return self._late(value, began, timeout)

    async def _call_async(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: float | None,
    ) -> Ended:
        import asyncio  # here, not at the top: the command line starts faster without it

        began = self.clock()
        try:
            attempt = asyncio.ensure_future(_awaited(fn(*args, **kwargs)))
            try:  # not wait_for: a TimeoutError of the function's own is its error
                finished, _ = await asyncio.wait({attempt}, timeout=timeout)
            except BaseException:  # the caller was cancelled: so is the attempt
                attempt.cancel()
                raise
            if not finished:
                attempt.cancel()
                await asyncio.wait({attempt})  # its end, without taking its CancelledError
                if not attempt.cancelled():
                    attempt.exception()  # retrieved: a late error is not logged as lost
                raise AttemptTimeout(timeout or 0.0, timeout or 0.0)
            value = attempt.result()
        except Exception as error:
            return Ended(error=error, duration=self._since(began))
        return self._late(value, began, timeout)

    def _late(self, value: Any, began: float, timeout: float | None) -> Ended:
        duration = self._since(began)
        if timeout is not None and duration > timeout:  # by the injected clock: testable
            return Ended(error=AttemptTimeout(timeout, duration), duration=duration)
        return Ended(value=value, duration=duration)

    async def _pause(self, seconds: float) -> None:
        import asyncio

        slept = asyncio.sleep(seconds) if self.sleep is _real_sleep else self.sleep(seconds)
        if inspect.isawaitable(slept):
            await slept

    def _result(self, run: Run, stage: str, attempted: Attempted) -> Any:
        if not attempted.routed:
            return attempted.result
        assert attempted.gave_up is not None
        raise attempted.gave_up

    def _since(self, began: float) -> float:
        """Seconds since `began`, to the microsecond: what an epoch clock can tell.

        A float near 1.7e9 holds about seven decimals, so a difference of two
        readings carries noise (5.200000047683716 for 5.2); an event's timestamp
        keeps microseconds, and so does a duration.
        """
        return round(max(0.0, self.clock() - began), 6)


class _Finished:
    """What `Supervisor.step` returns for a run it found in a final state (and finished)."""

    def __repr__(self) -> str:
        return "FINISHED"


_FINISHED: Any = _Finished()
FINISHED = _FINISHED
"""`Supervisor.step`'s answer when the run had nothing left to run."""


def _real_sleep(seconds: float) -> None:
    if seconds > 0:  # sleep(0) gives the processor away: on a busy machine, for milliseconds
        time.sleep(seconds)


def _real_clock() -> float:
    return time.time()


def _within(
    timeout: float, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """`fn(*args, **kwargs)` in a daemon thread; `AttemptTimeout` if it is not done in time.

    Python cannot stop a thread: a late call goes on in the background, its result
    dropped and its appends to any run refused.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as error:
            outcome["error"] = error

    worker = threading.Thread(target=target, name="stagetrail-attempt", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        abandon(worker)  # the run moves on: what the late call records is refused
        raise AttemptTimeout(timeout, timeout)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _no_call() -> None:
    """The function of a drive that never calls one."""


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _checked_policies(policies: Mapping[str, PolicyChoice]) -> dict[str, PolicyChoice]:
    for key, choice in policies.items():
        if not (isinstance(choice, RetryPolicy) or callable(choice)):
            raise InvalidArgument(
                "policies", f"{key!r} maps to a {type(choice).__name__}, "
                "not a RetryPolicy or a function returning one"
            )  # fmt: skip
    return dict(policies)


def _check_stages(run: Run, stages: Mapping[str, Callable[..., Any]]) -> None:
    """Refuse a function that is not callable, or whose name looks like a misspelt stage.

    A function for a name the table does not have is accepted and never called: an
    agent offers the functions of all its nodes, and one pipeline uses some of them.
    Only a name one or two letters off a stage of the table that has no function is
    refused (it is almost surely that stage, misspelt), before anything is recorded.
    """
    pipeline = run.pipeline
    unknown = set(stages) - set(pipeline.states)
    if unknown:
        missing = sorted(s for s in set(pipeline.states) - set(stages) if not pipeline.is_final(s))
        for name in sorted(unknown):
            close = [m for m in difflib.get_close_matches(name, missing, n=1, cutoff=0.75)
                     if abs(len(m) - len(name)) <= 1]  # fmt: skip
            if close:
                raise InvalidArgument(
                    "stages", f"{name!r} is not a state of pipeline {pipeline.name!r}; "
                    f"did you mean {close[0]!r}, which has no function?"
                )  # fmt: skip
    for stage, fn in stages.items():
        if not callable(fn):
            raise InvalidArgument("stages", f"the function for {stage!r} is not callable")


class _Ending:
    """The context of `Supervisor._ending` (a class: it wraps every supervised step).

    `StageGaveUp` is raised on (the decisions finished the run ``failed``, unless an
    `on_give_up` hook rolled it back); `RunStopped` ends the block quietly: a policy
    finished the run already, or routed it to a handler stage.
    """

    __slots__ = ("_run", "_supervisor")

    def __init__(self, supervisor: Supervisor, run: Run) -> None:
        self._supervisor, self._run = supervisor, run

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: object, trace: object) -> bool:
        if isinstance(error, StageGaveUp):
            self._supervisor.decisions.forget(self._run)
            return False
        return isinstance(error, RunStopped)


class _GroupCommit:
    """The context of `Supervisor._holding` (a class: it wraps every supervised attempt).

    A failed write, or an error out of the block, makes the supervisor forget the
    run's watch: it may have seen events the failed write dropped.
    """

    __slots__ = ("_run", "_supervisor", "_work")

    def __init__(self, supervisor: Supervisor, run: Run) -> None:
        self._supervisor, self._run = supervisor, run
        self._work: UnitOfWork | None = None

    def __enter__(self) -> None:
        work = unit_of(self._run)
        if self._supervisor.group_commits and not work.batches:  # in a batch: the watch refuses
            self._work = work
            work.begin()

    def __exit__(self, kind: type[BaseException] | None, error: object, trace: object) -> None:
        work = self._work
        if work is None:
            return
        try:
            work.end()
        except BaseException:
            self._supervisor.decisions.forget(self._run)
            raise
        if kind is not None:
            self._supervisor.decisions.forget(self._run)
