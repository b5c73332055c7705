"""The in-memory backend (tests, notebooks): eventsourcing's recorder interfaces over a list."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    ApplicationRecorder,
    IntegrityError,
    Notification,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)

from engine.store import meta
from engine.store.backend import Backend
from engine.store.codec import Codec
from engine.store.errors import HeadMissing
from engine.store.views import PageSave, RunQuery
from projections.errors import PositionMoved, ProjectionReplaced


class MemoryViews(TrackingRecorder):
    """Views kept in dicts; tracking records through eventsourcing's tracking recorder interface.

    Nothing leaves the process, so states stay values; snapshots arrive sealed by `codec`.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._database_lock = threading.Lock()
        self._max_tracking_ids: dict[str, int | None] = {}
        self._fingerprints: dict[str, str] = {}
        self._errors: dict[str, str | None] = {}
        self._states: dict[str, dict[str, Any]] = {}
        self._snapshots: dict[tuple[str, str, str, int], dict[int, bytes]] = {}
        self._resets = 0
        self.generation: Callable[[], int] = lambda: 0
        """The store's erasure generation now (the recorder's, set by `open_memory`)."""

    def register(self, name: str, fingerprint: str) -> bool:
        """Record a projection; reset it when its code changed (True if it did)."""
        with self._database_lock:
            known = self._fingerprints.get(name)
            if known == fingerprint:
                return False
            self._reset(name, fingerprint)
            return known is not None

    def fingerprint(self, name: str) -> str | None:
        """The code fingerprint `name` was registered with (None: not registered)."""
        with self._database_lock:
            return self._fingerprints.get(name)

    def reset(self, name: str, fingerprint: str) -> None:
        """Discard a projection's state and position."""
        with self._database_lock:
            self._reset(name, fingerprint)

    def _reset(self, name: str, fingerprint: str) -> None:
        self._resets += 1
        self._fingerprints[name] = fingerprint
        self._errors[name] = None
        self._states[name] = {}
        self._max_tracking_ids[name] = None

    def resets(self) -> int:
        """How many times a projection was reset."""
        with self._database_lock:
            return self._resets

    def positions(self, names: Sequence[str]) -> dict[str, int]:
        """Each projection's position in the notification log."""
        with self._database_lock:
            return {name: self._max_tracking_ids.get(name) or 0 for name in names}

    def resets_and_positions(self, names: Sequence[str]) -> tuple[int, dict[str, int]]:
        """The count of resets and each projection's position, under one lock."""
        with self._database_lock:
            positions = {name: self._max_tracking_ids.get(name) or 0 for name in names}
            return self._resets, positions

    def load(self, name: str, keys: Sequence[str]) -> dict[str, Any]:
        """Stored states by key (copies, as a database would return)."""
        with self._database_lock:
            states = self._states.get(name, {})
            return {key: copy.deepcopy(states[key]) for key in keys if key in states}

    def commit(self, saves: Sequence[PageSave]) -> None:
        """Save pages and tracking records atomically, or raise `PositionMoved`."""
        with self._database_lock:
            for save in saves:
                if self._fingerprints.get(save.name) != save.fingerprint:
                    raise ProjectionReplaced(save.name)
                found = self._max_tracking_ids.get(save.name) or 0
                if found != save.start or save.resets not in (None, self._resets):
                    raise PositionMoved(save.name, save.start, found)
            for save in saves:
                self._states.setdefault(save.name, {}).update(copy.deepcopy(save.states))
                self._errors[save.name] = None
                self._advance(Tracking(save.name, save.end))

    def drop_runs(self, run_ids: Sequence[str], names: Sequence[str]) -> None:
        """Delete erased runs' rows of the run index and their partitions of `names`."""
        with self._database_lock:
            for name in {*names, "run_index"}:
                states = self._states.get(name, {})
                for run_id in run_ids:
                    states.pop(run_id, None)

    def record_error(self, name: str, error: str) -> None:
        """Keep the error that stopped a projection."""
        with self._database_lock:
            self._errors[name] = error

    def errors(self) -> dict[str, str | None]:
        """The last error of every registered projection."""
        with self._database_lock:
            return dict(self._errors)

    def states(self, name: str) -> dict[str, Any]:
        """Every stored state of a projection."""
        with self._database_lock:
            return copy.deepcopy(self._states.get(name, {}))

    def runs(self, query: RunQuery) -> list[Any]:
        """Run index rows matching `query`, newest first."""
        with self._database_lock:
            rows = [d for d in self._states.get("run_index", {}).values() if query.matches(d)]
        rows.sort(key=lambda d: (d["started"], d["run_id"]), reverse=True)
        return copy.deepcopy(rows[query.offset : query.offset + query.limit])

    def run_ids(self, prefix: str, limit: int) -> list[str]:
        """Ids (text) of indexed runs that start with `prefix`, at most `limit`."""
        with self._database_lock:
            found = [key for key in self._states.get("run_index", {}) if key.startswith(prefix)]
        return sorted(found)[:limit]

    def snapshot(
        self, run_id: str, projection: str, fingerprint: str, generation: int, version: int
    ) -> tuple[int, bytes] | None:
        """The newest snapshot (version, sealed state) of `generation` at or before `version`."""
        with self._database_lock:
            stored = self._snapshots.get((run_id, projection, fingerprint, generation), {})
            best = max((v for v in stored if v <= version), default=None)
            return None if best is None else (best, stored[best])

    def save_snapshots(
        self,
        run_id: str,
        projection: str,
        fingerprint: str,
        generation: int,
        states: Sequence[tuple[int, bytes]],
    ) -> None:
        """Store snapshots (version, sealed state) of one run's projection, read in
        `generation`; nothing when runs were erased since (the run perhaps among them)."""
        with self._database_lock:
            if generation != self.generation():  # `erase` forgets snapshots after counting
                return
            key = (run_id, projection, fingerprint, generation)
            stored = self._snapshots.setdefault(key, {})
            for version, data in states:
                stored.setdefault(version, data)

    def erase_snapshots(self, run_ids: Sequence[UUID]) -> None:
        """Forget the snapshots of these runs."""
        names = {str(run_id) for run_id in run_ids}
        with self._database_lock:
            for key in [key for key in self._snapshots if key[0] in names]:
                del self._snapshots[key]

    def insert_tracking(self, tracking: Tracking) -> None:
        """Move a projection's position forward.

        Raises:
            IntegrityError: it is there or beyond already.
        """
        with self._database_lock:
            self._advance(tracking)

    def _advance(self, tracking: Tracking) -> None:
        known = self._max_tracking_ids.get(tracking.application_name)
        if known is not None and known >= tracking.notification_id:
            raise IntegrityError(
                f"Failed to record tracking for {tracking.application_name} "
                f"{tracking.notification_id}"
            )
        self._max_tracking_ids[tracking.application_name] = tracking.notification_id

    def max_tracking_id(self, application_name: str) -> int | None:
        """A projection's position (None: none recorded)."""
        with self._database_lock:
            return self._max_tracking_ids.get(application_name)

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """No notifications in memory: wait out the poll interval (or until stopped)."""
        stop.wait(timeout)
        return False


class MemoryRecorder(ApplicationRecorder):
    """eventsourcing's application recorder interface over a list, reading a run without a scan.

    It counts its erasures (`generation`), as the SQL stores do in their meta table.
    A run's versions are 1..n with no gap (the engine's fold refuses any other),
    so re-reading a run's few new events (as the supervisor does after a stage
    function records its own) looks them up directly instead of walking the run.
    """

    generation = 0
    """How many times `erase` removed runs."""

    def __init__(self) -> None:
        self._database_lock = threading.Lock()
        self._stored_events: list[StoredEvent | None] = []
        """By notification id - 1; None where `erase` removed one."""
        self._stored_events_index: dict[str, dict[int, int]] = {}
        """Each run's positions in `_stored_events` by version."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int]:
        """Append all of `stored_events` or none; their notification ids.

        Raises:
            IntegrityError: a version is taken, or given twice.
            HeadMissing: a run's event of `heads` (see `Store.write`) is not stored, or not
                with the bytes `head_states` gives.
        """
        heads: Sequence[tuple[UUID, int]] = kwargs.get("heads", ())
        states: Sequence[bytes | None] = kwargs.get("head_states") or [None] * len(heads)
        with self._database_lock:
            for (head, before), state in zip(heads, states, strict=True):
                position = self._stored_events_index.get(str(head), {}).get(before)
                held = None if position is None else self._stored_events[position]
                if held is None or (state is not None and held.state != state):
                    raise HeadMissing(f"run {head} holds no event {before} (or another)")
            keys = {(str(s.originator_id), s.originator_version) for s in stored_events}
            if len(keys) < len(stored_events):
                raise IntegrityError(f"Stored events are not unique: {stored_events}")
            for run_id, version in keys:
                if version in self._stored_events_index.get(run_id, ()):
                    raise IntegrityError(f"Stored event already recorded: {run_id} v{version}")
            ids = []
            for stored in stored_events:
                self._stored_events.append(stored)
                index = self._stored_events_index.setdefault(str(stored.originator_id), {})
                index[stored.originator_version] = len(self._stored_events) - 1
                ids.append(len(self._stored_events))
            return ids

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """The run's stored events with `gt < version <= lte`, at most `limit`."""
        with self._database_lock:
            index = self._stored_events_index.get(str(originator_id), {})
            last = next(reversed(index), 0) if index else 0
            if desc or last != len(index):  # not 1..n: the general scan
                versions = sorted(index, reverse=desc)
            else:
                start = max(gt or 0, 0) + 1
                versions = list(range(start, (last if lte is None else min(lte, last)) + 1))
            found: list[StoredEvent] = []
            for version in versions:
                if (gt is None or version > gt) and (lte is None or version <= lte):
                    stored = self._stored_events[index[version]]
                    assert stored is not None  # erase drops a run's index with its events
                    found.append(stored)
                    if len(found) == limit:
                        break
            return found

    def max_notification_id(self) -> int | None:
        """The newest notification id (None: nothing appended yet)."""
        with self._database_lock:
            return len(self._stored_events) or None

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        """Not kept in memory: followers poll (`MemoryViews.wait_for_events`)."""
        raise NotImplementedError("the memory store has no subscriptions; followers poll it")

    def erase(self, run_ids: Sequence[UUID]) -> int:
        """Remove the runs' events; their notification ids stay taken (gaps, as in SQL)."""
        removed = 0
        with self._database_lock:
            self.generation += 1
            for run_id in run_ids:
                index = self._stored_events_index.pop(str(run_id), {})
                for position in index.values():
                    self._stored_events[position] = None
                removed += len(index)
        return removed

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """eventsourcing's POPO selection, passing over the gaps `erase` left."""
        first = 1 if start is None else max(start + (0 if inclusive_of_start else 1), 1)
        found: list[Notification] = []
        with self._database_lock:
            end = len(self._stored_events) if stop is None else min(stop, len(self._stored_events))
            for position in range(first - 1, end):
                stored = self._stored_events[position]
                if stored is None or (topics and stored.topic not in topics):
                    continue
                found.append(
                    Notification(
                        id=position + 1,
                        originator_id=stored.originator_id,
                        originator_version=stored.originator_version,
                        topic=stored.topic,
                        state=stored.state,
                    )
                )
                if len(found) == limit:
                    break
        return found


def open_memory(settings: meta.AtRest) -> Backend:
    """A new, empty in-memory store (nothing outlives the engine)."""
    mapper = settings.mapper()
    codec = settings.codec(mapper)
    recorder, views = MemoryRecorder(), MemoryViews(codec)

    def erase(run_ids: Sequence[UUID]) -> int:
        removed = recorder.erase(run_ids)  # counted first: no older snapshot is saved after
        views.erase_snapshots(run_ids)
        return removed

    def generation() -> int:
        return recorder.generation

    views.generation = generation

    chain = meta.read_chain(meta.chain_rows(settings, 0))
    return Backend(
        recorder,
        mapper,
        lambda: None,
        views,
        erase=erase,
        codec=codec,
        generation=generation,
        chain=chain,
    )
