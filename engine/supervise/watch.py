"""What a supervisor knows of one run: projections advanced by every event the run records.

Folding the run's projections from the store before every attempt would cost
more than the attempt's own appends; a `RunWatch` is an observer of the run's
unit of work and applies each recorded event, once, to the states of the
projections the supervisor reads (each by the projection's own `apply`). Events
another writer stored reach it through `Run.refresh`; a version gap raises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeAlias, TypeVar, cast

from engine.errors import RuleViolation
from engine.pipeline import Pipeline
from engine.supervise.breaker import Circuits, CircuitStates, UnrolledCircuits
from engine.supervise.streaks import RetryStreaks, Streaks
from engine.supervise.verdict import Ending, RoutedVerdict
from events import JSON, Event
from projections import FailurePatterns, ProgressState, Projection, TaskTable
from projections.errors import ProjectionError
from projections.failures import Failures
from projections.progress import Progress
from projections.tasks import Task, Tasks

S = TypeVar("S")

_FAILURES = FailurePatterns()
_TASKS = TaskTable()
_PROGRESS = ProgressState()
_VERDICT = RoutedVerdict()
_ENDING = Ending()
_CIRCUITS = CircuitStates()
_UNROLLED = UnrolledCircuits()


Route: TypeAlias = tuple[tuple[Projection[Any], Callable[[Any, Any, Any], Any]], ...]
"""For one event type: each projection with a handler for it, and that handler."""


class WatchPlan:
    """What the watches of one pipeline under one supervisor fold: built once, shared.

    A supervisor folds a watch per run; the projections it folds and, per event
    type, which of their handlers apply are the same for every run of a pipeline,
    so they are worked out once here rather than for each run.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        progress: bool,
        circuits: bool,
        forget_rolled_back: bool,
        verdicts: bool = False,
    ) -> None:
        self.streaks = RetryStreaks(pipeline)
        self.plain = _CIRCUITS if circuits and not forget_rolled_back else None
        self.unrolled = _UNROLLED if circuits and forget_rolled_back else None
        chosen: list[Projection[Any]] = [self.streaks, _FAILURES, _TASKS, _ENDING]
        chosen += [_PROGRESS] if progress else []
        chosen += [_VERDICT] if progress or verdicts else []
        chosen += [p for p in (self.plain, self.unrolled) if p is not None]
        self.projections = tuple(chosen)
        self.routes: dict[type[Event], Route] = {}
        """Per event type, the projections with a handler for it (most events concern few)."""

    def route(self, kind: type[Event]) -> Route:
        """The handlers an event of `kind` goes through, worked out once per kind."""
        route: list[tuple[Projection[Any], Callable[[Any, Any, Any], Any]]] = []
        for projection in self.projections:
            handler = projection.handlers.get(kind)
            if projection.every_event:
                route.append((projection, type(projection).apply))
            elif handler is not None:
                route.append((projection, handler))
        self.routes[kind] = tuple(route)
        return self.routes[kind]


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
        plan: WatchPlan | None = None,
    ) -> None:
        if plan is None:
            plan = WatchPlan(pipeline, progress, circuits, forget_rolled_back)
        self._plan = plan
        self._streaks = plan.streaks
        self._plain, self._unrolled = plan.plain, plan.unrolled
        self.projections: tuple[Projection[Any], ...] = plan.projections
        """The projections this watch folds."""
        self._states: dict[Projection[Any], Any] = {p: p.initial() for p in plan.projections}
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
    def ending(self) -> dict[str, JSON] | None:
        """How the run finished (status, reason), or None while it runs."""
        return self.state(_ENDING)

    def exempt(self, state: str) -> bool:
        """Whether an attempt in `state` runs whatever the stop rules say: the handler a
        verdict was routed to, until a stage function completed there."""
        verdict = self.verdict
        return (
            verdict is not None and verdict.get("handler") == state and not verdict.get("handled")
        )

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
        route = self._plan.routes.get(kind)
        if route is None:
            route = self._plan.route(kind)
        states = self._states
        for projection, handler in route:
            try:
                states[projection] = handler(projection, states[projection], event)
            except Exception as error:
                raise ProjectionError(projection.name, event, error) from error

    def rewound(self, version: int) -> None:
        """Events after `version` were taken back: this fold is stale until folded again."""
        self.stale = True
