"""Failure patterns: failures by stage and error type, streaks, and repeated errors.

Persistent use keeps one state per pipeline, so the patterns span runs. Error
signatures live in hash-trie maps: a failure costs the same however many
distinct errors came before it.

A deleted run's part is taken out as the deletion is folded (`Projection.forget`):
counts subtract, and the streaks and recent failures, which follow the order of
every run's events, are worked out again from a bounded window of the newest
events kept with the runs that made them (`Failures.tracks`, `Failures.tail`).
When the window cannot tell (the run reaches further back than it), the state
says it is no longer `exact` and `Engine.compact` folds it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

import attrs

from events import JSON, Event, StageCompleted, StageFailed
from events.values import maker
from projections.base import Projection, folds_with, on
from projections.immutable import PMap
from projections.stretches import folded_in_stretches, plain

Signature = tuple[str, str, str]
"""A failure's identity: (stage, error_type, error)."""

RECENT = 5
"""How many of the newest failures `Failures.recent` keeps."""

TAIL = 4 * RECENT
"""How many of the newest failures, with their runs, a state keeps to forget a run."""

DEPTH = 8
"""How many of a stage's newest completions, with the failures after each, a state keeps."""

SPREAD = 32
"""Beyond this many failing runs between two completions, only their number is kept."""


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Segment:
    """A stage's failures from one completion (or the first failure) to the next completion."""

    completed_by: str | None
    """The run whose completion opens the segment; None: it opens at the first failure."""
    fails: Mapping[str, int] | None
    """Failures in the segment by run (hex id); None once more than `SPREAD` runs failed."""
    total: int

    def failed(self, run: str) -> Segment:
        """The segment with one more failure of `run`."""
        fails = self.fails
        if fails is None or (run not in fails and len(fails) >= SPREAD):
            return _SEGMENT(self.completed_by, None, self.total + 1)
        return _SEGMENT(self.completed_by, {**fails, run: fails.get(run, 0) + 1}, self.total + 1)

    def without(self, run: str, unlisted: int) -> Segment:
        """The segment without `run`'s failures (`unlisted` of them where not by run)."""
        if self.fails is None:
            return Segment(self.completed_by, None, self.total - unlisted)
        fails = {r: n for r, n in self.fails.items() if r != run}
        return Segment(self.completed_by, fails, self.total - self.fails.get(run, 0))

    def joined(self, later: Segment) -> Segment:
        """This segment and `later` as one, the completion between them gone."""
        fails = None
        if self.fails is not None and later.fails is not None:
            fails = dict(self.fails)
            for run, count in later.fails.items():
                fails[run] = fails.get(run, 0) + count
            fails = fails if len(fails) <= SPREAD else None
        return Segment(self.completed_by, fails, self.total + later.total)


Track = tuple[Segment, ...]
"""A stage's newest segments, oldest first; the last one's total is the stage's streak."""


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Failures:
    """How often, where and how stages failed.

    Equality and repr cover the patterns and `exact`, nothing else. `exact` takes part:
    compaction and tests compare a state that forgot runs with a rebuild, which is always
    exact, so an equal state is one that also knows its streaks and recent failures are
    right (an inexact one may match a rebuild's numbers by chance, yet compact folds it
    again). `tracks`, `cut` and `tail` are bookkeeping for forgetting a run; they take no
    part in equality (after a run is forgotten they reach less far back than a fold) nor
    in the repr, so two states whose reprs read the same are equal.
    """

    by_stage: Mapping[str, int] = attrs.field(factory=dict)
    by_error_type: Mapping[str, int] = attrs.field(factory=dict)
    streaks: Mapping[str, int] = attrs.field(factory=dict)
    signatures: PMap[Signature, int] = attrs.field(factory=PMap)
    repeats: PMap[Signature, int] = attrs.field(factory=PMap)
    total: int = 0
    recent: tuple[Signature, ...] = ()
    """The newest failures (at most `RECENT`), newest last."""
    exact: bool = True
    """False once forgetting a run needed more history than the state keeps."""
    tracks: Mapping[str, Track] = attrs.field(factory=dict, eq=False, repr=False)
    cut: frozenset[str] = attrs.field(default=frozenset(), eq=False, repr=False)
    """The stages whose track lost its oldest segments."""
    tail: tuple[tuple[str, Signature], ...] = attrs.field(default=(), eq=False, repr=False)
    """The newest failures (at most `TAIL`) with their runs, newest last."""

    def consecutive(self, stage: str) -> int:
        """The failures of `stage` since its last completion."""
        return self.streaks.get(stage, 0)

    @property
    def repeated_signatures(self) -> dict[Signature, int]:
        """Each (stage, error_type, error) seen more than once → how often it was seen."""
        return dict(self.repeats)

    def last(self, stage: str) -> tuple[str, str] | None:
        """The (error_type, error) of the newest failure of `stage` among the recent ones."""
        for failed_stage, error_type, error in reversed(self.recent):
            if failed_stage == stage:
                return error_type, error
        return None

    def count(self, stage: str, error_type: str, error: str) -> int:
        """How often this exact failure was seen."""
        return self.signatures.get((stage, error_type, error), 0)

    def failed(self, signature: Signature, run: str = "") -> Failures:
        """The patterns after one more failure with `signature` (of the run `run`)."""
        stage, error_type, _ = signature
        seen = self.signatures.get(signature, 0) + 1
        track = self.tracks.get(stage) or (Segment(None, {}, 0),)
        return _FAILURES(  # by position (`maker`): no __init__ on every failure of a fold
            _bump(self.by_stage, stage),
            _bump(self.by_error_type, error_type),
            _bump(self.streaks, stage),
            self.signatures.set(signature, seen),
            self.repeats.set(signature, seen) if seen > 1 else self.repeats,
            self.total + 1,
            (*self.recent[1 - RECENT :], signature),
            self.exact,
            {**self.tracks, stage: (*track[:-1], track[-1].failed(run))},
            self.cut,
            (*self.tail[1 - TAIL :], (run, signature)),
        )

    def completed(self, stage: str, run: str = "") -> Failures:
        """The patterns after `run` completed an attempt of `stage` (ending its streak)."""
        track = self.tracks.get(stage)
        if track is None:  # the stage never failed: nothing follows its completions
            return self
        newest = track[-1]
        if newest.total == 0 and newest.completed_by == run:
            # the same run completing again with no failure between: forgetting any run
            # tells the two completions apart no more than one (a long loop's common case)
            return self
        track = (*track, _SEGMENT(run, {}, 0))
        cut = self.cut
        if len(track) > DEPTH:
            track, cut = track[1:], cut | {stage}
        return _FAILURES(  # by position (`maker`): not __init__, nor attrs.evolve
            self.by_stage,
            self.by_error_type,
            {**self.streaks, stage: 0} if self.streaks.get(stage) else self.streaks,
            self.signatures,
            self.repeats,
            self.total,
            self.recent,
            self.exact,
            {**self.tracks, stage: track},
            cut,
            self.tail,
        )

    def without(self, run: str, gone: Failures) -> Failures:
        """The patterns without `run`'s part; `gone` is its events folded alone."""
        by_stage = _subtract(self.by_stage, gone.by_stage)
        tracks, exact = {}, self.exact
        for stage, track in self.tracks.items():
            if stage not in by_stage:
                continue
            kept = _track_without(track, run, gone.by_stage.get(stage, 0), stage in self.cut)
            exact = exact and kept is not None
            tracks[stage] = kept or track
        total = self.total - gone.total
        tail = tuple(entry for entry in self.tail if entry[0] != run)
        exact = exact and (len(tail) >= RECENT or len(tail) == total)
        signatures, repeats = self.signatures, self.repeats
        for signature, seen in gone.signatures.items():
            left = signatures.get(signature, 0) - seen
            signatures = signatures.set(signature, left) if left else signatures.delete(signature)
            repeats = repeats.set(signature, left) if left > 1 else _drop(repeats, signature)
        return Failures(
            by_stage=by_stage,
            by_error_type=_subtract(self.by_error_type, gone.by_error_type),
            streaks={stage: tracks[stage][-1].total for stage in by_stage},
            signatures=signatures,
            repeats=repeats,
            total=total,
            recent=tuple(signature for _, signature in tail[-RECENT:]),
            exact=exact,
            tracks=tracks,
            cut=self.cut & set(by_stage),
            tail=tail,
        )


_FAILURES = maker(Failures)
_SEGMENT = maker(Segment)


def _bump(counts: Mapping[str, int], key: str) -> dict[str, int]:
    return {**counts, key: counts.get(key, 0) + 1}


def _subtract(counts: Mapping[str, int], gone: Mapping[str, int]) -> dict[str, int]:
    left = {key: count - gone.get(key, 0) for key, count in counts.items()}
    return {key: count for key, count in left.items() if count > 0}


def _drop(counts: PMap[Signature, int], key: Signature) -> PMap[Signature, int]:
    return counts.delete(key) if key in counts else counts


def _track_without(track: Track, run: str, failures: int, cut: bool) -> Track | None:
    """`track` without `run`'s failures (`failures` in all) and completions; None: unknown.

    A failure not listed by run lies in the one segment that keeps only a number
    (when the track reaches the stage's first failure), or before the track (when
    it was cut: behind a completion, so it made no streak); anything else is unknown.
    """
    unlisted = failures - sum((s.fails or {}).get(run, 0) for s in track)
    numbers = [index for index, segment in enumerate(track) if segment.fails is None]
    hidden = -1
    if unlisted:
        if not cut and len(numbers) == 1:
            hidden = numbers[0]
        elif not (cut and not numbers):
            return None
    kept: list[Segment] = []
    for index, segment in enumerate(track):
        segment = segment.without(run, unlisted if index == hidden else 0)
        if segment.completed_by != run:
            kept.append(segment)
        elif kept:  # its completion never happened: the failures after it continue the one before
            kept[-1] = kept[-1].joined(segment)
        # else: the oldest kept completion of a cut track; its failures join the unknown before
    return tuple(kept) or None


class FailurePatterns(Projection[Failures]):
    """Failures by stage and error type, streaks per stage, repeated signatures."""

    scope = "pipeline"
    version = 2  # runs and windows kept for forgetting a deleted run

    def initial(self) -> Failures:
        """No failures yet."""
        return Failures()

    @on(StageFailed)
    def failed(self, state: Failures, event: StageFailed) -> Failures:
        """Count the failure everywhere it belongs."""
        return state.failed((event.stage, event.error_type, event.error), _hex(event.run_id))

    @on(StageCompleted)
    def completed(self, state: Failures, event: StageCompleted) -> Failures:
        """End the stage's streak of failures (a routed verdict does not: the stage did not run)."""
        if not event.attempt:
            return state
        track = state.tracks.get(event.stage)
        if track is None:  # never failed: no streak
            return state
        run, newest = _hex(event.run_id), track[-1]
        if newest.total == 0 and newest.completed_by == run:  # `Failures.completed`'s own test,
            return state  # inline: a long loop's run completing again and again
        return state.completed(event.stage, run)

    def _fold(
        self, events: Iterable[Event], current: Failures, tick: Callable[[], None]
    ) -> Failures:
        """`Projection._fold`, each stretch of outcomes counted into mutable copies of the
        patterns (`_Stretch`), a `Failures` made once at its end rather than per failure.
        The same state as `apply` event after event (its bookkeeping too)."""
        if not folds_with(self, FailurePatterns, StageCompleted, StageFailed):
            return Projection._fold(self, events, current, tick)  # a subclass: its own way
        return folded_in_stretches(self.name, self.apply, _stretch, events, current, tick)

    def forget_run(self, state: Failures, run_id: UUID, events: Sequence[Event]) -> Failures:
        """`state` without the deleted run's failures and completions (see `Failures.without`)."""
        return state.without(run_id.hex, self.fold(events))

    def exact(self, state: Failures) -> bool:
        """Whether forgetting runs left the state as a fold of the kept events makes it."""
        return state.exact

    def encode(self, state: Failures) -> JSON:
        """The counters as JSON; signatures as `[stage, error_type, error, count]` rows."""
        return {
            "by_stage": dict(state.by_stage),
            "by_error_type": dict(state.by_error_type),
            "streaks": dict(state.streaks),
            "signatures": [[*signature, seen] for signature, seen in state.signatures.items()],
            "total": state.total,
            "recent": [list(signature) for signature in state.recent],
            "exact": state.exact,
            "tracks": {stage: _encode_track(track) for stage, track in state.tracks.items()},
            "cut": sorted(state.cut),
            "tail": [[run, *signature] for run, signature in state.tail],
        }

    def decode(self, data: JSON) -> Failures:
        """The patterns `encode` turned into `data`."""
        counts = {(stage, kind, error): seen for stage, kind, error, seen in data["signatures"]}
        return Failures(
            by_stage=data["by_stage"],
            by_error_type=data["by_error_type"],
            streaks=data["streaks"],
            signatures=PMap(counts),
            repeats=PMap({key: seen for key, seen in counts.items() if seen > 1}),
            total=data["total"],
            recent=tuple((stage, kind, error) for stage, kind, error in data["recent"]),
            exact=data["exact"],
            tracks={stage: _decode_track(rows) for stage, rows in data["tracks"].items()},
            cut=frozenset(data["cut"]),
            tail=tuple((run, (stage, kind, error)) for run, stage, kind, error in data["tail"]),
        )


def _stretch(start: Failures) -> _Stretch | None:
    """The stretch of outcomes from `start` (None: `apply` takes this outcome, from patterns
    it may keep as they are: see `plain`)."""
    if not plain(start, Failures, start.by_stage, start.by_error_type, start.streaks, start.tracks):
        return None
    return _Stretch(start)


class _Stretch:
    """Outcomes counted into mutable copies of a `Failures` (`FailurePatterns._fold`): each
    stage's newest segment kept open as ``[completed_by, fails, total]``, its ``fails`` this
    stretch's own copy; the patterns made when asked for, as `Failures.failed` and
    `Failures.completed` would have made them one outcome after another."""

    __slots__ = (
        "by_error_type", "by_stage", "cut", "open", "recent", "repeats", "runs", "signatures",
        "start", "streaks", "tail", "total", "tracks",
    )  # fmt: skip

    def __init__(self, start: Failures) -> None:
        self.start, self.total = start, start.total
        self.by_stage, self.by_error_type = dict(start.by_stage), dict(start.by_error_type)
        self.streaks, self.cut = dict(start.streaks), set(start.cut)
        self.signatures, self.repeats = start.signatures.mutate(), start.repeats.mutate()
        self.recent, self.tail = list(start.recent), list(start.tail)
        self.tracks: dict[str, list[Any]] = {}
        """Each stage's track touched: its segments as made, the newest of them open."""
        self.open: set[str] = set()
        """The stages whose newest segment is an open ``[completed_by, fails, total]``."""
        self.runs: tuple[UUID | None, str] = (None, "")

    def took(self, event: StageCompleted | StageFailed) -> bool:
        """Count `event` as `FailurePatterns.failed` or `completed` would (always taken)."""
        run_id = event.run_id
        runs = self.runs
        run = runs[1] if runs[0] is run_id else self._run(run_id)
        if event.__class__ is StageFailed:
            self._failed(event.stage, event.error_type, event.error, run)
        elif event.attempt:
            stage = event.stage
            track = self.tracks.get(stage)
            if track is not None and stage not in self.open:  # `_completed`'s test, inline:
                newest = track[-1]  # a long loop's run completing again and again
                if newest.total == 0 and newest.completed_by == run:
                    return True
            self._completed(stage, run)
        return True

    def _run(self, run_id: UUID) -> str:
        run = _hex(run_id)
        self.runs = (run_id, run)
        return run

    def _track(self, stage: str) -> list[Any] | None:
        """The stage's track as this stretch grows it (None: the stage never failed)."""
        track = self.tracks.get(stage)
        if track is None:
            kept = self.start.tracks.get(stage)
            if not kept:
                return None
            track = self.tracks[stage] = list(kept)
        return track

    def _failed(self, stage: str, error_type: str, error: str, run: str) -> None:
        signature = (stage, error_type, error)
        seen = self.signatures.get(signature, 0) + 1
        by_stage, by_error_type, streaks = self.by_stage, self.by_error_type, self.streaks
        by_stage[stage] = by_stage.get(stage, 0) + 1
        by_error_type[error_type] = by_error_type.get(error_type, 0) + 1
        streaks[stage] = streaks.get(stage, 0) + 1
        self.signatures[signature] = seen
        if seen > 1:
            self.repeats[signature] = seen
        self.total += 1
        recent, tail = self.recent, self.tail
        recent.append(signature)
        tail.append((run, signature))
        if len(tail) > 2 * TAIL:  # bounded as the fold goes: the newest are all that is kept
            del recent[:-RECENT], tail[:-TAIL]
        track = self._track(stage)
        if track is None:
            track = self.tracks[stage] = [Segment(None, {}, 0)]
        newest = track[-1]
        if stage not in self.open:
            fails = newest.fails
            newest = track[-1] = [
                newest.completed_by,
                None if fails is None else dict(fails),
                newest.total,
            ]
            self.open.add(stage)
        fails = newest[1]
        if fails is not None and (run in fails or len(fails) < SPREAD):
            fails[run] = fails.get(run, 0) + 1
        else:
            newest[1] = None
        newest[2] += 1

    def _completed(self, stage: str, run: str) -> None:
        track = self._track(stage)
        if track is None:  # never failed: no streak
            return
        newest = track[-1]
        if stage in self.open:
            if newest[2] == 0 and newest[0] == run:  # the same run completing again
                return
            track[-1] = _SEGMENT(newest[0], newest[1], newest[2])
            self.open.discard(stage)
        elif newest.total == 0 and newest.completed_by == run:
            return
        track.append(_SEGMENT(run, {}, 0))
        if len(track) > DEPTH:
            del track[0]
            self.cut.add(stage)
        if self.streaks.get(stage):
            self.streaks[stage] = 0

    def made(self) -> Failures:
        """The patterns after the outcomes counted."""
        start, tracks = self.start, dict(self.start.tracks)
        for stage, track in self.tracks.items():
            if stage in self.open:
                newest = track[-1]
                track = [*track[:-1], _SEGMENT(newest[0], newest[1], newest[2])]
            tracks[stage] = tuple(track)
        return _FAILURES(
            self.by_stage, self.by_error_type, self.streaks, self.signatures.finish(),
            self.repeats.finish(), self.total, tuple(self.recent[-RECENT:]), start.exact,
            tracks, frozenset(self.cut), tuple(self.tail[-TAIL:]),
        )  # fmt: skip


_last_hex: tuple[UUID | None, str] = (None, "")
"""The run id `_hex` wrote last, and its hex: a fold asks for one run's, event after event."""


def _hex(run_id: UUID) -> str:
    """`run_id.hex` (a property that formats the id anew at each call)."""
    global _last_hex
    last = _last_hex  # one read of a tuple swapped whole: no lock needed between threads
    if last[0] is run_id:
        return last[1]
    text = run_id.hex
    _last_hex = (run_id, text)
    return text


def _encode_track(track: Track) -> JSON:
    return [[s.completed_by, None if s.fails is None else dict(s.fails), s.total] for s in track]


def _decode_track(rows: Iterable[list[JSON]]) -> Track:
    return tuple(Segment(by, fails, total) for by, fails, total in rows)
