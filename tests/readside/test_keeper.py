from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import sqlite3
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import ConcurrencyConflict, Engine, InvalidTransition, Pipeline, RunNotFound
from engine.errors import RunErased
from engine.machine import MachineFold, replay
from engine.readside import TimeTravel, keeper
from engine.run import Run
from events import DECIDED, RunStarted, StageCompleted
from projections import Projection, RunIndex, StateStack
from projections.errors import ProjectionStateError
from tests._helpers import LOOP, hub_table
from tests.readside.test_snapshots import CountingReader

KEEP_INTERVAL = 2_000
"""A shorter interval than the shipped one, to keep these runs short."""
KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64


def record(run: Run, outcomes: int, per_commit: int = 300) -> None:
    """`outcomes` outcomes of the loop (1 in 7 failed, a rollback in 50), in batches."""
    for start in range(0, outcomes, per_commit):
        with run.batch():
            for index in range(start, min(start + per_commit, outcomes)):
                if index % 50 == 49:
                    run.rollback(2, reason="again")
                elif index % 7 == 0:
                    run.stage_failed("work", error=f"e{index}")
                else:
                    run.stage_completed("work", result={"i": index})


def record_hub(run: Run, outcomes: int, per_commit: int = 300) -> None:
    """`outcomes` outcomes of `hub_table`'s nodes, each taking the hub's implicit route;
    one in 9 then rolled back alone (its route stays: a lone route), 1 in 23 two steps."""
    for start in range(0, outcomes, per_commit):
        with run.batch():
            for index in range(start, min(start + per_commit, outcomes)):
                if index % 9 == 8:
                    run.rollback(1, reason="again")
                elif index % 23 == 22 and run.machine.depth > 2:
                    run.rollback(2, reason="again")
                elif run.machine.state == "hub":
                    run.stage_completed("a" if index % 2 else "b")
                elif run.machine.state == "b":
                    run.stage_failed("b", error=f"e{index % 3}")
                else:  # a, or b_done after a rollback: back to the hub
                    run.stage_completed(run.machine.state)


def stored_snapshots(
    engine: Engine, run_id: uuid.UUID, projection: Any, generation: int | None = None
) -> dict[int, Any]:
    """Version → the `projection` snapshot the store holds of the run (unsealed JSON), of
    the store's erasure generation unless `generation` is given."""
    views = engine.store.views
    assert views is not None  # a SQLite or PostgreSQL store
    found, version = {}, len(engine.events(run_id))
    if generation is None:
        generation = engine.store.generation()
    while stored := views.snapshot(
        str(run_id), projection.name, projection.identity(), generation, version
    ):
        found[stored[0]] = views.codec.unseal(stored[1])
        version = stored[0] - 1
    return found


def snapshot_rows(url: str, run_id: uuid.UUID | None = None) -> list[tuple[str, int, bytes]]:
    """(projection, version, sealed state) of the stored snapshots, of one run if given."""
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
        rows = db.execute("SELECT run_id, projection, version, state FROM stagetrail_snapshots")
        return [(p, v, s) for r, p, v, s in rows if run_id is None or r == str(run_id)]


def recorded_through_trouble(
    engine: Engine, url: str, pipeline: Pipeline, recorder: Callable[..., None]
) -> Run:
    """A run recorded past a few crossings, through a batch that raised, another writer's
    events between this one's commits and a conflict it lost."""
    run = engine.start_run(pipeline)
    recorder(run, KEEP_INTERVAL + 700, 300)
    with pytest.raises(InvalidTransition), run.batch():  # nothing of it is written
        run.stage_completed(run.machine.state)
        run.stage_completed("nowhere")
    with Engine(url) as other:  # another writer, between this one's commits
        recorder(other.load(run.id), 400, 100)
    with pytest.raises(ConcurrencyConflict):
        recorder(run, 100, 100)
    run.refresh()
    recorder(run, 3 * KEEP_INTERVAL, 250)
    return run


@pytest.fixture(autouse=True)
def short_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers keep a snapshot every `KEEP_INTERVAL` events in these tests."""
    monkeypatch.setattr(keeper, "KEEP_INTERVAL", KEEP_INTERVAL)


class TestSnapshotKeeper:
    def test_a_fresh_engine_folds_at_most_an_interval_after_a_writer(self, sqlite_url: str) -> None:
        """No reader before: a fresh engine's state at any version folds ≤ one keep interval."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, 3 * KEEP_INTERVAL + 250)
        with Engine(sqlite_url) as fresh:
            events = fresh.events(run.id)
            for at in (KEEP_INTERVAL + 10, 2 * KEEP_INTERVAL + 777, len(events)):
                reader = CountingReader(fresh.store)
                state = TimeTravel(reader, fresh.store.views).project(run.id, StateStack(), at)
                assert reader.count <= KEEP_INTERVAL
                assert state == StateStack().fold(events[:at])

    def test_a_fresh_engine_loads_from_the_writers_machine_snapshot(self, sqlite_url: str) -> None:
        """engine.load after a writer folds only the events after its newest snapshot."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, 2 * KEEP_INTERVAL + 450)
            run.stage_started("work")
        with Engine(sqlite_url) as fresh:
            first, *rest = fresh.events(run.id)
            assert isinstance(first, RunStarted)
            reader = CountingReader(fresh.store)
            folded = TimeTravel(reader, fresh.store.views).project(
                run.id, MachineFold(), len(rest) + 1
            )
            assert reader.count <= 300  # the commits after the last crossing
            assert folded is not None
            assert folded[1] == replay(first, rest)[1] == fresh.load(run.id).machine
            loaded = fresh.load(run.id)
            loaded.stage_completed("work", outcome="done")
            assert fresh.verify(run.id).ok

    def test_the_writer_reads_the_run_only_at_its_first_crossing(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """After the first snapshot, a writer folds what it writes: it reads no event back."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, KEEP_INTERVAL + 100)
            reads: list[Any] = []
            recorder = engine.store.recorder
            # A run's events are read as `StoredEvent`s or, streamed on SQLite, as plain rows.
            for name in ("select_events", "select_rows"):
                monkeypatch.setattr(recorder, name, observing(getattr(recorder, name), reads))
            record(run, 3 * KEEP_INTERVAL)
            assert reads == []
        versions = sorted(v for p, v, _ in snapshot_rows(sqlite_url) if p == StateStack.name)
        assert len([v for v in versions if v > KEEP_INTERVAL + 100]) == 3

    def test_short_runs_store_no_snapshot(self, sqlite_url: str) -> None:
        """A run that never reaches the keep interval costs no snapshot."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, KEEP_INTERVAL - 10)
        assert snapshot_rows(sqlite_url) == []

    def test_writers_snapshots_are_sealed_by_the_stores_cipher(self, sqlite_url: str) -> None:
        """The snapshots a writer stores go through the store's cipher: no plain text."""
        with Engine(sqlite_url, cipher_key=KEY) as engine:
            run = engine.start_run(LOOP)
            record(run, KEEP_INTERVAL + 10)
        rows = snapshot_rows(sqlite_url)
        assert {p for p, _, _ in rows} == {StateStack.name, RunIndex.name, MachineFold.name}
        for _, _, sealed in rows:
            assert b"work" not in sealed
            assert b"loop" not in sealed
        with Engine(sqlite_url, cipher_key=KEY) as fresh:
            events = fresh.events(run.id)
            assert fresh.project(run.id, StateStack) == StateStack().fold(events)

    def test_an_erased_runs_writer_snapshots_are_gone_and_never_served(
        self, sqlite_url: str
    ) -> None:
        """Compaction removes a deleted run's snapshots; newer ones are of a new generation."""
        with Engine(sqlite_url) as engine:
            doomed, kept = engine.start_run(LOOP), engine.start_run(LOOP)
            record(doomed, KEEP_INTERVAL + 10)
            doomed.finish("deleted")
            before = engine.store.generation()
            engine.compact()
            assert snapshot_rows(sqlite_url, doomed.id) == []
            record(kept, KEEP_INTERVAL + 10)
        with contextlib.closing(sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))) as db:
            generations = {g for (g,) in db.execute("SELECT generation FROM stagetrail_snapshots")}
        assert generations == {before + 1}

    def test_two_writers_of_one_run_keep_correct_snapshots(self, sqlite_url: str) -> None:
        """Handles writing one run in turns fold only their own commits' events in order."""
        with Engine(sqlite_url) as engine:
            first = engine.start_run(LOOP)
            record(first, KEEP_INTERVAL + 50)
            second = engine.load(first.id)
            record(second, KEEP_INTERVAL)
            first.refresh()
            record(first, KEEP_INTERVAL)
        with Engine(sqlite_url) as fresh:
            events = fresh.events(first.id)
            for at in (KEEP_INTERVAL * 2 + 60, len(events)):
                assert fresh.project(first.id, StateStack, at=at) == StateStack().fold(events[:at])

    def test_a_stale_writer_of_an_erased_run_keeps_no_snapshot(self, sqlite_url: str) -> None:
        """A handle whose run another process deleted and compacted away cannot write on over
        the erased versions (RunErased), and keeps no snapshot of its state, its stack or its
        summary, though it holds the events it wrote (erased data)."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, KEEP_INTERVAL - 100)
            with Engine(sqlite_url) as other:
                other.load(run.id).finish("deleted")
                other.compact()
            with pytest.raises(RunErased):
                record(run, 200)  # would cross a snapshot interval in the new generation
        assert snapshot_rows(sqlite_url, run.id) == []
        with Engine(sqlite_url) as fresh, pytest.raises(RunNotFound):
            fresh.load(run.id)  # nothing of it is stored again

    def test_a_writer_of_a_run_that_outlived_an_erasure_keeps_on(self, sqlite_url: str) -> None:
        """Another run erased while a handle writes: its state agrees with the store (folded
        once, from the start: the run is short), so its snapshots go on, of the new generation."""
        with Engine(sqlite_url) as engine:
            run, doomed = engine.start_run(LOOP), engine.start_run(LOOP)
            record(run, KEEP_INTERVAL - 100)
            with Engine(sqlite_url) as other:
                other.load(doomed.id).finish("deleted")
                other.compact()
                generation = other.store.generation()
            record(run, KEEP_INTERVAL + 200)
            events = engine.events(run.id)
        with contextlib.closing(sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))) as db:
            rows = db.execute(
                "SELECT projection, version FROM stagetrail_snapshots"
                " WHERE run_id = ? AND generation = ?",
                (str(run.id), generation),
            )
            kept = set(rows)
        for name in (StateStack.name, MachineFold.name):  # one per crossing, at its commit
            crossings = {
                version // KEEP_INTERVAL for projection, version in kept if projection == name
            }
            assert crossings >= {1, 2}
        with Engine(sqlite_url) as fresh:
            assert fresh.project(run.id, StateStack) == StateStack().fold(events)


class TestKeptStack:
    @pytest.mark.parametrize("recorder", [record, record_hub], ids=["loop", "hub"])
    def test_the_writers_stack_snapshots_equal_a_rebuild(
        self, shared_url: str, recorder: Callable[..., None]
    ) -> None:
        """Each StateStack snapshot stored equals StateStack's own of the fold to its version;
        the writer's lie at each multiple of the interval (a reader folds at most one), also
        after rollbacks, a batch that raised, a conflict lost and another writer's events."""
        pipeline = LOOP if recorder is record else hub_table(hub=True)
        with Engine(shared_url) as engine:
            run = recorded_through_trouble(engine, shared_url, pipeline, recorder)
            events = engine.events(run.id)
            stored = stored_snapshots(engine, run.id, StateStack())
        for version, data in stored.items():
            assert data == StateStack().snapshot(StateStack().fold(events[:version])), version
        multiples = range(KEEP_INTERVAL, len(events) + 1, KEEP_INTERVAL)
        assert set(multiples) <= set(stored)
        with Engine(shared_url) as fresh:
            for at in (KEEP_INTERVAL + 1, 3 * KEEP_INTERVAL + 7, len(events)):
                reader = CountingReader(fresh.store)
                state = TimeTravel(reader, fresh.store.views).project(run.id, StateStack(), at)
                assert reader.count <= KEEP_INTERVAL
                assert state == StateStack().fold(events[:at])

    def test_a_writer_that_began_its_run_reads_no_event_back(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run's first writer stores its snapshots, the first crossing's too, reading none of
        its events back (it follows the stack's shape from the run's start)."""
        with Engine(sqlite_url) as engine:
            reads: list[Any] = []
            recorder = engine.store.recorder
            for name in ("select_events", "select_rows"):
                monkeypatch.setattr(recorder, name, observing(getattr(recorder, name), reads))
            run = engine.start_run(LOOP)
            record(run, 3 * KEEP_INTERVAL + 100)
            assert reads == []
        versions = sorted(v for p, v, _ in snapshot_rows(sqlite_url) if p == StateStack.name)
        assert versions == [KEEP_INTERVAL, 2 * KEEP_INTERVAL, 3 * KEEP_INTERVAL]

    def test_a_failure_following_the_begun_events_never_fails_the_start(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A stack shape that cannot follow a run's first events leaves the run started and
        recording; its snapshots then come from the fold, equal to a rebuild."""
        from projections import stack

        def broken(start: RunStarted) -> Any:
            raise RuntimeError("shape broken")

        monkeypatch.setattr(stack.StackShape, "started", staticmethod(broken))
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, KEEP_INTERVAL + 100)
            events = engine.events(run.id)
            assert len(events) == KEEP_INTERVAL + 101
            stored = stored_snapshots(engine, run.id, StateStack())
        assert stored, "the fallback fold keeps the stack's snapshots"
        for version, data in stored.items():
            assert data == StateStack().snapshot(StateStack().fold(events[:version])), version


SHORT = 16
"""The keep interval of the property tests: many crossings in short runs."""


def move(rng: random.Random, run: Run) -> None:
    """One legal event of `run`, chosen by `rng`: an outcome (by a hub's implicit route, a
    recorded route or a failure too), a rollback of one or more steps (to the bottom), a
    note, in a final state now and then the run's end."""
    machine, pipeline = run.machine, run.pipeline
    state = machine.state
    if machine.depth and rng.random() < 0.15:  # most often an outcome alone (a lone route)
        steps = rng.choice([1, 1, 1, 1, 2, 3, rng.randint(1, machine.depth), machine.depth])
        run.rollback(min(steps, machine.depth))
    elif pipeline.is_final(state):
        run.finish() if rng.random() < 0.01 else run.note("step", machine.version)
    elif state == pipeline.to_dict().get("hub") and rng.random() < 0.6:
        target = rng.choice(["a", "b"])
        if rng.random() < 0.3:
            run.record(StageCompleted, stage="hub", attempt=DECIDED, outcome=target)
        else:
            outcome(rng, run, target)
    else:
        outcome(rng, run, state)


def outcome(rng: random.Random, run: Run, stage: str) -> None:
    """A completed or failed outcome of `stage`, one its row allows (seldom to a final state)."""
    pipeline = run.pipeline
    names = pipeline.allowed(stage)
    going_on = [
        name for name in names if not pipeline.is_final(pipeline.next_state(stage, name) or "")
    ]
    name = rng.choice(going_on if going_on and rng.random() < 0.9 else names)
    if rng.random() < 0.3:
        run.stage_failed(stage, error="e", outcome=name)
    else:
        run.stage_completed(stage, outcome=name)


def commit(rng: random.Random, run: Run, events: int) -> None:
    """`events` legal events of `run` in one batch (fewer if it finished)."""
    with run.batch():
        for _ in range(events):
            if run.machine.status is None:
                move(rng, run)


class Raised(Exception):
    """What a batch of `act` raises, to be taken back."""


def act(rng: random.Random, engine: Engine, url: str, run: Run, runs: set[uuid.UUID]) -> Run:
    """One step of a writer's life, chosen by `rng`; the handle it goes on with."""
    choice = rng.random()
    if choice < 0.06:  # a batch that raised: none of it written
        with contextlib.suppress(Raised), run.batch():
            commit(rng, run, rng.randint(1, 20))
            raise Raised
    elif choice < 0.1:  # another process's writer in between: this one's commit is refused
        with Engine(url) as other:
            commit(rng, other.load(run.id), rng.randint(1, 30))
        with contextlib.suppress(ConcurrencyConflict):
            commit(rng, run, 3)
        run.refresh()
    elif choice < 0.14:  # a second handle of the run in this process, then either goes on
        second = engine.load(run.id)
        commit(rng, second, rng.randint(1, 30))
        run = second if rng.random() < 0.5 else run.refresh()
    elif choice < 0.17:  # a fork, short (it holds its copies) or long
        run = engine.fork(run.id, at=rng.randint(1, run.version - (run.status != "running")))
        runs.add(run.id)
    elif choice < 0.18:  # runs erased: a new erasure generation
        engine.start_run(LOOP).finish("deleted")
        engine.compact()
    elif choice < 0.24:  # committed through the event loop's group committer

        async def grouped() -> None:
            async with run.batch():
                commit(rng, run, rng.randint(1, 30))

        asyncio.run(grouped())
    else:
        commit(rng, run, rng.choice([1, 2, 5, 15, 16, 17, 33, 50, 80]))
    return run


def every_stored(engine: Engine, run_id: uuid.UUID, projection: Any) -> dict[tuple[int, int], Any]:
    """(generation, version) → the `projection` snapshot stored of the run, of every generation."""
    return {
        (generation, version): data
        for generation in range(engine.store.generation() + 1)
        for version, data in stored_snapshots(engine, run_id, projection, generation).items()
    }


class TestKeptSnapshotProperties:
    @pytest.mark.parametrize("kept", [StateStack, RunIndex])
    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(seed=st.integers(0, 2**32), hub=st.sampled_from([None, True, False]))
    def test_every_stored_snapshot_is_a_rebuild(
        self,
        shared_url: str,
        monkeypatch: pytest.MonkeyPatch,
        kept: type[Projection[Any]],
        seed: int,
        hub: bool | None,
    ) -> None:
        """Whatever a writer's life (implicit, recorded and lone routes, rollbacks to the
        bottom, batches that raised, other writers, a second handle, forks, erasures, group
        commits), each snapshot it stored of a kept projection (the stack, the summary), of
        every generation, equals that projection's own of a rebuild."""
        monkeypatch.setattr(keeper, "KEEP_INTERVAL", SHORT)
        rng = random.Random(seed)  # a life's many choices: hypothesis's own shrink to zeros
        with Engine(shared_url) as engine:
            run = engine.start_run(LOOP if hub is None else hub_table(hub=hub))
            runs = {run.id}
            for _ in range(rng.randint(20, 60)):
                if run.status != "running":
                    break
                run = act(rng, engine, shared_url, run, runs)
            for run_id in runs:
                events = engine.events(run_id)
                for at, data in every_stored(engine, run_id, kept()).items():
                    assert data == kept().snapshot(kept().fold(events[: at[1]])), at


def observing(select: Callable[..., Any], reads: list[Any]) -> Callable[..., Any]:
    """`select`, noting the keyword arguments of each call in `reads`."""

    def observed(*args: Any, **kwargs: Any) -> Any:
        reads.append(kwargs)
        return select(*args, **kwargs)

    return observed


def assert_rebuilt_at_every_multiple(stored: dict[int, Any], events: list[Any]) -> None:
    """Each summary `stored` (version → snapshot) is RunIndex's own of a rebuild, and one is
    stored at each multiple of the interval."""
    for version, data in stored.items():
        assert data == rebuilt(events, version), version
    assert set(range(KEEP_INTERVAL, len(events) + 1, KEEP_INTERVAL)) <= set(stored)


def rebuilt(events: list[Any], version: int) -> Any:
    """RunIndex's own snapshot of the fold of the run's first `version` events."""
    return RunIndex().snapshot(RunIndex().fold(events[:version]))


class CountingIndex(RunIndex):
    """RunIndex, counting the events each fold is given: a writer's folds of its commits (its
    own `fold`, so a folding of it is fed through that fold, part by part)."""

    folded: ClassVar[list[int]] = []

    def fold(self, events: Any, state: Any = None) -> Any:
        events = list(events)
        CountingIndex.folded.append(len(events))
        return super().fold(events, state)


class TestKeptSummary:
    def test_a_fresh_reader_folds_at_most_an_interval_of_the_summary(self, sqlite_url: str) -> None:
        """After a writer crossed the interval a few times, a fresh reader's RunIndex at the
        head (and at a crossing) folds at most one interval of events, equal to a full fold."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, 3 * KEEP_INTERVAL + 250)
        with Engine(sqlite_url) as fresh:
            events = fresh.events(run.id)
            for at in (len(events), 2 * KEEP_INTERVAL, 2 * KEEP_INTERVAL + 1):
                reader = CountingReader(fresh.store)
                state = TimeTravel(reader, fresh.store.views).project(run.id, RunIndex(), at)
                assert reader.count <= KEEP_INTERVAL, at
                assert state == RunIndex().fold(events[:at])

    def test_a_short_run_keeps_no_summary_and_folds_none(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Before its first crossing a writer folds no summary and stores none; the crossing
        folds it once, from the events the handle wrote (no event read back)."""
        assert [type(p) for p in keeper.kept_projections()] == [StateStack, RunIndex]
        monkeypatch.setattr(CountingIndex, "folded", [])
        monkeypatch.setattr(keeper, "kept_projections", lambda: [StateStack(), CountingIndex()])
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, KEEP_INTERVAL - 10)
            assert CountingIndex.folded == []
            assert snapshot_rows(sqlite_url) == []
            record(run, 400, per_commit=100)  # crosses at its first commit, then folds each
        assert CountingIndex.folded == [KEEP_INTERVAL, 91, 100, 100, 100]
        names = [p for p, _, _ in snapshot_rows(sqlite_url)]
        assert names.count(CountingIndex.name) == 1

    @pytest.mark.parametrize("recorder", [record, record_hub], ids=["loop", "hub"])
    def test_the_writers_summaries_equal_a_rebuild(
        self, shared_url: str, recorder: Callable[..., None]
    ) -> None:
        """Each RunIndex snapshot stored equals RunIndex's own of the fold to its version, one
        at each multiple of the interval, also after a batch that raised, a conflict lost,
        another writer's events between this one's commits and its run finished."""
        pipeline = LOOP if recorder is record else hub_table(hub=True)
        with Engine(shared_url) as engine:
            run = recorded_through_trouble(engine, shared_url, pipeline, recorder)
            events = engine.events(run.id)
            stored = stored_snapshots(engine, run.id, RunIndex())
        assert_rebuilt_at_every_multiple(stored, events)

    def test_a_run_begun_by_another_handle_keeps_correct_summaries(self, sqlite_url: str) -> None:
        """A handle that loaded a run begun elsewhere, and the first handle after its events,
        fold their first crossing from the store: every summary stored is a rebuild."""
        with Engine(sqlite_url) as engine:
            first = engine.start_run(LOOP)
            record(first, KEEP_INTERVAL - 300)
            with Engine(sqlite_url) as other:
                record(other.load(first.id), 2 * KEEP_INTERVAL)
            first.refresh()
            record(first, KEEP_INTERVAL + 100)
            events = engine.events(first.id)
            stored = stored_snapshots(engine, first.id, RunIndex())
        assert_rebuilt_at_every_multiple(stored, events)

    def test_runs_erased_between_commits_serve_no_old_summary(self, sqlite_url: str) -> None:
        """Runs erased before a writer's first crossing and again after it: its summaries are
        stored only under generations its state was checked in, each a rebuild (none from the
        events it held), and a fresh reader's summary is the run's own."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, KEEP_INTERVAL - 100)
            erased_at = []
            for _ in range(2):
                with Engine(sqlite_url) as other:
                    other.start_run(LOOP).finish("deleted")
                    other.compact()
                erased_at.append(run.version)
                record(run, KEEP_INTERVAL)
            events = engine.events(run.id)
            generation = engine.store.generation()
            assert stored_snapshots(engine, run.id, RunIndex(), generation - 2) == {}
            old = stored_snapshots(engine, run.id, RunIndex(), generation - 1)
            new = stored_snapshots(engine, run.id, RunIndex())
        # The first crossing after an erasure folds from the store (storing on the way),
        # if its nearest snapshot of the new generation is near enough (after the second: no).
        assert KEEP_INTERVAL in old
        assert max(old) <= erased_at[1]
        for version, data in {**old, **new}.items():
            assert data == rebuilt(events, version), version
        with Engine(sqlite_url) as fresh:
            assert fresh.project(run.id, RunIndex) == RunIndex().fold(events)


ALTERNATING = Pipeline(
    "alternating",
    initial="a",
    transitions=[("a", "completed", "b"), ("b", "completed", "a"), ("a", "end", "done")],
    final=["done"],
)
"""Every outcome pushes a state other than the one below it: the stack's runs are all of one."""


def record_alternating(run: Run, outcomes: int, per_commit: int = 300) -> None:
    """`outcomes` outcomes of `ALTERNATING`, in batches; one in 2,999 a rollback of some 1,500
    steps (below the crossing before: into the part an earlier snapshot holds)."""
    for start in range(0, outcomes, per_commit):
        with run.batch():
            for index in range(start, min(start + per_commit, outcomes)):
                if index % 2_999 == 2_998:
                    run.rollback(min(run.machine.depth, 1_500 + index % 5), reason="again")
                else:
                    run.stage_completed(run.machine.state)


def machine_sizes(url: str, run_id: uuid.UUID) -> dict[int, int]:
    """Version → stored (sealed) bytes of the run's machine snapshots."""
    return {v: len(s) for p, v, s in snapshot_rows(url, run_id) if p == MachineFold.name}


class TestKeptMachine:
    def test_a_machine_snapshot_of_alternating_states_stays_small(self, sqlite_url: str) -> None:
        """A stack of alternating states (runs of one) deepening by an interval per crossing:
        each machine snapshot stores what changed since the one before, not the whole stack."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(ALTERNATING)
            for _ in range(6):
                for _ in range(KEEP_INTERVAL // 500):  # no rollback: the stack only grows
                    with run.batch():
                        for _ in range(500):
                            run.stage_completed(run.machine.state)
        sizes = machine_sizes(sqlite_url, run.id)
        first, *later = (sizes[version] for version in sorted(sizes))
        assert len(later) == 5  # one per crossing, at the commit that crossed
        assert run.machine.depth > 5 * KEEP_INTERVAL
        assert max(later) < 1.5 * first

    @pytest.mark.parametrize(
        "recorder", [record_alternating, record, record_hub], ids=["alternating", "loop", "hub"]
    )
    def test_a_restored_machine_equals_replay_at_any_version(
        self, shared_url: str, recorder: Callable[..., None]
    ) -> None:
        """A fresh engine's machine at any version (from the writer's snapshots, their stacks'
        older parts made when walked) equals `replay`'s; so does a loaded handle's after a
        rollback to the bottom of its stack, and the run verifies."""
        pipelines = {record_alternating: ALTERNATING, record: LOOP}
        pipeline = pipelines.get(recorder, hub_table(hub=True))
        with Engine(shared_url) as engine:
            run = engine.start_run(pipeline)
            recorder(run, 5 * KEEP_INTERVAL + 300)
        with Engine(shared_url) as fresh:
            first, *rest = fresh.events(run.id)
            assert isinstance(first, RunStarted)
            for at in (KEEP_INTERVAL, 3 * KEEP_INTERVAL + 1, 4 * KEEP_INTERVAL + 777, len(rest)):
                travel = TimeTravel(fresh.store, fresh.store.views)
                folded = travel.project(run.id, MachineFold(), at + 1)
                assert folded is not None
                assert folded[1] == replay(first, rest[:at])[1], at
            loaded = fresh.load(run.id)
            assert loaded.machine == replay(first, rest)[1]
            loaded.rollback(loaded.machine.depth - 1, reason="to the bottom")
            rest = fresh.events(run.id)[1:]
            assert loaded.machine == replay(first, rest)[1]
            assert fresh.verify(run.id).ok

    def test_a_fork_of_a_deep_alternating_run_keeps_its_machine(self, shared_url: str) -> None:
        """A fork taken deep in an alternating run, then written across crossings of its own,
        loads in a fresh engine as `replay` folds it, rollbacks into its copies' part too."""
        with Engine(shared_url) as engine:
            run = engine.start_run(ALTERNATING)
            record_alternating(run, 3 * KEEP_INTERVAL + 100)
            fork = engine.fork(run.id, at=2 * KEEP_INTERVAL + 333)
            record_alternating(fork, 2 * KEEP_INTERVAL + 50)
        with Engine(shared_url) as fresh:
            loaded = fresh.load(fork.id)
            first, *rest = fresh.events(fork.id)
            assert isinstance(first, RunStarted)
            assert loaded.machine == replay(first, rest)[1]
            loaded.rollback(loaded.machine.depth - 2, reason="deep")
            rest = fresh.events(fork.id)[1:]
            assert loaded.machine == replay(first, rest)[1]
            assert fresh.verify(fork.id).ok

    def test_a_loaded_handle_rolls_back_deep_after_another_run_was_erased(
        self, sqlite_url: str
    ) -> None:
        """Runs erased after a handle was loaded: its stack's older part, made only now, is read
        from the run the store holds, checked to be the handle's (guard: main held it whole)."""
        with Engine(sqlite_url) as engine:
            run, doomed = engine.start_run(ALTERNATING), engine.start_run(LOOP)
            record_alternating(run, 4 * KEEP_INTERVAL + 100)
        with Engine(sqlite_url) as fresh:
            loaded = fresh.load(run.id)
            with Engine(sqlite_url) as other:
                other.load(doomed.id).finish("deleted")
                other.compact()
            loaded.rollback(loaded.machine.depth - 3, reason="deep")
            first, *rest = fresh.events(run.id)
            assert isinstance(first, RunStarted)
            assert loaded.machine == replay(first, rest)[1]

    def test_a_snapshot_restored_from_bare_events_folds_its_older_part(
        self, sqlite_url: str
    ) -> None:
        """`restore` given events alone (no earlier states) makes the stack's older part by a
        fold of the run up to the snapshot it names (guard of the fallback)."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(ALTERNATING)
            record_alternating(run, 3 * KEEP_INTERVAL + 10)
            views = engine.store.views
            assert views is not None
            fold = MachineFold()
            version, sealed = views.snapshot(
                str(run.id), fold.name, fold.identity(), engine.store.generation(), 10**9
            ) or (0, b"")
            data = views.codec.unseal(sealed)
            assert data["below"] is not None

            def events(gt: int, lte: int) -> Any:
                return engine.store.stream(run.id, gt=gt, lte=lte)

            restored = fold.restore(data, events)
            first, *rest = engine.events(run.id)
            assert isinstance(first, RunStarted)
            assert restored == replay(first, rest[: version - 1])


class TestKeptSummaryBytes:
    def test_a_summary_outgrowing_its_bytes_is_kept_less_often(self, sqlite_url: str) -> None:
        """The summary of a run whose states alternate outgrows the bytes its interval allows:
        its writer keeps it less and less often, each stored one within
        `KEPT_BYTES_PER_EVENT` bytes per event since the one before, and a fresh reader's
        summary at the head is still the fold of the run."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(ALTERNATING)
            record_alternating(run, 40 * KEEP_INTERVAL)
        rows = sorted(
            (version, len(data))
            for name, version, data in snapshot_rows(sqlite_url, run.id)
            if name == RunIndex.name
        )
        assert rows[0][0] == KEEP_INTERVAL
        assert len(rows) < 30
        for (before, _), (version, size) in zip([(0, 0), *rows], rows, strict=False):
            assert size <= keeper.KEPT_BYTES_PER_EVENT * (version - before), version
        with Engine(sqlite_url) as fresh:
            assert fresh.project(run.id, RunIndex()) == RunIndex().fold(fresh.events(run.id))


def record_random(run: Run, outcomes: int, seed: int, per_commit: int = 97) -> None:
    """`outcomes` events of `ALTERNATING` with rollbacks of random depth (some to the bottom
    of the stack, some just below a recent crossing), in batches of odd sizes."""
    rng = random.Random(seed)
    for start in range(0, outcomes, per_commit):
        with run.batch():
            for _ in range(start, min(start + per_commit, outcomes)):
                depth, roll = run.machine.depth, rng.random()
                if depth and roll < 0.00003:
                    run.rollback(depth, reason="to the bottom")
                elif depth > 1 and roll < 0.0012:
                    run.rollback(rng.randint(1, min(depth - 1, 900)), reason="deep")
                else:
                    run.stage_completed(run.machine.state)


def machines(first: RunStarted, rest: list[Any]) -> list[Any]:
    """`replay`'s machine state after each version (index 0: after event 1)."""
    pipeline, state = replay(first)
    states = [state]
    from engine.machine import apply

    for event in rest:
        state = apply(pipeline, state, event)
        states.append(state)
    return states


class TestDeferredChains:
    @pytest.mark.parametrize("seed", [1, 2])
    def test_a_chain_of_fifty_crossings_equals_replay_at_sampled_versions(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch, seed: int
    ) -> None:
        """Fifty crossings of a small interval, random rollbacks between: each reader's machine
        (fresh travel, shared travel walking down, a loaded handle rolled back to the bottom)
        equals `replay`'s, its chain of deferred parts walked without recursion limits."""
        monkeypatch.setattr(keeper, "KEEP_INTERVAL", 500)
        with Engine(sqlite_url) as engine:
            run = engine.start_run(ALTERNATING)
            record_random(run, 50 * 500 + 77, seed)
        with Engine(sqlite_url) as fresh:
            first, *rest = fresh.events(run.id)
            assert isinstance(first, RunStarted)
            expected = machines(first, rest)
            shared = TimeTravel(fresh.store, fresh.store.views)
            versions = sorted({*range(1, len(expected) + 1, 613), len(expected)}, reverse=True)
            versions += [v + d for v in range(500, len(expected), 500) for d in (-1, 0, 1)]
            for at in versions:
                alone = TimeTravel(fresh.store, fresh.store.views)
                for travel in (alone, shared):
                    folded = travel.project(run.id, MachineFold(), at)
                    assert folded is not None
                    assert folded[1] == expected[at - 1], at
            loaded = fresh.load(run.id)
            assert loaded.machine == expected[-1]
            if loaded.machine.depth:
                loaded.rollback(loaded.machine.depth, reason="to the bottom")
            first, *rest = fresh.events(run.id)
            assert loaded.machine == replay(first, rest)[1]  # type: ignore[arg-type]
            assert fresh.verify(run.id).ok

    def record_deep(self, url: str) -> uuid.UUID:
        """An alternating run of six crossings of 500 events, no rollback: every machine
        snapshot but the first names the one before as its stack's base."""
        with Engine(url) as engine:
            run = engine.start_run(ALTERNATING)
            for _ in range(30):
                with run.batch():
                    for _ in range(100):
                        run.stage_completed(run.machine.state)
        return run.id

    def test_a_missing_older_snapshot_is_folded_again(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A snapshot the newest one's older part names is gone: a deep rollback of a loaded
        handle folds that part from the snapshot before it (guard)."""
        monkeypatch.setattr(keeper, "KEEP_INTERVAL", 500)
        run_id = self.record_deep(sqlite_url)
        versions = sorted(v for p, v, _ in snapshot_rows(sqlite_url, run_id) if p == "run_machine")
        with contextlib.closing(sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))) as db:
            db.execute(
                "DELETE FROM stagetrail_snapshots WHERE projection='run_machine' AND version=?",
                (versions[-3],),
            )
            db.commit()
        with Engine(sqlite_url) as fresh:
            loaded = fresh.load(run_id)
            loaded.rollback(loaded.machine.depth - 1, reason="deep")
            first, *rest = fresh.events(run_id)
            assert isinstance(first, RunStarted)
            assert loaded.machine == replay(first, rest)[1]

    def test_an_older_snapshot_of_another_version_is_a_clear_error(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The snapshot an older part names holds another version's state (a newer one's,
        whose base is the newer snapshot: a cycle): walking it raises ProjectionStateError,
        nothing is recorded (fails before: RecursionError)."""
        monkeypatch.setattr(keeper, "KEEP_INTERVAL", 500)
        run_id = self.record_deep(sqlite_url)
        rows = {v: s for p, v, s in snapshot_rows(sqlite_url, run_id) if p == "run_machine"}
        *_, older, _newer, newest = sorted(rows)
        with contextlib.closing(sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))) as db:
            db.execute(
                "UPDATE stagetrail_snapshots SET state=? WHERE projection='run_machine' "
                "AND version=?",
                (rows[newest], older),
            )
            db.commit()
        with Engine(sqlite_url) as fresh:
            loaded = fresh.load(run_id)
            stored = len(fresh.events(run_id))
            with pytest.raises(ProjectionStateError, match=f"after event {older} "):
                loaded.rollback(loaded.machine.depth - 1, reason="deep")
            assert len(fresh.events(run_id)) == stored

    def test_a_handle_whose_run_was_erased_and_its_id_taken_never_serves_the_new_run(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A loaded handle's run erased, a run of another table started under its id: the
        handle's deep rollback raises ProjectionStateError, never walks the new run (guard)."""
        monkeypatch.setattr(keeper, "KEEP_INTERVAL", 500)
        run_id = self.record_deep(sqlite_url)
        with Engine(sqlite_url) as fresh:
            loaded = fresh.load(run_id)
            with Engine(sqlite_url) as other:
                other.load(run_id).finish("deleted")
                other.compact()
                taken = other.start_run(LOOP, run_id=run_id)
                record(taken, 3_100)
            with pytest.raises(ProjectionStateError):
                loaded.rollback(loaded.machine.depth - 1, reason="deep")

    def test_a_writer_crossing_after_an_erasure_keeps_snapshots_readers_walk_right(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Runs erased between a writer's crossings: its later snapshots (of the new erasure
        generation) name older parts of the old one; a fresh reader's machine at each
        version and a deep rollback still equal `replay` (guard)."""
        monkeypatch.setattr(keeper, "KEEP_INTERVAL", 500)
        with Engine(sqlite_url) as engine:
            run, doomed = engine.start_run(ALTERNATING), engine.start_run(LOOP)
            record_random(run, 2_120, seed=3)
            with Engine(sqlite_url) as other:
                other.load(doomed.id).finish("deleted")
                other.compact()
            record_random(run, 2_050, seed=4)
            run.rollback(run.machine.depth - 1, reason="deep, the writer's own")
            record_random(run, 1_030, seed=5)
        with Engine(sqlite_url) as fresh:
            first, *rest = fresh.events(run.id)
            assert isinstance(first, RunStarted)
            expected = machines(first, rest)
            for at in range(len(expected), 1, -97):
                travel = TimeTravel(fresh.store, fresh.store.views)
                folded = travel.project(run.id, MachineFold(), at)
                assert folded is not None
                assert folded[1] == expected[at - 1], at
            loaded = fresh.load(run.id)
            loaded.rollback(loaded.machine.depth, reason="to the bottom")
            first, *rest = fresh.events(run.id)
            assert loaded.machine == replay(first, rest)[1]  # type: ignore[arg-type]

    def test_threads_walking_shared_deferred_parts_see_replay(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Threads folding the machine of one deep run through one time travel (its states in
        memory shared, their older parts made once under each part's lock) each see `replay`'s
        stack at every version they ask for (guard)."""
        monkeypatch.setattr(keeper, "KEEP_INTERVAL", 500)
        with Engine(sqlite_url) as engine:
            run = engine.start_run(ALTERNATING)
            record_random(run, 6_040, seed=7)
        with Engine(sqlite_url) as fresh:
            first, *rest = fresh.events(run.id)
            assert isinstance(first, RunStarted)
            expected = machines(first, rest)
            travel = TimeTravel(fresh.store, fresh.store.views)

            def walk(seed: int) -> None:
                for at in random.Random(seed).sample(range(1, len(expected) + 1), 25):
                    folded = travel.project(run.id, MachineFold(), at)
                    assert folded is not None
                    assert list(folded[1].stack) == list(expected[at - 1].stack), at

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                for done in [pool.submit(walk, seed) for seed in range(4)]:
                    done.result()

    def test_machine_snapshots_with_older_parts_are_sealed_by_the_stores_cipher(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Under a cipher, the machine snapshots naming older parts hold no plain text, and a
        fresh engine with the key walks them down to the stack's bottom as `replay` (guard)."""
        monkeypatch.setattr(keeper, "KEEP_INTERVAL", 500)
        zebra = Pipeline(
            "zebrafish",
            initial="zebra",
            transitions=[
                ("zebra", "completed", "yak"),
                ("yak", "completed", "zebra"),
                ("zebra", "end", "done"),
            ],
            final=["done"],
        )
        with Engine(sqlite_url, cipher_key=KEY) as engine:
            run = engine.start_run(zebra)
            for _ in range(16):
                with run.batch():
                    for _ in range(100):
                        run.stage_completed(run.machine.state)
        rows = [s for p, _, s in snapshot_rows(sqlite_url, run.id) if p == MachineFold.name]
        assert len(rows) >= 3
        for sealed in rows:
            assert [word for word in (b"zebra", b"yak", b"below") if word in sealed] == []
        with Engine(sqlite_url, cipher_key=KEY) as fresh:
            loaded = fresh.load(run.id)
            loaded.rollback(loaded.machine.depth, reason="to the bottom")
            first, *rest = fresh.events(run.id)
            assert isinstance(first, RunStarted)
            assert loaded.machine == replay(first, rest)[1]
