"""What a supervisor knows of one run, kept up to date one event at a time.

Folding the run's projections from the store before every attempt would cost
more than the attempt's own appends; a `RunWatch` folds each event once: the
ones the supervisor records as it records them, the rest (written by a stage
function, or another writer) read from the store when the run's version moves.
"""

from __future__ import annotations

from typing import Any

from engine.errors import RuleViolation
from engine.pipeline import Pipeline
from engine.run import Run, unit_of
from engine.supervise.breaker import Circuits, CircuitStates
from engine.supervise.streaks import BudgetRules, RetryStreaks
from events import (
    INTERRUPTED,
    JSON,
    BudgetSpent,
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    Event,
    NoteAdded,
    StageCompleted,
    StageFailed,
    StateRolledBack,
    TaskCompleted,
    TaskFailed,
)
from projections import ProgressState
from projections.progress import Progress

_PROGRESS = ProgressState()
_CIRCUITS = CircuitStates()
RECENT_FAILURES = 5
"""How many of a run's latest failures a stuck verdict quotes."""

VERDICT_NOTE = "progress_verdict"
"""The note that records a stuck or partial verdict the table routes to a handler stage."""

_BREAKER_EVENTS = (StageCompleted, StageFailed, CircuitOpened, CircuitHalfOpened, CircuitClosed)


class RunWatch:
    """Progress, circuits, recent failures and task results of one run, folded incrementally."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        progress: bool = True,
        circuits: bool = True,
        forget_rolled_back: bool = False,
    ) -> None:
        self.watches_progress = progress  # off when no ProgressPolicy asks: the hot path
        self.watches_circuits = circuits  # off when no breaker reads them: the hot path too
        self.forgets_rolled_back = forget_rolled_back
        """Whether the circuits leave out failures a rollback took off the stack."""
        self._breaker_events: list[Event] = []  # kept only to refold after a rollback
        self.streaks = RetryStreaks(pipeline)
        """The failures retry budgets count."""
        self.version = 0
        self.progress: Progress = _PROGRESS.initial()
        self.circuits: Circuits = _CIRCUITS.initial()
        """Each stage's breaker state (left initial when `circuits` is off)."""
        self.recent_failures: tuple[tuple[str, str, str], ...] = ()
        self.task_failures: dict[str, int] = {}
        self.task_interruptions: dict[str, int] = {}
        self.task_errors: dict[str, tuple[str, str]] = {}
        self.task_results: dict[str, Any] = {}
        self.spent: dict[str, float] = {}
        """What the run has spent so far, by unit."""
        self.stale = False
        """Whether events this watch folded were taken back (it must be folded again)."""
        self.verdict: dict[str, JSON] | None = None
        """The progress verdict routed to a handler stage (status, reason), once there is one."""

    def consecutive_failures(self, run: Run, stage: str) -> int:
        """How many times in a row `stage` failed (its breaker's count).

        A watch that keeps no circuits folds them from the run's events: a rare
        question, asked when a stage gives up.
        """
        circuits = self.circuits
        if not self.watches_circuits:
            circuits = _CIRCUITS.fold(recorded_events(run))
        circuit = circuits.get(stage)
        return 0 if circuit is None else circuit.consecutive

    def recorded(self, event: Event) -> None:
        """Fold one event the run recorded (an `Observer` of its unit of work)."""
        self.see(event)

    def rewound(self, version: int) -> None:
        """Events after `version` were taken back: this fold is stale until folded again."""
        self.stale = True

    def task_streak(self, task_id: str, rules: BudgetRules) -> int:
        """The failures of a task its retry budget counts (interruptions only if asked)."""
        failures = self.task_failures.get(task_id, 0)
        if rules.count_interrupted:
            return failures
        return failures - self.task_interruptions.get(task_id, 0)

    def last_failure(self, stage: str) -> tuple[str, str]:
        """The newest (error_type, error) of `stage` this watch remembers."""
        for failed_stage, error_type, error in reversed(self.recent_failures):
            if failed_stage == stage:
                return error_type, error
        return "Error", ""

    def see(self, event: Event) -> Event:
        """Fold one event (the next of the run); returns it.

        Raises:
            RuleViolation: the event is not the next version: the fold would be wrong.
        """
        if event.version != self.version + 1:
            raise RuleViolation(
                event.run_id, "fold_gap", f"the supervisor's fold of the run is at version "
                f"{self.version} and was given version {event.version}"
            )  # fmt: skip
        self.version = event.version
        if self.watches_progress:
            self.progress = _PROGRESS.apply(self.progress, event)
        if self.watches_circuits:
            self.circuits = _CIRCUITS.apply(self.circuits, event)
        self.streaks.see(event)
        kind = type(event)
        if self.forgets_rolled_back:
            self._forget_rolled_back(event)
        if kind is StageFailed:
            failure = (event.stage, event.error_type, event.error)  # type: ignore[attr-defined]
            self.recent_failures = (*self.recent_failures[1 - RECENT_FAILURES :], failure)
        elif kind is TaskFailed:
            task_id = event.task_id  # type: ignore[attr-defined]
            self.task_failures[task_id] = self.task_failures.get(task_id, 0) + 1
            if event.error_type == INTERRUPTED:  # type: ignore[attr-defined]
                self.task_interruptions[task_id] = self.task_interruptions.get(task_id, 0) + 1
            self.task_errors[task_id] = (event.error_type, event.error)  # type: ignore[attr-defined]
        elif kind is TaskCompleted:
            self.task_results[event.task_id] = event.result  # type: ignore[attr-defined]
        elif kind is BudgetSpent:
            unit = event.unit  # type: ignore[attr-defined]
            self.spent[unit] = self.spent.get(unit, 0.0) + event.amount  # type: ignore[attr-defined]
        elif kind is NoteAdded and event.key == VERDICT_NOTE:  # type: ignore[attr-defined]
            self.verdict = event.value  # type: ignore[attr-defined]
        return event

    def _forget_rolled_back(self, event: Event) -> None:
        """Keep the breaker's events; after a rollback, refold them without the popped failures.

        A rollback is rare and pops few outcomes, so refolding the run's breaker
        events then costs less than an undo log for every circuit.
        """
        if isinstance(event, _BREAKER_EVENTS):
            self._breaker_events.append(event)
        elif type(event) is StateRolledBack:
            popped = self.streaks.popped_failures
            kept = (e for e in self._breaker_events if e.version not in popped)
            self.circuits = _CIRCUITS.fold(kept)


def recorded_events(run: Run) -> list[Event]:
    """Every event of `run` as its handle holds it: the stored ones, then the pending ones."""
    work = unit_of(run)
    return [*work.store.stream(run.id, lte=work.stored.version), *work.events]
