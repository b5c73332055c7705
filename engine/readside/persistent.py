"""Persistent projections: folded over every run, tracked, exactly-once, rebuildable.

`Projections` pulls pages of eventsourcing's notification log, folds each page
into the registered projections' partitioned states, and saves the touched
states with a tracking record in one transaction. Projections at the same
position share one read of each page; the one furthest behind goes first, so
the run index is always at least as far as any projection that needs it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import Any, NamedTuple
from uuid import UUID

import attrs
from eventsourcing.persistence import ApplicationRecorder, StoredEvent

from engine.readside.leaps import Leap, find_leap
from engine.store.chain import StoredRow
from engine.store.mapper import EventMapper
from engine.store.views import PageSave, RunQuery, Views
from events import Event, EventFormatError, RunDeleted, RunFinished, RunStarted
from projections.base import Projection, as_projection, folds_faster
from projections.collector import collector_paused
from projections.errors import (
    PositionMoved,
    ProjectionError,
    ProjectionNameTaken,
    ProjectionReplaced,
    ProjectionStateError,
    UnknownProjection,
)
from projections.run_index import RunIndex, RunSummary

PAGE = 2000
"""Notifications folded and saved per transaction."""

GONE_EVENTS = 10_000
"""Most events of a page's deleted runs read together to forget them (more: run by run)."""

RUN_PAGE_MIN = 8
"""Fewest events of one run in a page of notifications decoded together (`from_rows`):
fewer are decoded faster one by one."""

FOLD_MIN = 4
"""Fewest events of one key in a page folded by the projection's own fold (`_folded_by_key`):
fewer are applied one by one, faster than a fold's setting up (a stretch, mutable copies)."""

RESTORE_AFTER = 64
"""Events folded into a cached run summary, since it was loaded or last restored, after which
it is cached as stored (`Projections._keep_as_stored`): about what decoding a run's summary
costs in walking its newest states."""

_NUMBER = attrgetter("int")
_NONE_FOLDED: Folded = (set(), Counter())
_CACHE_LIMIT = 20_000
Progress = Callable[[str, int, int], None]
Folded = tuple[set[str], Counter[Any]]
"""A page's keys whose states it loaded, and its events folded by key (None: not seen)."""
Failure = ProjectionError | ProjectionStateError | ProjectionReplaced
_log = logging.getLogger(__name__)


class _Cached(dict[str, Any]):
    """One projection's cached states by key, and how many events each has folded since it
    was loaded or last restored from what was stored (`folded`)."""

    __slots__ = ("folded",)

    def __init__(self) -> None:
        super().__init__()
        self.folded: dict[str, int] = {}


class _PageFold(NamedTuple):
    """What folding a page into one projection's cached states did (`Projections._fold`)."""

    touched: set[str]
    """The keys whose states the page changed."""
    reached: int
    """The position folded up to: the page's end, or the one before the event that failed."""
    error: ProjectionError | None
    """The handler's error that stopped the page (None: folded to its end)."""
    keys: list[str | None]
    """The keys of the events folded, in order (None: an event the projection does not see)."""
    delivered: list[tuple[Any, Event]] | None
    """Each event folded with the state before it, for a projection that `delivers`."""


@attrs.frozen
class ProjectionStatus:
    """Where a persistent projection is: its position, the head, the lag, its last error."""

    name: str
    position: int
    head: int
    lag: int
    last_error: str | None


class Projections:
    """The registry and runner of an engine's persistent projections.

    States folded by this process are kept between pages (`_cache`) and used
    while the projection's position is where they left it; runs erased since,
    by any process, may come back under the same id with other events, so the
    cache belongs to the store's erasure generation, read before it is used.

    Args:
        recorder: eventsourcing's application recorder of the store (the notification log).
        mapper: turns stored events back into events.
        views: where states, tracking records and snapshots are kept.
        generation: the store's erasure generation (`Store.generation`).
    """

    def __init__(
        self,
        recorder: ApplicationRecorder,
        mapper: EventMapper,
        views: Views,
        generation: Callable[[], int],
    ) -> None:
        self._recorder = recorder
        self._mapper = mapper
        self.views = views
        self._generation = generation
        self._registered: dict[str, Projection[Any]] = {}
        self._unchecked: set[str] = set()
        """Registered lazily: their fingerprint not compared with the stored one yet."""
        self._cache: dict[str, tuple[int, _Cached]] = {}
        self._pipelines: dict[int, str] = {}  # by UUID.int: see _keys
        self._cached_generation: int | None = None
        self._lock = threading.RLock()

    def register(
        self, projection: Projection[Any] | type[Projection[Any]], *, lazily: bool = False
    ) -> Projection[Any]:
        """Fold `projection` over every run from now on (its stored state is kept if current).

        A projection whose code changed since its state was stored starts again from zero.
        With `lazily`, its code's fingerprint is computed and compared with the stored
        one when it is first used (caught up, read, reset, listed in `status`), not now:
        a reader that never uses it (``stagetrail runs``) does not pay for it.

        Raises:
            ProjectionNameTaken: another class is registered under the same name.
        """
        instance = as_projection(projection)
        with self._lock:
            known = self._registered.get(instance.name)
            if known is not None and type(known) is not type(instance):
                raise ProjectionNameTaken(instance.name, repr(known))
            self._registered[instance.name] = instance
            self._unchecked.add(instance.name)
            if not lazily:
                self._check([instance.name])
        return instance

    def settle(self) -> None:
        """Compare every lazily registered projection's fingerprint with the stored one now
        (`register`): the store records it as kept, as an eager registration does."""
        self._check(self.names)

    def _check(self, names: Iterable[str]) -> None:
        """Compare the fingerprints of those of `names` registered lazily with the stored ones
        (a stored state of other code is discarded)."""
        with self._lock:
            for name in [name for name in names if name in self._unchecked]:
                if self.views.register(name, self._registered[name].identity()):
                    self._cache.pop(name, None)
                self._unchecked.discard(name)

    @property
    def names(self) -> list[str]:
        """The registered projections' names, sorted."""
        return sorted(self._registered)

    def projection(self, name: str) -> Projection[Any]:
        """The registered projection called `name`.

        Raises:
            UnknownProjection: nothing is registered under that name.
        """
        try:
            return self._registered[name]
        except KeyError:
            raise UnknownProjection(name, list(self._registered)) from None

    def head(self) -> int:
        """The newest notification id of the store (0 when empty)."""
        return self._recorder.max_notification_id() or 0

    def catch_up(
        self, names: Sequence[str] | None = None, *, on_progress: Progress | None = None
    ) -> dict[str, int]:
        """Fold every event not yet folded into the projections (default: all registered).

        Returns:
            How many events each projection folded (for the run index, with those a leap
            over a long run passed: `engine.readside.leaps`).

        Raises:
            ProjectionError: a handler failed; the others were still caught up, and
                the failing one stays before the event (see `status`).
        """
        wanted = self._with_run_index(names)
        with self._lock:
            self._check(wanted)
            return self._catch_up(wanted, self.head(), on_progress)

    def _with_run_index(self, names: Sequence[str] | None) -> list[str]:
        chosen = list(self._registered) if names is None else list(names)
        for name in chosen:
            self.projection(name)
        needs_index = any(self._registered[n].scope == "pipeline" for n in chosen)
        if needs_index and RunIndex.name not in chosen:
            chosen.append(RunIndex.name)
        return chosen

    def _catch_up(
        self, names: list[str], head: int, on_progress: Progress | None
    ) -> dict[str, int]:
        folded = dict.fromkeys(names, 0)
        failures: dict[str, Failure] = {}
        while True:
            active = [name for name in names if name not in failures]
            # the resets before the positions: see `PageSave.resets`
            resets, positions = self.views.resets_and_positions(active)
            lowest = min(positions.values(), default=head)
            if lowest >= head:
                break
            group = [name for name in active if positions[name] == lowest]
            stop = min([p for p in positions.values() if p > lowest] + [head])
            try:
                with collector_paused():
                    count, end = self._page(group, lowest, stop, failures, resets)
            except PositionMoved:  # another follower, or a compaction, came first
                self._forget(group)
                head = min(head, self.head())  # a compaction may have erased the newest
                continue
            except ProjectionReplaced as replaced:  # stop that one; the others go on
                self._forget(group)
                failures[replaced.name] = replaced
                continue
            except BaseException:
                self._forget(group)  # their cached states may hold part of this page
                raise
            for name in group:
                if name not in failures:
                    folded[name] += count
                    if on_progress is not None:
                        on_progress(name, end, head)
        if failures:
            raise next(iter(failures.values()))
        return folded

    def _page(
        self,
        group: list[str],
        start: int,
        stop: int,
        failures: dict[str, Failure],
        resets: int,
    ) -> tuple[int, int]:
        generation = self._follow_generation()  # before the read: see `PageSave.generation`
        ids, events = self._read(start, stop)
        end = ids[-1] if ids else stop
        self._learn_pipelines(events)
        gone = self._deleted_runs(group, events)
        saves, folded = [], {}
        for name in group:
            save, error, folded[name] = self._fold(name, events, ids, start, end, gone)
            if save is not None:
                saves.append(attrs.evolve(save, generation=generation, resets=resets))
            if error is not None:
                failures[name] = error
        self._commit(saves, folded)
        for name, failure in failures.items():
            if name in group:  # kept after the commit, which clears last errors
                self.views.record_error(name, str(failure))
        if group == [RunIndex.name] and RunIndex.name not in failures:
            leapt = self._leap(events, end, stop, generation, resets)
            if leapt is not None:
                return len(events) + leapt.passed, leapt.target
        return len(events), end

    def _leap(
        self, events: list[Event], end: int, stop: int, generation: int, resets: int
    ) -> Leap | None:
        """Take the run index over the long run the page ended in, onto its writer's newest
        summary, where that run alone fills the notifications up to it (`find_leap`).

        The run index's own class only (a subclass folds the run in its own way), and only
        from where its page was saved; the summary is saved with the position it stands
        for in one transaction, as a page is.
        """
        projection = self._registered[RunIndex.name]
        cached = self._cache.get(RunIndex.name)
        if type(projection) is not RunIndex or cached is None or cached[0] != end:
            return None
        found = find_leap(self._recorder, self.views, events, end, stop, generation)
        if found is None:
            return None
        try:
            summary = projection.decode(found.summary)
        except Exception as error:  # the pages say what is wrong with it, if anything
            _log.debug("run %s's stored summary not used: %s", found.run_id, error)
            return None
        try:
            self.views.commit([found.saved(end, generation, resets)])
        except PositionMoved:  # another follower (or a compaction) came first: the page,
            return None  # committed, still counts; the next one starts where the store says
        key = str(found.run_id)
        cached[1][key] = summary
        cached[1].folded.pop(key, None)
        self._remember(RunIndex.name, found.target)
        return found

    def _deleted_runs(self, group: list[str], events: list[Event]) -> dict[UUID, list[Event]]:
        """The stored events of the runs the page deletes, read together where the store can
        (PostgreSQL), for the projections of `group` that forget them; else {}.

        Read a bounded page at a time, and only whole runs up to `GONE_EVENTS` events in
        all: a run past that budget is left out, and `_forget_run` reads it on its own.
        """
        read = getattr(self._recorder, "select_run_pages", None)
        if read is None or not any(_forgetting(self._registered[name]) for name in group):
            return {}
        deleted = [event.run_id for event in events if deletes(event)]
        if len(deleted) < 2:  # one run: `_forget_run` reads it as it always does
            return {}
        found: dict[UUID, list[Event]] = {run_id: [] for run_id in deleted}
        read_all, held = True, 0
        for page in read(deleted):
            for event in self._stored(page):
                found[event.run_id].append(event)
            held += len(page)
            if held >= GONE_EVENTS:
                read_all = False
                break
        if not read_all:  # only runs before the last one read are whole
            last = max(run_id for run_id, run_events in found.items() if run_events)
            found = {run_id: got for run_id, got in found.items() if run_id < last}
        for run_events in found.values():  # their pipelines, not one read of the index each
            self._learn_pipelines(run_events[:1])
        return found

    def _read(self, start: int, stop: int) -> tuple[list[int], list[Event]]:
        """The ids and events of the page of notifications after `start` (up to `stop`): read
        as rows where the recorder can (`select_notification_rows`), not as objects."""
        lean = getattr(self._recorder, "select_notification_rows", None)
        if lean is not None:
            ids, runs, rows = lean(start, PAGE, stop)
            return ids, self._decoded(runs, rows)
        notifications = self._recorder.select_notifications(
            start=start, limit=PAGE, stop=stop, inclusive_of_start=False
        )
        return [notification.id for notification in notifications], self._stored(notifications)

    def _stored(self, stored: Sequence[StoredEvent]) -> list[Event]:
        """The events of `stored`, in its order (`_decoded`)."""
        runs: list[Any] = [row.originator_id for row in stored]  # a recorder's are UUIDs
        rows = [(row.originator_version, row.topic, row.state) for row in stored]
        return self._decoded(runs, rows)

    def _decoded(self, runs: list[UUID], rows: list[StoredRow]) -> list[Event]:
        """The events of `rows` (of `runs`), in their order, each run's many decoded as a page
        (`EventMapper.from_rows`, as `Store.read` does): the same events as decoding each
        alone (`to_domain_event`), and the same error, for the first that cannot be read.
        """
        alone = self._mapper.alone
        numbers = list(map(_NUMBER, runs))  # an int's hash is C's, a UUID's is Python's
        by_run: dict[int, list[int]] = {}
        if not rows or len(set(numbers)) * RUN_PAGE_MIN > len(rows):  # no page pays
            return list(map(alone, runs, rows))
        try:
            if numbers[0] == numbers[-1] and numbers.count(numbers[0]) == len(numbers):
                return self._mapper.from_rows(runs[0], rows)  # one run's page, as it is
            for index, number in enumerate(numbers):
                by_run.setdefault(number, []).append(index)
            return _scattered(self._mapper, runs, rows, by_run)
        except EventFormatError:  # decoded in order, one by one: the first unreadable says so
            return list(map(alone, runs, rows))

    def _follow_generation(self) -> int:
        """Drop every cached state and pipeline name if runs were erased since they were read."""
        generation = self._generation()
        if generation != self._cached_generation:
            self._cache.clear()
            self._pipelines.clear()
            self._cached_generation = generation
        return generation

    def _forget(self, names: Iterable[str]) -> None:
        for name in names:
            self._cache.pop(name, None)

    def _commit(self, saves: list[PageSave], folded: dict[str, Folded]) -> None:
        if saves:
            self.views.commit(saves)
        for save in saves:
            self._remember(save.name, save.end)
            self._evict_settled(save)
            self._keep_as_stored(save, *folded[save.name])

    def _keep_as_stored(self, save: PageSave, loaded: set[str], counts: Counter[Any]) -> None:
        """Cache a saved state that has folded `RESTORE_AFTER` events or more since it was
        loaded (`loaded`: at this page's start) or last restored as `save` stored it: as the
        next page would load it in a fresh process. `counts`: the page's events by key.

        A state folded page after page holds everything pushed since it was loaded (a run's
        whole stack of states, a cell per outcome): encoding it again at every page would
        walk all of it, quadratic in the run's length, and keep it in memory. Decoded from
        what was stored, its older part is what the encoding made of it (`RunIndex`: a
        deferred stack whose packed runs are known without walking it), and only what
        later events push is walked. A state that folds a few events a page is decoded
        only every so many pages: a decode costs more than walking a few new states.

        The run index's states only (not a subclass's): its decode gives back the summary
        folded. Another projection's codec may not give back what its fold keeps (a tuple
        stored as a list, a cache left out), and decoding its states shortens no walk.
        """
        projection = self._registered[save.name]
        if type(projection) is not RunIndex:
            return
        cached = self._cache[save.name][1]
        since = cached.folded
        for key, count in counts.items():
            if key not in cached or key not in save.states:  # settled, evicted
                since.pop(key, None)
                continue
            count += 0 if key in loaded else since.get(key, 0)
            if count < RESTORE_AFTER:
                since[key] = count
                continue
            since.pop(key, None)
            try:
                cached[key] = projection.decode(save.states[key])
            except Exception:  # the next page loads it, and says what is wrong with it
                del cached[key]

    def _evict_settled(self, save: PageSave) -> None:
        """Drop cached states that can no longer change; a large cache slows every page."""
        projection = self._registered[save.name]
        if type(projection).settled is Projection.settled:
            return
        cached = self._cache[save.name][1]
        for key in save.states:
            if key in cached and projection.settled(cached[key]):
                del cached[key]

    def _fold(
        self,
        name: str,
        events: list[Event],
        ids: list[int],
        start: int,
        end: int,
        gone: dict[UUID, list[Event]],
    ) -> tuple[PageSave | None, ProjectionError | ProjectionStateError | None, Folded]:
        """Fold a page into `name`; on a handler error, keep what came before the event.

        Also returns the keys whose states the page loaded, and the events it folded by key.
        """
        projection = self._registered[name]
        keys = self._keys(projection, events)
        states, loaded = self._states(name, projection, keys, start)
        page = _folded_by_key(projection, events, keys, states, end)
        if page is None:  # not foldable key by key, or it failed: event by event says where
            page = self._fold_each(name, events, ids, (start, end), gone, keys, states)
        touched, reached, error, keys, folded = page
        if folded:
            try:
                projection.deliver(folded)
            except Exception as failure:  # nothing of the page is kept: it comes again
                self._cache.pop(name, None)
                return None, ProjectionError(name, folded[0][1], failure), _NONE_FOLDED
        try:
            encoded = {key: projection.encode(states[key]) for key in touched}
        except ProjectionStateError as failure:
            self._cache.pop(name, None)
            return None, failure, _NONE_FOLDED
        if reached == start:
            return None, error, _NONE_FOLDED
        save = PageSave(name, start, reached, encoded, projection.identity())
        return save, error, (loaded, Counter(keys))

    def _fold_each(
        self,
        name: str,
        events: list[Event],
        ids: list[int],
        bounds: tuple[int, int],
        gone: dict[UUID, list[Event]],
        keys: list[str | None],
        states: dict[str, Any],
    ) -> _PageFold:
        """Fold a page's events into `name`'s `states` one by one, as far as a handler error
        (the page from `bounds`' start to its end)."""
        projection = self._registered[name]
        start, end = bounds
        touched: set[str] = set()
        reached, error = end, None
        forgetting = _forgetting(projection)
        folded: list[tuple[Any, Event]] | None = [] if projection.delivers else None
        for index, event in enumerate(events):
            key, forgotten = keys[index], None
            try:
                if forgetting and deletes(event):
                    forgotten = self._forget_run(name, projection, states, event, gone)
                if key is not None:
                    before = states[key] if forgotten is None else forgotten.get(key, states[key])
                    after = projection.apply(before, event)
            except ProjectionError as failure:
                reached, error = (ids[index - 1] if index else start), failure
                keys = keys[:index]
                break
            if forgotten is not None:  # kept with the deletion's own fold, or not at all
                states.update(forgotten)
                touched.update(forgotten)
            if key is None:
                continue
            states[key] = after
            touched.add(key)
            if folded is not None:
                folded.append((before, event))
        return _PageFold(touched, reached, error, keys, folded)

    def _forget_run(
        self,
        name: str,
        projection: Projection[Any],
        states: dict[str, Any],
        deletion: Event,
        gone: dict[UUID, list[Event]],
    ) -> dict[str, Any]:
        """The partitions a deleted run's events reached without its part, by key (`states`
        left as they are: the deletion's own fold may fail, keeping what came before it).

        `gone` holds the events of the page's deleted runs where they were read at once.
        """
        if deletion.run_id in gone:
            events = [e for e in gone[deletion.run_id] if e.version < deletion.version]
        else:
            stored = self._recorder.select_events(deletion.run_id, lte=deletion.version - 1)
            events = self._stored(stored)
        by_key: dict[str, list[Event]] = {}
        for key, event in zip(self._keys(projection, events), events, strict=True):
            if key is not None:
                by_key.setdefault(key, []).append(event)
        missing = [key for key in by_key if key not in states]
        loaded = {k: projection.decode(v) for k, v in self.views.load(name, missing).items()}
        try:
            after = {
                key: projection.forget_run(
                    states[key] if key in states else loaded.get(key, projection.initial()),
                    deletion.run_id,
                    part,
                )
                for key, part in by_key.items()
            }
        except ProjectionError:
            raise
        except Exception as failure:
            raise ProjectionError(name, deletion, failure) from failure
        return after

    def _keys(self, projection: Projection[Any], events: list[Event]) -> list[str | None]:
        """Each event's partition key, None for events the projection does not see."""
        relevant = projection.relevant
        if type(projection).key is not Projection.key:
            return [
                projection.key(e, self._pipeline(e.run_id, projection)) if relevant(e) else None
                for e in events
            ]
        if projection.scope == "all":
            return ["" if relevant(e) else None for e in events]
        # Dicts keyed by UUID.int: hashing a UUID and str(UUID) are slow Python code,
        # and a page repeats the same few runs.
        if projection.scope == "pipeline":
            known = self._pipelines
            return [
                (known.get(e.run_id.int) or self._pipeline(e.run_id, projection))
                if relevant(e)
                else None
                for e in events
            ]
        texts: dict[int, str] = {}
        return [
            (texts.get(e.run_id.int) or texts.setdefault(e.run_id.int, str(e.run_id)))
            if relevant(e)
            else None
            for e in events
        ]

    def _states(
        self, name: str, projection: Projection[Any], keys: list[str | None], start: int
    ) -> tuple[_Cached, set[str]]:
        """The cached states of `name` at `start`, those of `keys` not cached loaded (or
        initial): all of them, and the keys loaded."""
        position, cached = self._cache.get(name, (-1, _Cached()))
        if position != start or len(cached) > _CACHE_LIMIT:
            cached = _Cached()
        missing = [key for key in set(keys) if key is not None and key not in cached]
        for key, data in self.views.load(name, missing).items():
            cached[key] = projection.decode(data)
        for key in missing:
            cached.setdefault(key, projection.initial())
        self._cache[name] = (start, cached)
        return cached, set(missing)

    def _remember(self, name: str, end: int) -> None:
        cached = self._cache.get(name, (-1, _Cached()))[1]
        self._cache[name] = (end, cached)

    def _learn_pipelines(self, events: Iterable[Event]) -> None:
        if len(self._pipelines) > _CACHE_LIMIT:
            self._pipelines.clear()
        for event in events:
            if isinstance(event, RunStarted):
                self._pipelines[event.run_id.int] = event.pipeline

    def _pipeline(self, run_id: UUID, projection: Projection[Any]) -> str | None:
        if projection.scope != "pipeline":
            return None
        if run_id.int not in self._pipelines:
            row = self.views.load(RunIndex.name, [str(run_id)]).get(str(run_id))
            self._pipelines[run_id.int] = "" if row is None else row["pipeline"]
        return self._pipelines[run_id.int]

    def reset(self, name: str) -> None:
        """Discard `name`'s materialized state and position: the next catch-up starts over."""
        projection = self.projection(name)
        with self._lock:
            self._unchecked.discard(name)  # the reset records this code's fingerprint
            self.views.reset(name, projection.identity())
            self._cache.pop(name, None)
            if name == RunIndex.name:
                self._pipelines.clear()

    def reset_stored(self) -> None:
        """Reset every projection the store keeps, registered in this engine or not.

        Before runs are erased (`Engine.compact`): a projection another program
        registered keeps its code's fingerprint and folds again from the first
        event when it next catches up, so no stored state remembers an erased run.
        """
        with self._lock:
            self._check(self.names)
            stored = self.views.errors()  # every projection registered in the store
            for name in sorted(set(stored) | set(self._registered)):
                known = self._registered.get(name)
                fingerprint = known.identity() if known else self.views.fingerprint(name)
                if fingerprint is not None:
                    self.views.reset(name, fingerprint)
            self._cache.clear()
            self._pipelines.clear()

    def unforgetting(self) -> list[str]:
        """The stored projections that cannot forget a deleted run as they fold its deletion.

        A registered one scoped by pipeline, by all or by a key of its own without
        `Projection.forget`, and any stored projection this engine does not register
        (its code is elsewhere): `Engine.compact` resets these and folds again the ones
        registered here.
        """
        with self._lock:
            self._check(self.names)
            stored = set(self.views.errors()) | set(self._registered)
            return sorted(
                name
                for name in stored
                if name not in self._registered
                or (self._registered[name].scope != "run" and not self._registered[name].forgets)
            )

    def inexact(self) -> list[str]:
        """The registered projections with a stored state that forgetting left inexact
        (`Projection.exact`): `Engine.compact` folds these again."""
        with self._lock:
            self._check(self.names)
            return [
                name
                for name, projection in sorted(self._registered.items())
                if type(projection).exact is not Projection.exact
                and not all(
                    projection.exact(projection.decode(data))
                    for data in self.views.states(name).values()
                )
            ]

    def reset_named(self, names: Iterable[str]) -> None:
        """Reset each projection in `names`, registered in this engine or only stored."""
        with self._lock:
            self._check(names := list(names))
            for name in names:
                known = self._registered.get(name)
                fingerprint = known.identity() if known else self.views.fingerprint(name)
                if fingerprint is not None:
                    self.views.reset(name, fingerprint)
                self._cache.pop(name, None)

    def drop_runs(self, run_ids: Sequence[UUID]) -> None:
        """Delete erased runs' run-index rows and partitions of the projections scoped by run."""
        names = [n for n, p in self._registered.items() if p.scope == "run" and n != RunIndex.name]
        with self._lock:
            self._check(names)
            self.views.drop_runs([str(run_id) for run_id in run_ids], names)
            for name in [*names, RunIndex.name]:
                cached = self._cache.get(name, (-1, _Cached()))[1]
                for run_id in run_ids:
                    cached.pop(str(run_id), None)

    def rebuild(self, name: str, *, on_progress: Progress | None = None) -> int:
        """Fold projection `name` again from the first event; return the events folded."""
        with self._lock:
            self.reset(name)
            return self._catch_up(self._with_run_index([name]), self.head(), on_progress)[name]

    def get(self, name: str, key: str | UUID = "", *, catch_up: bool = True) -> Any:
        """The materialized state of `name` (for partitioned ones, of the partition `key`)."""
        projection = self.projection(name)
        if catch_up:
            self.catch_up([name])
        self._check([name])
        data = self.views.load(name, [str(key)])
        return projection.decode(data[str(key)]) if str(key) in data else projection.initial()

    def states(self, name: str, *, catch_up: bool = True) -> dict[str, Any]:
        """Every partition's materialized state of `name`, by key."""
        projection = self.projection(name)
        if catch_up:
            self.catch_up([name])
        self._check([name])
        return {key: projection.decode(data) for key, data in self.views.states(name).items()}

    def runs(self, query: RunQuery) -> list[RunSummary]:
        """Run summaries matching `query`, newest first, after catching the index up."""
        if RunIndex.name not in self._registered:
            self.register(RunIndex)  # where views cannot be kept, this says why
        self.catch_up([RunIndex.name])
        index = self._registered[RunIndex.name]
        return [index.decode(data) for data in self.views.runs(query)]

    def run_ids(self, prefix: str, *, limit: int = 10) -> list[UUID]:
        """Ids of the runs whose id starts with `prefix` (after catching the index up)."""
        self.runs(RunQuery(limit=1))  # registers and catches up the index
        return [UUID(text) for text in self.views.run_ids(prefix.lower(), limit)]

    def status(self) -> list[ProjectionStatus]:
        """Position, head, lag and last error of every registered projection."""
        self._check(self.names)
        head = self.head()
        positions = self.views.positions(self.names)
        errors = self.views.errors()
        return [
            ProjectionStatus(n, positions[n], head, max(head - positions[n], 0), errors.get(n))
            for n in self.names
        ]

    def follow(self, stop: threading.Event, *, timeout: float = 1.0) -> None:
        """Catch up, then wait for new events (NOTIFY on PostgreSQL, else polling) until `stop`.

        `timeout` bounds each wait, so a lost notification delays folding by at most that.
        A failing projection keeps its error in `status` while the others go on; a
        database that fails (a restart, a dropped connection) is retried after `timeout`.
        """
        while not stop.is_set():
            try:
                self.catch_up()
            except (ProjectionError, ProjectionStateError, ProjectionReplaced):
                pass  # recorded in `status`; the other projections were caught up
            except Exception as error:  # the database: keep following, try again later
                _log.warning("catching up failed, retrying in %.1f s: %s", timeout, error)
                stop.wait(timeout)
            self.views.wait_for_events(timeout, stop)

    def __repr__(self) -> str:
        return f"Projections({self.names})"


def _scattered(
    mapper: EventMapper, runs: list[UUID], rows: list[StoredRow], by_run: dict[int, list[int]]
) -> list[Event]:
    """The events of `rows` of several runs (their indexes `by_run`), in the rows' order, each
    run's many decoded as a page (`Projections._decoded`)."""
    events: list[Any] = [None] * len(rows)
    for indexes in by_run.values():
        part = [rows[index] for index in indexes]
        run = runs[indexes[0]]
        if len(part) < RUN_PAGE_MIN:
            decoded = [mapper.alone(run, row) for row in part]
        else:
            decoded = mapper.from_rows(run, part)
        for index, event in zip(indexes, decoded, strict=True):
            events[index] = event
    return events


def _folded_by_key(
    projection: Projection[Any],
    events: list[Event],
    keys: list[str | None],
    states: dict[str, Any],
    end: int,
) -> _PageFold | None:
    """A page folded into `states` a key's events at once, by the projection's own fold
    (`RunIndex`'s takes a stretch of outcomes into one summary, not one per event).

    None, `states` untouched, where that cannot stand for folding the page event by event:
    a projection that delivers, or forgets deleted runs, or has no fold of its own (one by
    one is as fast), and a fold that failed (event by event names the event, and keeps what
    came before it). States are values, so folding a key's events apart from the others'
    gives what folding them in the page's order gives.
    """
    if projection.delivers or _forgetting(projection):
        return None
    if not folds_faster(projection):
        return None
    by_key = _by_key(keys, events)
    fold, apply = projection.fold, projection.apply
    try:
        folded = {
            key: fold(part, states[key]) if len(part) >= FOLD_MIN
            else _applied(apply, part, states[key])
            for key, part in by_key.items()
        }  # fmt: skip
    except Exception:  # told again, with where it stops, event by event
        return None
    states.update(folded)
    return _PageFold(set(folded), end, None, keys, None)


def _applied(apply: Callable[[Any, Event], Any], events: list[Event], state: Any) -> Any:
    """`state` after `events` given to `apply` one by one (a key's few in a page)."""
    for event in events:
        state = apply(state, event)
    return state


def _by_key(keys: list[str | None], events: list[Event]) -> dict[str, list[Event]]:
    """The events of each key, in order (those of key None left out)."""
    first = keys[0] if keys else None
    if first is not None and keys.count(first) == len(keys):  # one run's page, a long run's
        return {first: events}
    by_key: dict[str, list[Event]] = {}
    for key, event in zip(keys, events, strict=True):
        if key is not None:
            by_key.setdefault(key, []).append(event)
    return by_key


def _forgetting(projection: Projection[Any]) -> bool:
    """Whether persistent use takes a deleted run out of `projection` as it folds the deletion."""
    return projection.scope != "run" and projection.forgets


def deletes(event: Event) -> bool:
    """Whether `event` deletes its run (`RunDeleted`, or `RunFinished` as ``deleted``)."""
    return type(event) is RunDeleted or (type(event) is RunFinished and event.status == "deleted")
