"""The circuits every run of a pipeline shares (``CircuitBreaker(scope="pipeline")``).

A supervisor keeps each pipeline's `CircuitStates` folded incrementally: the
first read starts from the persistent projection's stored state (caught up
once), each later read folds only the notifications after the position it
remembers, of the event types a breaker reads, and only those of runs of that
pipeline. An admit therefore costs the events that arrived since the last one,
not a catch-up of the whole store. The run's own events not committed yet are
applied on top, so a read sees everything the run recorded without a commit.
"""

from __future__ import annotations

import threading
from uuid import UUID

from engine.run import Run, unit_of
from engine.store import Store
from engine.supervise.breaker import Circuits, CircuitStates
from engine.supervise.reader import RunReader
from events import (
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    Event,
    RunStarted,
    StageCompleted,
    StageFailed,
)

PAGE = 500
"""Notifications read at a time."""

MAX_RUNS = 10_000
"""Runs whose pipeline a fold remembers; beyond, it forgets them all and looks up again."""

_TOPICS = tuple(
    kind.topic
    for kind in (
        RunStarted,
        StageCompleted,
        StageFailed,
        CircuitOpened,
        CircuitHalfOpened,
        CircuitClosed,
    )
)
_STATES = CircuitStates()


class SharedCircuits:
    """Each pipeline's circuits, folded from the notification log as far as it has read.

    Thread-safe: the async driver reads it from worker threads.

    Attributes:
        read: how many notifications the folds have read (each at most once).
    """

    def __init__(self, engine: RunReader) -> None:
        self.engine = engine
        self.read = 0
        self._folds: dict[str, tuple[int, Circuits]] = {}
        self._pipelines: dict[UUID, str] = {}
        self._lock = threading.Lock()

    def circuits(self, run: Run) -> Circuits:
        """Each stage's circuit over every run of `run`'s pipeline, `run`'s pending events too."""
        pipeline, work = run.pipeline.name, unit_of(run)
        with self._lock:
            position, state = self._folds.get(pipeline) or self._seed(pipeline)
            position, state = self._advance(work.store, pipeline, position, state)
            self._folds[pipeline] = position, state
        return _STATES.fold(list(work.events), state) if work.events else state

    def _seed(self, pipeline: str) -> tuple[int, Circuits]:
        """The persistent projection's state of `pipeline` and the position it was folded to."""
        projections = self.engine.projections
        if CircuitStates.name not in projections.names:
            projections.register(CircuitStates)
        projections.catch_up([CircuitStates.name])
        views = projections.views
        while True:  # another catch-up may move it between the two reads: read again
            before = views.positions([CircuitStates.name]).get(CircuitStates.name, 0)
            state: Circuits = projections.get(CircuitStates.name, pipeline, catch_up=False)
            if views.positions([CircuitStates.name]).get(CircuitStates.name, 0) == before:
                return before, state

    def _advance(
        self, store: Store, pipeline: str, position: int, state: Circuits
    ) -> tuple[int, Circuits]:
        """`state` with the breaker's events of `pipeline` after `position` folded in."""
        recorder, mapper = store.recorder, store.mapper
        head = recorder.max_notification_id() or 0
        while position < head:
            page = recorder.select_notifications(
                start=position, limit=PAGE, stop=head, topics=_TOPICS, inclusive_of_start=False
            )
            self.read += len(page)
            for notification in page:
                event = mapper.to_domain_event(notification)
                if isinstance(event, RunStarted):
                    self._learn(event.run_id, event.pipeline)
                elif self._pipeline(event) == pipeline:
                    state = _STATES.apply(state, event)
            position = page[-1].id if len(page) == PAGE else head
        return position, state

    def _pipeline(self, event: Event) -> str:
        """The pipeline of the event's run (its first event says, read once)."""
        known = self._pipelines.get(event.run_id)
        if known is not None:
            return known
        first = self.engine.events(event.run_id, upto=1)
        name = first[0].pipeline if first and isinstance(first[0], RunStarted) else ""
        return self._learn(event.run_id, name)

    def _learn(self, run_id: UUID, pipeline: str) -> str:
        if len(self._pipelines) >= MAX_RUNS:
            self._pipelines.clear()
        self._pipelines[run_id] = pipeline
        return pipeline
