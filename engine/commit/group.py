"""Group commit for asyncio: the batches many runs commit at about the same time, one transaction.

A run driven in an event loop commits what it has recorded (an outcome, its
decision, the next attempt's start) before each call of a stage function. Written one
by one, N concurrent runs pay N durable commits (N fsyncs) and block the loop
during each. Through a `GroupCommitter`, the first batch to arrive starts a
write in a worker thread; batches that arrive while it is on disk wait and
are written together by the next one, so a commit carries as many runs as
were ready, and the loop goes on meanwhile. Each batch is durable before its
caller learns so: the guarantees of a commit per run, fewer fsyncs.

A shared transaction that meets a `ConcurrencyConflict` wrote nothing: each
batch in it is then written on its own, so one run's conflict never fails
another run's batch. Any other error (the store down, an outcome unknown) is
every batch's error.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.persistence import StoredEvent

from engine.store.errors import ConcurrencyConflict, RunErased, StoreError
from engine.store.event_store import Store

if TYPE_CHECKING:
    import asyncio


class Commit:
    """One run's batch submitted to a `GroupCommitter`: `done` tells how its write ended.

    Attributes:
        events: the stored events, all or nothing.
        done: resolved once the batch is on disk, or failed with its error.
        withdrawn: the caller took the batch back before its write began.
        known: the stored bytes of the run's event before the batch, where known
            (see `Store.write`).
    """

    __slots__ = ("done", "events", "known", "withdrawn")

    def __init__(
        self,
        events: list[StoredEvent],
        done: asyncio.Future[None],
        known: Mapping[UUID, bytes] | None = None,
    ) -> None:
        self.events, self.done, self.withdrawn, self.known = events, done, False, known

    @property
    def stored(self) -> bool:
        """Whether the batch is on disk."""
        return self.done.done() and not self.done.cancelled() and self.done.exception() is None


class GroupCommitter:
    """Writes the batches of concurrent runs on one store, as few transactions as can be.

    One per store and event loop: `shared(store)` gives the running loop's, which
    `async with run.batch()` and `Supervisor(shared_commits=True)` commit through.

    Attributes:
        commits: transactions that stored batches (a shared one counts once).
        batches: batches stored.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.commits = 0
        self.batches = 0
        self._queue: list[Commit] = []
        self._writing: asyncio.Task[None] | None = None

    def submit(
        self, stored: Sequence[StoredEvent], *, known: Mapping[UUID, bytes] | None = None
    ) -> Commit:
        """Queue one run's batch for the next transaction (a write starts if none is under way);
        `known` as `Store.write`'s."""
        import asyncio  # here, not at the top: the command line starts faster without it

        commit = Commit(list(stored), asyncio.get_running_loop().create_future(), known)
        self._queue.append(commit)
        if self._writing is None:
            self._writing = asyncio.get_running_loop().create_task(self._write_queued())
        return commit

    async def wait(self, commit: Commit) -> None:
        """Wait until `commit` is on disk.

        Raises:
            ConcurrencyConflict, StoreError, ...: as `Store.write`, for this batch
                alone; nothing of it was written.
            asyncio.CancelledError: cancelled. Before its write began, the batch is
                withdrawn (`commit.withdrawn`, nothing written); during the write,
                this waits for the write's outcome first (`commit.stored`).
        """
        import asyncio

        try:
            await asyncio.shield(commit.done)
        except asyncio.CancelledError:
            if commit in self._queue:
                self._queue.remove(commit)
                commit.withdrawn = True
            else:
                await settled(commit.done)
            raise
        commit.done.result()  # this batch's own error, if it was not written

    async def write(self, stored: Sequence[StoredEvent]) -> None:
        """`submit` and `wait`: one run's batch, on disk when this returns."""
        await self.wait(self.submit(stored))

    async def _write_queued(self) -> None:
        """Write what is queued, group after group, until nothing is."""
        import asyncio

        try:
            await asyncio.sleep(0)  # the runs woken with this one may join its group
            while self._queue:
                group, self._queue = self._queue, []
                await self._write(group)
        finally:
            self._writing = None  # a finished task would keep its loop alive
            left, self._queue = self._queue, []  # only if this task was cancelled
            for commit in left:
                problem = "the group writer was cancelled before this batch: nothing written"
                commit.done.set_exception(StoreError(self.store.url, problem))

    async def _write(self, group: list[Commit]) -> None:
        """Write `group` in a worker thread; its outcome is known even if this is cancelled."""
        import asyncio

        thread = asyncio.ensure_future(asyncio.to_thread(self._write_group, group))
        cancelled = await settled(thread)  # the thread writes on whatever happens to this task
        error = thread.exception()
        outcomes = thread.result() if error is None else [error] * len(group)
        for commit, outcome in zip(group, outcomes, strict=True):
            if outcome is None:
                commit.done.set_result(None)
            else:
                commit.done.set_exception(outcome)
        if cancelled:
            raise asyncio.CancelledError

    def _write_group(self, group: list[Commit]) -> list[BaseException | None]:
        """One transaction for the group; after a conflict, each batch on its own (a thread)."""
        if len(group) == 1:
            return self._write_each(group)
        known = {run: head for commit in group for run, head in (commit.known or {}).items()}
        try:
            self.store.write([event for commit in group for event in commit.events], known=known)
        except (ConcurrencyConflict, RunErased):  # nothing was written: find whose batch
            return self._write_each(group)
        except Exception as error:
            return [error] * len(group)
        self.commits += 1
        self.batches += len(group)
        return [None] * len(group)

    def _write_each(self, group: list[Commit]) -> list[BaseException | None]:
        """Each batch in its own transaction; a run's later batch follows its failed one."""
        outcomes: list[BaseException | None] = []
        failed: dict[Any, BaseException] = {}
        for commit in group:
            run_id = commit.events[0].originator_id
            if run_id in failed:  # its versions follow a batch that was not written
                outcomes.append(failed[run_id])
                continue
            try:
                self.store.write(commit.events, known=commit.known)
            except Exception as error:
                failed[run_id] = error
                outcomes.append(error)
            else:
                self.commits += 1
                self.batches += 1
                outcomes.append(None)
        return outcomes


_SHARED: weakref.WeakKeyDictionary[Any, dict[Store, GroupCommitter]] = weakref.WeakKeyDictionary()
"""Each event loop's committers, by store: a committer's task belongs to its loop."""


def shared(store: Store) -> GroupCommitter:
    """The committer the running event loop's runs on `store` share (made on first use).

    Its `commits` and `batches` say how many transactions the loop's runs shared.
    """
    import asyncio

    by_store = _SHARED.setdefault(asyncio.get_running_loop(), {})
    committer = by_store.get(store)
    if committer is None:
        committer = by_store[store] = GroupCommitter(store)
    return committer


def shared_exists(store: Store) -> bool:
    """Whether the running event loop has a committer for `store` (none is made)."""
    import asyncio

    return store in _SHARED.get(asyncio.get_running_loop(), {})


async def settled(done: asyncio.Future[Any]) -> bool:
    """Wait until `done` has its outcome, whatever cancellations arrive meanwhile.

    Each cancellation it absorbs is taken back (`Task.uncancel`); the caller
    raises one (the one it was handling, or a new one) when this says so.

    Returns:
        Whether a cancellation arrived while it waited.
    """
    import asyncio

    task, cancelled = asyncio.current_task(), False
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            cancelled = True
            if task is not None:
                task.uncancel()
    return cancelled
