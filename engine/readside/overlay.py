"""Projections over a store opened read-only: the stored views, with newer events folded in memory.

A read-only file, a read-only role or a read replica cannot save projection
states, yet `runs()`, `projections status` and `get` must still answer from every
committed event. `ReadOnlyViews` reads what the store holds (when its views are
current for the projection's code) and keeps whatever this process folds beyond
that in memory, layered on top. Nothing is ever written to the store.

What memory holds was folded from runs that another process may erase (and
whose ids may come back as new runs): every read first checks the store's
erasure generation and, when it moved, folds again from what the store holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from engine.store.codec import Codec
from engine.store.failures import classify
from engine.store.views import PageSave, RunQuery
from events.errors import StagetrailError
from projections.errors import PositionMoved

_log = logging.getLogger(__name__)


class ReadOnlyViews:
    """`Views` that read the store's own views and fold newer pages in memory.

    Args:
        url: the store's masked URL, for errors.
        base: the store's views (read from, never written), or None when the
            store has none this user can read (then everything folds in memory).
        codec: the store's serializer (stored snapshots are sealed with it).
        generation: the store's erasure generation (`Store.generation`).
    """

    def __init__(
        self, url: str, base: Any | None, codec: Codec, generation: Callable[[], int]
    ) -> None:
        self._url = url
        self._base = _readable(base)
        self.codec = codec
        self._generation = generation
        self._lock = threading.Lock()
        self._fingerprints: dict[str, str] = {}  # name -> the registered code's fingerprint
        self._from_base: dict[str, bool] = {}  # name -> stored state is current for its code
        self._positions: dict[str, int] = {}
        self._marks: dict[str, tuple[int, int]] = {}  # name -> stored (resets, position) layered on
        self._states: dict[str, dict[str, Any]] = {}
        self._errors: dict[str, str | None] = {}
        self._resets = 0
        self._seen = self._read_generation()

    def register(self, name: str, fingerprint: str) -> bool:
        """Use the stored state of `name` when it was folded by this code; never reset it."""
        with self._lock:
            if name in self._from_base:
                return False
            self._fingerprints[name] = fingerprint
            stored = self._layer(name)
            return stored is not None and stored != fingerprint

    def _layer(self, name: str) -> str | None:
        """Start `name` afresh over the store's state (if current for its code); the stored
        fingerprint."""
        stored = self._stored_fingerprint(name)
        self._from_base[name] = stored == self._fingerprints[name]
        self._marks[name] = self._base_mark(name) if self._from_base[name] else (0, 0)
        self._positions[name] = self._marks[name][1]
        self._states[name] = {}
        self._errors[name] = None
        return stored

    def _follow_generation(self) -> None:
        """Fold again over what the store holds when runs were erased since memory was folded."""
        generation = self._read_generation()
        with self._lock:
            if generation == self._seen:
                return
            self._seen = generation
            for name in self._from_base:
                self._layer(name)

    def _read_generation(self) -> int:
        try:
            return self._generation()
        except StagetrailError:
            raise
        except Exception as error:
            raise classify(self._url, error, "cannot read the store's generation") from error

    def _stored_fingerprint(self, name: str) -> str | None:
        if self._base is None:
            return None
        try:
            return self._base.fingerprint(name)  # type: ignore[no-any-return]
        except Exception as error:  # views the role may not read: fold from zero instead
            _log.debug("stored views unreadable, folding in memory: %s", error)
            self._base = None
            return None

    def _base_mark(self, name: str) -> tuple[int, int]:
        """The store's count of projection resets, then `name`'s stored position."""
        assert self._base is not None
        resets = int(self._read("resets"))
        return resets, int(self._read("positions", [name])[name])

    def fingerprint(self, name: str) -> str | None:
        """The fingerprint `name` was registered with here, else the stored one."""
        with self._lock:
            if name in self._fingerprints:
                return self._fingerprints[name]
        return self._stored_fingerprint(name)

    def reset(self, name: str, fingerprint: str) -> None:
        """Fold `name` from zero in memory (the stored state is left as it is)."""
        with self._lock:
            self._resets += 1
            self._from_base[name] = False
            self._positions[name] = 0
            self._states[name] = {}
            self._errors[name] = None

    def resets(self) -> int:
        """How many times this process reset a projection in memory."""
        with self._lock:
            return self._resets

    def positions(self, names: Sequence[str]) -> dict[str, int]:
        """Each projection's position: the stored one, or as far as memory got."""
        self._follow_generation()
        with self._lock:
            return {name: self._positions.get(name, 0) for name in names}

    def resets_and_positions(self, names: Sequence[str]) -> tuple[int, dict[str, int]]:
        """This process's count of resets and each projection's position, under one lock."""
        self._follow_generation()
        with self._lock:
            return self._resets, {name: self._positions.get(name, 0) for name in names}

    def load(self, name: str, keys: Sequence[str]) -> dict[str, Any]:
        """States by key: folded in memory first, else as stored."""
        self._follow_generation()
        with self._lock:
            found = {k: self._states[name][k] for k in keys if k in self._states.get(name, {})}
            use_base = self._from_base.get(name, False)
        missing = [key for key in keys if key not in found]
        if use_base and missing and self._base is not None:
            found.update(self._read("load", name, missing))
            self._check_layer(name)
        return found

    def _check_layer(self, name: str) -> None:
        """Layer `name` again if the stored state moved since memory was layered on it.

        States just loaded from the store may then hold events memory folds too; the
        page being folded is refused (`commit` sees the position moved) and folded again.
        """
        mark = self._base_mark(name)
        with self._lock:
            if self._from_base.get(name) and mark != self._marks.get(name):
                self._layer(name)

    def commit(self, saves: Sequence[PageSave]) -> None:
        """Keep folded pages in memory, checking positions as a store would."""
        with self._lock:
            for save in saves:
                moved = save.resets not in (None, self._resets)
                if moved or self._positions.get(save.name, 0) != save.start:
                    raise PositionMoved(save.name, save.start, self._positions.get(save.name, 0))
            for save in saves:
                self._states.setdefault(save.name, {}).update(save.states)
                self._positions[save.name] = save.end
                self._errors[save.name] = None

    def drop_runs(self, run_ids: Sequence[str], names: Sequence[str]) -> None:
        """Forget erased runs' partitions folded in memory (what is stored is left alone)."""
        with self._lock:
            for name in {*names, "run_index"}:
                for run_id in run_ids:
                    self._states.get(name, {}).pop(run_id, None)

    def record_error(self, name: str, error: str) -> None:
        """Keep the error that stopped a projection (in memory)."""
        with self._lock:
            self._errors[name] = error

    def errors(self) -> dict[str, str | None]:
        """The last error of every projection the store keeps or this process registered."""
        stored = self._read("errors") if self._base is not None else {}
        with self._lock:
            return {**stored, **{name: self._errors.get(name) for name in self._from_base}}

    def _read(self, method: str, *args: Any) -> Any:
        """Call a reading method of the stored views; a database failure is a StoreError."""
        try:
            return getattr(self._base, method)(*args)
        except StagetrailError:
            raise
        except Exception as error:
            raise classify(self._url, error, "cannot read the stored projections") from error

    def states(self, name: str) -> dict[str, Any]:
        """Every state of `name`: stored ones overlaid by those folded in memory."""
        self._follow_generation()
        with self._lock:
            use_base = self._from_base.get(name, False)
            mine = dict(self._states.get(name, {}))
        stored = self._read("states", name) if use_base and self._base is not None else {}
        return {**stored, **mine}

    def runs(self, query: RunQuery) -> list[Any]:
        """Run index rows matching `query`, newest first, memory's rows replacing stored ones."""
        name = "run_index"
        self._follow_generation()
        with self._lock:
            mine = dict(self._states.get(name, {}))
            use_base = self._from_base.get(name, False)
        rows = [data for data in mine.values() if query.matches(data)]
        if use_base and self._base is not None:
            wider = RunQuery(
                status=query.status,
                pipeline=query.pipeline,
                labels=query.labels,
                since=query.since,
                parent=query.parent,
                limit=query.offset + query.limit + len(mine),
            )
            rows += [data for data in self._read("runs", wider) if data["run_id"] not in mine]
        rows.sort(key=lambda data: (data["started"], data["run_id"]), reverse=True)
        return rows[query.offset : query.offset + query.limit]

    def run_ids(self, prefix: str, limit: int) -> list[str]:
        """Ids of indexed runs starting with `prefix`, from both layers."""
        self._follow_generation()
        with self._lock:
            found = {key for key in self._states.get("run_index", {}) if key.startswith(prefix)}
            use_base = self._from_base.get("run_index", False)
        if use_base and self._base is not None:
            found.update(self._read("run_ids", prefix, limit))
        return sorted(found)[:limit]

    def snapshot(
        self, run_id: str, projection: str, fingerprint: str, generation: int, version: int
    ) -> tuple[int, bytes] | None:
        """A stored snapshot, if the store has one (keyed by code and erasure generation)."""
        if self._base is None:
            return None
        found = self._read("snapshot", run_id, projection, fingerprint, generation, version)
        return found  # type: ignore[no-any-return]

    def save_snapshots(
        self,
        run_id: str,
        projection: str,
        fingerprint: str,
        generation: int,
        states: Sequence[tuple[int, bytes]],
    ) -> None:
        """Nothing: a read-only store keeps no new snapshots (answers stay correct)."""

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """Wait as the store's views do (NOTIFY on PostgreSQL), or poll."""
        if self._base is None:
            stop.wait(timeout)
            return False
        return bool(self._base.wait_for_events(timeout, stop))

    def close_listener(self) -> None:
        """Close the stored views' LISTEN connection, if any."""
        close = getattr(self._base, "close_listener", None)
        if close is not None:
            close()


def _readable(base: Any | None) -> Any | None:
    """`base` if this code can read its tables (they may be of an older shape, or unreadable)."""
    if base is None:
        return None
    try:
        if base.current():
            return base
    except Exception as error:  # views the role may not read: fold from zero instead
        _log.debug("stored views unreadable, folding in memory: %s", error)
    return None
