"""A run: the write side of one execution of a pipeline.

A `Run` holds its machine state, never its history: every method builds one
event, checks it with the pure fold in `engine.machine` and hands it to the
run's unit of work (`engine.commit`), which writes it before the method
returns, or at the end of the `batch()` (or a supervisor's step) it belongs to.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from engine.commit import Mark, UnitOfWork
from engine.errors import RuleViolation
from engine.machine import RunState, apply
from engine.pipeline import Pipeline
from engine.store import Store
from engine.store.errors import RunErased
from events import (
    JSON,
    BudgetSpent,
    Event,
    NoteAdded,
    ProgressObserved,
    RunFinished,
    RunStarted,
    StageCompleted,
    StageFailed,
    StageStarted,
    StateRolledBack,
    TaskAdded,
    TaskCompleted,
    TaskFailed,
    TaskStarted,
)
from events.recording import constructor

E = TypeVar("E", bound=Event)
RUNNING = "running"
"""`Run.status` of a run that has not finished."""
_UNREAD: Any = object()


class Run:
    """A live handle on one run; each recording method appends one event."""

    def __init__(
        self,
        store: Store,
        pipeline: Pipeline,
        state: RunState,
        *,
        begun: Sequence[Event] = (),
        link: bytes | None = None,
        unwritten: Sequence[StoredEvent] = (),
        head: bytes | None = None,
    ) -> None:
        self.pipeline = pipeline
        self._params: Any = _UNREAD
        self._work = UnitOfWork(store, state)
        self._work.begun = tuple(begun)
        self._work.link = self._work.stored_link = link  # None: read before the next append
        self._work.stored_head = head  # the stored bytes of `state`'s newest event, if known
        if unwritten:  # `begun`, serialized: written by the run's first commit
            self._work.defer(unwritten, begun)

    @property
    def id(self) -> UUID:
        """The run's id (its event stream's id)."""
        return self._work.state.run_id

    @property
    def state(self) -> str:
        """The machine's current state, e.g. ``"developer"``."""
        return self._work.state.state

    @property
    def version(self) -> int:
        """The number of events recorded so far (pending batch events included)."""
        return self._work.state.version

    @property
    def status(self) -> str:
        """The status the run finished with, or ``"running"`` while it runs.

        The same word `Engine.runs(status="running")` and ``stagetrail runs`` use.
        """
        return self._work.state.status or RUNNING

    @property
    def params(self) -> JSON:
        """The run's `params`, as its `RunStarted` holds them (read once, then kept)."""
        if self._params is _UNREAD:
            begun = self._work.begun
            first = begun[0] if begun else self._work.store.read(self.id, lte=1)[0]
            self._params = first.params if isinstance(first, RunStarted) else None
        return self._params

    @property
    def tasks(self) -> Mapping[str, str]:
        """Each task's status (pending, active, completed or failed), by task id.

        The run's own immutable map, not a copy: reading it costs O(1) at any number
        of tasks, and it cannot be changed (a later event gives the run a new map; one
        read earlier stays as it was). It is a `Mapping`, not a dict: to compare it
        with a dict, write ``dict(run.tasks) == {...}``.
        """
        return self._work.state.tasks

    @property
    def machine(self) -> RunState:
        """The full machine state (a frozen value)."""
        return self._work.state

    def stage_started(self, stage: str, *, timeout: float | None = None) -> StageStarted:
        """Record that an attempt of the current stage began (`timeout`: seconds it may take)."""
        work = self._work
        head, pending = work.state, work.pending
        started: StageStarted = (_MADE.get(StageStarted) or _made(StageStarted))(
            run_id=head.run_id,
            version=head.version + 1,
            timestamp=self._now(),
            stage=stage,
            attempt=head.next_attempt(stage),
            committed_with=pending[0].originator_version if pending else None,
            timeout=timeout,
        )
        return self._append(started)

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
        head = self._work.state  # built inline, not via record: this is the hot path
        completed: StageCompleted = (_MADE.get(StageCompleted) or _made(StageCompleted))(
            run_id=head.run_id,
            version=head.version + 1,
            timestamp=self._now(),
            stage=stage,
            attempt=head.next_attempt(stage),
            outcome=outcome,
            result=result,
            duration=self._duration(duration),
        )
        return self._append(completed)

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
            attempt=self._work.state.next_attempt(stage),
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

    def batch(self) -> Batch:
        """Group the events recorded inside the block into one transaction: all or nothing.

        If the block raises, or the write fails, nothing is written and the run is
        back in the state it had before the block. A nested batch joins the outer
        one's transaction; if its block raises, its own events are dropped (the outer
        batch goes on if it catches the error). ``async with run.batch():`` commits
        through the event loop's shared `GroupCommitter`, in a worker thread: the loop
        goes on while the transaction is written (and runs committing at about the
        same moment share it).
        """
        return Batch(self, self._work)

    def refresh(self) -> Run:
        """Fold in events other writers appended (after a `ConcurrencyConflict`).

        Raises:
            RunErased: the run was erased since this handle read it (its id may name
                another run by now); nothing is folded in.
        """
        work = self._work
        if work.groups:
            raise RuleViolation(self.id, "batch", "cannot refresh inside a batch; leave it first")
        store, version = work.store, work.state.version
        if work.stored_head is not None and store.stored_at(self.id, version) != work.stored_head:
            raise RunErased(self.id, version + 1)  # another run under this id by now
        events = list(store.stream(self.id, gt=version))
        state = work.state
        for event in events:
            state = apply(self.pipeline, state, event)
        work.refreshed(events, state)
        if events:
            work.stored_head = store.stored_at(self.id, state.version)
        return self

    def record(self, kind: type[E], **payload: Any) -> E:
        """Record one event of `kind` with `payload`: the one path every other method takes.

        The run's id, the next version and the timestamp are filled in; the event is
        checked by the rules fold and serialized before it is queued or written.

        Raises:
            InvalidTransition, RuleViolation, InvalidPayload: nothing is recorded.
        """
        head = self._work.state
        make = _MADE.get(kind) or _made(kind)
        event: E = make(
            run_id=head.run_id, version=head.version + 1, timestamp=self._now(), **payload
        )
        return self._append(event)

    def _now(self) -> datetime:
        work = self._work
        now, last = work.clock(), work.state.last_timestamp
        return now if now >= last else last  # keep a run's time monotonic

    def _append(self, event: E) -> E:
        if _abandoned_any and threading.current_thread() in _ABANDONED:
            raise RuleViolation(
                self.id, "abandoned", "this attempt ran past its timeout and was abandoned: "
                "nothing it records any more is written"
            )  # fmt: skip
        work = self._work
        state = apply(self.pipeline, work.state, event)
        # Serialised now, not at a commit, so an unstorable value is refused by the
        # call that brought it.
        work.add(event, state, work.seal(event))
        return event

    def _duration(self, given: float | None) -> float:
        if given is not None:
            return given
        opened = self._work.state.opened_at
        return 0.0 if opened is None else max(0.0, (self._work.clock() - opened).total_seconds())

    def __repr__(self) -> str:
        status = self.status
        return (
            f"Run({self.id}, pipeline={self.pipeline.name!r}, state={self.state!r}, "
            f"version={self.version}, {status})"
        )


_MADE: dict[type[Event], Callable[..., Any]] = {}
"""Each event class's `constructor` (for stagetrail's own classes the same checks as the
class's ``__init__``, with no frozen ``__setattr__`` call per field; a user's kind is itself),
made on the class's first record: not at import, which every command pays (~0.3 ms a class)."""


def _made(kind: type[Event]) -> Callable[..., Any]:
    made = _MADE[kind] = constructor(kind)
    return made


_ABANDONED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_abandoned_any = False  # a plain flag: the append hot path checks it, not the WeakSet


class Batch:
    """The context of `Run.batch`, as a ``with`` and as an ``async with`` block."""

    __slots__ = ("_mark", "_run", "_work")

    def __init__(self, run: Run, work: UnitOfWork) -> None:
        self._run, self._work = run, work
        self._mark: Mark | None = None

    def __enter__(self) -> Run:
        self._mark = self._work.begin(batch=True)
        return self._run

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        work, mark = self._work, self._mark
        assert mark is not None
        if kind is not None:
            work.take_back(mark)
        work.end(batch=True, failed=kind is not None)

    async def __aenter__(self) -> Run:
        return self.__enter__()

    async def __aexit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        work, mark = self._work, self._mark
        assert mark is not None
        if kind is not None:
            work.take_back(mark)
        outermost = work.groups == 1
        try:
            await work.end_async(batch=True, failed=kind is not None)
        except BaseException:
            if outermost and len(work.pending) > mark.pending:
                work.take_back(mark)  # withdrawn before its write: the batch is not written
            raise


def unit_of(run: Run) -> UnitOfWork:
    """The run handle's unit of work: where a supervisor groups, stamps and commits it."""
    return run._work


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
