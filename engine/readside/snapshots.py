"""Folding one run into a projection at any version, from the nearest snapshot.

Long runs keep snapshots of each projection every `interval` events, in the
store (for new processes) and in memory (for the next question in this one),
so reaching any point folds at most `interval` events, never the whole run.
Stored snapshots are whole ones, spaced so that they take about as many bytes as
the events they stand for, and between them deltas (`VIEW_GAP`): what changed since
the whole one before, its long texts (a deep stack's packed versions) written as the
part they share with it and what follows.
A snapshot belongs to the projection's code fingerprint: new code, new snapshots.
It also belongs to the store's erasure generation: once any process erased runs,
an id may name a new run, so no snapshot taken before is used again.
Stored snapshots are sealed by the store's codec (its cipher and compression).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Protocol
from uuid import UUID

import attrs

from engine.errors import InvalidArgument, RunErasedWhileRead
from engine.store.views import Views
from events import JSON, Event
from projections import collector, deferred
from projections.base import EventSource, Projection, folding, folds_faster
from projections.collector import collector_paused
from projections.errors import ProjectionStateError
from projections.run_index import forget_runs

SNAPSHOT_INTERVAL = 500
"""Events between two snapshots of a projection over one run (in memory; see `_Storer`)."""

DENSE_KEPT = 10 * SNAPSHOT_INTERVAL
"""Events before the version a fold was asked for within which it keeps in memory the states
of a projection kept closer than `SNAPSHOT_INTERVAL` (`kept_every`); further back, only one
every interval: a long fold keeps a slider's neighbourhood of close states, not one every
`kept_every` events of the whole run (a million-event run's viewer: 10,000 states)."""

BYTES_PER_EVENT = 256
"""Stored snapshot bytes allowed per event they stand for (about an event's own size)."""

VIEW_GAP = 4 * SNAPSHOT_INTERVAL
"""The most events between two stored snapshots of a long run, where a delta fits the byte
budget: whole snapshots spaced further apart (a deep stack's, by `BYTES_PER_EVENT`) get a
delta every `VIEW_GAP` events between them, so a new process folds at most this many.

A delta holds what changed since its whole snapshot (a deep stack: the frames since), so
it is stored only if it takes at most `BYTES_PER_EVENT` per event since the snapshot
before it: the stored bytes stay bounded as the whole snapshots' are, and a state that
shares nothing with its last whole snapshot gets no delta."""

DELTA_TAG = ":delta1"
"""Appended to a projection's identity for its deltas: the whole snapshots' key (and format)
is unchanged, and a new format of deltas takes a new tag, so none is ever misread."""

SHARED_TEXT = 256
"""A text of a snapshot sharing at least this many leading characters with the same text of
its whole snapshot is stored in a delta as the count shared and what follows."""

UNREADABLE_PASSED = 3
"""Stored whole snapshots that cannot be read passed over, newest first, before a fold
starts from the nearest state in memory or the first event instead."""

_UNREADABLE = object()
_log = logging.getLogger(__name__)
_Key = tuple[int, UUID, str, str]
"""Erasure generation, run id, projection name, the projection's identity."""


class EventReader(Protocol):
    """Reads one run's events in version order, and the store's erasure generation."""

    def stream(self, run_id: UUID, *, gt: int = 0, lte: int | None = None) -> Iterator[Any]:
        """The run's events with `gt < version <= lte`, oldest first."""

    def generation(self) -> int:
        """How many times runs were erased from the store (`Store.generation`)."""


class _Snapshots:
    """The snapshots of one (run, projection, code) kept in memory, by version."""

    def __init__(self) -> None:
        self.versions: list[int] = []
        self.states: dict[int, Any] = {}

    def best(self, upto: int) -> tuple[int, Any] | None:
        index = bisect.bisect_right(self.versions, upto)
        if index == 0:
            return None
        version = self.versions[index - 1]
        return version, self.states[version]

    def add(self, version: int, state: Any) -> None:
        if version not in self.states:
            bisect.insort(self.versions, version)
            self.states[version] = state


class TimeTravel:
    """Answers "what did projection P say after event N of run R?" quickly, for any N.

    Args:
        reader: where the run's events come from.
        views: where snapshots are stored (None: memory only).
        interval: events between snapshots.
        runs_in_memory: how many (run, projection) snapshot sets stay in memory.
        seals: whether folds seal snapshots to store (False when `views` store none, as a
            read-only store's: sealing them would be work thrown away).
    """

    def __init__(
        self,
        reader: EventReader,
        views: Views | None,
        *,
        interval: int = SNAPSHOT_INTERVAL,
        runs_in_memory: int = 32,
        seals: bool = True,
    ) -> None:
        self._reader = reader
        self._views = views
        self._seals = seals
        self.interval = interval
        self._limit = runs_in_memory
        self._memory: OrderedDict[_Key, _Snapshots] = OrderedDict()
        self._generation = 0  # of the snapshots in memory
        self._lock = threading.Lock()  # engines may be shared by threads (a viewer, a follower)

    def project(self, run_id: UUID, projection: Projection[Any], version: int) -> Any:
        """The state of `projection` after event `version` of the run.

        Raises:
            ProjectionError: a handler failed (names the event and version).
        """
        identity = projection.identity()
        if version < self.grid(projection):  # no snapshot lies this low: nothing kept is used
            events = list(self._reader.stream(run_id, lte=version))
            _whole(run_id, events[-1].version if events else 0, version)
            return projection.fold(events)
        while True:
            # Read before and after: an erasure in between (by any process) may have
            # given the id to another run while this fold read it, so fold again.
            generation = self._reader.generation()
            self._follow(generation)
            key = (generation, run_id, projection.name, identity)
            state = self._fold(key, projection, version)
            if self._reader.generation() == generation:
                return state

    def grid(self, projection: Projection[Any]) -> int:
        """Events between two states of `projection` kept in memory (`Projection.kept_every`)."""
        every = getattr(projection, "kept_every", 0)
        if every == 0:
            return self.interval
        if type(every) is not int or every < 0 or self.interval % every:
            raise InvalidArgument(
                f"{type(projection).__name__}.kept_every",
                f"must be 0 or an int dividing {self.interval}, got {every!r}",
            )
        return every

    @property
    def generation(self) -> int:
        """The erasure generation of the snapshots in memory: one the store had, never a
        newer one (0 before any was read), so no read is needed to know a lower bound."""
        return self._generation

    @property
    def stores(self) -> bool:
        """Whether snapshots are stored (a store with views), not only kept in memory."""
        return self._views is not None

    def reach(
        self, run_id: UUID, projection: Projection[Any], version: int, generation: int, most: int
    ) -> Any:
        """The state after event `version`, if the nearest snapshot lies at most `most` back.

        For a writer keeping snapshots as its run grows: the fold walks only the
        events since that snapshot (storing snapshots on the way); None when there is
        none that near (an older store's long run: its first reader folds it).
        """
        self._follow(generation)
        key = (generation, run_id, projection.name, projection.identity())
        start = self._start(key, projection, version).version if version >= self.interval else 0
        if version - start > most:
            return None
        return self._fold(key, projection, version)

    def keep(
        self,
        run_id: UUID,
        projection: Projection[Any],
        version: int,
        state: Any,
        generation: int,
        *,
        most: int | None = None,
    ) -> Any:
        """Store `state`, the projection's after event `version`, as a snapshot read in
        `generation`; the state to go on folding from (restored: its older part deferred).

        A writer's: its fold of the events it wrote, never a read of the run. With `most`,
        a snapshot sealed into more bytes than that is not stored, and None is returned.
        """
        key = (generation, run_id, projection.name, projection.identity())
        storer = _Storer(self, key, projection, 0)
        storer.spacing = 1  # due now, whatever the version
        data = storer.offer(version, state)
        if most is not None and any(len(sealed) > most for _, sealed in storer.sealed):
            return None
        if data is not None and type(projection).restore is not Projection.restore:
            state = projection.restore(data, self._events(key))
        self._follow(generation)
        self._remember(key, [(version, state)])
        storer.flush()
        return state

    def keep_snapshot(
        self, run_id: UUID, projection: Projection[Any], version: int, data: Any, generation: int
    ) -> None:
        """Store `data`, the projection's `snapshot` after event `version`, read in `generation`.

        A writer's that follows what its snapshot needs rather than the projection's state
        (`projections.stack.StackShape`). Nothing is kept in memory: restoring it costs a
        pass over what it holds, at every crossing, for a reader in this process that may
        never come (one restores it from the store).
        """
        key = (generation, run_id, projection.name, projection.identity())
        storer = _Storer(self, key, projection, 0)
        storer.seal(version, data)
        storer.flush()

    def _follow(self, generation: int) -> None:
        """Forget the snapshots in memory when runs were erased since they were taken."""
        with self._lock:
            if generation != self._generation:
                self._memory.clear()
                self._generation = generation
                deferred.forget_packed()
                forget_runs()

    def _fold(self, key: _Key, projection: Projection[Any], version: int) -> Any:
        run_id = key[1]
        begun = self._start(key, projection, version)
        start, state = begun.version, begun.state
        fresh: list[tuple[int, Any]] = []
        storer = _Storer(self, key, projection, begun.stored_size, begun.whole, start)
        relevant, together = projection.relevant, _together(projection)
        grid, interval = self.grid(projection), self.interval
        # A projection kept densely in memory goes on from its own state: its kept states
        # then share every item made, where each restored one would hold its own copy
        # of the versions of all its items (gigabytes over a fold of a million events).
        deferring = type(projection).restore is not Projection.restore and grid == interval
        left = every = collector.COLLECT_EVERY
        event = None
        dense_from = version - DENSE_KEPT
        part: list[Event] = []  # the relevant events since the last state kept
        unread: list[Exception] = []  # what a read of the run raised
        with collector_paused() as tick:
            for event in _read_until_failure(
                self._reader.stream(run_id, gt=start, lte=version), unread
            ):
                if relevant(event):
                    part.append(event)
                if event.version % grid == 0:
                    state = _folded(projection, together, part, state)
                    part = []
                    data = (
                        storer.offer(event.version, state)
                        if event.version % interval == 0
                        else None
                    )
                    if deferring and data is not None:
                        # Go on from the snapshot as a reader would restore it: the next
                        # snapshot then walks only what changed since, and memory holds
                        # the state's newest part, not the whole run.
                        state = projection.restore(data, self._events(key, fresh))
                    if event.version % interval == 0 or event.version > dense_from:
                        fresh.append((event.version, state))
                left -= 1
                if not left:
                    tick()
                    left = every
            # The events read before a failed read first: a handler error among them is the
            # one `apply` event by event raised, before reading on.
            state = _folded(projection, together, part, state)
        if unread:
            raise unread[0]
        # Before anything of the fold is kept or stored: events gone from under it.
        _whole(run_id, start if event is None else event.version, version)
        if not fresh or fresh[-1][0] != version:
            fresh.append((version, state))  # the same question again: no fold at all
        self._remember(key, fresh)
        storer.flush()
        return state

    def _events(self, key: _Key, fresh: list[tuple[int, Any]] | None = None) -> EventSource:
        """Reads the run's events for a restored state, while the run is the one it was; and
        states of the run at earlier versions (`_RunReads.state_at`), `fresh` among them (a
        fold's states, oldest first, not yet in memory)."""
        return _RunReads(self, key, fresh)

    def _snapshots(self, key: _Key) -> _Snapshots:
        memory = self._memory.pop(key, None) or _Snapshots()
        self._memory[key] = memory
        while len(self._memory) > self._limit:
            self._memory.popitem(last=False)
        return memory

    def _remember(self, key: _Key, states: list[tuple[int, Any]]) -> None:
        with self._lock:
            if key[0] < self._generation:  # read before an erasure another fold has seen
                return
            memory = self._snapshots(key)
            for version, state in states:
                memory.add(version, state)

    def _start(self, key: _Key, projection: Projection[Any], version: int) -> _Start:
        """Where a fold up to `version` starts: the nearest state in memory or stored."""
        with self._lock:
            start, state = self._snapshots(key).best(version) or (0, None)
        if version - start >= self.interval and self._views is not None:
            stored = self._stored(key, version)
            if stored is not None and stored.version > start:
                state = projection.restore(stored.state, self._events(key))
                self._remember(key, [(stored.version, state)])
                return attrs.evolve(stored, state=state)
        return _Start(start, projection.initial() if start == 0 else state)

    def _stored(self, key: _Key, version: int) -> _Start | None:
        """The newest stored snapshot up to `version` (its JSON), whole or a delta."""
        assert self._views is not None
        return _stored(self._views, key, version)

    def save(self, key: _Key, sealed: list[tuple[int, bytes]]) -> None:
        """Store snapshots; a store that refuses (read-only) only loses the speed-up."""
        if self._views is None or not sealed:
            return
        generation, run_id, name, identity = key
        try:
            self._views.save_snapshots(str(run_id), name, identity, generation, sealed)
        except Exception as error:  # any refusal of the database: answers stay correct
            _log.debug("snapshots of %s not stored: %s", key, error)


class _RunReads:
    """Reads one run for a state restored from a snapshot of `key`, while the run is the one
    it was (no erasure since `key`'s generation): its events, and another projection's or
    its own state at an earlier version (`engine.machine.EarlierStates`), from the snapshots
    of the same generation."""

    def __init__(
        self, travel: TimeTravel, key: _Key, fresh: list[tuple[int, Any]] | None = None
    ) -> None:
        self._travel, self._key, self._fresh = travel, key, fresh

    def _same_run(self) -> None:
        generation, run_id = self._key[0], self._key[1]
        if self._travel._reader.generation() != generation:
            raise ProjectionStateError(
                self._key[2], f"run {run_id} was erased since this state was read; read it again"
            )

    def __call__(self, gt: int, lte: int) -> Iterator[Any]:
        """The run's events with `gt < version <= lte`, oldest first."""
        self._same_run()
        read = list(self._travel._reader.stream(self._key[1], gt=gt, lte=lte))
        self._same_run()  # an erasure during the read (its id perhaps reused) shows here
        return iter(read)

    def held(self, projection: Projection[Any], version: int) -> Any:
        """The state of `projection` after event `version` if kept in memory (or among the
        fold's own states), else None."""
        generation, run_id = self._key[0], self._key[1]
        key = (generation, run_id, projection.name, projection.identity())
        if self._fresh and key == self._key:
            for at, state in reversed(self._fresh):
                if at <= version:
                    if at == version:
                        return state
                    break
        travel = self._travel
        with travel._lock:
            memory = travel._memory.get(key) if travel._generation == generation else None
            return None if memory is None else memory.states.get(version)

    def state_at(self, projection: Projection[Any], version: int) -> Any:
        """The state of `projection` after event `version`, from its nearest snapshot; None
        if runs were erased since `key`'s generation."""
        generation, run_id = self._key[0], self._key[1]
        if self._travel._reader.generation() != generation:
            return None
        key = (generation, run_id, projection.name, projection.identity())
        state = self._travel._fold(key, projection, version)
        return state if self._travel._reader.generation() == generation else None

    def state_now(self, projection: Projection[Any], version: int) -> Any:
        """The state of `projection` after event `version` of the run the store holds now."""
        return self._travel.project(self._key[1], projection, version)


def stored_snapshot(
    views: Views, run_id: UUID, projection: Projection[Any], generation: int, upto: int
) -> tuple[int, JSON] | None:
    """The newest snapshot of `projection` over the run stored in `generation` up to event
    `upto`, whole or a delta made whole: its version and its JSON (`Projection.snapshot`);
    None if there is none.

    What a reader that does not fold the run itself takes from it (the persistent catch-up
    leaping over a long run: `engine.readside.leaps`).
    """
    key = (generation, run_id, projection.name, projection.identity())
    start = _stored(views, key, upto)
    return None if start is None else (start.version, start.state)


def _stored(views: Views, key: _Key, version: int) -> _Start | None:
    """The newest stored snapshot of `key` up to `version` (its JSON), whole or a delta."""
    generation, run_id, name, identity = key
    whole = _readable_whole(views, key, version)
    delta = views.snapshot(str(run_id), name, identity + DELTA_TAG, generation, version)
    if delta is not None and (whole is None or delta[0] > whole.version):
        made = _from_delta(views, key, delta, whole)
        if made is not None:
            return made
    return whole


def _readable_whole(views: Views, key: _Key, version: int) -> _Start | None:
    """The newest whole snapshot of `key` up to `version` that can be read. One that cannot
    (its bytes damaged, another key's cipher) is passed over with a warning, as up to
    `UNREADABLE_PASSED` of them: a snapshot only saves time, and the fold from an
    older one (or from the first event) gives the same state."""
    generation, run_id, name, identity = key
    for _ in range(UNREADABLE_PASSED):
        row = views.snapshot(str(run_id), name, identity, generation, version)
        if row is None:
            return None
        data = _unsealed(views, key, row)
        if data is not _UNREADABLE:
            return _Start(row[0], data, len(row[1]), (row[0], data))
        version = row[0] - 1
    return None


def _from_delta(
    views: Views, key: _Key, delta: tuple[int, bytes], read: _Start | None
) -> _Start | None:
    """The snapshot a stored delta stands for; None if it or its whole snapshot is not there
    as it was, or cannot be read (then the whole one before it serves). `read`: a whole
    snapshot already read, used when it is the delta's base (it nearly always is) instead
    of reading it again."""
    generation, run_id, name, identity = key
    change = _unsealed(views, key, delta)
    if change is _UNREADABLE or not isinstance(change, dict) or "base" not in change:
        return None
    base = change["base"]
    if read is not None and read.version == base:
        data, size = read.state, read.stored_size
    else:
        row = views.snapshot(str(run_id), name, identity, generation, base)
        if row is None or row[0] != base:
            return None
        data, size = _unsealed(views, key, row), len(row[1])
        if data is _UNREADABLE:
            return None
    made = applied(change, data)
    return None if made is None else _Start(delta[0], made, size, (base, data))


def _unsealed(views: Views, key: _Key, row: tuple[int, bytes]) -> Any:
    """A stored snapshot's JSON, or `_UNREADABLE` (logged) if its bytes cannot be unsealed."""
    try:
        return views.codec.unseal(row[1])
    except Exception as error:  # damaged bytes: JSON, compression or the cipher refuse them
        _log.warning(
            "the %s snapshot of run %s after event %d cannot be read, and is passed over: %s",
            key[2],
            key[1],
            row[0],
            error,
        )
        return _UNREADABLE


def _read_until_failure(events: Iterator[Event], failures: list[Exception]) -> Iterator[Event]:
    """`events` until reading the next one raises: its error put in `failures`, not raised,
    so the events read before it are folded first (`TimeTravel._fold`)."""
    try:
        yield from events
    except Exception as error:  # raised once the events read are folded
        failures.append(error)


def _together(projection: Projection[Any]) -> Callable[[list[Event], Any], Any] | None:
    """How `projection` folds the events between two kept states faster than by `apply` one
    by one: its own fold (a stretch fold, `folds_faster`, or rows pushed in place, as
    `StateStack`'s), else its registered `folding` (a `RunView`'s parts' folds); None: it
    has neither, `apply` is as fast."""
    if folds_faster(projection) or type(projection).fold is not Projection.fold:
        return projection.fold  # a stretch made at each kept state: a reader's own fold
    if folding.dispatch(type(projection)) is folding.dispatch(Projection):
        return None

    def folded(events: list[Event], state: Any) -> Any:
        fed = folding(projection, state)
        fed.feed(events)
        return fed.state()

    return folded


def _folded(
    projection: Projection[Any],
    together: Callable[[list[Event], Any], Any] | None,
    events: list[Event],
    state: Any,
) -> Any:
    """`state` after `events` (relevant ones, in order): folded `together` where it can be,
    the same state `apply` makes event by event. A failure is told again by `apply` from
    `state`, event by event, so the error names the event it stops at (as a fold by event
    would have); states are values, so `state` is as it was before the faster fold.

    A state None is told to a fold as None only where that is the initial state (a fold
    from None starts from `initial`)."""
    if (
        together is not None
        and len(events) > 1
        and (state is not None or projection.initial() is None)
    ):
        try:
            return together(events, state)
        except Exception:  # told again below, by the event it stops at
            pass
    apply = projection.apply
    for event in events:
        state = apply(state, event)
    return state


def _whole(run_id: UUID, reached: int, version: int) -> None:
    """Refuse a fold of the run up to `version` whose events ended at `reached` before it:
    the run was erased while it was read (a long run is read a page at a time).

    Raises:
        RunErasedWhileRead: the first version the fold did not find.
    """
    if reached < version:
        raise RunErasedWhileRead(run_id, reached + 1)


class _Storer:
    """Decides which snapshots of one fold are worth storing, and stores them.

    A whole snapshot is stored every `spacing` events, and the spacing doubles while
    a snapshot is larger than `BYTES_PER_EVENT` times it: stored snapshots then take
    about as much room as the events they stand for, even for states that grow
    with the run (a deep stack), instead of a copy of the whole state every 500 events.
    Between them, a delta every `VIEW_GAP` events (see there) against the last whole
    one (`whole`: sealed in this fold, or the one the fold started from).
    """

    def __init__(
        self,
        travel: TimeTravel,
        key: _Key,
        projection: Projection[Any],
        stored_size: int,
        whole: tuple[int, JSON] | None = None,
        start: int = 0,
    ) -> None:
        self.travel, self.key, self.projection = travel, key, projection
        self.spacing = _spacing(travel.interval, stored_size)
        self.views = travel._views if travel._seals else None
        self.sealed: list[tuple[int, bytes]] = []
        self.deltas: list[tuple[int, bytes]] = []
        self.whole, self.previous = whole, start

    def offer(self, version: int, state: Any) -> Any:
        """Seal a snapshot of `state` (whole or a delta) if one is due at `version`; its
        JSON, or None."""
        if self.views is None:
            return None
        whole = version % self.spacing == 0
        if not whole and (version % VIEW_GAP or self.whole is None):
            return None
        try:
            snapshot = self.projection.snapshot(state)
        except ProjectionStateError as error:  # no codec: on-demand answers need none
            _log.debug("%s has no JSON codec, so no stored snapshots: %s", self.key[2], error)
            self.views = None
            return None
        if whole:
            self.seal(version, snapshot)
            self.whole = (version, snapshot)
        else:
            self.seal_delta(version, snapshot)
        return snapshot

    def seal(self, version: int, snapshot: Any) -> None:
        """Seal `snapshot`, the state's after event `version`, to be stored at `flush`."""
        if self.views is None:
            return
        data = self.views.codec.seal(snapshot)
        self.sealed.append((version, data))
        self.spacing = _spacing(self.spacing, len(data))
        self.previous = version

    def seal_delta(self, version: int, snapshot: JSON) -> None:
        """Seal `snapshot` as a delta against the last whole one, if it fits the byte budget."""
        assert self.views is not None
        assert self.whole is not None
        base, whole = self.whole
        change = delta(snapshot, whole)
        if change is None:
            return
        data = self.views.codec.seal({"base": base, **change})
        if len(data) <= BYTES_PER_EVENT * (version - self.previous):
            self.deltas.append((version, data))
            self.previous = version

    def flush(self) -> None:
        """Store the chosen snapshots in one transaction each (whole ones, then deltas)."""
        self.travel.save(self.key, self.sealed)
        generation, run_id, name, identity = self.key
        self.travel.save((generation, run_id, name, identity + DELTA_TAG), self.deltas)
        self.sealed, self.deltas = [], []


def _spacing(spacing: int, size: int) -> int:
    while size > spacing * BYTES_PER_EVENT:
        spacing *= 2
    return spacing


@attrs.frozen
class _Start:
    """A state a fold starts from: its version, the state (or stored JSON), and when it was
    stored, the size of its whole snapshot and that snapshot (version, JSON)."""

    version: int
    state: Any
    stored_size: int = 0
    whole: tuple[int, JSON] | None = None


def delta(data: JSON, whole: JSON) -> dict[str, JSON] | None:
    """`data` as a change of `whole`: ``data`` with each long text it shares the start of with
    the same text of `whole` emptied, and ``edits`` to make them again; None if none is shared.

    An edit is ``[path, shared, length, rest]``: the text at `path` (keys and indexes) is the
    first `shared` characters of `whole`'s, whose `length` it was, then `rest`.
    """
    edits: list[JSON] = []
    holed = _holed(data, whole, [], edits)
    return {"data": holed, "edits": edits} if edits else None


def applied(change: JSON, whole: JSON) -> JSON | None:
    """The JSON `delta` turned into `change`, from `whole`; None if `whole` is not the one it
    was made from (a text at an edit's path of another length)."""
    data = change["data"]
    for path, shared, length, rest in change["edits"]:
        text = _at(whole, path)
        if not isinstance(text, str) or len(text) != length:
            return None
        if not path:
            return text[:shared] + rest
        _at(data, path[:-1])[path[-1]] = text[:shared] + rest
    return data


def _holed(value: JSON, whole: JSON, path: list[Any], edits: list[JSON]) -> JSON:
    if isinstance(value, str):
        if len(value) >= SHARED_TEXT and isinstance(whole, str):
            shared = _shared(value, whole)
            if shared >= SHARED_TEXT:
                edits.append([list(path), shared, len(whole), value[shared:]])
                return ""
        return value
    if isinstance(value, list) and isinstance(whole, list):
        return [
            _holed(item, whole[index] if index < len(whole) else None, [*path, index], edits)
            for index, item in enumerate(value)
        ]
    if isinstance(value, dict) and isinstance(whole, dict):
        return {k: _holed(item, whole.get(k), [*path, k], edits) for k, item in value.items()}
    return value


def _at(data: JSON, path: list[Any]) -> Any:
    """The value at `path` in `data` (None where a key or index is missing)."""
    for step in path:
        if isinstance(data, dict) and isinstance(step, str):
            data = data.get(step)
        elif isinstance(data, list) and type(step) is int and 0 <= step < len(data):
            data = data[step]
        else:
            return None
    return data


def _shared(text: str, other: str) -> int:
    """How many leading characters `text` and `other` share (halving, compared in C)."""
    low, high = 0, min(len(text), len(other)) + 1  # text[:low] is shared, text[:high] not
    while high - low > 1:
        middle = (low + high) // 2
        if text.startswith(other[low:middle], low):
            low = middle
        else:
            high = middle
    return low
