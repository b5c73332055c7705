"""`engine.verify`: re-fold a run through its stored table and every projection."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any
from uuid import UUID

import attrs

from engine.errors import PipelineError
from engine.machine import RunState, apply, start
from engine.pipeline import Pipeline
from events import Event, RunStarted, StagetrailError
from projections import Projection, ProjectionError


@attrs.frozen
class Problem:
    """One thing wrong with a stored run: where, which check, what."""

    version: int
    check: str
    message: str


@attrs.frozen
class VerifyReport:
    """The outcome of verifying one run."""

    run_id: UUID
    events: int
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def verify_events(
    run_id: UUID, events: Iterable[Event], projections: Sequence[Projection[Any]]
) -> VerifyReport:
    """Check every event against the run's own table and fold it into each projection."""
    problems: list[Problem] = []
    machine: _Machine | None = None
    states = {p.name: p.initial() for p in projections}
    count = 0
    for count, event in enumerate(events, start=1):
        if count == 1:
            machine = _first(event, problems)
        elif machine is not None:
            machine.check(event, problems)
        _fold(projections, states, event, problems)
    if count == 0:
        problems.append(Problem(0, "events", "the run has no events"))
    return VerifyReport(run_id, count, tuple(problems))


class _Machine:
    """The run's machine, re-checking each event; a refused event is reported and skipped."""

    def __init__(self, pipeline: Pipeline, state: RunState) -> None:
        self.pipeline = pipeline
        self.state = state

    def check(self, event: Event, problems: list[Problem]) -> None:
        if event.timestamp < self.state.last_timestamp:
            problems.append(Problem(event.version, "time", "stamped before the event it follows"))
        try:
            self.state = apply(self.pipeline, self.state, event)
        except StagetrailError as error:
            problems.append(Problem(event.version, "transition", str(error)))
            self.state = attrs.evolve(self.state, version=event.version)


def _first(event: Event, problems: list[Problem]) -> _Machine | None:
    if not isinstance(event, RunStarted):
        problems.append(Problem(event.version, "start", "the run does not begin with RunStarted"))
        return None
    try:
        pipeline = Pipeline.from_dict(event.table)
        return _Machine(pipeline, start(pipeline, event))
    except (PipelineError, StagetrailError, KeyError, TypeError) as error:
        problems.append(Problem(1, "table", f"the stored table is not valid: {error}"))
        return None


def _fold(
    projections: Sequence[Projection[Any]],
    states: dict[str, Any],
    event: Event,
    problems: list[Problem],
) -> None:
    for projection in projections:
        if projection.name not in states or not projection.relevant(event):
            continue
        try:
            states[projection.name] = projection.apply(states[projection.name], event)
        except ProjectionError as error:
            problems.append(Problem(event.version, f"projection {projection.name}", str(error)))
            del states[projection.name]  # its later states would only repeat the error
