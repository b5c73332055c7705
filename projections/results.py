"""Per-stage history of a run: every attempt's outcome, and how often stages were retried.

`StageResults` keeps each stage's attempts in a persistent list (appending costs
the same at any length); `RetryCounts` keeps only counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from sys import intern
from typing import Any

import attrs

from events import JSON, StageCompleted, StageFailed, StageStarted
from events.values import build, evolve, maker
from projections.base import EventSource, Projection, on
from projections.deferred import (
    from_events,
    packed_versions,
    ranges_check,
    unpack_ranges,
    version_ranges,
)
from projections.immutable import PList
from projections.interning import interned


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Attempt:
    """The outcome of one attempt of a stage."""

    attempt: int
    outcome: str
    failed: bool
    result: JSON
    error: str | None
    error_type: str | None
    duration: float
    version: int


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Results:
    """Every stage's attempts, oldest first."""

    by_stage: Mapping[str, PList[Attempt]] = attrs.field(factory=dict)
    completed: Mapping[str, PList[Attempt]] = attrs.field(factory=dict)
    """Each stage's newest completed attempt (a list of one, made from its event when first
    read after a snapshot), so `latest` never walks the attempts of a stage that keeps failing."""

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages with at least one outcome, in order of their first outcome."""
        return tuple(self.by_stage)

    def latest(self, stage: str) -> JSON:
        """The result of the newest completed attempt of `stage`, or None."""
        newest = self.completed.get(stage, _EMPTY).last
        return None if newest is None else newest.result

    def attempts(self, stage: str) -> tuple[Attempt, ...]:
        """The outcomes of `stage`'s attempts, oldest first."""
        return self.by_stage.get(stage, PList()).to_tuple()

    def durations(self, stage: str) -> tuple[float, ...]:
        """How long each attempt of `stage` took, in seconds, oldest first."""
        return tuple(attempt.duration for attempt in self.attempts(stage))


class StageResults(Projection[Results]):
    """Each stage's attempts: outcome, result or error, duration."""

    scope = "run"

    def initial(self) -> Results:
        """No attempts yet."""
        return Results()

    @on(StageCompleted)
    def completed(self, state: Results, event: StageCompleted) -> Results:
        """Append a completed attempt to the stage's list (a routed verdict is none)."""
        if not event.attempt:
            return state
        stage, outcome = event.stage, event.outcome
        # `_attempt`, inline: a fold of a long run makes one attempt per event.
        outcome = intern(outcome) if outcome.__class__ is str else outcome
        attempt = _ATTEMPT(
            event.attempt, outcome, False, event.result, None, None, event.duration,
            event.version,
        )  # fmt: skip
        by_stage = state.by_stage
        return _RESULTS(
            {**by_stage, stage: by_stage.get(stage, _EMPTY).push(attempt)},
            {**state.completed, stage: _EMPTY.push(attempt)},
        )

    @on(StageFailed)
    def failed(self, state: Results, event: StageFailed) -> Results:
        """Append a failed attempt to the stage's list."""
        stage, outcome = event.stage, event.outcome  # as `completed` makes its attempt
        outcome = intern(outcome) if outcome.__class__ is str else outcome
        error, error_type = event.error, event.error_type
        error = intern(error) if error.__class__ is str else error
        error_type = intern(error_type) if error_type.__class__ is str else error_type
        attempt = _ATTEMPT(
            event.attempt, outcome, True, None, error, error_type, event.duration, event.version
        )
        by_stage = state.by_stage
        return _RESULTS(
            {**by_stage, stage: by_stage.get(stage, _EMPTY).push(attempt)}, state.completed
        )

    def encode(self, state: Results) -> JSON:
        """Each stage's attempts as lists of JSON objects."""
        return {
            stage: [attrs.asdict(attempt, recurse=False) for attempt in attempts]
            for stage, attempts in state.by_stage.items()
        }

    def snapshot(self, state: Results) -> JSON:
        """Each stage's attempts as the versions of their events (ranges), not the attempts,
        the version of its newest completed attempt (or None), and the ranges' newest version
        and count (a restore then reads neither from the ranges' text).

        A deferred tail (a snapshot restored) is not walked: its ranges are reused.
        """
        rows: list[JSON] = []
        for stage, attempts in state.by_stage.items():
            packed, last, count = packed_versions(attempts)
            newest = _newest_version(state.completed.get(stage))
            rows.append([stage, packed, newest, last, count, ranges_check(packed, last, count)])
        return rows

    def restore(self, data: JSON, events: EventSource) -> Results:
        """The results `snapshot` wrote: attempts made from their events when first walked."""
        by_stage, completed = {}, {}
        for stage, ranges, newest, *totals in data:
            packed = unpack_ranges(ranges, *totals)
            by_stage[stage] = from_events(self.name, packed, events, _made)
            if newest is not None:
                completed[stage] = from_events(self.name, [(newest, newest)], events, _made)
        return build(Results, {"by_stage": by_stage, "completed": completed})

    def decode(self, data: JSON) -> Results:
        """The results `encode` turned into `data`."""
        by_stage = {
            stage: PList.of([Attempt(**attempt) for attempt in attempts])
            for stage, attempts in data.items()
        }
        completed = {}
        for stage, attempts in by_stage.items():
            newest = next((a for a in attempts.newest_first() if not a.failed), None)
            if newest is not None:
                completed[stage] = _EMPTY.push(newest)
        return Results(by_stage, completed)


def _made(event: Any, index: int = 0, count: int = 1) -> Attempt:
    """The attempt an outcome appends (for a list made from its events: one each)."""
    if isinstance(event, StageFailed):
        return _attempt(event, None, event.error, event.error_type)
    return _attempt(event, event.result, None, None)


def _attempt(
    event: StageCompleted | StageFailed, result: JSON, error: str | None, error_type: str | None
) -> Attempt:
    """The attempt an outcome appends, its outcome and error interned (a long run repeats
    a few of them, and each event read brings its own copy)."""
    outcome = event.outcome
    if outcome.__class__ is str:  # `interned`, inline: a fold makes one attempt per outcome
        outcome = intern(outcome)
    if error is not None:
        error, error_type = interned(error), interned(error_type)
    return _ATTEMPT(
        event.attempt, outcome, isinstance(event, StageFailed), result, error, error_type,
        event.duration, event.version,
    )  # fmt: skip


def _newest_version(newest: PList[Attempt] | None) -> int | None:
    """The version of the attempt a list of one holds (not made if deferred), or None."""
    ranges = [] if newest is None else version_ranges(newest)
    return ranges[-1][1] if ranges else None


_EMPTY: PList[Any] = PList()
# Positional (`maker`), in the fields' declared order: a fold builds both per outcome.
_ATTEMPT = maker(Attempt)
_RESULTS = maker(Results)


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Retries:
    """How many attempts each stage had, and how many of them were retries."""

    attempt_counts: Mapping[str, int] = attrs.field(factory=dict)
    retry_counts: Mapping[str, int] = attrs.field(factory=dict)
    last_failed: frozenset[str] = frozenset()
    open_stage: str | None = None
    total_attempts: int = 0

    def attempts(self, stage: str) -> int:
        """How many attempts `stage` had (started, or recorded without a start)."""
        return self.attempt_counts.get(stage, 0)

    def retries(self, stage: str) -> int:
        """How many of `stage`'s attempts failed and were followed by another attempt."""
        return self.retry_counts.get(stage, 0)

    def begin(self, stage: str) -> Retries:
        """The counts after a new attempt of `stage` began."""
        retried = stage in self.last_failed
        # `maker`, not __init__ or attrs.evolve: this runs for every event of a fold.
        return _RETRIES(
            {**self.attempt_counts, stage: self.attempt_counts.get(stage, 0) + 1},
            {**self.retry_counts, stage: self.retry_counts.get(stage, 0) + 1}
            if retried
            else self.retry_counts,
            self.last_failed - {stage} if retried else self.last_failed,
            stage,
            self.total_attempts + 1,
        )

    def end(self, stage: str, failed: bool) -> Retries:
        """The counts after an outcome of `stage` closed its attempt."""
        if self.open_stage == stage:
            return evolve(
                self, open_stage=None, last_failed=_marked(self.last_failed, stage, failed)
            )
        # Recorded without a start: an attempt of its own (a retry if the last one
        # failed); another stage's attempt stays open. One value built, not two.
        retried = stage in self.last_failed
        return _RETRIES(
            {**self.attempt_counts, stage: self.attempt_counts.get(stage, 0) + 1},
            {**self.retry_counts, stage: self.retry_counts.get(stage, 0) + 1}
            if retried
            else self.retry_counts,
            _marked(self.last_failed, stage, failed),
            self.open_stage,
            self.total_attempts + 1,
        )


def _marked(last_failed: frozenset[str], stage: str, failed: bool) -> frozenset[str]:
    """`last_failed` with `stage` in it if its last attempt `failed`, else without (copied only
    when that changes)."""
    if failed == (stage in last_failed):
        return last_failed
    return last_failed | {stage} if failed else last_failed - {stage}


_RETRIES = maker(Retries)
"""Positional (`maker`), in the fields' declared order: a fold builds one per outcome."""


class RetryCounts(Projection[Retries]):
    """Attempts and retries per stage, and attempts in all."""

    scope = "run"

    def initial(self) -> Retries:
        """No attempts yet."""
        return Retries()

    @on(StageStarted)
    def started(self, state: Retries, event: StageStarted) -> Retries:
        """Count a new attempt of the stage (a retry if its last attempt failed)."""
        return state.begin(event.stage)

    @on(StageCompleted)
    def completed(self, state: Retries, event: StageCompleted) -> Retries:
        """Close the stage's attempt (counting one if it was not started); not a verdict's."""
        if not event.attempt:
            return state
        return state.end(event.stage, failed=False)

    @on(StageFailed)
    def failed(self, state: Retries, event: StageFailed) -> Retries:
        """Close the stage's attempt as failed (counting one if it was not started)."""
        return state.end(event.stage, failed=True)

    def encode(self, state: Retries) -> JSON:
        """The counters as a JSON object."""
        data: dict[str, Any] = attrs.asdict(state, recurse=False)
        data["attempt_counts"] = dict(state.attempt_counts)
        data["retry_counts"] = dict(state.retry_counts)
        data["last_failed"] = sorted(state.last_failed)
        return data

    def decode(self, data: JSON) -> Retries:
        """The counters `encode` turned into `data`."""
        return Retries(**{**data, "last_failed": frozenset(data["last_failed"])})
