"""Group commit for asyncio: the batches many runs flush at about the same time, one transaction.

A run driven in an event loop flushes what it holds (an outcome, its decision,
the next attempt's start) before each call of a stage function. Written one
by one, N concurrent runs pay N durable commits (N fsyncs) and block the loop
during each. Through a `GroupCommitter`, the first batch to arrive starts a
write in a worker thread; batches that arrive while it is on disk wait and
are written together by the next one, so a commit carries as many runs as
were ready, and the loop goes on meanwhile. Each batch is durable before its
caller's `write` returns: the guarantees of a commit per run, fewer fsyncs.

A transaction that fails is not shared: each batch in it is then written on its
own, so one run's `ConcurrencyConflict` never fails another run's batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from eventsourcing.persistence import StoredEvent

from engine.store.event_store import Store

if TYPE_CHECKING:
    import asyncio


class GroupCommitter:
    """Writes the batches of concurrent runs on one store, as few transactions as can be.

    One per store and event loop (`Supervisor(shared_commits=True)` makes them).

    Attributes:
        commits: transactions that stored batches (a shared one counts once).
        batches: batches stored.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.commits = 0
        self.batches = 0
        self._queue: list[_Batch] = []
        self._writing: asyncio.Task[None] | None = None

    async def write(self, stored: Sequence[StoredEvent]) -> None:
        """Write one run's batch, all or nothing, in a transaction it may share with others.

        Raises:
            ConcurrencyConflict, StoreError, ...: as `Store.write`, for this batch
                alone; nothing of it was written.
            asyncio.CancelledError: cancelled before its write began (nothing was
                written). Cancelled during the write, it waits for the outcome and
                returns or raises it, with the cancellation delivered at the task's
                next ``await``.
        """
        import asyncio  # here, not at the top: the command line starts faster without it

        batch = _Batch(list(stored), asyncio.get_running_loop().create_future())
        self._queue.append(batch)
        if self._writing is None or self._writing.done():
            self._writing = asyncio.create_task(self._write_queued())
        try:
            await asyncio.shield(batch.done)
        except asyncio.CancelledError:
            if batch in self._queue:  # not taken by a write yet: withdrawn whole
                self._queue.remove(batch)
                raise
            await _settled(batch.done)
            _cancel_later()
        batch.done.result()  # this batch's own error, if it was not written

    async def _write_queued(self) -> None:
        """Write what is queued, group after group, until nothing is."""
        import asyncio

        await asyncio.sleep(0)  # the runs woken with this one may join its group
        while self._queue:
            group, self._queue = self._queue, []
            try:
                outcomes = await asyncio.to_thread(self._write_group, group)
            except BaseException as error:  # the thread could not be started
                outcomes = [error] * len(group)
            for batch, outcome in zip(group, outcomes, strict=True):
                if outcome is None:
                    batch.done.set_result(None)
                else:
                    batch.done.set_exception(outcome)

    def _write_group(self, group: list[_Batch]) -> list[BaseException | None]:
        """One transaction for the group; if it fails, each batch on its own (in a thread)."""
        if len(group) > 1:
            try:
                self.store.write([event for batch in group for event in batch.events])
            except Exception:  # retried batch by batch below, to say whose it was
                pass
            else:
                self.commits += 1
                self.batches += len(group)
                return [None] * len(group)
        return self._write_each(group)

    def _write_each(self, group: list[_Batch]) -> list[BaseException | None]:
        """Each batch in its own transaction; a run's later batch follows its failed one."""
        outcomes: list[BaseException | None] = []
        failed: dict[Any, BaseException] = {}
        for batch in group:
            run_id = batch.events[0].originator_id
            if run_id in failed:  # its versions follow a batch that was not written
                outcomes.append(failed[run_id])
                continue
            try:
                self.store.write(batch.events)
            except Exception as error:
                failed[run_id] = error
                outcomes.append(error)
            else:
                self.commits += 1
                self.batches += 1
                outcomes.append(None)
        return outcomes


class _Batch:
    """One run's events waiting for a transaction, and the future its writer awaits."""

    __slots__ = ("done", "events")

    def __init__(self, events: list[StoredEvent], done: asyncio.Future[None]) -> None:
        self.events, self.done = events, done


async def _settled(done: asyncio.Future[None]) -> None:
    """Wait until `done` has its outcome, whatever cancellations arrive meanwhile."""
    import asyncio

    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            continue


def _cancel_later() -> None:
    """Deliver a cancellation that arrived during a write at the task's next await."""
    import asyncio

    task = asyncio.current_task()
    if task is not None:
        task.cancel()
