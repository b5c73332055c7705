"""A run: the write side of one execution of a pipeline.

A `Run` holds its machine state, never its history: every method builds one
event, checks it with the pure fold in `engine.machine`, and appends it
durably before returning it (or queues it inside `batch()`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from engine.errors import RuleViolation
from engine.machine import RunState, apply
from engine.pipeline import Pipeline
from engine.store import GroupCommitter, Store
from events import (
    JSON,
    BudgetSpent,
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    Event,
    NoteAdded,
    ProgressObserved,
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
    utc_now,
)

E = TypeVar("E", bound=Event)
D = TypeVar("D", RetryScheduled, CircuitOpened, CircuitHalfOpened, CircuitClosed)
DECISIONS: frozenset[type[Event]] = frozenset(
    {RetryScheduled, CircuitOpened, CircuitHalfOpened, CircuitClosed}
)
"""The events that record a supervisor's decisions."""


class Run:
    """A live handle on one run; each recording method appends one event."""

    def __init__(
        self, store: Store, pipeline: Pipeline, state: RunState, newest: Event | None = None
    ) -> None:
        self._store = store
        self.pipeline = pipeline
        self._state = state
        self._pending: list[StoredEvent] | None = None
        self._held = 0  # open `held()` blocks: their queue is written at each `flush()`
        self._flushed = state  # the state the store holds while events are held
        self._clock: Callable[[], datetime] = utc_now
        self._stampings = 0  # open `stamped_by` blocks: the clock is theirs while any is
        self._newest = newest  # the event at `version`, when this handle recorded it
        self._flushing: Any = None  # the future of a `flush_async` under way

    @property
    def id(self) -> UUID:
        """The run's id (its event stream's id)."""
        return self._state.run_id

    @property
    def state(self) -> str:
        """The machine's current state, e.g. ``"developer"``."""
        return self._state.state

    @property
    def version(self) -> int:
        """The number of events recorded so far (pending batch events included)."""
        return self._state.version

    @property
    def status(self) -> str | None:
        """The status the run finished with, or None while it is running."""
        return self._state.status

    @property
    def depth(self) -> int:
        """How many outcomes are on the state stack."""
        return self._state.depth

    @property
    def open_attempt(self) -> int | None:
        """The attempt of the current stage that was started and has no outcome yet."""
        return self._state.open_attempt

    @property
    def tasks(self) -> Mapping[str, str]:
        """Each task's status (pending, active, completed or failed), by task id.

        The run's own immutable map, not a copy: reading it costs O(1) at any number
        of tasks, and it cannot be changed (a later event gives the run a new map; one
        read earlier stays as it was). It is a `Mapping`, not a dict: to compare it
        with a dict, write ``dict(run.tasks) == {...}``.
        """
        return self._state.tasks

    @property
    def in_batch(self) -> bool:
        """Whether events are being queued by `batch()` rather than written at once."""
        return self._pending is not None and not self._held

    @property
    def newest(self) -> Event | None:
        """The event at `version` when this handle recorded it (None after a `refresh`).

        A reader that is one event behind takes it from here, not from the store; it
        is durable once no `batch()` or `held()` block holds it.
        """
        newest = self._newest
        return newest if newest is not None and newest.version == self._state.version else None

    @property
    def store(self) -> Store:
        """The store the run is recorded in."""
        return self._store

    @property
    def machine(self) -> RunState:
        """The full machine state (a frozen value)."""
        return self._state

    def allowed_outcomes(self) -> tuple[str, ...]:
        """The outcomes the table allows in the current state."""
        return self.pipeline.allowed(self._state.state)

    def attempts(self, stage: str) -> int:
        """How many attempts of `stage` have been opened in this run."""
        return self._state.attempts.get(stage, 0) + (
            1 if self._state.open_attempt is not None and stage == self._state.state else 0
        )

    def stage_started(self, stage: str) -> StageStarted:
        """Record that an attempt of the current stage began."""
        head, pending = self._state, self._pending
        return self._append(
            StageStarted(
                run_id=head.run_id,
                version=head.version + 1,
                timestamp=self._now(),
                stage=stage,
                attempt=head.next_attempt(stage),
                committed_with=pending[0].originator_version if pending else None,
            )
        )

    def stage_completed(
        self,
        stage: str,
        result: JSON = None,
        *,
        outcome: str = "completed",
        duration: float | None = None,
    ) -> StageCompleted:
        """Record a stage's result; `outcome` picks the row of the table to follow.

        Args:
            stage: the current state's stage.
            result: any strict JSON value.
            outcome: the trigger; ``"completed"`` unless named.
            duration: seconds; by default the time since `stage_started`, else 0.

        Raises:
            InvalidTransition: `stage` is not current or `outcome` not allowed;
                nothing is appended.
        """
        head = self._state  # built inline, not via record: this is the hot path
        return self._append(
            StageCompleted(
                run_id=head.run_id,
                version=head.version + 1,
                timestamp=self._now(),
                stage=stage,
                attempt=head.next_attempt(stage),
                outcome=outcome,
                result=result,
                duration=self._duration(duration),
            )
        )

    def stage_failed(
        self,
        stage: str,
        error: BaseException | str = "",
        *,
        outcome: str = "failed",
        error_type: str | None = None,
        retryable: bool = True,
        duration: float | None = None,
        details: JSON = None,
    ) -> StageFailed:
        """Record a failed attempt from an exception (or a message); `outcome` moves the machine.

        Args:
            details: strict JSON that says more than the message (failing test names).

        Raises:
            InvalidTransition: `stage` is not current or `outcome` not allowed;
                nothing is appended.
        """
        message, kind = _describe(error)
        return self.record(
            StageFailed,
            stage=stage,
            attempt=self._state.next_attempt(stage),
            outcome=outcome,
            error=message,
            error_type=error_type or kind,
            retryable=retryable,
            duration=self._duration(duration),
            details=details,
        )

    def rollback(self, steps: int = 1, reason: str = "") -> StateRolledBack:
        """Undo the newest `steps` outcomes: the machine returns to the state before them."""
        return self.record(StateRolledBack, steps=steps, reason=reason)

    def decision(self, kind: type[D], **payload: Any) -> D:
        """Record a supervisor's decision: `RetryScheduled` or a `Circuit*` event.

        Raises:
            TypeError: `kind` is not one of the decision events.
        """
        if kind not in DECISIONS:
            names = ", ".join(sorted(k.__name__ for k in DECISIONS))
            raise TypeError(f"decision() records one of {names}, not {kind.__name__}")
        return self.record(kind, **payload)

    def note(self, key: str, value: JSON) -> NoteAdded:
        """Keep a note (a strategy tried, a learned pattern) in the history."""
        return self.record(NoteAdded, key=key, value=value)

    def add_task(self, task_id: str, parent: str | None = None, title: str = "") -> TaskAdded:
        """Add a task, optionally under a parent task."""
        return self.record(TaskAdded, task_id=task_id, parent_id=parent, title=title)

    def task_started(self, task_id: str) -> TaskStarted:
        """Record that work on a task began."""
        return self.record(TaskStarted, task_id=task_id)

    def task_completed(self, task_id: str, result: JSON = None) -> TaskCompleted:
        """Record a task's result."""
        return self.record(TaskCompleted, task_id=task_id, result=result)

    def task_failed(
        self, task_id: str, error: BaseException | str = "", error_type: str | None = None
    ) -> TaskFailed:
        """Record that a task failed (it may be started again)."""
        message, kind = _describe(error)
        return self.record(
            TaskFailed, task_id=task_id, error=message, error_type=error_type or kind
        )

    def spend(self, amount: float, unit: str = "usd") -> BudgetSpent:
        """Record budget spent: money, tokens, minutes."""
        return self.record(BudgetSpent, amount=amount, unit=unit)

    def observe_progress(
        self,
        changed_files: int | list[str] | None = None,
        *,
        diagnostics_signature: str | None = None,
        test_signature: str | None = None,
        functional_ok: bool | None = None,
    ) -> ProgressObserved:
        """Record what one observer saw in a step, so loops without progress can be caught.

        Pass only the signals this observer knows (a coder its changed files, a
        verifier its failing test's signature, ``""`` when nothing fails); a signal
        left out keeps the value an earlier observation gave it.
        """
        return self.record(
            ProgressObserved,
            changed_files=changed_files,
            diagnostics_signature=diagnostics_signature,
            test_signature=test_signature,
            functional_ok=functional_ok,
        )

    def finish(self, status: str = "succeeded", reason: JSON = "") -> RunFinished:
        """End the run; nothing may be recorded after this."""
        return self.record(RunFinished, status=status, reason=reason)

    @contextmanager
    def batch(self) -> Iterator[Run]:
        """Group the events recorded inside the block into one transaction: all or nothing.

        If the block raises, or the append fails, nothing is written and the run
        is back in the state it had before the block. A nested batch joins the
        outer one's transaction; if its block raises, its own events are dropped
        (the outer batch goes on if it catches the error).
        """
        if self._pending is not None:
            yield from self._nested_batch(self._pending)
            return
        before, self._pending = self._state, []
        try:
            yield self
            if self._pending:
                self._store.write(self._pending)
        except BaseException:
            self._state = before
            raise
        finally:
            self._pending = None

    def held(self) -> _Holding:
        """Hold the events recorded in the block and write them together at each `flush()`.

        What is held is written at the block's end, also when the block raises (each
        event passed its checks: it happened). The supervisor holds a run it drives
        and flushes before any code of the caller runs (`released`) and before any
        wait, so every outcome is durable before the next attempt begins, in one
        transaction with its decision and the next attempt's start. A nested block
        joins the outer one.

        Raises:
            RuleViolation: the run is inside `batch()`.
        """
        return _Holding(self)

    def flush(self) -> None:
        """Write what a `held()` block has queued, in one transaction (else do nothing).

        Raises:
            ConcurrencyConflict, StoreError: nothing queued was written; the run is back
                in the state the store holds.
        """
        pending = self._pending
        if not self._held or not pending:
            return
        reached = self._state
        try:
            self._store.write(pending)
        except BaseException:
            self._take_in(False, pending, len(pending), reached)
            raise
        self._take_in(True, pending, len(pending), reached)

    async def flush_async(self, committer: GroupCommitter) -> None:
        """`flush` through `committer`: what is held may share a transaction with other runs'.

        One flush of a run at a time: a second waits for the first to end.

        Raises:
            ConcurrencyConflict, StoreError: nothing of the batch was written; the run is
                back in the state the store holds.
            asyncio.CancelledError: cancelled. Before its write began, what is held
                stays held (the `held()` block writes it as it ends); during the write,
                the run takes in the write's outcome first.
        """
        import asyncio  # here, not at the top: the command line starts faster without it

        while self._flushing is not None:
            await asyncio.wait([self._flushing])  # its outcome is its flusher's to handle
        pending = self._pending
        if not self._held or not pending:
            return
        batch, reached = list(pending), self._state
        commit = committer.submit(batch)
        self._flushing = commit.done
        try:
            await committer.wait(commit)
        except BaseException:
            if not commit.withdrawn:
                self._take_in(commit.stored, pending, len(batch), reached)
            raise
        else:
            self._take_in(True, pending, len(batch), reached)
        finally:
            self._flushing = None

    def _take_in(
        self, stored: bool, pending: list[StoredEvent], count: int, reached: RunState
    ) -> None:
        """Follow a written batch's outcome: its events leave the queue, stored or lost."""
        if stored:
            del pending[:count]  # what was recorded meanwhile stays held
            self._flushed = reached
            return
        self._state = self._flushed  # later events were built on the lost ones: gone too
        pending.clear()

    def released(self) -> _Released:
        """Inside a `held()` block: write what is held, then record directly in this block.

        Code of the caller (a stage function) runs here: what it records is durable
        when its call returns, as anywhere else.
        """
        return _Released(self)

    def _nested_batch(self, pending: list[StoredEvent]) -> Iterator[Run]:
        before, mark = self._state, len(pending)
        try:
            yield self
        except BaseException:
            del pending[mark:]
            self._state = before
            raise

    def refresh(self) -> Run:
        """Fold in events other writers appended (after a `ConcurrencyConflict`)."""
        if self._pending is not None:
            raise RuleViolation(self.id, "batch", "cannot refresh inside a batch; leave it first")
        for event in self._store.stream(self.id, gt=self._state.version):
            self._state = apply(self.pipeline, self._state, event)
        self._newest = None  # another writer's event may now hold its version
        return self

    def record(self, kind: type[E], **payload: Any) -> E:
        """Record one event of `kind` with `payload`: the one path every other method takes.

        The run's id, the next version and the timestamp are filled in; the event is
        checked by the rules fold and serialized before it is queued or written.

        Raises:
            InvalidTransition, RuleViolation, InvalidPayload: nothing is recorded.
        """
        head = self._state
        return self._append(
            kind(run_id=head.run_id, version=head.version + 1, timestamp=self._now(), **payload)
        )

    def stamped_by(self, clock: Callable[[], datetime]) -> _Stamping:
        """Stamp the events recorded inside the ``with`` block with `clock` (a supervisor's).

        The run's time stays monotonic: a clock behind the newest event stamps that
        event's time. The previous clock is back when the block ends.
        """
        return _Stamping(self, clock)

    def _now(self) -> datetime:
        now = self._clock()
        last = self._state.last_timestamp
        return now if now >= last else last  # keep a run's time monotonic

    def _append(self, event: E) -> E:
        if _abandoned_any and threading.current_thread() in _ABANDONED:
            raise RuleViolation(
                self.id, "abandoned", "this attempt ran past its timeout and was abandoned: "
                "nothing it records any more is written"
            )  # fmt: skip
        state = apply(self.pipeline, self._state, event)
        # Serialised now, not at the end of a batch, so an unstorable value is
        # refused by the call that brought it.
        stored = self._store.serialize(event)
        if self._pending is not None:
            self._pending.append(stored)
        else:
            self._store.write([stored])
        self._state = state
        self._newest = event
        return event

    def _duration(self, given: float | None) -> float:
        if given is not None:
            return given
        opened = self._state.opened_at
        return 0.0 if opened is None else max(0.0, (self._clock() - opened).total_seconds())

    def __repr__(self) -> str:
        status = self._state.status or "running"
        return (
            f"Run({self.id}, pipeline={self.pipeline.name!r}, state={self.state!r}, "
            f"version={self.version}, {status})"
        )


_ABANDONED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_abandoned_any = False  # a plain flag: the append hot path checks it, not the WeakSet


class _Stamping:
    """The context of `Run.stamped_by` (a class: it wraps every supervised call).

    Overlapping blocks on one run (two tasks of an async coordinator, threads) share
    the clock of the outermost one, and the wall clock is back only when the last ends.
    """

    __slots__ = ("_clock", "_run")

    def __init__(self, run: Run, clock: Callable[[], datetime]) -> None:
        self._run, self._clock = run, clock

    def __enter__(self) -> Run:
        run = self._run
        if run._stampings == 0:
            run._clock = self._clock
        run._stampings += 1
        return run

    def __exit__(self, *exc: object) -> None:
        run = self._run
        run._stampings -= 1
        if run._stampings == 0:
            run._clock = utc_now


class _Holding:
    """The context of `Run.held` (a class: it wraps every supervised attempt)."""

    __slots__ = ("_outer", "_run")

    def __init__(self, run: Run) -> None:
        self._run, self._outer = run, False

    def __enter__(self) -> Run:
        run = self._run
        if run._held:  # a nested block joins the outer one
            run._held += 1
            return run
        if run._pending is not None:
            raise RuleViolation(run.id, "batch", "cannot hold a run inside a batch")
        self._outer = True
        run._held, run._pending, run._flushed = 1, [], run._state
        return run

    def __exit__(self, *exc: object) -> None:
        run = self._run
        if not self._outer:
            run._held -= 1
            return
        try:
            run.flush()
        finally:
            run._held, run._pending = 0, None


class _Released:
    """The context of `Run.released`: what is held is written, then appends go straight through."""

    __slots__ = ("_active", "_run")

    def __init__(self, run: Run) -> None:
        self._run, self._active = run, False

    def __enter__(self) -> Run:
        run = self._run
        if run._held and run._pending is not None:
            run.flush()
            run._pending = None
            self._active = True
        return run

    def __exit__(self, *exc: object) -> None:
        if self._active:
            run = self._run
            run._pending, run._flushed = [], run._state


def abandon(thread: threading.Thread) -> None:
    """Refuse every later append from `thread`: an attempt the supervisor gave up waiting for."""
    global _abandoned_any
    _ABANDONED.add(thread)
    _abandoned_any = True


def _describe(error: BaseException | str) -> tuple[str, str]:
    """An error's message and type name; lone surrogates (undecodable file names) and
    NUL characters escaped (``\\udce9``, ``\\x00``), since no store keeps them.

    Recording a failure must not itself fail on an odd byte in the message.
    """
    if isinstance(error, BaseException):
        message, kind = str(error), type(error).__name__
    else:
        message, kind = error, "Error"
    if isinstance(message, str) and not message.isascii():
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(message, str) and "\x00" in message:
        message = message.replace("\x00", "\\x00")
    return message, kind
