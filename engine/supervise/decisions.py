"""The supervisor's decisions, written once for synchronous and async callers.

Each loop is a generator that records events and yields what it needs done —
`Call` the function (with a timeout) or `Pause` before a retry — and is sent
back how the call `Ended`. The drivers in `engine.supervise.supervisor` only call, await
and sleep; every rule lives here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeAlias

import attrs

from engine.commit import UnitOfWork
from engine.errors import (
    AttemptError,
    AttemptTimeout,
    CircuitOpen,
    RuleViolation,
    RunAlreadyFinished,
    RunStopped,
    StageGaveUp,
)
from engine.run import Run, unit_of
from engine.supervise.breaker import Circuit
from engine.supervise.context import StageContext
from engine.supervise.guards import BreakerGuard, progress_stop
from engine.supervise.outcome import Outcome, Spent
from engine.supervise.policies import CircuitBreaker, ProgressPolicy, RetryPolicy, SpendingLimit
from engine.supervise.reader import RunReader
from engine.supervise.streaks import counts, routes_elsewhere
from engine.supervise.watch import VERDICT_NOTE, RunWatch, recorded_events
from events import JSON, CircuitClosed, CircuitOpened, RetryScheduled
from projections import TaskTable

PolicyChoice: TypeAlias = "RetryPolicy | Callable[[StageContext], RetryPolicy]"
MAX_WATCHES = 1024
"""Runs whose watch a supervisor keeps; the oldest is dropped (and refolded if needed)."""


@attrs.frozen
class Call:
    """Run the function once; fail it as a timeout after `timeout` seconds."""

    timeout: float | None


@attrs.frozen
class Pause:
    """Sleep this many seconds before the next attempt."""

    seconds: float


@attrs.frozen
class Ended:
    """How a call ended: its value, or the exception it raised, and its duration."""

    value: Any = None
    error: Exception | None = None
    duration: float = 0.0


@attrs.frozen
class Attempted:
    """A stage's last attempt: its result, or `routed` when a failure moved the run on."""

    result: JSON = None
    routed: bool = False


VERDICT_OUTCOMES = {"aborted_stuck": "stuck", "done_partial": "partial"}
"""The outcome a table row names to route a progress verdict to a handler stage."""

Step: TypeAlias = Generator[Call | Pause, Any, Any]
Chosen: TypeAlias = tuple[RetryPolicy, str]
"""A policy and what chose it."""


class Decisions:
    """Retry, breaker and progress rules, applied to one run's attempts and recorded.

    A failure and the decision it leads to (a retry, a breaker trip, giving up)
    are written in one transaction, so no crash can separate them.
    """

    def __init__(
        self,
        engine: RunReader,
        *,
        retry: RetryPolicy,
        policies: Mapping[str, PolicyChoice],
        breaker: CircuitBreaker | None,
        progress: ProgressPolicy | None,
        spending: SpendingLimit | None = None,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        self.engine = engine
        self.retry = retry
        self.policies = dict(policies)
        self.breaker = breaker
        self.guard = None if breaker is None else BreakerGuard(engine, breaker, clock)
        self.progress = progress
        self.spending = spending
        self.rng = rng
        self._watches: dict[Any, RunWatch] = {}
        self._units: dict[Any, UnitOfWork] = {}

    def watch(self, run: Run) -> RunWatch:
        """The run's watch: it follows every event the run handle records."""
        work = unit_of(run)
        if work.batches:
            raise RuleViolation(
                run.id, "batch", "the supervisor records each attempt durably; "
                "call it outside run.batch()"
            )  # fmt: skip
        watch = self._watches.get(run.id)
        if watch is not None and not watch.stale and watch in work.observers:
            return watch
        if watch is not None:
            self.forget(run)
        if len(self._watches) >= MAX_WATCHES:
            self._detach(next(iter(self._watches)))
        watch = self._watches[run.id] = RunWatch(
            run.pipeline,
            progress=self.progress is not None,
            circuits=self.breaker is not None,
            forget_rolled_back=self.breaker is not None and self.breaker.forget_rolled_back,
        )
        for event in recorded_events(run):
            watch.see(event)
        work.observers.append(watch)
        self._units[run.id] = work
        return watch

    def stage(self, run: Run, stage: str) -> Step:
        """Attempts of `stage` until it completes, its failure moves the run, or a rule stops it."""
        watch = self.watch(run)
        _check_current(run, stage)
        while True:
            self._check_spending(run, watch, stage)
            self._check_progress(run, watch, stage)
            circuit = None if self.guard is None else self.guard.admit(run, stage, watch)
            chosen = self.policy(run, stage, stage)
            recordable = _records_failures(run, chosen[0])
            if recordable:
                streak = watch.streaks.count(stage, chosen[0])
                self._check_budget(run, stage, streak, watch.last_failure(stage), chosen)
                # Opened only where every failure can close it, so none is left open.
                if run.machine.open_attempt is None and _every_failure_recordable(run, chosen[0]):
                    run.stage_started(stage)
            ended = yield Call(chosen[0].timeout)
            watch = self.watch(run)  # the function may have recorded events of its own
            if ended.error is None:
                return self._completed(run, stage, ended, circuit, watch)
            delay = self._failed(run, stage, ended, chosen, recordable, circuit, watch)
            if delay is None:
                return Attempted(routed=True)
            yield Pause(delay)

    def task(self, run: Run, task_id: str) -> Step:
        """Attempts of a task until it completes or a rule gives up; a completed task is skipped."""
        watch = self.watch(run)
        if run.tasks.get(task_id) == "completed":
            return watch.task_results.get(task_id)
        if task_id not in run.tasks:
            run.add_task(task_id)
        while True:
            self._check_spending(run, watch, f"task:{task_id}")
            chosen = self.policy(run, task_id, run.state)
            failures, last = watch.task_streak(task_id, chosen[0]), watch.task_errors.get(task_id)
            self._check_budget(run, f"task:{task_id}", failures, last or ("Error", ""), chosen)
            if run.tasks[task_id] != "active":
                run.task_started(task_id)
            ended = yield Call(chosen[0].timeout)
            watch = self.watch(run)
            if ended.error is None:
                return self._task_completed(run, task_id, ended.value, watch)
            yield Pause(self._task_failed(run, task_id, ended, chosen))

    def policy(self, run: Run, key: str, stage: str) -> tuple[RetryPolicy, str]:
        """The policy for the next attempt, and what chose it (recorded with decisions)."""
        choice = self.policies.get(key, self.policies.get(stage))
        if choice is None:
            return self.retry, "default"
        if isinstance(choice, RetryPolicy):
            return choice, f"policies[{key if key in self.policies else stage!r}]"
        with unit_of(run).calling():  # the caller's code: what the run recorded is stored
            policy = choice(StageContext(self.engine, run, stage))
        if not isinstance(policy, RetryPolicy):
            raise TypeError(
                f"the policy function {_name(choice)} for {key!r} returned "
                f"{type(policy).__name__}, not a RetryPolicy"
            )
        return policy, _name(choice)

    def forget(self, run: Run) -> None:
        """Drop the watch of a run that finished."""
        self._detach(run.id)

    def _detach(self, run_id: Any) -> None:
        """Drop a run's watch and stop it following the run."""
        watch, work = self._watches.pop(run_id, None), self._units.pop(run_id, None)
        if work is not None and watch in work.observers:
            work.observers.remove(watch)

    def _completed(
        self, run: Run, stage: str, ended: Ended, circuit: Circuit | None, watch: RunWatch
    ) -> Attempted:
        value = ended.value
        outcome, result = (
            (value.outcome, value.result) if isinstance(value, Outcome) else ("completed", value)
        )
        if circuit is None or circuit.status != "half_open":
            run.stage_completed(stage, result, outcome=outcome, duration=ended.duration)
            return Attempted(result)
        with run.batch():  # a successful trial and the closing of its breaker: together
            run.stage_completed(stage, result, outcome=outcome, duration=ended.duration)
            run.record(CircuitClosed, stage=stage, reason="the trial attempt succeeded")
        return Attempted(result)

    def _failed(
        self,
        run: Run,
        stage: str,
        ended: Ended,
        chosen: Chosen,
        recordable: bool,
        circuit: Circuit | None,
        watch: RunWatch,
    ) -> float | None:
        error = ended.error
        assert error is not None
        outcome = chosen[0].outcome_for(error)
        if not _has_row(run, outcome) and _has_row(run, "failed"):
            outcome = "failed"  # the table has no row for the mapped outcome here
        if not recordable or not _has_row(run, outcome):
            reason = f"the table has no {outcome!r} row for {stage!r}, so it is not retried"
            attempts = _attempts(run, stage) + 1
            gave_up = self._gave_up(
                run, stage, attempts, reason, _kind(error), chosen, "no_failure_row"
            )
            raise gave_up from error
        routed = routes_elsewhere(run.pipeline, stage, outcome)
        streak = watch.streaks.count(stage, chosen[0]) + counts((False, routed), chosen[0])
        with run.batch():
            run.stage_failed(
                stage,
                error,
                outcome=outcome,
                error_type="Timeout" if isinstance(error, AttemptTimeout) else None,
                retryable=chosen[0].retryable(error),
                duration=ended.duration,
                details=getattr(error, "details", None),
            )
            decision = self._decide(run, stage, streak, circuit, error, chosen, routed)
        if isinstance(decision, Exception):
            raise decision from error
        return decision

    def _decide(
        self,
        run: Run,
        stage: str,
        streak: int,
        circuit: Circuit | None,
        error: Exception,
        chosen: Chosen,
        routed: bool,
    ) -> float | Exception | None:
        trip = None if circuit is None else self.breaker.trips(circuit.outcome(True))  # type: ignore[union-attr]
        if trip is not None:
            run.record(CircuitOpened, stage=stage, reason=trip)
            return CircuitOpen(run.id, stage, self.breaker.reset_timeout, trip)  # type: ignore[union-attr]
        if run.pipeline.is_final(run.state):
            return None  # the table ends the run on this failure: nothing left to retry
        attempt = _attempts(run, stage) + 1
        return self._retry_or_give_up(run, stage, streak, attempt, error, chosen, routed)

    def _task_completed(self, run: Run, task_id: str, value: Any, watch: RunWatch) -> JSON:
        if not isinstance(value, Spent):
            run.task_completed(task_id, value)
            return value
        with run.batch():  # the cost and the completion land together, or neither does
            run.spend(value.amount, value.unit)
            run.task_completed(task_id, value.result)
        return value.result

    def _task_failed(self, run: Run, task_id: str, ended: Ended, chosen: Chosen) -> float:
        error = ended.error
        assert error is not None
        watch = self.watch(run)
        failures = watch.task_streak(task_id, chosen[0]) + 1
        timeout = "Timeout" if isinstance(error, AttemptTimeout) else None
        attempt = watch.task_failures.get(task_id, 0) + 2  # interruptions included
        with run.batch():
            run.task_failed(task_id, error, error_type=timeout)
            decision = self._retry_or_give_up(
                run, f"task:{task_id}", failures, attempt, error, chosen
            )
        if isinstance(decision, Exception):
            raise decision from error
        assert decision is not None
        return decision

    def _retry_or_give_up(
        self,
        run: Run,
        stage: str,
        streak: int,
        attempt: int,
        error: Exception,
        chosen: Chosen,
        routed: bool = False,
    ) -> float | Exception | None:
        policy, chosen_by = chosen
        if routed:
            return None  # the table moved the run on: the stage it went to decides
        exhausted = _exhausted(policy, error, streak)
        if exhausted is not None:
            cause, problem = exhausted
            return self._gave_up(run, stage, streak, problem, _kind(error), chosen, cause)
        delay = policy.delay_for(streak, self.rng)
        reason = f"retry {streak} of {policy.max_retries} after {_describe(error)}"
        run.record(
            RetryScheduled,
            stage=stage,
            attempt=attempt,
            delay=delay,
            reason=reason,
            policy={**policy.to_json(), "chosen_by": chosen_by},
        )
        return delay

    def _check_budget(
        self, run: Run, stage: str, streak: int, last: tuple[str, str], chosen: Chosen
    ) -> None:
        """Refuse to call again once the stage's (or task's) failures in a row spent the budget."""
        spent = _over_budget(chosen[0], streak)
        if spent is None:
            return
        reason = f"the retry budget is spent: {spent}"
        raise self._gave_up(run, stage, streak, reason, last, chosen)

    def _gave_up(
        self,
        run: Run,
        stage: str,
        attempts: int,
        reason: str,
        last: tuple[str, str],
        chosen: Chosen,
        cause: str = "budget_spent",
    ) -> StageGaveUp:
        """Record why the stage gives up (a ``gave_up`` note); the error to raise."""
        policy, chosen_by = chosen
        error_type, error = last
        decision: dict[str, JSON] = {
            "stage": stage,
            "attempts": attempts,
            "cause": cause,
            "reason": reason,
            "error_type": error_type,
            "error": error,
            "policy": {**policy.to_json(), "chosen_by": chosen_by},
        }
        run.note("gave_up", decision)
        return StageGaveUp(run.id, stage, attempts, reason, error_type, error, cause)

    def _check_spending(self, run: Run, watch: RunWatch, stage: str) -> None:
        """Finish the run ``failed`` instead of another attempt once it spent its limit."""
        limit = self.spending
        if limit is None:
            return
        spent = self._spent(run, watch, limit)
        if spent < limit.limit:
            return
        whose = "" if limit.scope == "run" else " by the run's tree"
        reason: dict[str, JSON] = {
            "rule": "budget",
            "detected": f"spent {spent:g} {limit.unit}{whose} of a {limit.limit:g} "
            f"{limit.unit} limit",
            "spent": spent,
            **limit.to_json(),
            "stage": stage,
        }
        run.finish("failed", reason)
        self.forget(run)
        raise RunStopped(run.id, "failed", reason)

    def _spent(self, run: Run, watch: RunWatch, limit: SpendingLimit) -> float:
        """What counts against `limit`: the run's own spending, or its whole tree's."""
        if limit.scope == "run":
            return watch.spent.get(limit.unit, 0.0)
        root = run.id
        while (parent := self.engine.events(root, upto=1)[0].parent_run_id) is not None:  # type: ignore[attr-defined]
            root = parent
        tasks = self.engine.project(root, TaskTable, tree=True)
        return float(tasks.budget.get(limit.unit, 0.0))

    def _check_progress(self, run: Run, watch: RunWatch, stage: str) -> None:
        """Stop a stuck (or partial) run: route the verdict to its handler stage, or finish it.

        A table with a ``stuck`` (``partial``) row from the current state sends the
        verdict there, recorded as a decision with the outcome that moves the run; the
        handler stage then runs, and reaching a final state finishes the run with the
        verdict's status. Without such a row the run is finished at once. A verdict is
        routed once: after it only `max_steps` still applies, and it finishes the run,
        so a handler that sends the run back into its loop cannot loop for ever.
        """
        if self.progress is None:
            return
        handled = watch.verdict is not None
        policy = attrs.evolve(
            self.progress, max_consecutive_no_ops=None, max_same_error=None
        ) if handled else self.progress  # fmt: skip
        stop = progress_stop(policy, watch, stage)
        if stop is None:
            return
        status, reason = stop
        outcome = VERDICT_OUTCOMES[status]
        if not handled and outcome in run.pipeline.allowed(run.state):
            with run.batch():  # the verdict and the outcome that routes it: together
                run.note(VERDICT_NOTE, {"status": status, "reason": reason})
                run.stage_completed(stage, reason, outcome=outcome, duration=0.0)
            raise RunStopped(run.id, status, reason, routed_to=run.state)
        run.finish(status, reason)
        self.forget(run)
        raise RunStopped(run.id, status, reason)


def _exhausted(policy: RetryPolicy, error: Exception, streak: int) -> tuple[str, str] | None:
    """Why no retry follows this failure (cause, reason), or None when one may."""
    if not policy.retryable(error):
        return "not_retryable", f"{_kind(error)[0]} is not retried by the policy"
    spent = _over_budget(policy, streak)
    return None if spent is None else ("budget_spent", spent)


def _over_budget(policy: RetryPolicy, streak: int) -> str | None:
    """How `streak` counted failures overspend the policy's budget, or None when they do not."""
    if streak <= policy.max_retries:
        return None
    counted = "in the run" if policy.budget == "run" else "in a row"
    return f"{streak} failures {counted} (max_retries={policy.max_retries})"


def _records_failures(run: Run, policy: RetryPolicy) -> bool:
    """Whether the table can record a failure of the current stage, with any mapped outcome."""
    return _has_row(run, "failed") or any(_has_row(run, outcome) for _, outcome in policy.outcomes)


def _every_failure_recordable(run: Run, policy: RetryPolicy) -> bool:
    """Whether any exception of the stage function can be recorded as an outcome here.

    A "failed" row takes every unmapped error; else a mapping of `Exception` itself
    must have a row (a mapped outcome without a row falls back to "failed").
    """
    if _has_row(run, "failed"):
        return True
    return any(
        issubclass(Exception, kind) and _has_row(run, outcome) for kind, outcome in policy.outcomes
    )


def _has_row(run: Run, outcome: str) -> bool:
    """Whether the run's table has a row for `outcome` in the run's current state."""
    return run.pipeline.next_state(run.state, outcome) is not None


def _check_current(run: Run, stage: str) -> None:
    if run.status is not None:
        raise RunAlreadyFinished(run.id, run.status)
    if stage != run.state:
        raise AttemptError(
            run.id, stage, f"cannot run stage {stage!r}: the current state is {run.state!r}"
        )


def _kind(error: Exception) -> tuple[str, str]:
    """The error's recorded type name and message."""
    return ("Timeout" if isinstance(error, AttemptTimeout) else type(error).__name__), str(error)


def _describe(error: Exception) -> str:
    kind, message = _kind(error)
    return f"{kind}: {message[:200]}" if message else kind


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)


def _attempts(run: Run, stage: str) -> int:
    """How many attempts of `stage` the run has opened (an open one included)."""
    machine = run.machine
    opened = machine.open_attempt is not None and stage == machine.state
    return machine.attempts.get(stage, 0) + opened
