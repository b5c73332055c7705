"""What a supervisor knows of one run: projections advanced by every event the run records.

Folding the run's projections from the store before every attempt would cost
more than the attempt's own appends; a `RunWatch` is an observer of the run's
unit of work and applies each recorded event, once, to the states of the
projections the supervisor reads (each by the projection's own `apply`). Events
another writer stored reach it through `Run.refresh`; a version gap raises.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar, cast

from engine.errors import RuleViolation
from engine.pipeline import Pipeline
from engine.supervise.breaker import Circuits, CircuitStates, UnrolledCircuits
from engine.supervise.streaks import RetryStreaks, Streaks
from engine.supervise.verdict import RoutedVerdict
from events import JSON, Event
from projections import FailurePatterns, ProgressState, Projection, TaskTable
from projections.failures import Failures
from projections.progress import Progress
from projections.tasks import Task, Tasks

S = TypeVar("S")

_FAILURES = FailurePatterns()
_TASKS = TaskTable()
_PROGRESS = ProgressState()
_VERDICT = RoutedVerdict()
_CIRCUITS = CircuitStates()
_UNROLLED = UnrolledCircuits()


class RunWatch:
    """The supervisor's projections of one run, folded one recorded event at a time.

    Args:
        pipeline: the run's table (retry budgets ask it which failures were routed).
        progress: fold the progress counters and the routed verdict (a `ProgressPolicy` reads them).
        circuits: fold each stage's breaker (a `CircuitBreaker` reads them).
        forget_rolled_back: the circuits leave out failures a rollback took off the stack.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        progress: bool = True,
        circuits: bool = True,
        forget_rolled_back: bool = False,
    ) -> None:
        self._streaks = RetryStreaks(pipeline)
        self._plain = _CIRCUITS if circuits and not forget_rolled_back else None
        self._unrolled = _UNROLLED if circuits and forget_rolled_back else None
        chosen: list[Projection[Any]] = [self._streaks, _FAILURES, _TASKS]
        chosen += [_PROGRESS, _VERDICT] if progress else []
        chosen += [p for p in (self._plain, self._unrolled) if p is not None]
        self.projections: tuple[Projection[Any], ...] = tuple(chosen)
        """The projections this watch folds."""
        self._states: dict[Projection[Any], Any] = {p: p.initial() for p in chosen}
        # Per event type, the projections with a handler for it: most events concern few.
        self._routes: dict[type[Event], tuple[Projection[Any], ...]] = {}
        self.version = 0
        """The version of the newest event folded."""
        self.stale = False
        """Whether events this watch folded were taken back (it must be folded again)."""

    def state(self, projection: Projection[S]) -> S:
        """The state of one of this watch's projections."""
        return cast(S, self._states[projection])

    @property
    def streaks(self) -> Streaks:
        """The failures retry budgets count."""
        return self.state(self._streaks)

    @property
    def failures(self) -> Failures:
        """The run's failure patterns: streaks per stage, the recent failures."""
        return self.state(_FAILURES)

    @property
    def tasks(self) -> Tasks:
        """The run's tasks and what it spent."""
        return self.state(_TASKS)

    @property
    def progress(self) -> Progress:
        """The progress counters (initial unless the watch folds progress)."""
        return self.state(_PROGRESS) if _PROGRESS in self._states else _PROGRESS.initial()

    @property
    def verdict(self) -> dict[str, JSON] | None:
        """The progress verdict routed to a handler stage (status, reason), once there is one."""
        return self.state(_VERDICT) if _VERDICT in self._states else None

    @property
    def circuits(self) -> Circuits:
        """Each stage's breaker (empty unless the watch folds circuits)."""
        if self._plain is not None:
            return self.state(self._plain)
        return {} if self._unrolled is None else self.state(self._unrolled).circuits

    def task(self, run_id: Any, task_id: str) -> Task | None:
        """The task `task_id` of the run, or None before it was added."""
        return self.tasks.table.get((run_id, task_id))

    def last_failure(self, stage: str) -> tuple[str, str]:
        """The newest (error_type, error) of `stage` among the run's recent failures."""
        return self.failures.last(stage) or ("Error", "")

    def consecutive_failures(self, stage: str) -> int:
        """How many times in a row `stage` failed: its breaker's count, else its streak."""
        if self._plain is None and self._unrolled is None:
            return self.failures.consecutive(stage)
        circuit = self.circuits.get(stage)
        return 0 if circuit is None else circuit.consecutive

    def fold(self, events: Iterable[Event]) -> RunWatch:
        """Fold `events` (the run's next ones, in order); returns the watch."""
        for event in events:
            self.recorded(event)
        return self

    def recorded(self, event: Event) -> None:
        """Fold one event the run recorded (an `Observer` of its unit of work).

        Raises:
            RuleViolation: the event is not the next version: the fold would be wrong.
        """
        if event.version != self.version + 1:
            raise RuleViolation(
                event.run_id, "fold_gap", f"the supervisor's fold of the run is at version "
                f"{self.version} and was given version {event.version}"
            )  # fmt: skip
        self.version = event.version
        kind = type(event)
        route = self._routes.get(kind)
        if route is None:
            route = self._routes[kind] = tuple(p for p in self.projections if p.relevant(event))
        states = self._states
        for projection in route:
            states[projection] = projection.apply(states[projection], event)

    def rewound(self, version: int) -> None:
        """Events after `version` were taken back: this fold is stale until folded again."""
        self.stale = True
