"""`engine.verify`: re-fold a run through its stored table and every projection."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from uuid import UUID

import attrs

from engine.errors import PipelineError
from engine.machine import replay
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
    seen = _Seen(projections, problems)
    checked = seen.each(events)
    first = next(checked, None)
    if first is None:
        problems.append(Problem(0, "events", "the run has no events"))
    elif not isinstance(first, RunStarted):
        problems.append(Problem(first.version, "start", "the run does not begin with RunStarted"))
    else:
        _replay(first, checked, problems)
    for _ in checked:  # the projections see every event, even after a broken start
        pass
    return VerifyReport(run_id, seen.count, tuple(problems))


def _replay(first: RunStarted, rest: Iterator[Event], problems: list[Problem]) -> None:
    """The run's machine replayed; a refused event is reported and passed over."""

    def refused(event: Event, error: StagetrailError) -> None:
        problems.append(Problem(event.version, "transition", str(error)))

    try:
        pipeline = Pipeline.from_dict(first.table)
    except (PipelineError, KeyError, TypeError) as error:
        problems.append(Problem(1, "table", f"the stored table is not valid: {error}"))
        return
    try:
        replay(first, rest, pipeline=pipeline, refused=refused)
    except StagetrailError as error:  # only the start can raise: later refusals are reported
        problems.append(Problem(1, "table", f"the stored table is not valid: {error}"))


class _Seen:
    """What verify checks of every event beside the machine: its time and each projection."""

    def __init__(self, projections: Sequence[Projection[Any]], problems: list[Problem]) -> None:
        self.projections = projections
        self.problems = problems
        self.states = {p.name: p.initial() for p in projections}
        self.count = 0

    def each(self, events: Iterable[Event]) -> Iterator[Event]:
        """`events`, each checked and folded before it is passed on."""
        before: Event | None = None
        for event in events:
            self.count += 1
            if before is not None and event.timestamp < before.timestamp:
                self.problems.append(
                    Problem(event.version, "time", "stamped before the event it follows")
                )
            before = event
            yield event
            self._fold(event)  # after the machine's check: its problems come first

    def _fold(self, event: Event) -> None:
        states = self.states
        for projection in self.projections:
            if projection.name not in states or not projection.relevant(event):
                continue
            try:
                states[projection.name] = projection.apply(states[projection.name], event)
            except ProjectionError as error:
                self.problems.append(
                    Problem(event.version, f"projection {projection.name}", str(error))
                )
                del states[projection.name]  # its later states would only repeat the error
