"""Every error stagetrail raises, from one module: ``from engine.errors import ...``.

The engine's own errors are defined here; those raised below the engine (by the
event classes, the projections and the store) are defined in their own layers,
which may not import `engine`, and re-exported here, so a user imports each
error from this one module (the contract ones also from `engine`). All share
the root `StagetrailError`, and each also subclasses a builtin exception.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from engine.store.errors import ChainKeyMismatch as ChainKeyMismatch
from engine.store.errors import ConcurrencyConflict as ConcurrencyConflict
from engine.store.errors import OutcomeUnknown as OutcomeUnknown
from engine.store.errors import RunBeingErased as RunBeingErased
from engine.store.errors import RunErased as RunErased
from engine.store.errors import RunErasedWhileRead as RunErasedWhileRead
from engine.store.errors import StoreError as StoreError
from engine.store.errors import StoreFull as StoreFull
from engine.store.errors import StoreReadOnly as StoreReadOnly
from events.errors import EventFormatError as EventFormatError
from events.errors import InvalidEvent as InvalidEvent
from events.errors import InvalidPayload as InvalidPayload
from events.errors import PayloadTooLarge as PayloadTooLarge
from events.errors import PipelineError as PipelineError
from events.errors import StagetrailError as StagetrailError
from projections.errors import PositionMoved as PositionMoved
from projections.errors import ProjectionError as ProjectionError
from projections.errors import ProjectionNameTaken as ProjectionNameTaken
from projections.errors import ProjectionReplaced as ProjectionReplaced
from projections.errors import ProjectionStateError as ProjectionStateError
from projections.errors import UnknownProjection as UnknownProjection

__all__ = [
    "AmbiguousRunId",
    "AttemptError",
    "AttemptTimeout",
    "ChainKeyMismatch",
    "CircuitOpen",
    "ConcurrencyConflict",
    "EventFormatError",
    "GIVE_UP_CAUSES",
    "InvalidArgument",
    "InvalidEvent",
    "InvalidFork",
    "InvalidPayload",
    "InvalidRollback",
    "InvalidTransition",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PipelineError",
    "PositionMoved",
    "ProjectionError",
    "ProjectionNameTaken",
    "ProjectionReplaced",
    "ProjectionStateError",
    "RuleViolation",
    "RunAlreadyExists",
    "RunAlreadyFinished",
    "RunBeingErased",
    "RunErased",
    "RunErasedWhileRead",
    "RunNotFound",
    "RunStopped",
    "StageGaveUp",
    "StageNotDriven",
    "StagetrailError",
    "StoreError",
    "StoreFull",
    "StoreReadOnly",
    "TaskError",
    "UnknownProjection",
]


class InvalidTransition(StagetrailError, ValueError):
    """An outcome is not a row of the run's table in its current state.

    Attributes:
        state: the run's current state.
        outcome: the outcome that was refused.
        allowed: the outcomes the table allows in that state.
        stage: the stage the caller named.
    """

    def __init__(
        self, state: str, outcome: str, allowed: Iterable[str], stage: str | None = None
    ) -> None:
        self.state = state
        self.outcome = outcome
        self.allowed = tuple(sorted(allowed))
        self.stage = stage if stage is not None else state
        super().__init__(self._message())

    def _message(self) -> str:
        if self.stage != self.state:
            return (
                f"stage {self.stage!r} is not the current state {self.state!r}; "
                f"record outcomes of {self.state!r} (allowed: {self._allowed()})"
            )
        return (
            f"outcome {self.outcome!r} is not allowed in state {self.state!r}; "
            f"allowed: {self._allowed()}"
        )

    def _allowed(self) -> str:
        if not self.allowed:
            return "none (it is a final state)"
        return ", ".join(repr(o) for o in self.allowed)


class RuleViolation(StagetrailError, ValueError):
    """An event breaks one of the engine's rules (other than the transition table).

    Attributes:
        run_id: the run concerned.
        rule: a short name of the rule broken, e.g. ``"finished"``.
    """

    def __init__(self, run_id: UUID, rule: str, message: str) -> None:
        self.run_id = run_id
        self.rule = rule
        super().__init__(message)


class RunAlreadyExists(ConcurrencyConflict):
    """`start_run` was given a run id that the store already holds."""

    def __init__(self, run_id: UUID) -> None:
        super().__init__(run_id, 1)
        self.args = (f"run {run_id} already exists; choose another run_id, or engine.load() it",)


class AmbiguousRunId(StagetrailError, LookupError):
    """A run id prefix matches more than one run.

    Attributes:
        prefix: the prefix given.
        matches: (some of) the run ids it matches.
    """

    def __init__(self, prefix: str, matches: Iterable[UUID]) -> None:
        self.prefix = prefix
        self.matches = tuple(matches)
        shown = ", ".join(str(match) for match in self.matches[:3])
        more = ", ..." if len(self.matches) > 3 else ""
        super().__init__(
            f"run id prefix {prefix!r} is ambiguous: it matches {shown}{more}; give more characters"
        )


class RunNotFound(StagetrailError, LookupError):
    """No run with this id is in the store."""

    def __init__(self, run_id: object, store: str) -> None:
        self.run_id = run_id
        self.store = store
        super().__init__(f"no run {run_id} in store {store}")


class RunAlreadyFinished(RuleViolation):
    """Nothing may be recorded after `RunFinished`."""

    def __init__(self, run_id: UUID, status: str) -> None:
        self.status = status
        super().__init__(
            run_id, "finished", f"run {run_id} already finished ({status}); nothing may follow"
        )


class InvalidRollback(RuleViolation):
    """A rollback asks for more outcomes than the stack holds, or an attempt is open."""

    def __init__(self, run_id: UUID, steps: int, depth: int, why: str) -> None:
        self.steps = steps
        self.depth = depth
        super().__init__(run_id, "rollback", f"cannot roll back {steps} step(s): {why}")


class AttemptError(RuleViolation):
    """A stage attempt was started twice, or for a stage that is not current."""

    def __init__(self, run_id: UUID, stage: str, message: str) -> None:
        self.stage = stage
        super().__init__(run_id, "attempt", message)


class TaskError(RuleViolation):
    """A task event does not fit the task's status (unknown, duplicate, done)."""

    def __init__(self, run_id: UUID, task_id: str, message: str) -> None:
        self.task_id = task_id
        super().__init__(run_id, "task", f"task {task_id!r}: {message}")


class InvalidArgument(StagetrailError, ValueError):
    """An argument of a query (``at``, ``upto``, ``label``, ``limit``...) is not usable.

    Attributes:
        argument: the argument's name.
        reason: what is wrong with it.
    """

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument
        self.reason = reason
        super().__init__(f"argument {argument!r}: {reason}")


class InvalidFork(StagetrailError, ValueError):
    """A run cannot be forked at that version."""

    def __init__(self, run_id: UUID, at: int, reason: str) -> None:
        self.run_id = run_id
        self.at = at
        self.reason = reason
        super().__init__(f"cannot fork run {run_id} at version {at}: {reason}")


GIVE_UP_CAUSES = ("budget_spent", "not_retryable", "no_failure_row", "routed", "final_state")
"""Why a supervisor stops retrying a stage: `StageGaveUp.cause`."""


class StageGaveUp(StagetrailError, RuntimeError):
    """The supervisor stopped retrying a stage (or task); the last error is the cause.

    Attributes:
        run_id: the run.
        stage: the stage (``"task:<id>"`` for a task).
        attempts: how many attempts failed in a row.
        reason: why no further attempt is made.
        error_type: the last error's type name.
        error: the last error's message.
        cause: which rule stopped it, one of `GIVE_UP_CAUSES`: ``"budget_spent"`` (the
            retry budget), ``"not_retryable"`` (the policy never retries this error),
            ``"no_failure_row"`` (the table cannot record this failure in this state),
            ``"routed"`` (the table moved the failed stage on to another stage) or
            ``"final_state"`` (the table ended the run on this failure).
    """

    def __init__(
        self,
        run_id: UUID,
        stage: str,
        attempts: int,
        reason: str,
        error_type: str,
        error: str,
        cause: str = "budget_spent",
    ) -> None:
        self.run_id = run_id
        self.stage = stage
        self.attempts = attempts
        self.reason = reason
        self.error_type = error_type
        self.error = error
        self.cause = cause
        super().__init__(
            f"run {run_id}: gave up on {stage!r} after {attempts} failed attempt(s): "
            f"{reason}; last error {error_type}: {error}"
        )


class CircuitOpen(StagetrailError, RuntimeError):
    """A stage's circuit breaker is open: the call was refused without running.

    Attributes:
        run_id: the run.
        stage: the stage whose breaker is open.
        retry_after: seconds until the breaker lets one trial through.
        reason: why it opened.
    """

    def __init__(self, run_id: UUID, stage: str, retry_after: float, reason: str) -> None:
        self.run_id = run_id
        self.stage = stage
        self.retry_after = retry_after
        self.reason = reason
        super().__init__(
            f"run {run_id}: the circuit of {stage!r} is open ({reason}); "
            f"a trial is allowed in {retry_after:.1f} s"
        )


class RunStopped(StagetrailError, RuntimeError):
    """A policy stopped the run: the progress policy (``aborted_stuck`` or ``done_partial``)
    or the spending limit (``failed``).

    Attributes:
        run_id: the run: finished, or moved to the handler stage of `routed_to`.
        status: the status it finished with (or will, once its handler is done).
        reason: the structured reason recorded in its `RunFinished` (or its verdict).
        routed_to: the handler state the table routed the verdict to, or None.
    """

    def __init__(
        self, run_id: UUID, status: str, reason: dict[str, Any], routed_to: str | None = None
    ) -> None:
        self.run_id = run_id
        self.status = status
        self.reason = reason
        self.routed_to = routed_to
        detected = reason.get("detected", reason)
        if routed_to is None:
            super().__init__(f"run {run_id} stopped as {status}: {detected}")
        else:
            verdict = status.removeprefix("aborted_").removeprefix("done_")
            verdict = "over its budget" if status == "failed" else verdict  # a spending limit
            super().__init__(
                f"run {run_id} is {verdict}: {detected}; the table routed it to {routed_to!r}"
            )


class StageNotDriven(StagetrailError, LookupError):
    """`drive` reached a stage that has no function; nothing was recorded for it.

    Attributes:
        run_id: the run.
        stage: the stage without a function.
        known: the stages that have one.
    """

    def __init__(self, run_id: UUID, stage: str, known: Iterable[str]) -> None:
        self.run_id = run_id
        self.stage = stage
        self.known = tuple(sorted(known))
        super().__init__(
            f"run {run_id} is in stage {stage!r}, which has no function; "
            f"functions were given for: {', '.join(self.known) or 'none'}"
        )


class AttemptTimeout(StagetrailError, TimeoutError):
    """An attempt ran longer than its policy's `timeout` (recorded as ``error_type="Timeout"``).

    Attributes:
        timeout: the policy's limit in seconds.
        duration: how long the attempt had run when it was judged late.
    """

    def __init__(self, timeout: float, duration: float) -> None:
        self.timeout = timeout
        self.duration = duration
        super().__init__(
            f"the attempt ran {duration:.3g} s, longer than its timeout of {timeout:g} s"
        )
