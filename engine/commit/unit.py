"""The unit of work: what one run handle has recorded and not yet written, and its one writer.

Every recording method of `Run` checks its event with the rules fold and hands
it here, serialized. Outside any grouping the unit commits it at once, so a
hand-recording caller has it durable before the method returns. A grouping
(`run.batch()` for a caller, a supervisor's drive between two calls of the
caller's code) keeps events pending until its commit point: `commit()` on the
caller's thread, or `commit_async()` through a `GroupCommitter`, so an event
loop never waits on a disk. Nothing else writes a run's events, and nothing
reads them back to see them: the unit's state and its observers (the
supervisor's fold of the run) see each event as it is recorded, and are told
when events are taken back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from engine.commit.group import GroupCommitter, shared
from engine.machine import RunState
from engine.store import Store
from events import Event, utc_now

if TYPE_CHECKING:
    import asyncio


class Observer(Protocol):
    """What follows a run's recorded events (the supervisor's fold of the run)."""

    def recorded(self, event: Event) -> None:
        """`event` was recorded (pending or written): the next version of the run."""

    def rewound(self, version: int) -> None:
        """The events after `version` were taken back: a batch raised, or a commit failed."""


class Follower(Protocol):
    """What follows a run's committed events (the writer's snapshots of a long run)."""

    def committed(self, events: Sequence[Event], state: RunState) -> RunState | None:
        """`events` were written, the run's newest; `state` is the machine state after them.

        Returns an equal state for the unit to hold instead (one whose older part is
        made from a snapshot only when walked), or None. It must not raise: the events
        are stored whatever it does.
        """


class Mark:
    """Where a grouping began: the run's state and chain link then, and how much was pending."""

    __slots__ = ("link", "pending", "state")

    def __init__(self, state: RunState, pending: int, link: bytes | None) -> None:
        self.state, self.pending, self.link = state, pending, link


class UnitOfWork:
    """One run handle's state, its pending events and how they are committed.

    Attributes:
        state: the run's machine state with every recorded event folded in.
        stored: the state the store holds, as far as this handle wrote it.
        pending: the recorded events not written yet, serialized.
        events: the same events as recorded (observers refold from them).
        groups: open groupings; while any is open, events wait for a commit point.
        batches: open `run.batch()` blocks among them (a supervisor refuses to run inside one).
        clock: what stamps each event (a supervisor's clock while it drives the run).
        observers: told of every event recorded and every one taken back.
        followers: told of the events of every commit, once written.
        link: the chain link of the newest event recorded (None: not known yet, read
            from the store before the next event is sealed).
        stored_link: the same for the newest event the store holds, as far as known.
        stored_head: the stored bytes of that event, as far as known (None: not known): each
            append requires the store to hold these very bytes before it, so a handle of
            a run erased since never appends to a new run under the same id.
    """

    __slots__ = (
        "_committing",
        "_stampings",
        "batches",
        "begun",
        "clock",
        "events",
        "followers",
        "groups",
        "link",
        "observers",
        "pending",
        "state",
        "store",
        "stored",
        "stored_head",
        "stored_link",
        "unwritten",
    )

    def __init__(self, store: Store, state: RunState) -> None:
        self.store = store
        self.state = state
        self.stored = state
        self.pending: list[StoredEvent] = []
        self.events: list[Event] = []
        self.groups = 0
        self.batches = 0
        self.clock: Callable[[], datetime] = utc_now
        self.observers: list[Observer] = []
        self.followers: list[Follower] = []
        self._stampings = 0
        self._committing: asyncio.Future[None] | None = None
        self.link: bytes | None = None
        self.stored_link: bytes | None = None
        self.stored_head: bytes | None = None
        self.begun: tuple[Event, ...] = ()
        """The events this handle began the run with (`Engine.start_run`, a short fork)."""
        self.unwritten: tuple[list[StoredEvent], list[Event]] | None = None
        """The run's first events while they wait for its first commit (see `defer`)."""

    def defer(self, stored: Sequence[StoredEvent], events: Sequence[Event]) -> None:
        """Keep the run's first events pending: its first commit writes them with what follows.

        Until a commit writes them they stay pending, also when a commit fails, so no
        later event is ever written without them; a grouping that raised leaves them
        pending, unwritten (bad input writes nothing, not a run without its events).
        """
        self.unwritten = (list(stored), list(events))
        self.pending[:0], self.events[:0] = stored, events

    def stored_history(self) -> list[Event] | None:
        """The run's stored events when this handle holds them all, else None (read them).

        True of a handle that began the run and has committed nothing since: what a
        supervisor asked to drive a run it was just given needs no read. A deferred
        start is not stored yet: none (its events are pending, in `events`).
        """
        if self.unwritten is not None:
            return []
        begun = self.begun
        if begun and begun[-1].version == self.stored.version:
            return list(begun)
        return None

    def seal(self, event: Event) -> StoredEvent:
        """`event` serialized, chained to the event recorded before it (the next version).

        Raises:
            InvalidPayload: the event cannot be stored; the chain is as it was.
        """
        stored, self.link = self.store.chained(event, self.link)
        return stored

    def add(self, event: Event, state: RunState, stored: StoredEvent) -> None:
        """Take in one checked event: pending, observed, and committed unless grouped.

        Raises:
            ConcurrencyConflict, StoreError: ungrouped, the write failed; nothing of it
                is kept.
        """
        self.pending.append(stored)
        self.events.append(event)
        self.state = state
        for observer in self.observers:
            observer.recorded(event)
        if not self.groups and self._committing is None:
            self.commit()

    def commit(self) -> None:
        """Write what is pending in one transaction (nothing pending: nothing written).

        Raises:
            ConcurrencyConflict, StoreError: nothing was written; the run is back in the
                state the store holds.
        """
        pending = self.pending
        if not pending:
            return
        try:
            self.store.write(pending, known=self.known())
        except BaseException:
            self._lost()
            raise
        self._kept(len(pending), self.state, self.link)

    def known(self) -> dict[UUID, bytes] | None:
        """The stored bytes of the run's event before what is pending, where known."""
        head = self.stored_head
        return None if head is None else {self.state.run_id: head}

    async def commit_async(self, committer: GroupCommitter | None = None) -> None:
        """`commit` off the event loop, through `committer` (default: the loop's shared one).

        What several runs commit at about the same moment may share one transaction.
        One commit of a unit at a time: a second waits for the first to end.

        Raises:
            ConcurrencyConflict, StoreError: nothing was written; the run is back in the
                state the store holds.
            asyncio.CancelledError: cancelled. Before its write began, what is pending
                stays pending (the grouping's end decides); during the write, the unit
                takes in the write's outcome first.
        """
        import asyncio  # here, not at the top: the command line starts faster without it

        while self._committing is not None:
            await asyncio.wait([self._committing])  # its outcome is its committer's to handle
        if not self.pending:
            return
        batch, reached, link = list(self.pending), self.state, self.link
        writer = committer if committer is not None else shared(self.store)
        commit = writer.submit(batch, known=self.known())
        self._committing = commit.done
        try:
            await writer.wait(commit)
        except BaseException:
            if not commit.withdrawn:
                self._kept(len(batch), reached, link) if commit.stored else self._lost()
            raise
        finally:
            self._committing = None
        self._kept(len(batch), reached, link)
        if self.pending and not self.groups:  # recorded while the write was under way
            await self.commit_async(committer)

    def begin(self, batch: bool = False) -> Mark:
        """Open a grouping: what is recorded waits for its end (or an outer one's)."""
        self.groups += 1
        self.batches += batch
        return Mark(self.state, len(self.pending), self.link)

    def take_back(self, mark: Mark) -> None:
        """Drop what was recorded since `mark`: the run is back in the state it had there."""
        del self.pending[mark.pending :]
        del self.events[mark.pending :]
        self.state, self.link = mark.state, mark.link
        for observer in self.observers:
            observer.rewound(mark.state.version)

    def end(self, batch: bool = False, failed: bool = False) -> None:
        """Close a grouping; the outermost commits what is pending.

        A grouping that `failed` (raised) never writes a deferred start alone: it
        waits for the run's next commit that has events of its own.

        Raises:
            ConcurrencyConflict, StoreError: as `commit`.
        """
        self.groups -= 1
        self.batches -= batch
        if not self.groups and not (failed and self._start_alone()):
            self.commit()

    async def end_async(self, batch: bool = False, failed: bool = False) -> None:
        """`end` committing through `commit_async`; the grouping stays open while it waits."""
        try:
            if self.groups == 1 and not (failed and self._start_alone()):
                await self.commit_async()
        finally:
            self.groups -= 1
            self.batches -= batch

    def calling(self) -> Calling:
        """The context of the caller's code inside a grouping: pending is written first, and
        what the code records is written at once, as anywhere else."""
        return Calling(self)

    def grouped(self) -> Grouping:
        """A grouping as a ``with`` block: what is recorded in it, also when it raises (each
        event passed its checks: it happened), is committed at its end or a commit point."""
        return Grouping(self)

    def stamped(self, clock: Callable[[], datetime]) -> Stamping:
        """Stamp what is recorded inside the ``with`` block with `clock` (a supervisor's).

        The run's time stays monotonic: a clock behind the newest event stamps that
        event's time.
        """
        return Stamping(self, clock)

    def stamp(self, clock: Callable[[], datetime]) -> None:
        """Begin a `stamped` block: the outermost one's clock stamps while any is open."""
        if self._stampings == 0:
            self.clock = clock
        self._stampings += 1

    def unstamp(self) -> None:
        """End a `stamped` block: the wall clock is back when the last one ends."""
        self._stampings -= 1
        if self._stampings == 0:
            self.clock = utc_now

    def refreshed(self, events: Sequence[Event], state: RunState) -> None:
        """Take in events other writers stored (folded into `state` by the caller)."""
        self.state = self.stored = state
        if events:  # their links are read when the next event is sealed
            self.link = self.stored_link = self.stored_head = None
        for event in events:
            for observer in self.observers:
                observer.recorded(event)

    def _start_alone(self) -> bool:
        """Whether all that is pending is the deferred start (see `defer`)."""
        unwritten = self.unwritten
        return unwritten is not None and len(self.pending) == len(unwritten[0])

    def _kept(self, count: int, reached: RunState, link: bytes | None) -> None:
        """A commit of the first `count` pending events succeeded."""
        self.stored_head = self.pending[count - 1].state
        del self.pending[:count]  # what was recorded meanwhile stays pending
        written = self.events[:count] if self.followers else ()
        del self.events[:count]
        self.stored, self.stored_link = reached, link
        self.unwritten = None
        for follower in self.followers:
            lighter = follower.committed(written, reached)
            if lighter is not None and self.stored is reached:
                self.stored = lighter
                if self.state is reached:  # nothing recorded since the commit began
                    self.state = lighter

    def _lost(self) -> None:
        """A commit failed: nothing pending was written, nor can be (later events follow it)."""
        self.pending.clear()
        self.events.clear()
        self.state, self.link = self.stored, self.stored_link
        if self.unwritten is not None:  # the run's first events: still to be written first
            self.pending[:], self.events[:] = self.unwritten
        for observer in self.observers:
            observer.rewound(self.stored.version)


class Calling:
    """The context of `UnitOfWork.calling` (a class: it wraps every supervised call)."""

    __slots__ = ("_groups", "_work")

    def __init__(self, work: UnitOfWork) -> None:
        self._work, self._groups = work, 0

    def __enter__(self) -> None:
        work = self._work
        work.commit()
        self._groups, work.groups = work.groups, 0

    def __exit__(self, *exc: object) -> None:
        self._work.groups = self._groups


class Stamping:
    """The context of `UnitOfWork.stamped`.

    Overlapping blocks on one unit (two tasks of an async coordinator, threads) share
    the clock of the outermost one, and the wall clock is back only when the last ends.
    """

    __slots__ = ("_clock", "_work")

    def __init__(self, work: UnitOfWork, clock: Callable[[], datetime]) -> None:
        self._work, self._clock = work, clock

    def __enter__(self) -> None:
        self._work.stamp(self._clock)

    def __exit__(self, *exc: object) -> None:
        self._work.unstamp()


class Grouping:
    """The context of `UnitOfWork.grouped` (a class: it wraps every supervised step)."""

    __slots__ = ("_work",)

    def __init__(self, work: UnitOfWork) -> None:
        self._work = work

    def __enter__(self) -> None:
        self._work.begin()

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self._work.end(failed=kind is not None)
