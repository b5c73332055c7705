"""The in-memory backend (tests, notebooks): eventsourcing's POPO recorders, views in dicts."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent, Tracking
from eventsourcing.popo import POPOApplicationRecorder, POPOTrackingRecorder

from engine.store import meta
from engine.store.backend import Backend
from engine.store.codec import Codec
from engine.store.views import PageSave, RunQuery
from projections.errors import PositionMoved, ProjectionReplaced


class MemoryViews(POPOTrackingRecorder):
    """Views kept in dicts; tracking records in eventsourcing's POPO tracking recorder.

    Nothing leaves the process, so states stay values; snapshots arrive sealed by `codec`.
    """

    def __init__(self, codec: Codec) -> None:
        super().__init__()
        self.codec = codec
        self._fingerprints: dict[str, str] = {}
        self._errors: dict[str, str | None] = {}
        self._states: dict[str, dict[str, Any]] = {}
        self._snapshots: dict[tuple[str, str, str, int], dict[int, bytes]] = {}

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
        self._fingerprints[name] = fingerprint
        self._errors[name] = None
        self._states[name] = {}
        self._max_tracking_ids[name] = None

    def positions(self, names: Sequence[str]) -> dict[str, int]:
        """Each projection's position in the notification log."""
        with self._database_lock:
            return {name: self._max_tracking_ids[name] or 0 for name in names}

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
                found = self._max_tracking_ids[save.name] or 0
                if found != save.start:
                    raise PositionMoved(save.name, save.start, found)
            for save in saves:
                self._states.setdefault(save.name, {}).update(copy.deepcopy(save.states))
                self._errors[save.name] = None
                self._insert_tracking(Tracking(save.name, save.end))

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
        return copy.deepcopy(rows[: query.limit])

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
        """Store snapshots (version, sealed state) of one run's projection."""
        with self._database_lock:
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

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """No notifications in memory: wait out the poll interval (or until stopped)."""
        stop.wait(timeout)
        return False


class MemoryRecorder(POPOApplicationRecorder):
    """eventsourcing's in-memory recorder, reading a run's newest events without a scan.

    It counts its erasures (`generation`), as the SQL stores do in their meta table.

    The POPO recorder walks every version of a run to select the ones after `gt`,
    so re-reading a run's few new events (as the supervisor does after a stage
    function records its own) cost O(run length). A run's versions are 1..n with
    no gap (the engine's fold refuses any other), so they are looked up directly.
    """

    generation = 0
    """How many times `erase` removed runs."""

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
            index = self._stored_events_index[str(originator_id)]
            last = next(reversed(index), 0) if index else 0
            if desc or last != len(index):  # not 1..n: eventsourcing's general scan
                return super().select_events(originator_id, gt=gt, lte=lte, desc=desc, limit=limit)
            start = max(gt or 0, 0) + 1
            stop = last if lte is None else min(lte, last)
            if limit is not None:
                stop = min(stop, start + limit - 1)
            return [self._stored_events[index[v]] for v in range(start, stop + 1)]

    def erase(self, run_ids: Sequence[UUID]) -> int:
        """Remove the runs' events; their notification ids stay taken (gaps, as in SQL)."""
        removed = 0
        with self._database_lock:
            self.generation += 1
            for run_id in run_ids:
                index = self._stored_events_index.pop(str(run_id), {})
                for position in index.values():
                    self._stored_events[position] = None  # type: ignore[call-overload]
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
        views.erase_snapshots(run_ids)
        return recorder.erase(run_ids)

    def generation() -> int:
        return recorder.generation

    return Backend(
        recorder, mapper, lambda: None, views, erase=erase, codec=codec, generation=generation
    )
