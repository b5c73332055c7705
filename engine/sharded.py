"""Several stores (shards) as one engine: each run written to its shard, read as one union.

`ShardedEngine` opens an `Engine` per shard of a ``shards:`` layout
(`engine.store.shards`). A run lives in exactly one shard, found from its id alone,
so writes, per-run optimistic concurrency and every read of one run touch that
shard only. Lists (`runs`, run id prefixes, a run's tree) ask every shard for a
bounded page of its run index and merge them in the index's own order.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import attrs
from eventsourcing.persistence import StoredEvent

from engine import arguments
from engine.engine import (
    Compacted,
    Engine,
    child_id,
    lineage,
    merged_tree,
    readable,
    run_query,
)
from engine.errors import InvalidArgument, RunNotFound, StoreError
from engine.pipeline import Pipeline
from engine.store import urls
from engine.store.shards import Layout, is_sharded, load
from engine.store.views import RunQuery
from events import JSON, Event, RunFinished, RunStarted
from projections import Projection, RunIndex, RunSummary, as_projection

if TYPE_CHECKING:
    from engine.run import Run
    from engine.supervise import Supervisor
    from engine.verify import VerifyReport

T = TypeVar("T")
_ALL_CHILDREN = 1_000_000
_SAMPLED = 8
"""Oldest events of each shard whose runs must hash to it: a changed [shards] list shows."""


def open_engine(url: str | None = None, *, create: bool = False, read_only: bool = False) -> Any:
    """An `Engine`, or a `ShardedEngine` for a ``shards:`` URL (`read_only`: `for_reading`)."""
    chosen = url or urls.default_url()
    kind: Any = ShardedEngine if is_sharded(chosen) else Engine
    return kind.for_reading(chosen, create=create) if read_only else kind(chosen, create=create)


class ShardedEngine:
    """Records each run in its shard and reads all shards as one store.

    Args:
        url: a ``shards:PATH`` URL naming a layout file (`engine.store.shards`).
        create: whether missing shards may be created.
        read_only, cipher_key, max_event_bytes, settings, chain_key: as `Engine`'s,
            for every shard.

    Raises:
        StoreError: the layout is wrong, or a shard cannot be opened (none is left open).
    """

    layout: Layout
    shards: tuple[Engine, ...]
    """An engine per shard, in the layout's order."""
    store: ShardedStore
    """Per-run store calls (`read`, `stream`, `last`, `serialize`, `append`), in the run's shard."""
    projections: ShardedIndex
    """The run index of every shard as one: `runs`, `get`, `run_ids`, `catch_up`."""

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        cipher_key: str | None = None,
        max_event_bytes: int | None = None,
        read_only: bool = False,
        settings: Mapping[str, str] | None = None,
        chain_key: str | None = None,
    ) -> None:
        def opener(shard: str) -> Engine:
            return Engine(
                shard,
                create=create,
                cipher_key=cipher_key,
                max_event_bytes=max_event_bytes,
                read_only=read_only,
                settings=settings,
                chain_key=chain_key,
            )

        self._attach(load(url), opener)

    @classmethod
    def for_reading(cls, url: str, *, create: bool = False) -> ShardedEngine:
        """Each shard opened as `Engine.for_reading` opens one store (a reader writes no event)."""
        engine = cls.__new__(cls)
        engine._attach(load(url), lambda shard: Engine.for_reading(shard, create=create))
        return engine

    def _attach(self, layout: Layout, opener: Callable[[str], Engine]) -> None:
        """Open every shard of `layout` with `opener`, and the threads that ask them at once."""
        self.layout = layout
        self.shards = _open_all(layout, opener)
        from concurrent.futures import ThreadPoolExecutor  # here: a plain store needs no pool

        self._pool = ThreadPoolExecutor(len(self.shards), thread_name_prefix="stagetrail-shard")
        self._asking = threading.Lock()
        self.store = ShardedStore(self)
        self.projections = ShardedIndex(self)

    @property
    def url(self) -> str:
        """The ``shards:`` URL (each shard's own URL is in `shards`, masked)."""
        return self.layout.url

    def each(self, ask: Callable[[Engine], T]) -> list[T]:
        """`ask` of every shard, in shard order, the shards asked at the same time."""
        if len(self.shards) == 1:
            return [ask(self.shards[0])]
        with self._asking:  # one fan-out at a time: each shard's engine serves one asker
            return list(self._pool.map(ask, self.shards))

    def shard_of(self, run_id: UUID | str) -> Engine:
        """The engine of the shard that holds (or will hold) `run_id`."""
        return self.shards[self.layout.index_of(self._run_id(run_id))]

    def start_run(
        self,
        pipeline: Pipeline,
        *,
        params: JSON = None,
        labels: Mapping[str, str] | None = None,
        parent: Run | UUID | None = None,
        run_id: UUID | None = None,
    ) -> Run:
        """`Engine.start_run` in the shard the layout routes the run to (a chosen id: its hash)."""
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"start_run needs a Pipeline, got {type(pipeline).__name__}")
        chosen = run_id or self.layout.new_id(pipeline.name, labels)
        return self.shard_of(chosen).start_run(
            pipeline, params=params, labels=labels, parent=parent, run_id=chosen
        )

    def child_run(
        self,
        parent: Run | UUID | str,
        pipeline: Pipeline,
        *,
        key: str,
        params: JSON = None,
        labels: Mapping[str, str] | None = None,
    ) -> Run:
        """`Engine.child_run`: the parent read in its shard, the child kept in its own."""
        from engine.run import Run

        parent_id = parent.id if isinstance(parent, Run) else self._run_id(parent)
        run_id = child_id(parent_id, key, labels)
        if self.shard_of(parent_id).store.last(parent_id) is None:
            raise RunNotFound(parent_id, self.url)
        shard = self.shard_of(run_id)
        return shard._start_child(parent_id, run_id, pipeline, key, params, labels)

    def load(self, run_id: UUID | str) -> Run:
        """`Engine.load` from the run's shard."""
        return self.shard_of(run_id).load(run_id)

    def events(self, run_id: UUID | str, upto: int | datetime | None = None) -> list[Event]:
        """`Engine.events` from the run's shard."""
        return self.shard_of(run_id).events(run_id, upto)

    def project(
        self,
        run_id: UUID | str,
        projection: Any,
        *,
        at: int | datetime | None = None,
        tree: bool = False,
    ) -> Any:
        """`Engine.project`; with `tree`, the run's descendants are read from their shards."""
        if not tree:
            return self.shard_of(run_id).project(run_id, projection, at=at)
        rid = self._run_id(run_id)
        instance: Projection[Any] = as_projection(projection)
        if at is not None and not isinstance(at, datetime):
            raise InvalidArgument("at", "with tree=True, `at` must be a datetime")
        if at is not None:
            arguments.in_utc(at, "at")
        return instance.fold(merged_tree(self.tree(rid), self.store.stream, at))

    def tree(self, run_id: UUID | str) -> list[UUID]:
        """The run and its descendants in every shard, parents first (as `Engine.tree`)."""
        rid = self._run_id(run_id)
        if self.store.last(rid) is None:
            raise RunNotFound(rid, self.url)
        return lineage(
            rid,
            lambda parent: readable(self.runs(parent=parent, limit=_ALL_CHILDREN), self.store.last),
        )

    def runs(
        self,
        *,
        status: str | None = None,
        pipeline: str | None = None,
        label: str | Mapping[str, str] | Iterable[str] | None = None,
        since: datetime | None = None,
        parent: UUID | str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[RunSummary]:
        """`Engine.runs` over every shard: newest first, paged as if one store held them all."""
        query = run_query(status, pipeline, label, since, parent, limit, offset)
        return self.projections.runs(query)

    def fork(
        self,
        run_id: UUID | str,
        *,
        at: int,
        new_run_id: UUID | None = None,
        params: JSON = None,
        labels: Mapping[str, str] | None = None,
    ) -> Run:
        """`Engine.fork`: read from the origin's shard, the new run written in its own."""
        rid = self._run_id(run_id)
        origin = self.shard_of(rid)
        new_id = new_run_id or self._fork_id(origin, rid, labels)
        started, copies = origin._forked(rid, at, new_id, params, labels)
        return self.shard_of(new_id)._begin(started, copies)

    def _fork_id(self, origin: Engine, rid: UUID, labels: Mapping[str, str] | None) -> UUID:
        """A new id for a fork of `rid`, routed by the origin's pipeline and merged labels."""
        first = origin.events(rid, upto=1)[0]
        if not isinstance(first, RunStarted):
            raise StoreError(self.url, f"run {rid} does not begin with RunStarted")
        merged = {**first.labels, **(labels if isinstance(labels, Mapping) else {})}
        return self.layout.new_id(first.pipeline, merged)

    def verify(
        self,
        run_id: UUID | str,
        *,
        chain_only: bool = False,
        workers: int | None = None,
        worker_timeout: float | None = None,
    ) -> VerifyReport:
        """`Engine.verify` in the run's shard."""
        shard = self.shard_of(run_id)
        return shard.verify(
            run_id, chain_only=chain_only, workers=workers, worker_timeout=worker_timeout
        )

    def resume(self, run_id: UUID | str, *, tree: bool = False) -> Run:
        """`Engine.resume`; with `tree`, each unfinished descendant in its own shard."""
        root = self.shard_of(run_id).resume(run_id)
        if tree:
            for member in self.tree(root.id)[1:]:
                if not isinstance(self.store.last(member), RunFinished):
                    self.shard_of(member).resume(member)
        return root

    def compact(self) -> Compacted:
        """`Engine.compact` in every shard; what they removed, together."""
        done = [shard.compact() for shard in self.shards]
        return Compacted(
            tuple(run for each in done for run in each.runs),
            sum(each.events for each in done),
            tuple(sorted({name for each in done for name in each.rebuilt})),
        )

    def supervisor(self, **settings: Any) -> Supervisor:
        """A `Supervisor` recording into the runs' shards."""
        from engine.supervise import Supervisor  # the supervisor's modules load on first use

        return Supervisor(self, **settings)  # type: ignore[arg-type]  # the same run API

    def close(self) -> None:
        """Release every shard's connections and the threads that ask them."""
        self._pool.shutdown()
        for shard in self.shards:
            shard.close()

    def __enter__(self) -> ShardedEngine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardedEngine({self.url!r}, shards={len(self.shards)})"

    def _run_id(self, run_id: UUID | str) -> UUID:
        if isinstance(run_id, UUID):
            return run_id
        try:
            return UUID(str(run_id))
        except ValueError:
            raise RunNotFound(run_id, self.url) from None


def _open_all(layout: Layout, opener: Callable[[str], Engine]) -> tuple[Engine, ...]:
    """An engine per shard, in order; if one fails, the ones opened are closed."""
    opened: list[Engine] = []
    try:
        for url in layout.urls:
            opened.append(opener(url))
        for index, engine in enumerate(opened):
            _check_address(layout, index, engine)
    except BaseException:
        for engine in opened:
            engine.close()
        raise
    return tuple(opened)


def _merged(pages: Sequence[Sequence[RunSummary]]) -> list[RunSummary]:
    """Pages of the run index merged in its order: newest first, then by run id."""
    return list(heapq.merge(*pages, key=lambda s: (s.started, s.run_id), reverse=True))


def _check_address(layout: Layout, index: int, engine: Engine) -> None:
    """Refuse a layout whose shard `index` holds runs it would look for elsewhere.

    Raises:
        StoreError: one of the shard's oldest runs hashes to another shard (the
            [shards] list was reordered or resized, or a run was written to the
            shard's own URL with another id than the layout would choose).
    """
    for notification in engine.store.recorder.select_notifications(start=1, limit=_SAMPLED):
        run_id = UUID(str(notification.originator_id))
        home = layout.index_of(run_id)
        if home != index:
            raise StoreError(
                layout.url,
                f"shard {layout.names[index]!r} holds run {run_id}, "
                f"which this layout places in shard {layout.names[home]!r}: the [shards] "
                "list must keep the order and number it had when the runs were written",
            )


class ShardedStore:
    """The per-run store calls the commands and the viewer make, each in the run's shard."""

    def __init__(self, engine: ShardedEngine) -> None:
        self._engine = engine

    @property
    def url(self) -> str:
        """The ``shards:`` URL."""
        return self._engine.url

    @property
    def upgrade_available(self) -> str:
        """What ``stagetrail upgrade`` of a shard's own URL would improve ("": nothing)."""
        layout = self._engine.layout
        found = [
            f"shard {name!r} ({urls.mask(url)}), which {shard.store.upgrade_available}"
            for name, url, shard in zip(layout.names, layout.urls, self._engine.shards, strict=True)
            if shard.store.upgrade_available
        ]
        return "has " + "; and ".join(found) if found else ""

    def generation(self) -> int:
        """The erasure generations of every shard, summed: it grows whenever any shard erases.

        Each shard's generation only ever grows, so a cache keyed by this number
        (`Store.generation`) serves nothing read before an erasure in any shard.
        """
        return sum(self._engine.each(lambda shard: shard.store.generation()))

    def read(self, run_id: UUID, **query: Any) -> list[Event]:
        """`Store.read` in the run's shard."""
        return self._engine.shard_of(run_id).store.read(run_id, **query)

    def stream(self, run_id: UUID, *, gt: int = 0, lte: int | None = None) -> Iterator[Event]:
        """`Store.stream` in the run's shard."""
        return self._engine.shard_of(run_id).store.stream(run_id, gt=gt, lte=lte)

    def last(self, run_id: UUID) -> Event | None:
        """`Store.last` in the run's shard."""
        return self._engine.shard_of(run_id).store.last(run_id)

    def serialize(self, event: Event, previous: bytes | None = None) -> StoredEvent:
        """`Store.serialize` by the run's shard (its compression, cipher and chain key)."""
        return self._engine.shard_of(event.run_id).store.serialize(event, previous)

    def append(self, events: Sequence[Event]) -> list[int]:
        """`Store.append` of one run's events, in one transaction of its shard.

        Raises:
            StoreError: the events belong to runs of different shards (no transaction
                spans two stores).
        """
        shards = {self._engine.layout.index_of(event.run_id) for event in events}
        if len(shards) > 1:
            raise StoreError(self.url, "one append must not span runs of different shards")
        if not events:
            return []
        return self._engine.shard_of(events[0].run_id).store.append(events)


class ShardedIndex:
    """Every shard's run index read as one; other projection commands take one shard's URL."""

    def __init__(self, engine: ShardedEngine) -> None:
        self._engine = engine

    @property
    def names(self) -> list[str]:
        """The projections registered in every shard."""
        return self._engine.shards[0].projections.names

    def projection(self, name: str) -> Projection[Any]:
        """The registered projection `name`."""
        return self._engine.shards[0].projections.projection(name)

    def catch_up(self, names: Sequence[str] | None = None) -> None:
        """Catch each shard's projections up."""
        self._engine.each(lambda shard: shard.projections.catch_up(names))

    def runs(self, query: RunQuery) -> list[RunSummary]:
        """The page `query` asks for, as one store holding every shard's runs would give it.

        A deep page first asks each shard for a window around its share of the offset
        (ids spread evenly over the shards). When the merged windows cannot prove
        which rows hold the asked ranks (an uneven spread: routes, filters), a page
        no deeper than its length reads each shard's first offset + limit rows; a
        deeper one finds each shard's share of the offset by asking the shards for one
        row at a time (`_shares`: about shards² x log(offset) rows), then reads a page
        from each shard past its share. Every page reads a bounded number of rows.
        """
        shards = self._engine.shards
        if len(shards) == 1:
            return shards[0].projections.runs(query)
        window = self._window(query)
        if window is not None:
            return window
        if query.offset <= query.limit:
            wide = attrs.evolve(
                query, limit=min(query.offset + query.limit, arguments.MAX_INT), offset=0
            )
            pages = self._engine.each(lambda shard: shard.projections.runs(wide))
            return _merged(pages)[query.offset : query.offset + query.limit]
        shares = self._shares(query)
        if shares is None:
            return []
        pages = self._pages([attrs.evolve(query, offset=share) for share in shares])
        return _merged(pages)[: query.limit]

    def _shares(self, query: RunQuery) -> list[int] | None:
        """How many of the newest `query.offset` matching runs each shard holds (None: fewer).

        Each round asks every shard for its row `step` past its share so far
        (step = what is left / shards) and counts the `step` rows of the shard
        whose row is newest into its share: at most shards x (step - 1) + 1 rows
        of all shards are as new as that row, so all of them are among those left.
        A shard with no such row has fewer than `step` left, none of them counted.
        """
        shares = [0] * len(self._engine.shards)
        left = query.offset
        while left > 0:
            step = max(1, left // len(shares))
            peeks = self._pages([attrs.evolve(query, limit=1, offset=n + step - 1) for n in shares])
            found = [(page[0].started, page[0].run_id, n) for n, page in enumerate(peeks) if page]
            if not found:  # every shard has fewer than `step` rows left: fewer than `left`
                return None
            shares[max(found)[2]] += step
            left -= step
        return shares

    def _pages(self, queries: Sequence[RunQuery]) -> list[list[RunSummary]]:
        """Each shard's page of its run index for its own query (in shard order)."""
        asked = dict(zip(map(id, self._engine.shards), queries, strict=True))
        return self._engine.each(lambda shard: shard.projections.runs(asked[id(shard)]))

    def _window(self, query: RunQuery) -> list[RunSummary] | None:
        """The page from windows of each shard around offset / shards, or None if unproven."""
        count = len(self._engine.shards)
        # A shard's share of the newest `offset` runs deviates from offset / count by at
        # most sqrt(offset / count) (one standard deviation): the window spans 4 each side.
        margin = 4 * math.isqrt(query.offset // count) + 4
        skip = query.offset // count - margin
        if skip <= 0:
            return None
        take = min(2 * margin + query.limit, arguments.MAX_INT - skip)
        near = attrs.evolve(query, limit=take, offset=skip)
        pages = self._engine.each(lambda shard: shard.projections.runs(near))
        if not all(pages):  # a shard with at most `skip` rows: how many it has is unknown
            return None
        merged = _merged(pages)
        place = {id(summary): position for position, summary in enumerate(merged)}
        # Ranks are exact from the newest of the windows' first rows (every skipped row
        # of every shard is newer) to the oldest of the full windows' last rows.
        lowest = max(place[id(page[0])] for page in pages)
        full = [place[id(page[-1])] for page in pages if len(page) == take]
        highest = min(full, default=len(merged) - 1)
        start = query.offset - count * skip
        if start < lowest or start + query.limit - 1 > highest:
            return None
        return merged[start : start + query.limit]

    def get(self, name: str, key: str | UUID = "", *, catch_up: bool = True) -> Any:
        """The run index's entry for run `key`, from its shard."""
        if name != RunIndex.name:
            self._one_store(f"get({name!r})")
        shard = self._engine.shard_of(key)
        return shard.projections.get(name, key, catch_up=catch_up)

    def run_ids(self, prefix: str, *, limit: int = 10) -> list[UUID]:
        """Ids starting with `prefix` in any shard, in id order, at most `limit`."""
        pages = self._engine.each(lambda shard: shard.projections.run_ids(prefix, limit=limit))
        return sorted((i for page in pages for i in page), key=str)[:limit]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        self._one_store(name)

    def _one_store(self, what: str) -> Any:
        shards = ", ".join(urls.mask(url) for url in self._engine.layout.urls)
        raise StoreError(
            self._engine.url,
            f"projections.{what} works on one store: run it against each shard ({shards})",
        )
