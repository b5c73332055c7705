"""Group commit: concurrent runs' batches share a transaction; each fails or is cancelled alone."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.persistence import StoredEvent

from engine import ConcurrencyConflict, Engine, Run, StoreError
from engine.commit import GroupCommitter
from engine.errors import RunErased
from engine.run import unit_of
from engine.store import Store
from events import NoteAdded
from tests._helpers import REVIEW


def grouped_note(run: Run, value: int) -> Any:
    """Group the run's events and record a note; the grouping is returned, left open."""
    grouping = unit_of(run).grouped()
    grouping.__enter__()
    run.note("n", value)
    return grouping


async def commit(run: Run, committer: GroupCommitter) -> None:
    """Commit the run's pending events through `committer`."""
    await unit_of(run).commit_async(committer)


def note_at(engine: Engine, run_id: UUID, version: int) -> list[StoredEvent]:
    """One stored NoteAdded of `run_id` at `version`, serialised as the store writes it."""
    when = datetime(2026, 1, 1, tzinfo=UTC)
    event = NoteAdded(run_id=run_id, version=version, timestamp=when, key="k", value=version)
    return [engine.store.serialize(event)]


class TestGroupCommitter:
    def test_batches_committed_together_are_one_commit(self, engine: Engine) -> None:
        """Five runs committing at once are stored whole in one transaction."""
        runs = [engine.start_run(REVIEW) for _ in range(5)]
        committer = GroupCommitter(engine.store)
        for n, run in enumerate(runs):
            grouped_note(run, n)

        async def commit_all() -> None:
            await asyncio.gather(*(commit(run, committer) for run in runs))

        asyncio.run(commit_all())
        assert (committer.commits, committer.batches) == (1, 5)
        for n, run in enumerate(runs):
            assert [e.value for e in engine.events(run.id)[1:]] == [n]  # type: ignore[attr-defined]
            assert run.version == 2

    def test_a_conflict_fails_its_own_batch_only(self, engine: Engine) -> None:
        """A batch at a taken version is a ConcurrencyConflict; the rest of its group is stored."""
        runs = [engine.start_run(REVIEW) for _ in range(3)]
        engine.load(runs[1].id).note("first", "another writer")
        committer = GroupCommitter(engine.store)
        for n, run in enumerate(runs):
            grouped_note(run, n)

        async def commit_all() -> list[BaseException | None]:
            commits = (commit(run, committer) for run in runs)
            return await asyncio.gather(*commits, return_exceptions=True)

        outcomes = asyncio.run(commit_all())
        assert outcomes[0] is None
        assert outcomes[2] is None
        assert isinstance(outcomes[1], ConcurrencyConflict)
        assert runs[1].version == 1  # back to what the store holds of its own writes
        assert [len(engine.events(run.id)) for run in runs] == [2, 2, 2]
        assert committer.batches == 2

    def test_an_erased_run_fails_its_own_batch_only(self, engine: Engine) -> None:
        """A stale handle's batch of a run compaction erased is RunErased; the rest of its
        group is stored, as with a conflict."""
        stale, live = engine.start_run(REVIEW), engine.start_run(REVIEW)
        stale.stage_completed("project_analysis")
        engine.load(stale.id).finish("deleted")
        assert engine.compact().runs == (stale.id,)
        committer = GroupCommitter(engine.store)
        for n, run in enumerate((stale, live)):
            grouped_note(run, n)

        async def commit_all() -> list[BaseException | None]:
            commits = (commit(run, committer) for run in (stale, live))
            return await asyncio.gather(*commits, return_exceptions=True)

        erased, stored = asyncio.run(commit_all())
        assert isinstance(erased, RunErased)
        assert stored is None
        assert [e.version for e in engine.events(live.id)] == [1, 2]
        assert engine.store.last(stale.id) is None

    def test_a_later_batch_of_a_failed_run_is_not_written(self, engine: Engine) -> None:
        """Two batches of one run in a group: when the first fails, the second leaves no gap."""
        run = engine.start_run(REVIEW)
        engine.load(run.id).note("taken", 2)
        committer = GroupCommitter(engine.store)

        async def both() -> tuple[BaseException | None, BaseException | None]:
            first = committer.write(note_at(engine, run.id, 2))  # version 2 is taken
            second = committer.write(note_at(engine, run.id, 3))
            return await asyncio.gather(first, second, return_exceptions=True)

        first, second = asyncio.run(both())
        assert isinstance(first, ConcurrencyConflict)
        assert second is first
        assert [e.version for e in engine.events(run.id)] == [1, 2]

    def test_a_batch_cancelled_before_its_write_stays_pending(self, engine: Engine) -> None:
        """Cancelled while queued behind a write, a batch is withdrawn: kept, written later."""
        early, late = engine.start_run(REVIEW), engine.start_run(REVIEW)
        committer = GatedCommitter(engine.store)
        grouped_note(early, 1)
        grouping = grouped_note(late, 2)

        async def cancel_the_queued() -> None:
            first = asyncio.ensure_future(commit(early, committer))
            with committer.opened_at_the_end():
                await committer.writing()  # the first batch is on its way to disk
                second = asyncio.ensure_future(commit(late, committer))
                await asyncio.sleep(0)
                assert committer._queue  # the second waits for the next write
                second.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await second
            await first

        asyncio.run(cancel_the_queued())
        assert [len(engine.events(run.id)) for run in (early, late)] == [2, 1]
        assert (committer.commits, committer.batches) == (1, 1)
        assert late.version == 2  # the note happened: the grouping writes it at its end
        grouping.__exit__(None, None, None)
        assert [e.version for e in engine.events(late.id)] == [1, 2]

    def test_a_batch_cancelled_during_its_write_is_stored_and_known(self, engine: Engine) -> None:
        """Cancelled while on its way to disk, the batch's outcome stands; the cancel follows."""
        run = engine.start_run(REVIEW)
        committer = GatedCommitter(engine.store)
        grouping = grouped_note(run, 1)

        async def cancel_while_writing() -> None:
            pending = asyncio.ensure_future(commit(run, committer))
            with committer.opened_at_the_end():
                await committer.writing()
                pending.cancel()
                await asyncio.sleep(0)
                assert not pending.done()  # it waits for the write's outcome
            with pytest.raises(asyncio.CancelledError):
                await pending

        asyncio.run(cancel_while_writing())
        assert [e.version for e in engine.events(run.id)] == [1, 2]
        assert run.version == 2
        grouping.__exit__(None, None, None)  # nothing left to write: no second copy
        assert [e.version for e in engine.events(run.id)] == [1, 2]

    def test_a_cancelled_writer_finishes_its_write_and_refuses_the_rest(
        self, engine: Engine
    ) -> None:
        """The writer task cancelled mid-write: its batch is stored, the queued one refused."""
        first, second = engine.start_run(REVIEW), engine.start_run(REVIEW)
        committer = GatedCommitter(engine.store)
        grouped_note(first, 1)
        grouped_note(second, 2)

        async def cancel_the_writer() -> list[BaseException | None]:
            commits = [asyncio.ensure_future(commit(first, committer))]
            with committer.opened_at_the_end():
                await committer.writing()
                commits.append(asyncio.ensure_future(commit(second, committer)))
                await asyncio.sleep(0)
                assert committer._writing is not None
                committer._writing.cancel()
                await asyncio.sleep(0)
            return await asyncio.gather(*commits, return_exceptions=True)

        outcomes = asyncio.run(cancel_the_writer())
        assert outcomes[0] is None
        assert isinstance(outcomes[1], StoreError)
        assert "nothing written" in str(outcomes[1])
        assert [len(engine.events(run.id)) for run in (first, second)] == [2, 1]
        assert (first.version, second.version) == (2, 1)

    def test_a_store_error_fails_the_whole_group_without_retries(self, sqlite_url: str) -> None:
        """An error that is not a conflict is every batch's, each run back where the store is."""
        engine = Engine(sqlite_url)
        runs = [engine.start_run(REVIEW) for _ in range(3)]
        committer = GroupCommitter(engine.store)
        for n, run in enumerate(runs):
            grouped_note(run, n)
        engine.close()

        async def commit_all() -> list[BaseException | None]:
            commits = (commit(run, committer) for run in runs)
            return await asyncio.gather(*commits, return_exceptions=True)

        outcomes = asyncio.run(commit_all())
        assert all(isinstance(outcome, StoreError) for outcome in outcomes)
        assert [run.version for run in runs] == [1, 1, 1]
        with Engine(sqlite_url) as again:
            assert [len(again.events(run.id)) for run in runs] == [1, 1, 1]


class GatedCommitter(GroupCommitter):
    """A committer whose writing thread waits at a gate: the test decides when a write lands."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.gate = threading.Event()
        self.taken = threading.Event()

    def _write_group(self, group: list[Any]) -> list[BaseException | None]:
        self.taken.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return super()._write_group(group)

    async def writing(self) -> None:
        """Return once a group is in the writing thread (polled: the thread cannot await)."""
        while not self.taken.is_set():
            await asyncio.sleep(0.001)

    @contextlib.contextmanager
    def opened_at_the_end(self) -> Iterator[None]:
        """Open the gate when the block ends, also when an assertion in it fails."""
        try:
            yield
        finally:
            self.gate.set()
