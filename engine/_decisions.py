"""The supervisor's decisions, written once for synchronous and async callers.

Each loop is a generator that records events and yields what it needs done —
`Call` the function (with a timeout) or `Pause` before a retry — and is sent
back how the call `Ended`. The drivers in `engine.supervisor` only call, await
and sleep; every rule lives here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from engine._watch import RunWatch
from engine.breaker import Circuit, CircuitBreaker, CircuitStates
from engine.context import StageContext
from engine.errors import (
    AttemptError,
    AttemptTimeout,
    CircuitOpen,
    RuleViolation,
    RunAlreadyFinished,
    RunStopped,
    StageGaveUp,
)
from engine.policies import Outcome, RetryPolicy, Spent
from engine.run import Run
from events import JSON, CircuitClosed, CircuitHalfOpened, CircuitOpened, RetryScheduled
from projections import ProgressPolicy
from projections.progress import Verdict

if TYPE_CHECKING:
    from engine.engine import Engine

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


Step: TypeAlias = Generator[Call | Pause, Any, Any]


class Decisions:
    """Retry, breaker and progress rules, applied to one run's attempts and recorded."""

    def __init__(
        self,
        engine: Engine,
        *,
        retry: RetryPolicy,
        policies: Mapping[str, PolicyChoice],
        breaker: CircuitBreaker | None,
        progress: ProgressPolicy | None,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        self.engine = engine
        self.retry = retry
        self.policies = dict(policies)
        self.breaker = breaker
        self.progress = progress
        self.clock = clock
        self.rng = rng
        self._watches: dict[Any, RunWatch] = {}

    def watch(self, run: Run) -> RunWatch:
        """The run's watch, caught up with the run."""
        if run.in_batch:
            raise RuleViolation(
                run.id, "batch", "the supervisor records each attempt durably; "
                "call it outside run.batch()"
            )  # fmt: skip
        watch = self._watches.get(run.id)
        if watch is None:
            if len(self._watches) >= MAX_WATCHES:
                del self._watches[next(iter(self._watches))]
            watch = self._watches[run.id] = RunWatch(progress=self.progress is not None)
        return watch.catch_up(run)

    def stage(self, run: Run, stage: str) -> Step:
        """Attempts of `stage` until it completes, its failure moves the run, or a rule stops it."""
        watch = self.watch(run)
        _check_current(run, stage)
        while True:
            self._check_progress(run, watch, stage)
            self._admit(run, stage, watch)
            policy, chosen_by = self.policy(run, stage, stage)
            recordable = "failed" in run.allowed_outcomes()
            if run.open_attempt is None and recordable:
                watch.see(run.stage_started(stage))
            ended = yield Call(policy.timeout)
            watch = self.watch(run)  # the function may have recorded events of its own
            if ended.error is None:
                return self._completed(run, stage, ended, watch)
            delay = self._failed(run, stage, ended, (policy, chosen_by), recordable)
            if delay is None:
                return Attempted(routed=True)
            yield Pause(delay)

    def task(self, run: Run, task_id: str) -> Step:
        """Attempts of a task until it completes or a rule gives up; a completed task is skipped."""
        watch = self.watch(run)
        if run.tasks.get(task_id) == "completed":
            return watch.task_results.get(task_id)
        if task_id not in run.tasks:
            watch.see(run.add_task(task_id))
        while True:
            policy, chosen_by = self.policy(run, task_id, run.state)
            if run.tasks[task_id] != "active":
                watch.see(run.task_started(task_id))
            ended = yield Call(policy.timeout)
            watch = self.watch(run)
            if ended.error is None:
                return self._task_completed(run, task_id, ended.value, watch)
            yield Pause(self._task_failed(run, task_id, ended, (policy, chosen_by)))

    def policy(self, run: Run, key: str, stage: str) -> tuple[RetryPolicy, str]:
        """The policy for the next attempt, and what chose it (recorded with decisions)."""
        choice = self.policies.get(key, self.policies.get(stage))
        if choice is None:
            return self.retry, "default"
        if isinstance(choice, RetryPolicy):
            return choice, f"policies[{key if key in self.policies else stage!r}]"
        policy = choice(StageContext(self.engine, run, stage))
        if not isinstance(policy, RetryPolicy):
            raise TypeError(
                f"the policy function {_name(choice)} for {key!r} returned "
                f"{type(policy).__name__}, not a RetryPolicy"
            )
        return policy, _name(choice)

    def forget(self, run: Run) -> None:
        """Drop the watch of a run that finished."""
        self._watches.pop(run.id, None)

    def now(self) -> datetime:
        """The injected clock's time, as an aware datetime."""
        return datetime.fromtimestamp(self.clock(), UTC)

    def _completed(self, run: Run, stage: str, ended: Ended, watch: RunWatch) -> Attempted:
        value = ended.value
        outcome, result = (
            (value.outcome, value.result) if isinstance(value, Outcome) else ("completed", value)
        )
        watch.see(run.stage_completed(stage, result, outcome=outcome, duration=ended.duration))
        if self.breaker is not None and self._circuit(run, stage).status == "half_open":
            reason = "the trial attempt succeeded"
            watch.see(run.decision(CircuitClosed, stage=stage, reason=reason))
        return Attempted(result)

    def _failed(
        self,
        run: Run,
        stage: str,
        ended: Ended,
        chosen: tuple[RetryPolicy, str],
        recordable: bool,
    ) -> float | None:
        error, (policy, _) = ended.error, chosen
        assert error is not None
        watch = self.watch(run)
        if not recordable:
            reason = f"the table has no 'failed' row for {stage!r}, so it is not retried"
            raise self._give_up(run, stage, run.attempts(stage) + 1, reason, error, chosen)
        watch.see(
            run.stage_failed(
                stage,
                error,
                error_type="Timeout" if isinstance(error, AttemptTimeout) else None,
                retryable=policy.retryable(error),
                duration=ended.duration,
            )
        )
        self._trip(run, stage)
        if run.pipeline.is_final(run.state):
            return None  # the table ends the run on this failure: nothing left to retry
        streak = watch.circuits[stage].consecutive
        if not policy.retryable(error):
            reason = f"{type(error).__name__} is not retried by the policy"
            raise self._give_up(run, stage, streak, reason, error, chosen)
        if streak > policy.max_retries:
            reason = f"{streak} failures in a row (max_retries={policy.max_retries})"
            raise self._give_up(run, stage, streak, reason, error, chosen)
        if run.state != stage:
            return None  # the table sends a failure elsewhere: no retry here
        return self._schedule(run, stage, run.attempts(stage) + 1, streak, error, chosen)

    def _task_completed(self, run: Run, task_id: str, value: Any, watch: RunWatch) -> JSON:
        if not isinstance(value, Spent):
            watch.see(run.task_completed(task_id, value))
            return value
        with run.batch():  # the cost and the completion land together, or neither does
            spent = run.spend(value.amount, value.unit)
            done = run.task_completed(task_id, value.result)
        watch.see(spent)
        watch.see(done)
        return value.result

    def _task_failed(
        self, run: Run, task_id: str, ended: Ended, chosen: tuple[RetryPolicy, str]
    ) -> float:
        error, (policy, _) = ended.error, chosen
        assert error is not None
        timeout = isinstance(error, AttemptTimeout)
        watch = self.watch(run)
        watch.see(run.task_failed(task_id, error, error_type="Timeout" if timeout else None))
        failures, key = watch.task_failures[task_id], f"task:{task_id}"
        if not policy.retryable(error):
            reason = f"{type(error).__name__} is not retried by the policy"
            raise self._give_up(run, key, failures, reason, error, chosen)
        if failures > policy.max_retries:
            reason = f"{failures} failures (max_retries={policy.max_retries})"
            raise self._give_up(run, key, failures, reason, error, chosen)
        return self._schedule(run, key, failures + 1, failures, error, chosen)

    def _schedule(
        self,
        run: Run,
        stage: str,
        attempt: int,
        retry: int,
        error: Exception,
        chosen: tuple[RetryPolicy, str],
    ) -> float:
        policy, chosen_by = chosen
        delay = policy.delay_for(retry, self.rng)
        self.watch(run).see(
            run.decision(
                RetryScheduled,
                stage=stage,
                attempt=attempt,
                delay=delay,
                reason=f"retry {retry} of {policy.max_retries} after {_describe(error)}",
                policy={**policy.to_json(), "chosen_by": chosen_by},
            )
        )
        return delay

    def _give_up(
        self,
        run: Run,
        stage: str,
        attempts: int,
        reason: str,
        error: Exception,
        chosen: tuple[RetryPolicy, str],
    ) -> StageGaveUp:
        policy, chosen_by = chosen
        decision: dict[str, JSON] = {
            "stage": stage,
            "attempts": attempts,
            "reason": reason,
            "error_type": "Timeout" if isinstance(error, AttemptTimeout) else type(error).__name__,
            "error": str(error),
            "policy": {**policy.to_json(), "chosen_by": chosen_by},
        }
        self.watch(run).see(run.note("gave_up", decision))
        gave_up = StageGaveUp(run.id, stage, attempts, reason, decision["error_type"], str(error))
        gave_up.__cause__ = error
        return gave_up

    def _check_progress(self, run: Run, watch: RunWatch, stage: str) -> None:
        if self.progress is None:
            return
        verdict = watch.progress.evaluate(self.progress)
        if not verdict.stopped:
            return
        status = "aborted_stuck" if verdict.decision == "stuck" else "done_partial"
        reason = self._stop_reason(verdict, watch, stage)
        run.finish(status, reason)
        self.forget(run)
        raise RunStopped(run.id, status, reason)

    def _stop_reason(self, verdict: Verdict, watch: RunWatch, stage: str) -> dict[str, JSON]:
        assert self.progress is not None
        return {
            **verdict.reason,
            "detected": _DETECTED[verdict.reason["rule"]].format(**verdict.reason),
            "stage": stage,
            "last_failures": [list(failure) for failure in watch.recent_failures],
            "policy": attrs.asdict(self.progress),
        }

    def _admit(self, run: Run, stage: str, watch: RunWatch) -> None:
        if self.breaker is None:
            return
        circuit = self._circuit(run, stage)
        if circuit.status == "closed" or (circuit.status, self.breaker.scope) == (
            "half_open",
            "run",
        ):
            return  # in one run, a half-open circuit's trial is this attempt (or one cut short)
        wait = self.breaker.waits(circuit, self.now())
        if wait > 0:
            why = (
                circuit.reason
                if circuit.status == "open"
                else "a trial is under way in another run"
            )
            rejected = {"stage": stage, "retry_after": wait, "opened_because": circuit.reason}
            watch.see(run.note("circuit_rejected", rejected))
            raise CircuitOpen(run.id, stage, wait, why)
        since = circuit.status.replace("_", "-")
        reason = f"{since} for {self.breaker.reset_timeout:g} s (reset_timeout); one trial allowed"
        watch.see(run.decision(CircuitHalfOpened, stage=stage, reason=reason))

    def _trip(self, run: Run, stage: str) -> None:
        if self.breaker is None:
            return
        reason = self.breaker.trips(self._circuit(run, stage))
        if reason is None:
            return
        self.watch(run).see(run.decision(CircuitOpened, stage=stage, reason=reason))
        raise CircuitOpen(run.id, stage, self.breaker.reset_timeout, reason)

    def _circuit(self, run: Run, stage: str) -> Circuit:
        assert self.breaker is not None
        if self.breaker.scope == "run":
            return self.watch(run).circuits.get(stage, _CLOSED)
        projections = self.engine.projections
        if CircuitStates.name not in projections.names:
            projections.register(CircuitStates)
        projections.catch_up([CircuitStates.name])
        circuits = projections.get(CircuitStates.name, run.pipeline.name) or {}
        return circuits.get(stage, _CLOSED)  # type: ignore[no-any-return]


_CLOSED = Circuit()
_DETECTED = {
    "max_steps": "{steps} steps taken without finishing (max_steps={limit})",
    "no_progress": "{consecutive_no_ops} steps in a row changed no file, diagnostic or "
    "test result (max_consecutive_no_ops={limit})",
    "same_error": "the same test failure {last_test_signature!r} {same_error_count} times "
    "in a row (max_same_error={limit})",
}


def _check_current(run: Run, stage: str) -> None:
    if run.status is not None:
        raise RunAlreadyFinished(run.id, run.status)
    if stage != run.state:
        raise AttemptError(
            run.id, stage, f"cannot run stage {stage!r}: the current state is {run.state!r}"
        )


def _describe(error: Exception) -> str:
    kind = "Timeout" if isinstance(error, AttemptTimeout) else type(error).__name__
    message = str(error)
    return f"{kind}: {message[:200]}" if message else kind


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)
