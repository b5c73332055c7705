"""What persistent views store, independent of the database that stores them."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

import attrs

from engine.store.codec import Codec
from engine.store.errors import StoreError
from projections.run_index import iso


@attrs.frozen
class PageSave:
    """One projection's folded page: its new states and the positions it moves between."""

    name: str
    start: int
    end: int
    states: dict[str, Any]
    fingerprint: str
    generation: int | None = None
    """The erasure generation the page was read in: a commit in another one is refused."""
    resets: int | None = None
    """The store's count of projection resets when `start` was read: a commit after another
    reset is refused (the reset may have folded back to `start` with other states)."""


@attrs.frozen
class RunQuery:
    """A filter over the run index."""

    status: str | None = None
    pipeline: str | None = None
    labels: dict[str, str] = attrs.field(factory=dict)
    since: datetime | None = None
    parent: str | None = None
    limit: int = 100
    offset: int = 0
    """How many of the newest matching runs to pass over (a page of a listing)."""

    def where(self, labels_table: str, codec: Codec) -> tuple[str, list[Any]]:
        """An SQL WHERE clause (with ? placeholders) and its parameters.

        Pipeline names and labels are compared as the `codec`'s digests, as stored.
        """
        clauses: list[str] = []
        params: list[Any] = []
        pipeline = None if self.pipeline is None else codec.digest(self.pipeline)
        for column, value in (
            ("status", self.status),
            ("pipeline", pipeline),
            ("parent_run_id", self.parent),
        ):
            if value is not None:
                clauses.append(f"{column}=?")
                params.append(value)
        if self.since is not None:
            clauses.append("started>=?")
            params.append(iso(self.since))
        for key, value in self.labels.items():
            clauses.append(f"run_id IN (SELECT run_id FROM {labels_table} WHERE label=?)")
            params.append(codec.digest(label_text(key, value)))
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

    def matches(self, data: dict[str, Any]) -> bool:
        """Whether an encoded run summary passes this filter (for in-memory stores)."""
        checks = (
            self.status is None or data["status"] == self.status,
            self.pipeline is None or data["pipeline"] == self.pipeline,
            self.parent is None or data["parent_run_id"] == self.parent,
            self.since is None or data["started"] >= iso(self.since),
            all(data["labels"].get(k) == v for k, v in self.labels.items()),
        )
        return all(checks)


def run_columns(data: dict[str, Any], codec: Codec) -> tuple[Any, ...]:
    """The indexed columns of an encoded run summary: ids, status, times, a pipeline digest.

    Everything else (the state, the labels, what the run did) is only in the sealed summary.
    """
    return (
        data["run_id"],
        codec.digest(data["pipeline"]),
        data["status"],
        data["started"],
        data["finished"],
        data["parent_run_id"],
    )


def label_text(key: str, value: str) -> str:
    """One label as the text its digest is taken of (unambiguous, whatever the key holds)."""
    return json.dumps([key, value], ensure_ascii=False, separators=(",", ":"))


class Views(Protocol):
    """Storage of persistent projections, snapshots and tracking, in one database."""

    codec: Codec
    """Seals what is stored (snapshots are sealed by their caller with it)."""

    def register(self, name: str, fingerprint: str) -> bool:
        """Record a projection; reset it when its code changed (True if it did)."""

    def reset(self, name: str, fingerprint: str) -> None:
        """Discard a projection's state and position."""

    def fingerprint(self, name: str) -> str | None:
        """The code fingerprint `name`'s stored state was folded by (None: not registered)."""

    def resets(self) -> int:
        """How many times a projection was reset; read before the positions a page starts at."""

    def positions(self, names: Sequence[str]) -> dict[str, int]:
        """Each projection's position in the notification log."""

    def resets_and_positions(self, names: Sequence[str]) -> tuple[int, dict[str, int]]:
        """`resets()` then `positions(names)`, read together where the storage can."""

    def load(self, name: str, keys: Sequence[str]) -> dict[str, Any]:
        """Stored states by key."""

    def commit(self, saves: Sequence[PageSave]) -> None:
        """Save pages and tracking records atomically, or raise `PositionMoved`."""

    def record_error(self, name: str, error: str) -> None:
        """Keep the error that stopped a projection."""

    def drop_runs(self, run_ids: Sequence[str], names: Sequence[str]) -> None:
        """Delete erased runs' rows of the run index and their partitions of `names`."""

    def errors(self) -> dict[str, str | None]:
        """The last error of every registered projection."""

    def states(self, name: str) -> dict[str, Any]:
        """Every stored state of a projection."""

    def runs(self, query: RunQuery) -> list[Any]:
        """Run index rows matching `query`, newest first."""

    def run_ids(self, prefix: str, limit: int) -> list[str]:
        """Ids (text) of indexed runs that start with `prefix`, at most `limit`."""

    def snapshot(
        self, run_id: str, projection: str, fingerprint: str, generation: int, version: int
    ) -> tuple[int, bytes] | None:
        """The newest snapshot (version, sealed state) of `generation` up to `version`."""

    def save_snapshots(
        self,
        run_id: str,
        projection: str,
        fingerprint: str,
        generation: int,
        states: Sequence[tuple[int, bytes]],
    ) -> None:
        """Store snapshots (version, sealed state) of one run's projection, read in `generation`."""

    def wait_for_events(self, timeout: float, stop: threading.Event) -> bool:
        """Block until new events may have arrived or `timeout` passes; True if notified."""


class NoViews:
    """Stands in for views a store cannot keep (e.g. read-only), failing with the reason."""

    def __init__(self, url: str, problem: str) -> None:
        self._error = StoreError(url, f"cannot keep projections in this store ({problem})")

    def __getattr__(self, name: str) -> Any:
        raise self._error
