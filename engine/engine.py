"""The engine: a store plus the ways to start, load and read runs."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from engine import _urls
from engine.errors import ConcurrencyConflict, RunAlreadyExists, RunNotFound, StoreError
from engine.machine import RunState, apply, start
from engine.pipeline import Pipeline
from engine.run import Run
from engine.store import Store
from events import JSON, Event, InvalidEvent, RunStarted


class Engine:
    """Records and reads runs in one store.

    Args:
        url: the store; default ``$STAGETRAIL_STORE``, else ``sqlite:///stagetrail.db``.
        create: whether a missing store may be created.
        cipher_key: AES key for encryption at rest; default ``$STAGETRAIL_CIPHER_KEY``.

    Raises:
        StoreError: the store cannot be opened.
    """

    def __init__(
        self, url: str | None = None, *, create: bool = True, cipher_key: str | None = None
    ) -> None:
        key = cipher_key if cipher_key is not None else os.environ.get("STAGETRAIL_CIPHER_KEY")
        self.store = Store(url or _urls.default_url(), create=create, cipher_key=key)

    @property
    def url(self) -> str:
        """The store URL, password masked."""
        return self.store.url

    def start_run(
        self,
        pipeline: Pipeline,
        *,
        params: JSON = None,
        labels: Mapping[str, str] | None = None,
        parent: Run | UUID | None = None,
        run_id: UUID | None = None,
    ) -> Run:
        """Start a run of `pipeline`: append its `RunStarted`, return a live `Run`.

        Args:
            pipeline: the definition; its whole table is stored with the run.
            params: any strict JSON value describing this run's input.
            labels: str to str tags to filter runs by.
            parent: the parent run, for child pipelines.
            run_id: a chosen id (default: a new random UUID).
        """
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"start_run needs a Pipeline, got {type(pipeline).__name__}")
        event = RunStarted(
            run_id=run_id or uuid.uuid4(),
            version=1,
            pipeline=pipeline.name,
            table=pipeline.to_dict(),
            params={} if params is None else params,
            labels={} if labels is None else labels,  # type: ignore[arg-type]  # its converter checks
            parent_run_id=parent.id if isinstance(parent, Run) else parent,
        )
        state = start(pipeline, event)
        try:
            self.store.append([event])
        except ConcurrencyConflict:
            raise RunAlreadyExists(event.run_id) from None
        return Run(self.store, pipeline, state)

    def load(self, run_id: UUID | str) -> Run:
        """Rebuild a live `Run` from the store alone (after a crash, in another process).

        Raises:
            RunNotFound: no such run.
        """
        pipeline, state = self._fold(self._run_id(run_id))
        return Run(self.store, pipeline, state)

    def events(self, run_id: UUID | str, upto: int | datetime | None = None) -> list[Event]:
        """The run's events, oldest first; `upto` a version, or a time (events at or before it).

        Raises:
            RunNotFound: no such run.
            InvalidEvent: `upto` is negative, or a naive datetime.
        """
        rid = self._run_id(run_id)
        events = self._read(rid, upto)
        if not events and self.store.last(rid) is None:
            raise RunNotFound(rid, self.url)
        return events

    def close(self) -> None:
        """Release the store's connections."""
        self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Engine({self.url!r})"

    def _read(self, run_id: UUID, upto: int | datetime | None) -> list[Event]:
        if upto is None:
            return list(self.store.stream(run_id))
        if isinstance(upto, datetime):
            if upto.tzinfo is None:
                raise InvalidEvent("upto", "must be timezone-aware (naive datetimes are ambiguous)")
            stream = self.store.stream(run_id)
            return list(itertools.takewhile(lambda e: e.timestamp <= upto, stream))
        if type(upto) is not int or upto < 0:
            raise InvalidEvent("upto", f"must be a version (int >= 0) or a datetime, got {upto!r}")
        return list(self.store.stream(run_id, lte=upto))

    def _fold(self, run_id: UUID) -> tuple[Pipeline, RunState]:
        events = self.store.stream(run_id)
        first = next(events, None)
        if first is None:
            raise RunNotFound(run_id, self.url)
        if not isinstance(first, RunStarted):
            raise StoreError(self.url, f"run {run_id} does not begin with RunStarted")
        pipeline = Pipeline.from_dict(first.table)
        state = start(pipeline, first)
        for event in events:
            state = apply(pipeline, state, event)
        return pipeline, state

    def _run_id(self, run_id: UUID | str) -> UUID:
        if isinstance(run_id, UUID):
            return run_id
        try:
            return UUID(str(run_id))
        except ValueError:
            raise RunNotFound(run_id, self.url) from None
