"""Eight writer processes and two followers on one PostgreSQL store while their backends are
terminated at random: every append stored exactly once, and every persistent projection the
followers folded equals a rebuild from the first event.

Writers append to runs of their own (single events and batches) and all race on one shared
run (per-run optimistic concurrency: a conflict is refreshed and retried). A killer thread
calls ``pg_terminate_backend`` on the writers' and followers' connections meanwhile.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import uuid
from typing import Any
from uuid import UUID

import pytest

from engine import ConcurrencyConflict, Engine, StoreError
from engine.errors import OutcomeUnknown
from events import Event, NoteAdded
from projections import FailurePatterns, Projection, RunIndex
from tests._helpers import POSTGRES_URL, REVIEW

WRITERS = 8
FOLLOWERS = 2
APPENDS = 60
"""Appends per writer: about half to the shared run."""
SEED = 28


class EventsPerRun(Projection[int]):
    """How many events of each run were folded: a skipped or doubled event changes it."""

    name = "events_per_run"
    scope = "run"

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Event) -> int:
        return state + 1


class NotesInOrder(Projection[list[str]]):
    """Every note's value in the order followed: the global order of the shared run."""

    name = "notes_in_order"

    def initial(self) -> list[str]:
        return []

    def apply(self, state: list[str], event: Event) -> list[str]:
        return [*state, str(event.value)] if isinstance(event, NoteAdded) else state


def append(engine: Engine, run_id: UUID, values: list[str], stats: dict[str, int]) -> None:
    """Record `values` as one batch on the run, following docs/reliability.md's advice."""
    check = False
    while True:
        try:
            run = engine.load(run_id)
            if check and any(getattr(e, "value", None) == values[0] for e in engine.events(run_id)):
                return  # the append whose outcome was unknown was stored
            check = False
            with run.batch():
                for value in values:
                    run.note("v", value)
            return
        except ConcurrencyConflict:
            stats["conflicts"] += 1
        except OutcomeUnknown:
            stats["unknown"] += 1
            check = True
        except StoreError:
            stats["store_errors"] += 1


def write(url: str, index: int, shared: str, results: Any, ready: Any) -> None:
    """One writer: its own runs and the shared one, every value unique."""
    rng = random.Random(SEED * 100 + index)
    stats = {"conflicts": 0, "unknown": 0, "store_errors": 0}
    try:
        with Engine(url) as engine:
            ready.put(index)
            own: list[str] = []
            run_id: UUID | None = None
            for number in range(APPENDS):
                values = [f"{index}:{number}:{k}" for k in range(rng.choice((1, 1, 2, 4)))]
                if rng.random() < 0.5:
                    append(engine, UUID(shared), values, stats)
                    continue
                if run_id is None or rng.random() < 0.2:
                    run_id = start(engine, stats)
                    own.append(str(run_id))
                append(engine, run_id, values, stats)
        results.put(("writer", index, own, stats))
    except BaseException as error:  # report anything to the parent
        results.put(("failed", index, f"{type(error).__name__}: {error}", stats))


def start(engine: Engine, stats: dict[str, int]) -> UUID:
    """Start a run of a chosen id (so a lost answer is checked, not doubled)."""
    run_id = uuid.uuid4()
    while True:
        try:
            return engine.start_run(REVIEW, run_id=run_id).id
        except (OutcomeUnknown, StoreError, ConcurrencyConflict):
            stats["store_errors"] += 1
            try:
                if engine.events(run_id):
                    return run_id
            except StoreError:
                pass


def follow(url: str, index: int, finish: Any, results: Any, ready: Any) -> None:
    """One follower: fold the projections until told to finish, then until caught up."""
    try:
        with Engine(url) as engine:
            for projection in (EventsPerRun, NotesInOrder):
                engine.projections.register(projection)
            stop = threading.Event()
            thread = threading.Thread(
                target=engine.projections.follow, args=(stop,), kwargs={"timeout": 0.1}
            )
            thread.start()
            ready.put(index)
            finish.wait()
            stop.set()
            thread.join()
            while True:  # a pooled connection terminated earlier fails its first use
                try:
                    engine.projections.catch_up()
                    status = [(s.name, s.lag, s.last_error) for s in engine.projections.status()]
                    break
                except StoreError:
                    continue
        results.put(("follower", index, status, {}))
    except BaseException as error:
        results.put(("failed", index, f"{type(error).__name__}: {error}", {}))


def terminate(name: str, stop: threading.Event, killed: list[int]) -> None:
    """Terminate one of the test's backends every few tens of milliseconds."""
    import psycopg

    rng = random.Random(SEED)
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        while not stop.wait(rng.uniform(0.02, 0.08)):
            pids = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchall()
            if pids:
                conn.execute("SELECT pg_terminate_backend(%s)", (rng.choice(pids)[0],))
                killed[0] += 1


@pytest.mark.slow
class TestConcurrentFollowers:
    def test_projections_equal_a_rebuild_under_terminated_backends(self, postgres_url: str) -> None:
        """8 writers, 2 followers, backends terminated: nothing lost, doubled or skipped."""
        name = f"st_scale_{uuid.uuid4().hex[:8]}"  # only this test's connections die
        url = f"{postgres_url}&application_name={name}"
        with Engine(postgres_url) as engine:
            shared = str(engine.start_run(REVIEW).id)
        context = multiprocessing.get_context("spawn")
        results, finish, ready = context.Queue(), context.Event(), context.Queue()
        followers = [
            context.Process(target=follow, args=(url, i, finish, results, ready))
            for i in range(FOLLOWERS)
        ]
        writers = [
            context.Process(target=write, args=(url, i, shared, results, ready))
            for i in range(WRITERS)
        ]
        for process in followers + writers:
            process.start()
        for _ in followers + writers:  # terminations hit appends and follows, not opens
            ready.get(timeout=300)
        stop, killed = threading.Event(), [0]
        killer = threading.Thread(target=terminate, args=(name, stop, killed))
        killer.start()
        try:
            written = [results.get(timeout=600) for _ in writers]
        finally:
            stop.set()
            killer.join()
            finish.set()
        followed = [results.get(timeout=300) for _ in followers]
        for process in followers + writers:
            process.join(timeout=60)
        print(f"terminated {killed[0]} backends; writers {[w[3] for w in written]}")
        assert [w[2] for w in written + followed if w[0] == "failed"] == []
        assert killed[0] >= 10
        for _, _, status, _ in followed:
            assert {(n, lag, error) for n, lag, error in status} == {
                (EventsPerRun.name, 0, None),
                (NotesInOrder.name, 0, None),
                (RunIndex.name, 0, None),
                (FailurePatterns.name, 0, None),
            }
        own = {UUID(run) for _, _, runs, _ in written for run in runs}
        self._check(postgres_url, UUID(shared), own)

    def _check(self, url: str, shared: UUID, own: set[UUID]) -> None:
        with Engine(url) as engine:
            every = self._notifications(engine)
            keys = [(n.originator_id, n.originator_version) for n in every]
            assert len(keys) == len(set(keys))  # one notification per (run, version)
            assert [n.id for n in every] == sorted(n.id for n in every)
            runs = {n.originator_id for n in every}
            assert runs == own | {shared}
            values = [e.value for e in engine.events(shared)[1:]]  # type: ignore[attr-defined]
            assert len(values) == len(set(values))  # no append stored twice
            projections = engine.projections
            for projection in (EventsPerRun, NotesInOrder):
                projections.register(projection)
            names = (EventsPerRun.name, NotesInOrder.name, RunIndex.name, FailurePatterns.name)
            followed = {name: projections.states(name, catch_up=False) for name in names}
            for name in names:
                projections.rebuild(name)
            rebuilt = {name: projections.states(name, catch_up=False) for name in names}
            assert followed == rebuilt
            versions = {run_id: engine.load(run_id).version for run_id in runs}
            assert followed[EventsPerRun.name] == {str(r): v for r, v in versions.items()}

    def _notifications(self, engine: Engine) -> list[Any]:
        recorder = engine.store.recorder
        found: list[Any] = []
        while True:
            start = found[-1].id if found else 0
            page = recorder.select_notifications(start=start, limit=5000, inclusive_of_start=False)
            found.extend(page)
            if len(page) < 5000:
                return found
