"""The supervisor's decisions: a pure generator, written once for synchronous and async callers.

Each loop yields what it needs done — `Record` events, `Read` what only the
store or the caller's policy function can answer, `Call` the function (with a
timeout), `Pause` before a retry — and is sent back the answer. It reads the
run handle's in-memory state and its `RunWatch`, never the store; the drivers in
`engine.supervise.supervisor` perform every command. Every rule lives here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeAlias
from uuid import UUID

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
from engine.pipeline import Pipeline
from engine.run import Run, unit_of
from engine.supervise.breaker import Circuit
from engine.supervise.commands import (
    Attempted,
    Call,
    Command,
    Ended,
    GiveUpAnswer,
    Pause,
    PipelineCircuits,
    PolicyAnswer,
    Read,
    Record,
    RunHistory,
    Step,
    TreeSpending,
)
from engine.supervise.context import StageContext
from engine.supervise.guards import CLOSED, BreakerGuard, progress_stop
from engine.supervise.outcome import Outcome, Rollback, Spent
from engine.supervise.policies import CircuitBreaker, ProgressPolicy, RetryPolicy, SpendingLimit
from engine.supervise.streaks import counts, routes_elsewhere
from engine.supervise.verdict import VERDICT_NOTE
from engine.supervise.watch import RunWatch, WatchPlan
from events import (
    DECIDED,
    JSON,
    BudgetSpent,
    CircuitClosed,
    CircuitOpened,
    NoteAdded,
    RetryScheduled,
    RunFinished,
    StageCompleted,
    StageFailed,
    StageStarted,
    StateRolledBack,
    TaskAdded,
    TaskCompleted,
    TaskFailed,
    TaskStarted,
)

PolicyChoice: TypeAlias = "RetryPolicy | Callable[[StageContext], RetryPolicy]"
MAX_WATCHES = 1024
"""Runs whose watch a supervisor keeps; the oldest is dropped (and refolded if needed)."""

VERDICT_OUTCOMES = {"aborted_stuck": "stuck", "done_partial": "partial"}
"""The outcome a table row names to route a progress verdict to a handler stage."""
BUDGET_OUTCOME = "over_budget"
"""The outcome a table row names to route a spending limit's stop to a handler stage."""
GiveUpHook: TypeAlias = "Callable[[StageContext, StageGaveUp], Rollback | None]"
"""`on_give_up`: given a stage that gave up in `drive`, a `Rollback`, or None to finish failed."""

Watching: TypeAlias = Generator[Command, Any, RunWatch]
"""A sub-generator that answers with the run's watch."""


@attrs.frozen
class Attempt:
    """The facts of one attempt: what it attempts, under which policy and circuit.

    Attributes:
        stage: the stage, or ``task:<id>`` for a task.
        policy: the retry policy of this attempt.
        chosen_by: what chose the policy (recorded with each decision).
        recordable: whether the table can record a failure of it.
        circuit: the breaker's circuit it runs under (None without a breaker).
    """

    stage: str
    policy: RetryPolicy
    chosen_by: str
    recordable: bool = True
    circuit: Circuit | None = None

    def policy_json(self) -> dict[str, JSON]:
        """The policy as recorded with a decision, with what chose it."""
        return {**self.policy.to_json(), "chosen_by": self.chosen_by}


class Decisions:
    """Retry, breaker and progress rules, applied to one run's attempts.

    A failure and the decision it leads to (a retry, a breaker trip, giving up)
    are yielded as one `Record` of events written together, so no crash can
    separate them.
    """

    def __init__(
        self,
        *,
        retry: RetryPolicy,
        policies: Mapping[str, PolicyChoice],
        breaker: CircuitBreaker | None,
        progress: ProgressPolicy | None,
        spending: SpendingLimit | None = None,
        on_give_up: GiveUpHook | None = None,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        self.retry = retry
        self.policies = dict(policies)
        self.breaker = breaker
        self.guard = None if breaker is None else BreakerGuard(breaker, clock)
        self.progress = progress
        self.spending = spending
        self.on_give_up = on_give_up
        self.rng = rng
        self._watches: dict[UUID, RunWatch] = {}
        self._units: dict[UUID, UnitOfWork] = {}
        self._plans: dict[int, tuple[Pipeline, WatchPlan]] = {}
        """Per pipeline (by identity, kept alive with it), what its runs' watches fold."""

    def _following(self, run: Run) -> RunWatch | None:
        """The run's watch when it follows the run (no read needed), else None."""
        watch = self._watches.get(run.id)
        if watch is None or watch.stale or unit_of(run).batches:
            return None
        return watch if watch in unit_of(run).observers else None

    def watched(self, run: Run) -> Watching:
        """The run's watch, read from the run's history when it has none that follows the run."""
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
        history = yield Read(RunHistory(run))
        watch = self._new_watch(run).fold(history)
        if watch.version != run.version:  # recorded while it was read: read again
            return (yield from self.watched(run))
        if len(self._watches) >= MAX_WATCHES:
            self._detach(next(iter(self._watches)))
        self._watches[run.id], self._units[run.id] = watch, work
        work.observers.append(watch)
        return watch

    def stage(self, run: Run, stage: str) -> Step:
        """Attempts of `stage` until it completes, its failure moves the run, or a rule stops it."""
        # Sub-generators only where a rule has something to do: this runs for every attempt.
        watch = self._following(run) or (yield from self.watched(run))
        _check_current(run, stage)
        while True:
            # A handler a verdict was routed to runs whatever the stop rules say, once.
            if self.spending is not None and not watch.exempt(stage):
                yield from self._check_spending(run, watch, stage)
            if self.progress is not None and not watch.exempt(stage):
                yield from self._check_progress(run, watch, stage)
            circuit = None if self.guard is None else (yield from self._admit(run, stage, watch))
            attempt = self._chosen(run, stage, stage, circuit) or (
                yield from self._attempt(run, stage, stage, circuit)
            )
            if attempt.recordable:
                streak = watch.streaks.count(stage, attempt.policy)
                if streak > attempt.policy.max_retries:
                    yield from self._check_budget(run, attempt, streak, watch.last_failure(stage))
                # Opened only where every failure can close it, so none is left open.
                if run.machine.open_attempt is None and _every_failure_recordable(
                    run, attempt.policy
                ):
                    started = {"stage": stage, "timeout": attempt.policy.timeout}
                    yield Record(((StageStarted, started),))
            ended = yield Call(attempt.policy.timeout)
            # The function may have recorded events: the watch follows them, or is read again.
            watch = self._following(run) or (yield from self.watched(run))
            if run.machine.status is not None or isinstance(ended.error, RunStopped):
                yield from self._stopped_inside(run, watch, stage, ended)
            if ended.error is None:
                return (yield from self._completed(run, attempt, ended))
            delay = yield from self._failed(run, attempt, ended, watch)
            if delay is None:
                return Attempted(routed=True, gave_up=self._routed(run, stage, watch))
            yield Pause(delay)

    def task(self, run: Run, task_id: str) -> Step:
        """Attempts of a task until it completes or a rule gives up; a completed task is skipped."""
        watch = yield from self.watched(run)
        if run.tasks.get(task_id) == "completed":
            done = watch.task(run.id, task_id)
            return None if done is None else done.result
        if task_id not in run.tasks:
            yield Record(((TaskAdded, {"task_id": task_id, "parent_id": None, "title": ""}),))
        key = f"task:{task_id}"
        while True:
            yield from self._check_spending(run, watch, key, route=False)
            attempt = yield from self._attempt(run, task_id, run.state, None, key)
            task = watch.task(run.id, task_id)
            failures = (
                0 if task is None else _task_streak(task.failures, task.interruptions, attempt)
            )
            last = (
                (task.error_type or "Error", task.error or "") if task and task.failures else None
            )
            yield from self._check_budget(run, attempt, failures, last or ("Error", ""))
            if run.tasks[task_id] != "active":
                yield Record(((TaskStarted, {"task_id": task_id}),))
            ended = yield Call(attempt.policy.timeout)
            watch = yield from self.watched(run)
            if ended.error is None:
                return (yield from self._task_completed(task_id, ended.value))
            yield Pause((yield from self._task_failed(run, task_id, ended, attempt, watch)))

    def driven(self, run: Run, stage: str) -> Step:
        """`stage` as `drive` and `step` run it: a give-up is answered by the `on_give_up`
        hook (a `Rollback` goes on from the state it leaves), else it finishes the run
        ``failed`` and is raised."""
        try:
            return (yield from self.stage(run, stage))
        except StageGaveUp as gave_up:
            if self.on_give_up is not None and run.machine.status is None:
                answer = yield Read(GiveUpAnswer(self.on_give_up, run, stage, gave_up))
                if isinstance(answer, Rollback):
                    undo = {"steps": answer.steps, "reason": answer.reason}
                    yield Record(((StateRolledBack, undo),))
                    return Attempted(routed=True)
                if answer is not None:
                    raise TypeError(
                        f"on_give_up {_name(self.on_give_up)} returned {type(answer).__name__}, "
                        "not a Rollback or None"
                    ) from gave_up
            if run.machine.status is None:
                yield Record(
                    ((RunFinished, {"status": "failed", "reason": _gave_up_reason(gave_up)}),)
                )
            self.forget(run)
            raise

    def forget(self, run: Run) -> None:
        """Drop the watch of a run that finished."""
        self._detach(run.id)

    def _new_watch(self, run: Run) -> RunWatch:
        pipeline = run.pipeline
        known = self._plans.get(id(pipeline))
        if known is None or known[0] is not pipeline:  # an id is unique while its object lives
            plan = WatchPlan(
                pipeline,
                verdicts=self.spending is not None,
                progress=self.progress is not None,
                circuits=self.breaker is not None,
                forget_rolled_back=self.breaker is not None and self.breaker.forget_rolled_back,
            )
            if len(self._plans) >= MAX_WATCHES:
                del self._plans[next(iter(self._plans))]
            known = self._plans[id(pipeline)] = (pipeline, plan)
        return RunWatch(pipeline, plan=known[1])

    def _detach(self, run_id: UUID) -> None:
        """Drop a run's watch and stop it following the run."""
        watch, work = self._watches.pop(run_id, None), self._units.pop(run_id, None)
        if work is not None and watch in work.observers:
            work.observers.remove(watch)

    def _chosen(
        self, run: Run, key: str, stage: str, circuit: Circuit | None, label: str | None = None
    ) -> Attempt | None:
        """The next attempt's facts when no policy function chooses its policy, else None."""
        choice = self.policies.get(key, self.policies.get(stage))
        if choice is None:
            policy, chosen_by = self.retry, "default"
        elif isinstance(choice, RetryPolicy):
            policy, chosen_by = choice, f"policies[{key if key in self.policies else stage!r}]"
        else:
            return None
        return self._facts(run, key, policy, chosen_by, circuit, label)

    def _facts(
        self,
        run: Run,
        key: str,
        policy: RetryPolicy,
        chosen_by: str,
        circuit: Circuit | None,
        label: str | None,
    ) -> Attempt:
        if label is not None:  # a task: its failures are always recordable
            return Attempt(label, policy, chosen_by)
        return Attempt(key, policy, chosen_by, _records_failures(run, policy), circuit)

    def _attempt(
        self, run: Run, key: str, stage: str, circuit: Circuit | None, label: str | None = None
    ) -> Generator[Command, Any, Attempt]:
        """The next attempt's facts: its policy (a policy function is asked), and what chose it."""
        chosen = self._chosen(run, key, stage, circuit, label)
        if chosen is not None:
            return chosen
        choice = self.policies.get(key, self.policies.get(stage))
        assert callable(choice)  # neither None nor a RetryPolicy: `_chosen` took those
        policy = yield Read(PolicyAnswer(choice, run, stage))
        if not isinstance(policy, RetryPolicy):
            raise TypeError(
                f"the policy function {_name(choice)} for {key!r} returned "
                f"{type(policy).__name__}, not a RetryPolicy"
            )
        return self._facts(run, key, policy, _name(choice), circuit, label)

    def _admit(
        self, run: Run, stage: str, watch: RunWatch
    ) -> Generator[Command, Any, Circuit | None]:
        """The circuit the next attempt runs under (None without a breaker); or `CircuitOpen`."""
        guard = self.guard
        if guard is None:
            return None
        if guard.breaker.scope == "run":
            circuit = watch.circuits.get(stage, CLOSED)
        else:
            circuits = yield Read(PipelineCircuits(run))
            circuit = circuits.get(stage, CLOSED)
        admission = guard.admit(run.id, stage, circuit)
        if admission.record is not None:
            yield admission.record
        if admission.refused is not None:
            raise admission.refused
        return admission.circuit

    def _completed(
        self, run: Run, attempt: Attempt, ended: Ended
    ) -> Generator[Command, Any, Attempted]:
        value = ended.value
        outcome, result = (
            (value.outcome, value.result) if isinstance(value, Outcome) else ("completed", value)
        )
        completed = (
            StageCompleted,
            {
                "stage": attempt.stage,
                "result": result,
                "outcome": outcome,
                "duration": ended.duration,
            },
        )
        circuit = attempt.circuit
        if circuit is None or circuit.status != "half_open":
            yield Record((completed,))
        else:  # a successful trial and the closing of its breaker: together
            closed = (
                CircuitClosed,
                {"stage": attempt.stage, "reason": "the trial attempt succeeded"},
            )
            yield Record((completed, closed), together=True)
        return Attempted(result)

    def _failed(
        self, run: Run, attempt: Attempt, ended: Ended, watch: RunWatch
    ) -> Generator[Command, Any, float | None]:
        error, stage, policy = ended.error, attempt.stage, attempt.policy
        assert error is not None
        outcome = policy.outcome_for(error)
        if not _has_row(run, outcome) and _has_row(run, "failed"):
            outcome = "failed"  # the table has no row for the mapped outcome here
        if not attempt.recordable or not _has_row(run, outcome):
            reason = f"the table has no {outcome!r} row for {stage!r}, so it is not retried"
            number = _attempts(run, stage) + 1
            gave_up = self._gave_up(run, attempt, number, reason, _kind(error), "no_failure_row")
            yield gave_up[0]
            raise gave_up[1] from error
        routed = routes_elsewhere(run.pipeline, stage, outcome)
        streak = watch.streaks.count(stage, policy) + counts((False, routed), policy)
        failed_attempt = run.machine.next_attempt(stage)
        failure = (
            StageFailed,
            {
                "stage": stage,
                "error": error,
                "outcome": outcome,
                "error_type": "Timeout" if isinstance(error, AttemptTimeout) else None,
                "retryable": policy.retryable(error) and not isinstance(error, RunStopped),
                "duration": ended.duration,
                "details": getattr(error, "details", None),
            },
        )
        # The run after the failure: in the state the table names, the attempt closed.
        final = run.pipeline.is_final(run.pipeline.next_state(stage, outcome) or stage)
        decision, record = self._decide(
            run, attempt, streak, failed_attempt + 1, error, routed, final
        )
        yield Record((failure, *record), together=True)
        if isinstance(decision, Exception):
            raise decision from error
        return decision

    def _decide(
        self,
        run: Run,
        attempt: Attempt,
        streak: int,
        number: int,
        error: Exception,
        routed: bool,
        final: bool,
    ) -> tuple[float | Exception | None, tuple[Any, ...]]:
        """What follows a failure, and the events that record it (with the failure)."""
        breaker, circuit = self.breaker, attempt.circuit
        trip = None if breaker is None or circuit is None else breaker.trips(circuit.outcome(True))
        if trip is not None and breaker is not None:
            opened = (CircuitOpened, {"stage": attempt.stage, "reason": trip})
            return CircuitOpen(run.id, attempt.stage, breaker.reset_timeout, trip), (opened,)
        if final:
            return None, ()  # the table ends the run on this failure: nothing left to retry
        return self._retry_or_give_up(run, attempt, streak, number, error, routed)

    def _task_completed(self, task_id: str, value: Any) -> Generator[Command, Any, JSON]:
        if not isinstance(value, Spent):
            yield Record(((TaskCompleted, {"task_id": task_id, "result": value}),))
            return value
        spent = (BudgetSpent, {"amount": value.amount, "unit": value.unit})
        completed = (TaskCompleted, {"task_id": task_id, "result": value.result})
        yield Record((spent, completed), together=True)  # the cost with the completion, or neither
        return value.result

    def _task_failed(
        self, run: Run, task_id: str, ended: Ended, attempt: Attempt, watch: RunWatch
    ) -> Generator[Command, Any, float]:
        error = ended.error
        assert error is not None
        task = watch.task(run.id, task_id)
        failed, interrupted = (0, 0) if task is None else (task.failures, task.interruptions)
        streak = _task_streak(failed, interrupted, attempt) + 1
        timeout = "Timeout" if isinstance(error, AttemptTimeout) else None
        number = failed + 2  # interruptions included
        failure = (TaskFailed, {"task_id": task_id, "error": error, "error_type": timeout})
        decision, record = self._retry_or_give_up(run, attempt, streak, number, error)
        yield Record((failure, *record), together=True)
        if isinstance(decision, Exception):
            raise decision from error
        assert decision is not None
        return decision

    def _retry_or_give_up(
        self,
        run: Run,
        attempt: Attempt,
        streak: int,
        number: int,
        error: Exception,
        routed: bool = False,
    ) -> tuple[float | Exception | None, tuple[Any, ...]]:
        """A retry after a delay, or giving up (an error to raise), and the events to record."""
        policy = attempt.policy
        if routed:
            return None, ()  # the table moved the run on: the stage it went to decides
        exhausted = _exhausted(policy, error, streak)
        if exhausted is not None:
            cause, problem = exhausted
            note, gave_up = self._gave_up(run, attempt, streak, problem, _kind(error), cause)
            return gave_up, note.events
        delay = policy.delay_for(streak, self.rng)
        retry = {
            "stage": attempt.stage,
            "attempt": number,
            "delay": delay,
            "reason": f"retry {streak} of {policy.max_retries} after {_describe(error)}",
            "policy": attempt.policy_json(),
        }
        return delay, ((RetryScheduled, retry),)

    def _check_budget(
        self, run: Run, attempt: Attempt, streak: int, last: tuple[str, str]
    ) -> Generator[Command, Any, None]:
        """Refuse to call again once the stage's (or task's) failures in a row spent the budget."""
        spent = _over_budget(attempt.policy, streak)
        if spent is None:
            return
        reason = f"the retry budget is spent: {spent}"
        note, gave_up = self._gave_up(run, attempt, streak, reason, last)
        yield note
        raise gave_up

    def _gave_up(
        self,
        run: Run,
        attempt: Attempt,
        attempts: int,
        reason: str,
        last: tuple[str, str],
        cause: str = "budget_spent",
    ) -> tuple[Record, StageGaveUp]:
        """The ``gave_up`` note that says why the stage gives up, and the error to raise."""
        error_type, error = last
        decision: dict[str, JSON] = {
            "stage": attempt.stage,
            "attempts": attempts,
            "cause": cause,
            "reason": reason,
            "error_type": error_type,
            "error": error,
            "policy": attempt.policy_json(),
        }
        note = Record(((NoteAdded, {"key": "gave_up", "value": decision}),))
        return note, StageGaveUp(run.id, attempt.stage, attempts, reason, error_type, error, cause)

    def _routed(self, run: Run, stage: str, watch: RunWatch) -> StageGaveUp:
        """What `execute` raises when the table moved the failed stage on."""
        error_type, error = watch.last_failure(stage)
        streak = watch.consecutive_failures(stage)  # in a row, as for any give-up
        moved = f"the table moved the failed stage on to {run.state!r}"
        cause = "final_state" if run.pipeline.is_final(run.state) else "routed"
        return StageGaveUp(run.id, stage, streak, moved, error_type, error, cause)

    def _check_spending(
        self, run: Run, watch: RunWatch, stage: str, route: bool = True
    ) -> Generator[Command, Any, None]:
        """Stop the run once it spent its limit: route the stop to a handler, or finish ``failed``.

        A table row with the outcome ``over_budget`` from the current state sends the
        stop there (`_stop`); without one, or inside an attempt, the run finishes.
        """
        limit = self.spending
        if limit is None:
            return
        if limit.scope == "run":
            spent = float(watch.tasks.budget.get(limit.unit, 0.0))
        else:
            spent = yield Read(TreeSpending(run.id, limit.unit))
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
        yield from self._stop(
            run, watch, stage, "failed", reason, BUDGET_OUTCOME if route else None
        )

    def _check_progress(
        self, run: Run, watch: RunWatch, stage: str
    ) -> Generator[Command, Any, None]:
        """Stop a stuck (or partial) run: route the verdict to its handler stage, or finish it.

        After a verdict was routed, only `max_steps` still applies, so a handler that
        sends the run back into its loop cannot loop for ever.
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
        yield from self._stop(run, watch, stage, status, reason, VERDICT_OUTCOMES[status])

    def _stop(
        self,
        run: Run,
        watch: RunWatch,
        stage: str,
        status: str,
        reason: dict[str, JSON],
        outcome: str | None,
    ) -> Generator[Command, Any, None]:
        """Route a stop to the handler stage the table names for `outcome`, or finish the run.

        A first stop with a row for `outcome` from the current state is recorded as
        a decision (a ``progress_verdict`` note) and, in the same transaction, an
        outcome no attempt produced (``attempt`` 0: not a result or step of `stage`,
        which did not run); the handler then runs whatever the stop rules say, until
        it completes. A stop after a routed verdict finishes the run with the first
        verdict's status and reason (the later stop is added as ``then``).
        """
        verdict = watch.verdict
        if verdict is None and outcome is not None and _has_row(run, outcome):
            handler = run.pipeline.next_state(run.state, outcome)
            value = {"status": status, "reason": reason, "handler": handler, "outcome": outcome}
            noted = (NoteAdded, {"key": VERDICT_NOTE, "value": value})
            routed = (
                StageCompleted,
                {"stage": stage, "attempt": DECIDED, "result": reason, "outcome": outcome},
            )
            yield Record((noted, routed), together=True)  # the verdict and its outcome: together
            raise RunStopped(run.id, status, reason, routed_to=run.state)
        if verdict is not None and isinstance(verdict.get("reason"), dict):
            first: Any = verdict["reason"]
            status, reason = str(verdict["status"]), {**first, "then": reason["detected"]}
        yield Record(((RunFinished, {"status": status, "reason": reason}),))
        self.forget(run)
        raise RunStopped(run.id, status, reason)

    def _stopped_inside(
        self, run: Run, watch: RunWatch, stage: str, ended: Ended
    ) -> Generator[Command, Any, None]:
        """A stop met inside the stage function: the run's, or one its limit shares.

        The run finished during the call (a task over its spending limit, say):
        `RunStopped` with how it finished, and no failure recorded. A stop of another
        run (a child over the tree's limit) stops this run too when its own limit is
        spent; otherwise it is recorded as a failure that is not retried.
        """
        ending = watch.ending
        if run.machine.status is not None and ending is not None:
            reason: Any = ending["reason"]
            reason = reason if isinstance(reason, dict) else {"detected": reason}
            self.forget(run)
            raise RunStopped(run.id, str(ending["status"]), reason) from ended.error
        if run.machine.status is not None:
            self.forget(run)
            raise RunStopped(run.id, run.status, {"detected": "the run was finished"})
        yield from self._check_spending(run, watch, stage, route=False)


def _gave_up_reason(gave_up: StageGaveUp) -> dict[str, JSON]:
    """The reason `drive` finishes a run whose stage gave up with."""
    return {
        "rule": "gave_up",
        "cause": gave_up.cause,
        "stage": gave_up.stage,
        "attempts": gave_up.attempts,
        "detected": gave_up.reason,
        "error_type": gave_up.error_type,
        "error": gave_up.error,
    }


def _task_streak(failures: int, interruptions: int, attempt: Attempt) -> int:
    """The failures of a task its retry budget counts (interruptions only if asked)."""
    return failures if attempt.policy.count_interrupted else failures - interruptions


def _exhausted(policy: RetryPolicy, error: Exception, streak: int) -> tuple[str, str] | None:
    """Why no retry follows this failure (cause, reason), or None when one may.

    A `RunStopped` out of the stage function (a run it drove was stopped by a policy)
    is never retried: trying again would meet the same stop.
    """
    if isinstance(error, RunStopped):
        return "not_retryable", f"{error}: a stopped run is not retried"
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
    if run.machine.status is not None:
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
