"""`StageContext`: what a stage function or an adaptive policy may look at."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

from engine.supervise.reader import RunReader
from projections import (
    FailurePatterns,
    ProgressState,
    Projection,
    RetryCounts,
    StageResults,
    StateStack,
    TaskTable,
)
from projections.failures import Failures
from projections.progress import Progress
from projections.results import Results, Retries
from projections.stack import Stack
from projections.tasks import Tasks

if TYPE_CHECKING:
    from engine.run import Run

S = TypeVar("S")


class StageContext:
    """One stage of one run, with the run's projections folded on first use.

    `drive` passes it to each stage function; a callable policy receives it to
    choose the `RetryPolicy` of the next attempt.
    """

    def __init__(self, engine: RunReader, run: Run, stage: str) -> None:
        self.engine = engine
        self.run = run
        self.stage = stage

    @property
    def attempt(self) -> int:
        """The number the next (or open) attempt of the stage carries."""
        return self.run.machine.next_attempt(self.stage)

    @property
    def params(self) -> Any:
        """The run's `params` (from its `RunStarted`): `Run.params`."""
        return self.run.params

    @cached_property
    def stack(self) -> Stack:
        """The run's state stack (`latest_result(stage)` reads an earlier stage's result)."""
        return self._project(StateStack)

    @cached_property
    def results(self) -> Results:
        """Every stage's attempts and results."""
        return self._project(StageResults)

    @cached_property
    def retries(self) -> Retries:
        """Attempts and retries per stage."""
        return self._project(RetryCounts)

    @cached_property
    def failures(self) -> Failures:
        """The run's failure patterns."""
        return self._project(FailurePatterns)

    @cached_property
    def progress(self) -> Progress:
        """The run's progress counters."""
        return self._project(ProgressState)

    @cached_property
    def tasks(self) -> Tasks:
        """The run's tasks (and those of its child runs)."""
        return self.engine.project(self.run.id, TaskTable, tree=True)

    def project(self, projection: Projection[S] | type[Projection[S]], *, tree: bool = False) -> S:
        """Any projection of this run (yours or a built-in), folded now: `Engine.project`.

        What the stage recorded so far is included: the supervisor commits before it
        calls the stage function, and what the function records is written at once.
        """
        return self.engine.project(self.run.id, projection, tree=tree)

    def _project(self, projection: type[Projection[S]]) -> S:
        return self.engine.project(self.run.id, projection)

    def __repr__(self) -> str:
        return f"StageContext(run={self.run.id}, stage={self.stage!r}, attempt={self.attempt})"
