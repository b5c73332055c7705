"""The in-memory backend (tests, notebooks): eventsourcing's POPO recorders, views in dicts."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent, Tracking
from eventsourcing.popo import POPOApplicationRecorder, POPOTrackingRecorder

from engine.store import meta
from engine.store.backend import Backend
from engine.store.views import PageSave, RunQuery
from projections.errors import PositionMoved, ProjectionReplaced


class MemoryViews(POPOTrackingRecorder):
    """Views kept in dicts; tracking records in eventsourcing's POPO tracking recorder."""

    def __init__(self) -> None:
        super().__init__()
        self._fingerprints: dict[str, str] = {}
        self._errors: dict[str, str | None] = {}
        self._states: dict[str, dict[str, Any]] = {}
        self._snapshots: dict[tuple[str, str, str], dict[int, str]] = {}

    def register(self, name: str, fingerprint: str) -> bool:
        """Record a projection; reset it when its code changed (True if it did)."""
        with self._database_lock:
            known = self._fingerprints.get(name)
            if known == fingerprint:
                return False
            self._reset(name, fingerprint)
            return known is not None

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
        self, run_id: str, projection: str, fingerprint: str, version: int
    ) -> tuple[int, str] | None:
        """The newest snapshot (version, JSON text) at or before `version`."""
        with self._database_lock:
            stored = self._snapshots.get((run_id, projection, fingerprint), {})
            best = max((v for v in stored if v <= version), default=None)
            return None if best is None else (best, stored[best])

    def save_snapshots(
        self, run_id: str, projection: str, fingerprint: str, states: Sequence[tuple[int, str]]
    ) -> None:
        """Store snapshots (version, JSON text) of one run's projection."""
        with self._database_lock:
            stored = self._snapshots.setdefault((run_id, projection, fingerprint), {})
            for version, text in states:
                stored.setdefault(version, text)

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """No notifications in memory: wait out the poll interval (or until stopped)."""
        stop.wait(timeout)
        return False


class MemoryRecorder(POPOApplicationRecorder):
    """eventsourcing's in-memory recorder, reading a run's newest events without a scan.

    The POPO recorder walks every version of a run to select the ones after `gt`,
    so re-reading a run's few new events (as the supervisor does after a stage
    function records its own) cost O(run length). A run's versions are 1..n with
    no gap (the engine's fold refuses any other), so they are looked up directly.
    """

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


def open_memory(settings: meta.AtRest) -> Backend:
    """A new, empty in-memory store (nothing outlives the engine)."""
    return Backend(MemoryRecorder(), settings.mapper(), lambda: None, MemoryViews())
