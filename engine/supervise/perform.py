"""How a driver performs the generator's `Record`s and store `Read`s (sync and async alike).

`record` hands each event to the run's recording method, so the run builds,
checks and numbers it as it does for any caller. `Reader` answers the
questions that read the store; the async driver runs it in a worker thread.
A policy function's answer is the caller's code: the drivers call it themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.run import Run, unit_of
from engine.supervise.commands import (
    PipelineCircuits,
    Question,
    Record,
    RunHistory,
    TreeSpending,
)
from engine.supervise.reader import RunReader
from engine.supervise.shared_circuits import SharedCircuits
from events import Event, RunStarted, StageCompleted, StageFailed, StageStarted, TaskFailed
from projections import TaskTable

_METHODS: dict[type[Event], Callable[..., Event]] = {
    StageStarted: Run.stage_started,  # numbers the attempt, names its transaction's start
    StageCompleted: Run.stage_completed,  # the hot path: built inline
    StageFailed: Run.stage_failed,  # describes the exception
    TaskFailed: Run.task_failed,  # describes the exception
}
"""The kinds `Run` records through a method of their own; the rest go through `Run.record`."""


def record(run: Run, command: Record) -> None:
    """Record the command's events on `run`, in one batch when `together` (all or none)."""
    if command.together and len(command.events) > 1:
        with run.batch():
            _record_each(run, command)
        return
    _record_each(run, command)


def _record_each(run: Run, command: Record) -> None:
    for kind, payload in command.events:
        method = _METHODS.get(kind)
        if method is None or "attempt" in payload:  # a decided outcome names its attempt (0)
            run.record(kind, **payload)
        else:
            method(run, **payload)


class Reader:
    """Answers the generator's questions that read the store."""

    def __init__(self, engine: RunReader) -> None:
        self.engine = engine
        self.circuits = SharedCircuits(engine)
        """Each pipeline's circuits, folded incrementally (pipeline-scoped breakers)."""

    def answer(self, question: Question) -> Any:
        """The answer to `question` (not a `PolicyAnswer`: that is the caller's code)."""
        if isinstance(question, RunHistory):
            return history(question.run)
        if isinstance(question, TreeSpending):
            return self.tree_spending(question)
        if isinstance(question, PipelineCircuits):
            return self.circuits.circuits(question.run)
        raise TypeError(f"{type(question).__name__} is answered by the driver, not the store")

    def tree_spending(self, question: TreeSpending) -> float:
        """What the root of the run's tree and all its descendants spent in the unit."""
        root = question.run_id
        while True:
            first = self.engine.events(root, upto=1)
            parent = first[0].parent_run_id if first and isinstance(first[0], RunStarted) else None
            if parent is None:
                break
            root = parent
        tasks = self.engine.project(root, TaskTable, tree=True)
        return float(tasks.budget.get(question.unit, 0.0))


def history(run: Run) -> list[Event]:
    """Every event of `run` as its handle holds it: the stored ones, then the pending ones."""
    held = held_history(run)
    if held is not None:
        return held
    work = unit_of(run)
    pending = list(work.events)
    return [*work.store.stream(run.id, lte=work.stored.version), *pending]


def held_history(run: Run) -> list[Event] | None:
    """`history` when the handle holds all of it (it began the run): no read; else None."""
    work = unit_of(run)
    stored = work.stored_history()
    return None if stored is None else [*stored, *work.events]
