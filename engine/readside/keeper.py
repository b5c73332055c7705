"""Snapshots of a long run taken by its writer, as the run grows.

Without them the first question about a long run in a new process (its state at some
version, `Engine.load`) folds the whole run. A `SnapshotKeeper` follows one run
handle's commits: each time a commit crosses a multiple of `KEEP_INTERVAL`, it
stores a snapshot of the machine (the writer's own state: no fold at all) and of
each kept projection (`kept_projections`). `StateStack`'s is made from its shape
(`projections.stack.StackShape`: the versions of its frames, followed from the run's
start by a push or pop per outcome or rollback, checked against the machine's depth
at each commit; no frame made, no event read). Another kept projection (`RunIndex`,
the run's summary every `show` and `replay` reads) is fed the events each commit
wrote, from the first crossing on, through a folding held (`projections.folding`:
the summary's keeps its stretch of outcomes open, so a loop's summary is made only
at a crossing, its new states counted there, not made into cells); at that crossing
a handle that began the run folds it from the events it wrote since (held until
then: the commits' lists, not folded), its snapshot stored at the multiple of the
interval, then fed on from the state the snapshot restores (kept half as often once
its snapshot outgrows `KEPT_BYTES_PER_EVENT`). The run is read back and
folded only where nothing is held: at the first crossing of a handle that did not
begin the run, and at one after another writer's events came between, a projection
is folded from its nearest stored snapshot (at most twice the interval back, else
not kept then); at the first crossing after runs were erased from the store, the
machine is folded so too and must equal the writer's state, else this keeper keeps
nothing more (the events held are dropped then). Short runs cost a push per outcome,
one comparison and one append per commit. Snapshots go through `TimeTravel`: sealed
by the store's codec, keyed by an erasure generation the writer's state is known to
hold in (the one it was read in, or a later one it was checked against: never one
merely read later, as the run may have been erased meanwhile). A unit committing
through an event loop (`commit_async`) hears of its commit on the loop's thread, so
there the crossing's small write runs on it too: one per `KEEP_INTERVAL` events.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from engine.machine import MachineFold, RunState
from engine.pipeline import Pipeline
from engine.readside.snapshots import SNAPSHOT_INTERVAL, EventReader, TimeTravel
from events import JSON, Event, RunStarted
from projections import Folding, Projection, folding

if TYPE_CHECKING:
    from projections.stack import StackShape

KEEP_INTERVAL = 10 * SNAPSHOT_INTERVAL
"""Events between two snapshots a writer stores (a reader then folds at most this many).

Each costs the writer one more small transaction: at 5,000 events, one per 50
commits of 100 events, while a fresh reader folds at most ~20 ms of events."""

KEPT_BYTES_PER_EVENT = 16
"""Sealed bytes a kept projection's snapshot may take per event of its interval.

A larger one is not stored, and that projection is kept half as often from then on
(twice the events, twice the bytes): the summary of a run whose states alternate packs
a run of states per outcome, and stored at every interval it would fill the store with
the square of the run's length. A loop's summary takes about a kilobyte."""


def kept_projections() -> list[Projection[Any]]:
    """The projections a writer keeps snapshots of, beside the machine (`Engine.load`).

    Imported when a run first crosses an interval, not with the engine: a command
    that only lists runs never loads a stack's code.
    """
    from projections import RunIndex, StateStack

    return [StateStack(), RunIndex()]


_log = logging.getLogger(__name__)


class SnapshotKeeper:
    """Stores time travel's snapshots of one run as its writer commits it.

    Args:
        travel: the engine's time travel (its store, codec and memory of snapshots).
        reader: the store, for its erasure generation.
        pipeline: the run's pipeline (the machine snapshot's table).
        generation: an erasure generation the store had before the writer's state
            was read (an older one only costs a check at the first crossing).
        interval: events between two snapshots (default `KEEP_INTERVAL`).
        begun: the run's stored events when the handle holds them all (it began the run):
            the stack's shape is followed from them, so no crossing reads the run back.
    """

    def __init__(
        self,
        travel: TimeTravel,
        reader: EventReader,
        pipeline: Pipeline,
        *,
        generation: int,
        interval: int | None = None,
        begun: Sequence[Event] = (),
    ) -> None:
        self._travel, self._reader, self._pipeline = travel, reader, pipeline
        self.interval = KEEP_INTERVAL if interval is None else interval
        self._generation: int | None = generation
        """Where the writer's state is known to agree with the store; None: keep no more."""
        self._projections: list[Projection[Any]] = []  # made at the first crossing
        self._shape: StackShape | None = None
        """StateStack's shape, while this writer followed every event of the run since it."""
        if begun:
            try:
                self._follow(begun, None)
            except Exception as error:  # the run is stored: only the speed-up is lost
                _log.warning("run %s's stack not followed: %s", begun[0].run_id, error)
                self._shape = None
        self._every: dict[str, int] = {}
        """Per projection kept less often than `interval` (`KEPT_BYTES_PER_EVENT`): its own."""
        self._held: dict[str, tuple[int, int, Folding[Any]]] = {}
        """Per projection: the generation and version of its state held, and its folding."""
        self._written: list[Sequence[Event]] | None = [begun] if begun else None
        """The events written since the run began (this handle began it), held until its
        first crossing folds the kept projections from them; None: not all of them."""

    def committed(self, events: Sequence[Event], state: RunState) -> RunState | None:
        """Follow what was written (the stack's shape, other kept projections' states held);
        store snapshots at a crossing.

        Returns, at a crossing, the machine state as its snapshot restores it, for the
        writer to hold: its stack's older part is then made only when walked, so the
        next snapshot writes only what changed since (never a walk of the whole stack).
        """
        if not events:
            return None
        first, last = events[0].version, state.version
        crossed = last // self.interval != (first - 1) // self.interval
        at = last - last % self.interval if crossed else None
        try:
            stack = self._follow(events, state, at)
            written = self._written
            if written is not None:  # before the first crossing: one append per commit
                if written[-1][-1].version == first - 1:
                    written.append(events)
                else:  # another writer's events came between
                    self._written = None
            if crossed:
                assert at is not None
                return self._keep(state, stack, at, events)
            if self._held:  # nothing is held before the first crossing: short runs skip this
                for projection in self._projections:
                    self._advance(projection, events, first)
            return None
        except Exception as error:  # the events are stored: only the speed-up is lost
            _log.warning("snapshots of run %s not kept: %s", state.run_id, error)
            self._held.clear()
            self._shape = None
            self._written = None
            return None

    def _follow(
        self, events: Sequence[Event], state: RunState | None, at: int | None = None
    ) -> JSON:
        """Follow the stack's shape over `events` (from the run's start: a handle that began
        it), checked against the machine's `state` after them when given.

        Returns StateStack's snapshot after event `at` if it is among `events` (a crossing's
        multiple of the interval: a reader then folds at most an interval), else None.
        """
        shape = self._shape
        if shape is None:
            start = events[0]
            if not isinstance(start, RunStarted) or self._generation is None:
                return None  # a run begun elsewhere: its first crossing reads the stack's
            from projections.stack import StackShape

            shape = self._shape = StackShape.started(start)
            events = events[1:]
        snapshot = None
        if events and at is not None and events[0].version <= at <= events[-1].version:
            split = at - events[0].version + 1
            shape.advance(events[:split])
            snapshot, events = shape.snapshot(), events[split:]
        if events:
            shape.advance(events)
        if not shape.known or (state is not None and shape.depth != state.depth):
            self._shape = None  # another writer's events came between
            return None
        return snapshot

    def _advance(self, projection: Projection[Any], events: Sequence[Event], first: int) -> None:
        held = self._held.get(projection.name)
        if held is None:
            return  # nothing held yet: the next crossing folds from a stored snapshot
        if held[1] != first - 1:  # another writer's events came between
            del self._held[projection.name]
            return
        held[2].feed(events)
        self._held[projection.name] = (held[0], events[-1].version, held[2])

    def _keep(
        self, machine: RunState, stack: JSON, at: int, events: Sequence[Event]
    ) -> RunState | None:
        travel, run_id, version = self._travel, machine.run_id, machine.version
        generation = self._reader.generation()
        if generation != self._generation and not self._agrees(machine, generation):
            self._written = None
            return None
        if not self._projections:
            self._projections = kept_projections()
        from projections.stack import StateStack

        for projection in self._projections:
            if type(projection) is StateStack:  # made from the stack's shape, not a fold
                self._keep_stack(run_id, projection, version, generation, at, stack)
            else:
                self._keep_one(run_id, projection, events, at, generation)
        self._written = None  # held states (or stored snapshots) serve from here on
        kept = travel.keep(run_id, MachineFold(), version, (self._pipeline, machine), generation)
        return None if kept is None else kept[1]

    def _agrees(self, machine: RunState, generation: int) -> bool:
        """Whether the store, read in `generation`, holds the run the writer's state is of.

        Runs were erased since the writer's state was read: the run itself may have
        been, and its state must then never be kept under the new generation. The
        run folded from the store (from a snapshot near enough, else nothing) must
        equal the writer's state; if not, this keeper keeps nothing any more.
        """
        self._held.clear()  # states of the old generation
        self._shape = None
        self._written = None
        self._generation = None
        folded = self._travel.reach(
            machine.run_id, MachineFold(), machine.version, generation, 2 * self.interval
        )
        if folded is None or folded[1] != machine:
            _log.info(
                "run %s: runs were erased since its writer read it; no snapshot kept",
                machine.run_id,
            )
            return False
        self._generation = generation
        return True

    def _keep_stack(
        self,
        run_id: UUID,
        projection: Projection[Any],
        version: int,
        generation: int,
        at: int | None,
        snapshot: JSON,
    ) -> None:
        """Store the `snapshot` after event `at` the stack's shape made; with none, fold the
        stack from a stored snapshot and follow its shape from there."""
        if at is not None and snapshot is not None and self._shape is not None:
            self._travel.keep_snapshot(run_id, projection, at, snapshot, generation)
            return
        self._shape = None
        state = self._travel.reach(run_id, projection, version, generation, 2 * self.interval)
        if state is not None:
            from projections.stack import StackShape

            self._shape = StackShape.of(state, version)

    def _keep_one(
        self,
        run_id: UUID,
        projection: Projection[Any],
        events: Sequence[Event],
        at: int,
        generation: int,
    ) -> None:
        """Store the projection's state after event `at` (among the commit's `events`) if
        due, and hold its state after them: fed on from the state held, else folded from
        the events written since the run began, else from the nearest stored snapshot."""
        name, split = projection.name, at - events[0].version + 1
        every = self._every.get(name, self.interval)
        held = self._held.pop(name, None)
        fed = held[2] if held and held[0] == generation and held[1] == at - split else None
        if at % every:  # not due: its snapshots outgrew `KEPT_BYTES_PER_EVENT`
            if fed is not None:
                fed.feed(events)
                self._held[name] = (generation, events[-1].version, fed)
            return
        if fed is not None:
            fed.feed(events[:split])
            state = fed.state()
        elif self._written is not None:  # this handle began the run: no event read back
            state = projection.fold(itertools.islice(itertools.chain(*self._written), at))
        else:  # the first crossing of a handle that did not begin the run, or after a gap
            state = self._travel.reach(run_id, projection, at, generation, 2 * self.interval)
            if state is None:
                return
        most = KEPT_BYTES_PER_EVENT * every
        restored = self._travel.keep(run_id, projection, at, state, generation, most=most)
        if restored is None:  # larger than the events it stands for allow: half as often
            self._every[name] = 2 * every
        kept = folding(projection, restored) if restored is not None else fed
        kept = kept if kept is not None else folding(projection, state)
        if split < len(events):
            kept.feed(events[split:])
        self._held[name] = (generation, events[-1].version, kept)
