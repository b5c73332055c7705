"""Per-stage history of a run: every attempt's outcome, and how often stages were retried.

`StageResults` keeps each stage's attempts in a persistent list (`Attempts`: the
newest kept as rows of their fields, an attempt made when read; appending costs the
same at any length, and a fold appends its outcomes' rows in place); `RetryCounts`
keeps only counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from sys import intern
from typing import Any

import attrs

from events import JSON, Event, StageCompleted, StageFailed, StageStarted
from events.values import build, evolve, maker
from projections.base import EventSource, Projection, folded_by, folds_with, on
from projections.collector import COLLECT_EVERY
from projections.deferred import (
    from_events,
    packed_versions,
    ranges_check,
    unpack_ranges,
    version_ranges,
)
from projections.errors import ProjectionError
from projections.immutable import ROWS_PER_BLOCK, PList, RowList
from projections.interning import interned
from projections.stretches import folded_in_stretches, plain


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


def _newest_each(lists: Mapping[str, PList[Attempt]]) -> dict[str, Attempt | None]:
    """Each list's newest attempt (what `Results.completed` is compared by)."""
    try:
        return {stage: attempts.last for stage, attempts in lists.items()}
    except AttributeError:  # not a map of attempt lists (a value made by hand): compared as is
        return lists  # type: ignore[return-value]


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Results:
    """Every stage's attempts, oldest first."""

    by_stage: Mapping[str, PList[Attempt]] = attrs.field(factory=dict)
    completed: Mapping[str, PList[Attempt]] = attrs.field(factory=dict, eq=_newest_each)
    """Each stage's attempts as they were when its newest completed attempt was pushed (a list
    whose newest item is that attempt: a fold's, or a list of one made from its event when
    first read after a snapshot), so `latest` never walks the attempts of a stage that keeps
    failing. Compared by those newest attempts only (what `latest` answers), not walked."""

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
        by_stage, stage = state.by_stage, event.stage
        attempts = by_stage.get(stage, _EMPTY)
        if attempts.__class__ is not Attempts:  # a restored stage's or a new one's: rows on top
            attempts = Attempts.on(attempts)
        attempts = attempts.pushed(event, None, None)  # type: ignore[attr-defined]
        return _RESULTS({**by_stage, stage: attempts}, {**state.completed, stage: attempts})

    @on(StageFailed)
    def failed(self, state: Results, event: StageFailed) -> Results:
        """Append a failed attempt to the stage's list."""
        by_stage, stage = state.by_stage, event.stage
        attempts = by_stage.get(stage, _EMPTY)
        if attempts.__class__ is not Attempts:
            attempts = Attempts.on(attempts)
        error, error_type = event.error, event.error_type
        error = interned(error)
        error_type = interned(error_type)
        attempts = attempts.pushed(event, error, error_type)  # type: ignore[attr-defined]
        return _RESULTS({**by_stage, stage: attempts}, state.completed)

    def fold(self, events: Iterable[Event], state: Results | None = None) -> Results:
        """`Projection.fold`, each outcome pushed as a row in place onto its stage's attempts.

        The states between two events of a fold are nobody's but its own, so while the
        outcomes are of one stage (a loop's), their rows go straight onto the newest block
        of its attempts (`RowList`): no results, dicts or attempt made per event. Another
        stage's outcome (or another event) has the results made first, as `apply` would.
        """
        if not folds_with(self, StageResults, StageCompleted, StageFailed):
            return super().fold(events, state)  # a subclass takes outcomes its own way
        return folded_by(self, self._pushed_in_place, events, state)

    def _pushed_in_place(
        self, events: Iterable[Event], current: Results, tick: Callable[[], None]
    ) -> Results:
        # One loop, its state in locals (the stage's `RowList.parts`, the newest row's
        # outcome): a call per event would cost what the push does.
        handlers, left, every, cap = (
            self.handlers,
            COLLECT_EVERY,
            COLLECT_EVERY,
            _WIDTH * ROWS_PER_BLOCK,
        )
        event: Any
        stage: Any = _NO_NAME
        outcome: Any = _NO_NAME
        tip: list[Any] = []
        blocks: Any = None
        newest: Any = None  # the stage's parts when its newest completed attempt was pushed
        cells, size, used = None, 0, 0
        for event in events:
            kind = event.__class__
            if kind is StageCompleted or kind is StageFailed:
                if kind is StageCompleted and not event.attempt:
                    pass  # a routed verdict is no attempt
                else:
                    try:
                        if event.stage != stage:  # another stage's: the results made first
                            if stage is not _NO_NAME:
                                current = _flushed(
                                    current, stage, (cells, size, tip, used, blocks), newest
                                )
                            stage, outcome, newest = event.stage, _NO_NAME, None
                            attempts = Attempts.on(current.by_stage.get(stage, _EMPTY))
                            cells, size, tip, used, blocks = attempts.parts()
                        called = event.outcome
                        if called != outcome:  # else the newest row's, again
                            outcome = intern(called) if called.__class__ is str else called
                        if kind is StageCompleted:
                            row: tuple[Any, ...] = (
                                event.attempt, outcome, False, event.result, None, None,
                                event.duration, event.version,
                            )  # fmt: skip
                        else:
                            error, error_type = event.error, event.error_type
                            error = interned(error)
                            error_type = interned(error_type)
                            row = (
                                event.attempt, outcome, True, None, error, error_type,
                                event.duration, event.version,
                            )  # fmt: skip
                        if used == cap:  # the newest block is full: it goes below, a new one starts
                            blocks, tip, used = Attempts.sealed(tip[:used], blocks), [], 0
                        tip.extend(row)
                        used += _WIDTH
                        size += 1
                        if len(tip) != used:  # another list went on from it at the same moment
                            tip = tip[: used - _WIDTH] + list(row)
                        if kind is StageCompleted:
                            newest = (cells, size, tip, used, blocks)
                    except Exception as failure:
                        raise ProjectionError(self.name, event, failure) from failure
            else:
                handler = handlers.get(kind)
                if handler is not None:
                    if stage is not _NO_NAME:
                        current = _flushed(current, stage, (cells, size, tip, used, blocks), newest)
                        stage = _NO_NAME
                    try:
                        current = handler(self, current, event)
                    except Exception as failure:
                        raise ProjectionError(self.name, event, failure) from failure
            left -= 1
            if not left:
                tick()
                left = every
        if stage is not _NO_NAME:
            current = _flushed(current, stage, (cells, size, tip, used, blocks), newest)
        return current

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


def _flushed(results: Results, stage: str, parts: Any, newest: Any) -> Results:
    """`results` with `stage`'s attempts those of `parts` (`RowList.parts`), and its newest
    completed attempt the newest of `newest`'s, if given."""
    completed = results.completed
    if newest is not None:
        completed = {**completed, stage: Attempts.of_parts(*newest)}
    return _RESULTS({**results.by_stage, stage: Attempts.of_parts(*parts)}, completed)


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
    """The version of the newest attempt of a list (not made if deferred), or None."""
    if isinstance(newest, RowList) and newest.tip_versions():
        return newest.tip_versions()[-1]
    ranges = [] if newest is None else version_ranges(newest)
    return ranges[-1][1] if ranges else None


_EMPTY: PList[Any] = PList()
# Positional (`maker`), in the fields' declared order: a fold builds results per outcome.
_ATTEMPT = maker(Attempt)
_RESULTS = maker(Results)
_FIELDS = tuple(field.name for field in attrs.fields(Attempt))
_WIDTH = len(_FIELDS)
_new = object.__new__
_NO_NAME: Any = object()
"""A name no event gives: a fold's stage and outcome before its first."""


class Attempts(RowList[Attempt]):
    """A stage's attempts, the newest kept as rows of their fields (`RowList`): a fold pushes
    a row per outcome, and an attempt is made from it when read."""

    __slots__ = ()

    fields = _FIELDS
    version_at = _FIELDS.index("version")
    frozen_at = _FIELDS.index("result")
    make = staticmethod(_ATTEMPT)

    def pushed(self, event: Any, error: str | None, error_type: str | None) -> Attempts:
        """The attempts with `event`'s appended (`error` given: a failure's): the newest row's
        outcome name taken again when it is the event's (a loop's repeats it: no interning),
        the row put at the end of the newest block when this list owns it (`RowList.push_row`)."""
        tip, used = self._tip, self._used
        outcome = event.outcome
        if used and outcome == tip[used - _WIDTH + 1]:
            outcome = tip[used - _WIDTH + 1]
        elif outcome.__class__ is str:
            outcome = intern(outcome)
        row: tuple[Any, ...]
        if event.__class__ is StageCompleted:
            row = (
                event.attempt, outcome, False, event.result, None, None, event.duration,
                event.version,
            )  # fmt: skip
        else:
            row = (
                event.attempt, outcome, True, None, error, error_type, event.duration,
                event.version,
            )  # fmt: skip
        return self.push_row(row)  # type: ignore[return-value]


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

    def _fold(self, events: Iterable[Event], current: Retries, tick: Callable[[], None]) -> Retries:
        """`Projection._fold`, each stretch of outcomes counted into mutable copies of the
        counters (`_Counting`), a `Retries` made once at its end rather than per outcome.
        The same state as `apply` event after event."""
        if not folds_with(self, RetryCounts, StageCompleted, StageFailed):
            return Projection._fold(self, events, current, tick)  # a subclass: its own way
        return folded_in_stretches(self.name, self.apply, _counting, events, current, tick)

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


def _counting(start: Retries) -> _Counting | None:
    """The stretch of outcomes from `start` (None: `apply` takes this outcome, from counters
    `Retries.end` may keep as they are: see `plain`)."""
    if not plain(start, Retries, start.attempt_counts, start.retry_counts):
        return None
    return _Counting(start)


class _Counting:
    """Outcomes counted into mutable copies of a `Retries` (`RetryCounts._fold`), the counters
    made when asked for, as `Retries.end` would have made them one outcome after another."""

    __slots__ = ("attempts", "failed", "open", "retries", "total")

    def __init__(self, start: Retries) -> None:
        self.attempts, self.retries = dict(start.attempt_counts), dict(start.retry_counts)
        self.failed = set(start.last_failed)
        self.open, self.total = start.open_stage, start.total_attempts

    def took(self, event: StageCompleted | StageFailed) -> bool:
        """Count `event` as `RetryCounts.completed` or `failed` would (always taken)."""
        failed = event.__class__ is StageFailed
        if not (failed or event.attempt):  # a routed verdict closes no attempt
            return True
        stage = event.stage
        if self.open == stage:  # its started attempt closed
            self.open = None
        else:  # recorded without a start: an attempt of its own (a retry if the last failed)
            attempts = self.attempts
            attempts[stage] = attempts.get(stage, 0) + 1
            self.total += 1
            if stage in self.failed:
                retries = self.retries
                retries[stage] = retries.get(stage, 0) + 1
        if failed:
            self.failed.add(stage)
        else:
            self.failed.discard(stage)
        return True

    def made(self) -> Retries:
        """The counters after the outcomes counted."""
        return _RETRIES(self.attempts, self.retries, frozenset(self.failed), self.open, self.total)
