"""The engine: a store plus the ways to start, load, read, fork and verify runs.

`Engine` composes the subsystems (the store, persistent projections, time
travel, supervisors); nothing below it imports it back.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import attrs

from engine import arguments
from engine.errors import (
    ConcurrencyConflict,
    InvalidArgument,
    InvalidFork,
    RunAlreadyExists,
    RunAlreadyFinished,
    RunBeingErased,
    RunErasedWhileRead,
    RunNotFound,
    StoreError,
)
from engine.pipeline import Pipeline
from engine.readside import Projections, ReadOnlyViews, TimeTravel, deletes
from engine.store import ChainKeyMismatch, Store, StoreFull, StoreReadOnly, urls, writable
from engine.store.views import NoViews, RunQuery, Views
from events import INTERRUPTED, JSON, Event, RunDeleted, RunFinished, RunStarted, utc_now
from events.storable import unstorable_text
from projections import (
    FailurePatterns,
    Projection,
    RunIndex,
    RunSummary,
    as_projection,
    handled_topics,
)

if TYPE_CHECKING:
    # Imported where used: a reader (`stagetrail runs`) starts without the write side,
    # retention and verification.
    from engine.machine import RunState
    from engine.retention import Doomed, RetentionRule
    from engine.run import Run
    from engine.supervise import Supervisor
    from engine.verify import VerifyReport

S = TypeVar("S")
"""The state of the projection `Engine.project` is given."""
_ALL_CHILDREN = 1_000_000
_DELETIONS = 200
"""Retention's deletions written per transaction."""
_KEPT_COPIES = 64
"""A run begun with fewer events than this keeps them on its handle: a supervisor that
drives it next folds them without reading the run back (a long fork's copies are read)."""


class Engine:
    """Records and reads runs in one store.

    Args:
        url: the store; default ``$STAGETRAIL_STORE``, else ``sqlite:///stagetrail.db``.
        create: whether a missing store may be created.
        cipher_key: AES key for encryption at rest; default ``$STAGETRAIL_CIPHER_KEY``.
        max_event_bytes: the largest event, serialised as JSON, an append may write;
            default the URL's ``?max_event_bytes=`` option, else 1 MiB (1,048,576).
        read_only: only read: nothing is ever written to the store (a SQLite file
            opens ``mode=ro``; a PostgreSQL read replica or read-only role serves
            every read), persistent projections fold newer events in memory.
        settings: settings of an ``eventsourcing://TOPIC`` store's persistence
            module, beside those in the URL (see docs/reliability.md).
        chain_key: the secret of keyed links in each run's hash chain (docs/audit.md);
            default ``$STAGETRAIL_CHAIN_KEY``, else derived from the cipher key.
        lazy_projections: register the built-in ``failure_patterns`` when it is first
            used, not now (what `for_reading` does: a reader of the run index never
            computes its code's fingerprint); a writer keeps it from its first open.

    Raises:
        StoreError: the store cannot be opened.
        InvalidArgument: `max_event_bytes` is not an int >= 1.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        create: bool = True,
        cipher_key: str | None = None,
        max_event_bytes: int | None = None,
        read_only: bool = False,
        settings: Mapping[str, str] | None = None,
        chain_key: str | None = None,
        lazy_projections: bool = False,
    ) -> None:
        key = cipher_key if cipher_key is not None else os.environ.get("STAGETRAIL_CIPHER_KEY")
        links = chain_key if chain_key is not None else os.environ.get("STAGETRAIL_CHAIN_KEY")
        if max_event_bytes is not None:
            arguments.max_event_bytes(max_event_bytes)
        self.store = Store(
            url or urls.default_url(),
            create=create,
            cipher_key=key,
            max_event_bytes=max_event_bytes,
            read_only=read_only,
            settings=settings,
            chain_key=links,
        )
        views = self.store.views
        if self.store.views_read_only:  # newer events fold in memory: nothing is written
            views = ReadOnlyViews(self.store.url, views, self.store.codec, self.store.generation)
        self.projections = self._projections(views, lazily=lazy_projections)
        """The persistent projections: register, catch_up, get, status, rebuild."""
        self._time_travel = TimeTravel(self.store, views, seals=not self.store.views_read_only)

    def _projections(self, views: Views | None, *, lazily: bool) -> Projections:
        store = self.store
        if views is not None:
            projections = Projections(store.recorder, store.mapper, views, store.generation)
            try:
                projections.register(RunIndex)
                projections.register(FailurePatterns, lazily=lazily)
                return projections
            except Exception as error:  # e.g. a read-only file: reading runs must still work
                store.views_problem = f"{type(error).__name__}: {error}"
        missing: Any = NoViews(self.url, store.views_problem)
        return Projections(store.recorder, store.mapper, missing, store.generation)

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
        deferred: bool = False,
    ) -> Run:
        """Start a run of `pipeline`: append its `RunStarted`, return a live `Run`.

        Args:
            pipeline: the definition; its whole table is stored with the run.
            params: any strict JSON value describing this run's input.
            labels: str to str tags to filter runs by.
            parent: the parent run, for child pipelines.
            run_id: a chosen id (default: a new random UUID).
            deferred: the `RunStarted` waits in the run's handle and is written in one
                transaction with the run's first commit (its first event, or first
                ``batch()``), one transaction fewer. Nothing is stored until then (a
                first ``batch()`` that raises stores nothing: the start waits for the
                next); a taken id then fails that commit with `ConcurrencyConflict`.
        """
        from engine.run import Run

        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"start_run needs a Pipeline, got {type(pipeline).__name__}")
        started = RunStarted(
            run_id=run_id or uuid.uuid4(),
            version=1,
            pipeline=pipeline.name,
            table=pipeline.to_dict(),
            params={} if params is None else params,
            labels={} if labels is None else labels,  # type: ignore[arg-type]  # its converter checks
            parent_run_id=parent.id if isinstance(parent, Run) else parent,
        )
        return self._begin(started, (), pipeline, deferred=deferred)

    def child_run(
        self,
        parent: Run | UUID | str,
        pipeline: Pipeline,
        *,
        key: str,
        params: JSON = None,
        labels: Mapping[str, str] | None = None,
    ) -> Run:
        """The child run of `parent` for `key` (a feature, a task): started once, then found.

        Its id is derived from the parent's id and `key` (a UUID 5 in the parent's id
        as namespace), so asking again, after a restart or from another process at
        the same moment, gives the same run: the first asker starts it, the others
        load it (no query of the run index, no race). `key` is recorded as the label
        ``key``, and a found run must be the parent's child of this pipeline for this
        key, so two keys never share a run. `params` and `labels` apply when the run
        is started; a found run keeps its own.

        Raises:
            RunNotFound: no such parent run.
            InvalidArgument: `key` is empty or not a str, or `labels` has another ``key``.
            RunAlreadyExists: the derived id holds a run of another parent, key or pipeline.
        """
        from engine.run import Run

        parent_id = parent.id if isinstance(parent, Run) else self._run_id(parent)
        run_id = child_id(parent_id, key, labels)
        if self.store.last(parent_id) is None:
            raise RunNotFound(parent_id, self.url)
        return self._start_child(parent_id, run_id, pipeline, key, params, labels)

    def _start_child(
        self,
        parent_id: UUID,
        run_id: UUID,
        pipeline: Pipeline,
        key: str,
        params: JSON,
        labels: Mapping[str, str] | None,
    ) -> Run:
        """`child_run` once its parent is known to exist (in this store or another shard)."""
        try:
            labelled = {**(labels or {}), "key": key}
            return self.start_run(
                pipeline, params=params, labels=labelled, parent=parent_id, run_id=run_id
            )
        except RunAlreadyExists:
            found = self.events(run_id, upto=1)[0]
            mine = isinstance(found, RunStarted) and (
                found.parent_run_id,
                found.labels.get("key"),
                found.pipeline,
            ) == (parent_id, key, pipeline.name)
            if not mine:
                raise
            return self.load(run_id)

    def load(self, run_id: UUID | str) -> Run:
        """Rebuild a live `Run` from the store alone (after a crash, in another process).

        Raises:
            RunNotFound: no such run.
        """
        from engine.run import Run

        run_id = self._run_id(run_id)
        generation = self._keeping()
        pipeline, state, head = self._fold(run_id)
        if head is None:  # appended to meanwhile: its appends require the newest one's bytes
            head = self.store.stored_at(run_id, state.version)
        return self._handle(Run(self.store, pipeline, state, head=head), generation)

    def events(self, run_id: UUID | str, upto: int | datetime | None = None) -> list[Event]:
        """The run's events, oldest first; `upto` a version, or a time (events at or before it).

        Raises:
            RunNotFound: no such run.
            InvalidArgument: `upto` is negative, not an int, or a naive datetime.
        """
        rid = self._run_id(run_id)
        events = self._read(rid, upto)
        if not events and self.store.last(rid) is None:
            raise RunNotFound(rid, self.url)
        return events

    def project(
        self,
        run_id: UUID | str,
        projection: Projection[S] | type[Projection[S]],
        *,
        at: int | datetime | None = None,
        tree: bool = False,
    ) -> S:
        """The state of `projection` over one run, now or after event `at` (a version or a time).

        The first question about a long run stores snapshots every `SNAPSHOT_INTERVAL`
        events; later ones (in any process) fold only from the nearest snapshot.

        Args:
            tree: fold the run and all its child runs (recursively) together, in time
                order; `at` may then only be a time, since versions are per run.

        Raises:
            RunNotFound: no such run.
            RunErased: the run was erased by a compaction while it was folded
                (`RunErasedWhileRead`), or is being erased (`RunBeingErased`).
            InvalidArgument: `at` is negative, not an int, or a naive datetime.
            ProjectionError: a handler failed (names the event and its version).
        """
        # The common arguments (a UUID, a projection class) checked inline: a point-in-time
        # read of a short run is a few dozen calls, two of them these.
        rid = run_id if type(run_id) is UUID else self._run_id(run_id)
        instance = (
            projection()
            if type(projection) is type and issubclass(projection, Projection)
            else as_projection(projection)
        )
        if tree:
            return instance.fold(self._tree_events(rid, at))
        travel = self._time_travel
        # `grid` of a projection keeping no states of its own (nearly all) inline.
        if type(at) is int and 0 < at < (
            travel.interval if getattr(instance, "kept_every", 0) == 0 else travel.grid(instance)
        ):
            # No snapshot lies below the first interval: one read and a fold, without
            # the newest event (a read of its own) or the snapshot bookkeeping; only
            # the events the projection handles are decoded. A run being erased is
            # refused by the read where it reaches what is gone (before it, its history
            # is whole: the state then is answered, as for any deleted run).
            events = self.store.read(rid, lte=at, topics=handled_topics(instance))
            if not events and self.store.last(rid) is None:
                raise RunNotFound(rid, self.url)
            return instance.fold(events)
        last = self.store.last(rid)
        if last is None:
            raise RunNotFound(rid, self.url)
        version = (
            last.version
            if at is None
            else arguments.version_at(self.store, rid, at, last.version, "at")
        )
        state: S = travel.project(rid, instance, version)
        return state

    def tree(self, run_id: UUID | str) -> list[UUID]:
        """The run and all its descendants (child runs, their children...), parents first;
        not a deleted descendant a compaction has begun erasing (nor, then, its own).

        Raises:
            RunNotFound: no such run.
            RunBeingErased: the run itself is being erased.
        """
        rid = self._run_id(run_id)
        if self.store.last(rid) is None:
            raise RunNotFound(rid, self.url)
        return lineage(
            rid,
            lambda parent: readable(self.runs(parent=parent, limit=_ALL_CHILDREN), self.store.last),
        )

    def _tree_events(self, run_id: UUID, at: int | datetime | None) -> Iterator[Event]:
        if at is not None and not isinstance(at, datetime):
            raise InvalidArgument("at", "with tree=True, `at` must be a datetime")
        if at is not None:
            arguments.version_at(self.store, run_id, at, 0, "at")  # checks it is timezone-aware
        return merged_tree(self.tree(run_id), self.store.stream, at)

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
        """Summaries of the runs that match, newest first, from the run index (caught up first).

        Args:
            status: ``running`` or a finish status.
            pipeline: the pipeline's name.
            label: ``"key=value"``, several of them, or a mapping; all must match.
            since: only runs started at or after this (timezone-aware) time.
            parent: only the child runs of this run.
            limit: at most this many.
            offset: pass over this many of the newest first (a page of a listing).

        Raises:
            InvalidArgument: an unknown status, or a malformed label, limit, offset, since
                or parent.
        """
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
        """A new run whose history is a copy of events 1..`at` of `run_id`, ready to continue.

        The copies are stamped with the time of the fork (the original times stay in the
        origin); the new `RunStarted.forked_from` is ``(run_id, at)``. A fork has no parent
        run: it is not one more child in the origin's tree.

        Args:
            new_run_id: the new run's id (default: a new random UUID).
            params: the new run's params (default: the origin's).
            labels: labels set on the new run over the origin's (a key given replaces
                the origin's value).

        Raises:
            RunNotFound: no such run.
            InvalidFork: `at` is outside the run, or includes its `RunFinished`.
            RunAlreadyExists: the store holds a run with `new_run_id` already.
        """
        rid = self._run_id(run_id)
        started, copies = self._forked(rid, at, new_run_id or uuid.uuid4(), params, labels)
        return self._begin(started, copies)

    def _forked(
        self,
        rid: UUID,
        at: int,
        new_id: UUID,
        params: JSON,
        labels: Mapping[str, str] | None,
    ) -> tuple[RunStarted, list[Event]]:
        """The first events of `fork`'s new run `new_id`, checked, not yet written."""
        if type(at) is not int or at < 1:
            raise InvalidFork(rid, at, "the version must be an int >= 1")
        events = self.events(rid, upto=at)
        if len(events) < at:
            raise InvalidFork(rid, at, f"the run has only {len(events)} events")
        if isinstance(events[-1], RunFinished):
            raise InvalidFork(rid, at, "that version is the run's RunFinished; fork before it")
        first = events[0]
        if not isinstance(first, RunStarted):
            raise StoreError(self.url, f"run {rid} does not begin with RunStarted")
        now = utc_now()
        # A fork is an alternative history, not one more child: it leaves the parent's tree,
        # whose task and budget totals would otherwise count the copied events twice.
        started = attrs.evolve(
            first,
            run_id=new_id,
            timestamp=now,
            forked_from=(rid, at),
            parent_run_id=None,
            params=first.params if params is None else params,
            labels={**first.labels, **(labels or {})},
        )
        copies = [attrs.evolve(event, run_id=new_id, timestamp=now) for event in events[1:]]
        return started, copies

    def verify(
        self,
        run_id: UUID | str,
        *,
        chain_only: bool = False,
        workers: int | None = None,
        worker_timeout: float | None = None,
    ) -> VerifyReport:
        """Check the run's hash chain and re-fold it through the table stored in its
        `RunStarted` and every projection, reading its stored events a page at a time.

        Args:
            chain_only: check the hash chain alone, decoding no event (see docs/audit.md).
            workers: with `chain_only`, how many worker processes check the pages of a run
                of 200,000 events or more beside this one (default none). They are started
                with multiprocessing's ``spawn``: a script run as a file or ``-m`` that asks
                for them must guard its entry with ``if __name__ == "__main__":``.
            worker_timeout: seconds a worker may take to answer once waited for (default
                `engine.verify.WORKER_TIMEOUT`, 60): one that neither answers nor dies by
                then is taken as hung, every worker is stopped and the rest of the run is
                checked here (the same report; a warning is logged).

        Returns:
            A report whose `problems` name each broken link, illegal event or failing
            projection by version.

        Raises:
            RunNotFound: no such run.
            RunErasedWhileRead: the run was deleted and erased by a compaction while it was
                checked (or its id names another run by now).
            RunBeingErased: the run is deleted and a compaction has begun erasing it
                (before or while it was checked): its history is no longer whole.
            InvalidArgument: `workers` is not a whole number from 0 to 64, or
                `worker_timeout` not a number of seconds above 0 and at most
                `engine.verify.MAX_WORKER_TIMEOUT` (the longest wait a thread can make).
        """
        from engine.verify import (
            RANGE,
            RunRanges,
            chain_workers,
            verify_chain,
            verify_stored,
            worker_seconds,
        )

        timeout = worker_seconds(worker_timeout)

        rid = self._run_id(run_id)
        newest = self.store.last(rid)
        if newest is None:
            raise RunNotFound(rid, self.url)
        # a version edited to text sorts last in SQLite: the check reports that row
        upto = newest.version if type(newest.version) is int else 0
        helpers = chain_workers(upto, workers)  # refused even without `chain_only`
        pages, mapper = self.store.stored_rows(rid), self.store.mapper
        linked_from, key_problem = self.store.must_link_from(rid), self.store.chain_key_problem()
        plain = self.store.chain_record is not None and self.store.chain_record.mode == "plain"
        if chain_only:
            # A run shorter than a range is read page by page: none of a reading to make.
            reading = self.store.range_reading() if upto >= RANGE else None
            ranges = None
            if reading is not None:
                after = functools.partial(self.store.stored_rows, rid)
                ranges = RunRanges(reading, upto, after)
            chained = verify_chain(
                rid, pages, mapper, must_link_from=linked_from, key_problem=key_problem,
                workers=helpers, ranges=ranges, plain=plain, worker_timeout=timeout,
            )  # fmt: skip
            return self._not_erased_meanwhile(rid, newest, chained)
        registered = [self.projections.projection(n) for n in self.projections.names]
        report = verify_stored(
            rid,
            pages,
            mapper,
            registered,
            must_link_from=linked_from,
            key_problem=key_problem,
            plain=plain,
        )
        return self._not_erased_meanwhile(rid, newest, report)

    def _not_erased_meanwhile(
        self, run_id: UUID, newest: Event, report: VerifyReport
    ) -> VerifyReport:
        """`report`, unless the run's erasure began while it was checked: then
        `RunBeingErased`, or `RunErasedWhileRead` once it is gone (or its id names another
        run), as a fold refuses it, rather than a report of the events read before.

        A compaction erases only deleted runs, whose `newest` event (read before the check)
        is their deletion: the store is asked again for those, and for a report with
        problems or fewer events than `newest` (a run deleted while checked), never for a
        sound run that is not deleted.
        """
        whole = type(newest.version) is int and report.events >= newest.version
        if report.ok and whole and not deletes(newest):
            return report
        now = self.store.last(run_id)  # RunBeingErased: its erasure has begun
        if now is None or (deletes(newest) and now != newest):
            raise RunErasedWhileRead(run_id, report.events + 1)
        return report

    def compact(self, *, batch: int = 200) -> Compacted:
        """Physically remove every deleted run while other processes go on writing and folding.

        Deletion itself is an event (`RunDeleted`, or `RunFinished` with status
        ``deleted``): readers treat such a run as gone at once, and each persistent
        projection takes the run's part out of its state as it folds the deletion
        (`Projection.forget`). This catches the registered projections up, so they
        have, then removes the runs' events and snapshots `batch` runs per short
        transaction (each counts one more erasure generation, so no cache serves an
        erased run again; on PostgreSQL, where appends wait for it, a transaction
        also deletes at most 500 events, a longer batch or run taking several, and
        every reader refuses a run partly erased with `RunBeingErased` until a
        compaction finishes it), and deletes their run-index rows and run-scoped
        partitions.
        A projection that cannot forget (see `Projections.unforgetting`), or whose
        forgetting left a state inexact (`Projection.exact`: the built-in
        `failure_patterns` when an erased run reached further back than the window it
        keeps), is reset and, if registered here, folded again.

        Raises:
            InvalidArgument: `batch` is not a positive int.
            StoreError: the database failed; the batches before it were removed.
        """
        if type(batch) is not int or batch < 1:
            raise InvalidArgument("batch", f"must be an int >= 1, got {batch!r}")
        doomed = tuple(s.run_id for s in self.runs(status="deleted", limit=_ALL_CHILDREN))
        if not doomed:
            return Compacted((), 0, ())
        self.projections.catch_up()  # every registered projection folds the deletions first
        stale = sorted({*self.projections.unforgetting(), *self.projections.inexact()})
        self.projections.reset_named(stale)
        erased = 0
        for first in range(0, len(doomed), batch):
            chunk = doomed[first : first + batch]
            erased += self.store.erase(chunk)
            self.projections.drop_runs(chunk)
        rebuilt = tuple(name for name in stale if name in self.projections.names)
        for name in rebuilt:
            self.projections.rebuild(name)
        return Compacted(doomed, erased, rebuilt)

    def retain(
        self,
        rules: Iterable[RetentionRule] | RetentionRule,
        *,
        apply: bool = False,
        compact: bool = True,
        now: datetime | None = None,
    ) -> Retention:
        """The finished runs `rules` choose; with `apply`, delete them (and `compact`).

        Dry run by default: nothing is written. With ``apply=True`` each chosen run
        gets a `RunDeleted` recording the rule (as data) that chose it, then
        `compact` erases them while other processes go on. A child run is chosen only
        with its parent, so the tree of a kept run stays whole; forks of an erased run
        are runs of their own and stay.

        Args:
            rules: alternatives; a run goes when one chooses it (the first is recorded).
            compact: with `apply`, also erase the deleted runs (else a later `compact` does).
            now: the time ages are measured from (default: now).
        """
        from engine.retention import RetentionRule, choose

        chosen_rules = [rules] if isinstance(rules, RetentionRule) else list(rules)
        for rule in chosen_rules:
            if not isinstance(rule, RetentionRule):
                raise InvalidArgument("rules", f"expected RetentionRule, got {rule!r}")
        moment = now or utc_now()
        candidates: dict[UUID, RunSummary] = {}
        for rule in chosen_rules:
            statuses: list[str | None] = [*sorted(rule.status)] or [None]
            for status in statuses:
                for summary in self.runs(
                    status=status,
                    pipeline=rule.pipeline,
                    label=dict(rule.labels) or None,
                    limit=_ALL_CHILDREN,
                ):
                    candidates[summary.run_id] = summary
        plan = tuple(choose(chosen_rules, candidates.values(), moment, self._stored))
        if not apply:
            return Retention(plan, applied=False, compacted=None)
        for first in range(0, len(plan), _DELETIONS):
            self._delete_batch(plan[first : first + _DELETIONS])
        return Retention(plan, applied=True, compacted=self.compact() if compact else None)

    def _stored(self, run_id: UUID) -> bool:
        """Whether the run is stored and not being erased (a parent on its way out)."""
        try:
            return self.store.last(run_id) is not None
        except RunBeingErased:
            return False

    def _delete_batch(self, batch: Sequence[Doomed]) -> None:
        """Record the batch's `RunDeleted`s in one transaction (one by one after a conflict).

        A chosen run is finished, so its deletion follows its `RunFinished` directly;
        one whose newest event is anything else changed since the plan and is left out.
        """
        now, deletions = utc_now(), []
        for doomed in batch:
            last = self.store.last(doomed.run_id)
            if isinstance(last, RunFinished) and last.status != "deleted":
                deletions.append(
                    RunDeleted(
                        run_id=doomed.run_id,
                        version=last.version + 1,
                        timestamp=now,
                        rule=doomed.rule.to_json(),
                        reason=f"retention: {doomed.rule}",
                    )
                )
        if not deletions:
            return
        try:
            self.store.write(self.store.seal(deletions)[0])
        except ConcurrencyConflict:  # another process deleted one meanwhile
            for doomed in batch:
                self._delete(doomed)

    def _delete(self, doomed: Doomed) -> None:
        """Record a retention rule's `RunDeleted`; a run deleted meanwhile is left as it is."""
        # A run deleted (or erased) by another process since the plan was made is left alone.
        with contextlib.suppress(RunAlreadyFinished, RunNotFound):
            run = self.load(doomed.run_id)
            run.record(RunDeleted, rule=doomed.rule.to_json(), reason=f"retention: {doomed.rule}")

    def supervisor(self, **settings: Any) -> Supervisor:
        """A `Supervisor` recording into this engine's store.

        Args:
            settings: `retry`, `policies`, `breaker`, `progress`, `sleep`, `clock`, `rng`
                (see `Supervisor`).
        """
        from engine.supervise import Supervisor  # the supervisor's modules load on first use

        return Supervisor(self, **settings)

    def resume(self, run_id: UUID | str, *, tree: bool = False) -> Run:
        """Load a run whose process died, recording what the crash left unfinished.

        An attempt that was started but has no outcome is recorded as `StageFailed`
        (``error_type="Interrupted"``) when the table has a ``failed`` row for the
        stage (else it stays open and the next outcome closes it); a task left active
        is recorded as `TaskFailed` (``"Interrupted"``). Both in one transaction.

        Args:
            tree: also resume every unfinished descendant (child runs, their children...,
                as `tree` lists them), parents first, each in its own transaction.
                Finished runs are left alone. Only the root is returned: load the
                children with `load`.

        Raises:
            RunNotFound: no such run.
        """
        root = self._resume_one(self._run_id(run_id))
        if tree:
            for member in self.tree(root.id)[1:]:
                if not isinstance(self.store.last(member), RunFinished):
                    self._resume_one(member)
        return root

    def _resume_one(self, run_id: UUID) -> Run:
        """`resume` for one run: its unfinished attempt and tasks, in one transaction."""
        run = self.load(run_id)
        if run.machine.status is not None:
            return run
        with run.batch():
            _interrupted(run)
        return run

    @classmethod
    def for_reading(cls, url: str | None = None, *, create: bool = False) -> Engine:
        """An engine for a reader (a read command, the viewer), which never records an event.

        On a store this process may write (`engine.store.writable`) the engine opens
        normally, with its run index caught up and saved, so the next reader starts
        where this one stopped. Elsewhere (a read-only file, a read replica, a role
        that may only read), or when that save fails (a full disk, a file system
        remounted read-only), or with a chain key other than the store's recorded one
        (which only a writer is refused), it opens the store read-only and folds in memory.

        Raises:
            StoreError: the store cannot be opened (or is missing, unless `create`).
        """
        if writable(url or urls.default_url()):
            try:
                engine = cls(url, create=create, lazy_projections=True)
            except ChainKeyMismatch:  # it records no event: `verify` names the key's problem
                return cls(url, create=create, read_only=True, lazy_projections=True)
            try:
                engine.projections.catch_up([RunIndex.name])
                return engine
            except (StoreFull, StoreReadOnly):
                engine.close()
            except BaseException:
                engine.close()
                raise
        return cls(url, create=create, read_only=True, lazy_projections=True)

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
        last = self.store.last(run_id)
        if last is None:
            arguments.version_at(self.store, run_id, upto, 0, "upto")  # still check the argument
            return []
        version = arguments.version_at(self.store, run_id, upto, last.version, "upto")
        return list(self.store.stream(run_id, lte=version))

    def _fold(self, run_id: UUID) -> tuple[Pipeline, RunState, bytes | None]:
        """The run's pipeline and state, and the stored bytes of the state's newest event
        (None: the run grew past the newest event read first)."""
        from engine.machine import MachineFold, replay

        newest = self.store.newest(run_id)
        if newest is None:
            raise RunNotFound(run_id, self.url)
        last, head = newest
        if last.version >= self._time_travel.interval:
            # A long run: from the newest snapshot of the machine, plus the events after it.
            folded: tuple[Pipeline, RunState] | None = self._time_travel.project(
                run_id, MachineFold(), last.version
            )
            if folded is None:
                raise StoreError(self.url, f"run {run_id} does not begin with RunStarted")
            return folded[0], folded[1], head if folded[1].version == last.version else None
        events = self.store.stream(run_id)
        first = next(events, None)
        if first is None:
            raise RunNotFound(run_id, self.url)
        if not isinstance(first, RunStarted):
            raise StoreError(self.url, f"run {run_id} does not begin with RunStarted")
        pipeline, state = replay(first, events)
        return pipeline, state, head if state.version == last.version else None

    def _begin(
        self,
        started: RunStarted,
        copies: Sequence[Event],
        pipeline: Pipeline | None = None,
        *,
        deferred: bool = False,
    ) -> Run:
        """The one way a run begins, started or forked: its first events checked by the
        rules and written in one transaction (`deferred`: with the run's first commit),
        then a live `Run` on them.

        Raises:
            RunAlreadyExists: the store holds a run with this id already.
        """
        from engine.machine import replay
        from engine.run import Run

        pipeline, state = replay(started, copies, pipeline=pipeline)
        stored, links = self.store.seal([started, *copies])
        if deferred:
            link = links[started.run_id]
            return Run(
                self.store, pipeline, state, begun=(started, *copies), link=link, unwritten=stored
            )
        generation = self._keeping()
        try:
            self.store.write(stored)
        except ConcurrencyConflict:
            raise RunAlreadyExists(started.run_id) from None
        begun = (started, *copies) if len(copies) < _KEPT_COPIES else ()
        return self._handle(
            Run(
                self.store,
                pipeline,
                state,
                begun=begun,
                link=links[started.run_id],
                head=stored[-1].state,
            ),
            generation,
        )

    def _keeping(self) -> int | None:
        """An erasure generation the store had before a handle's state is read, when a keeper
        will follow the handle (None: none will).

        Time travel's newest, not a read: an older one than the store's costs the keeper
        one check of its state at its first crossing, never a snapshot of erased data.
        """
        travel = self._time_travel
        return travel.generation if travel.stores else None

    def _handle(self, run: Run, generation: int | None) -> Run:
        """`run`, its writes followed by a keeper of its snapshots (see docs/time-travel.md),
        its state read in `generation`."""
        from engine.readside import SnapshotKeeper
        from engine.run import unit_of

        if generation is not None:
            unit = unit_of(run)
            keeper = SnapshotKeeper(
                self._time_travel,
                self.store,
                run.pipeline,
                generation=generation,
                begun=unit.stored_history() or (),
            )
            unit.followers.append(keeper)
        return run

    def _run_id(self, run_id: UUID | str) -> UUID:
        if isinstance(run_id, UUID):
            return run_id
        try:
            return UUID(str(run_id))
        except ValueError:
            raise RunNotFound(run_id, self.url) from None


@attrs.frozen
class Retention:
    """What `Engine.retain` chose (and, if `applied`, deleted and compacted)."""

    runs: tuple[Doomed, ...]
    applied: bool
    compacted: Compacted | None


@attrs.frozen
class Compacted:
    """What `Engine.compact` removed: the deleted runs, their events, the projections rebuilt."""

    runs: tuple[UUID, ...]
    events: int
    rebuilt: tuple[str, ...]


def child_id(parent_id: UUID, key: str, labels: Mapping[str, str] | None) -> UUID:
    """The id of `parent_id`'s child run for `key`, once `key` and `labels` are checked.

    Raises:
        InvalidArgument: `key` is empty or not a str, or `labels` has another ``key``.
    """
    if type(key) is not str or not key:
        raise InvalidArgument("key", f"must be a non-empty str, got {key!r}")
    problem = unstorable_text(key)
    if problem is not None:  # checked before the id is derived from it
        raise InvalidArgument("key", f"{key!r} {problem}: a child's key is stored as its label")
    if labels is not None and labels.get("key", key) != key:
        raise InvalidArgument("labels", f"'key' is the child's key {key!r}, not {labels['key']!r}")
    return uuid.uuid5(parent_id, key)


def lineage(root: UUID, children: Callable[[UUID], Iterable[RunSummary]]) -> list[UUID]:
    """`root` and its descendants, parents first, each run's `children` in id order."""
    found, index = [root], 0
    while index < len(found):
        found += sorted((child.run_id for child in children(found[index])), key=str)
        index += 1
    return found


def readable(children: Iterable[RunSummary], last: Callable[[UUID], object]) -> list[RunSummary]:
    """`children` but the deleted ones a compaction has begun erasing: a tree passes over
    them, as it will once they are gone, rather than fail for its live runs (`last`, the
    store's, raises `RunBeingErased` for them; only deleted children are read)."""
    kept = []
    for child in children:
        if child.status == "deleted":
            try:
                last(child.run_id)
            except RunBeingErased:
                continue
        kept.append(child)
    return kept


def merged_tree(
    members: Sequence[UUID],
    stream: Callable[[UUID], Iterator[Event]],
    at: datetime | None,
) -> Iterator[Event]:
    """The events of the runs `members` in time order (ties: member order, then version)."""
    streams = [
        ((e.timestamp, order, e.version, e) for e in stream(member))
        for order, member in enumerate(members)
    ]
    merged = (item[3] for item in heapq.merge(*streams, key=lambda item: item[:3]))
    return merged if at is None else itertools.takewhile(lambda e: e.timestamp <= at, merged)


def _interrupted(run: Run) -> None:
    message = "the process recording this {} died before it ended"
    opened = run.machine.open_attempt
    if opened is not None and "failed" in run.pipeline.allowed(run.state):
        attempt = f"attempt {opened} of {run.state!r}"
        run.stage_failed(run.state, message.format(attempt), error_type=INTERRUPTED)
    for task_id, status in run.tasks.items():
        if status == "active":
            run.task_failed(task_id, message.format(f"task {task_id!r}"), INTERRUPTED)


def run_query(
    status: str | None,
    pipeline: str | None,
    label: str | Mapping[str, str] | Iterable[str] | None,
    since: datetime | None,
    parent: UUID | str | None,
    limit: int,
    offset: int,
) -> RunQuery:
    """The run index query `Engine.runs` takes, each argument checked.

    Raises:
        InvalidArgument: an unknown status, or a malformed label, limit, offset, since
            or parent.
    """
    return RunQuery(
        status=arguments.status(status),
        pipeline=arguments.text("pipeline", pipeline),
        labels=arguments.labels(label),
        since=arguments.since(since),
        parent=None if parent is None else str(arguments.run_id(parent, "parent")),
        limit=arguments.limit(limit),
        offset=arguments.offset(offset),
    )
