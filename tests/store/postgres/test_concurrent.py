"""Concurrent appends on PostgreSQL: no table lock, followers that never pass over a late
commit, the append section released after a failure, and stores of the older release
upgraded in place."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest

from engine import ConcurrencyConflict, Engine, StoreError
from engine.store import meta
from engine.store.postgres.recorder import (
    APPEND_FUNCTION,
    APPEND_SIGNATURE,
    CONCURRENT_SCHEMA,
    SHAPES,
    TX_COLUMN,
    append_lock,
    has_append_function,
)
from events import Event
from projections import Projection, RunIndex
from tests._helpers import POSTGRES_URL, REVIEW

WAIT = 60.0
"""Bound on a wait that only a hang (a lock never released) would reach."""


class EventsPerRun(Projection[int]):
    """How many events of each run were folded: a skipped or doubled event changes it."""

    name = "events_per_run"
    scope = "run"

    def initial(self) -> int:
        return 0

    def relevant(self, event: Event) -> bool:
        return True

    def apply(self, state: int, event: Event) -> int:
        return state + 1


def schema_of(url: str) -> str:
    return url.rsplit("schema=", 1)[1]


def connect() -> Any:
    import psycopg

    return psycopg.connect(POSTGRES_URL, autocommit=True)


class HeldCommit:
    """Holds one engine's next append after its INSERT, before its COMMIT, until released.

    An append of the store's function commits as the call returns: the held one is
    called inside a transaction the hold opens, as a slow COMMIT would leave it. With
    `function` False the engine appends statement by statement.
    """

    def __init__(self, engine: Engine, *, function: bool = True) -> None:
        recorder: Any = engine.store.recorder
        self.recorder = recorder
        recorder.function = function
        self.hooked = "_execute_append" if function else "_execute_insert"
        self.original = getattr(recorder, self.hooked)
        self.inserted = threading.Event()
        self.release = threading.Event()
        setattr(recorder, self.hooked, self._held_call if function else self._held)
        self.recorder.settle_seconds = 0.1  # its own head waits for its held commit

    def _held(self, *args: Any, **kwargs: Any) -> Any:
        ids = self.original(*args, **kwargs)  # the rows are inserted, the section left
        setattr(self.recorder, self.hooked, self.original)
        self.inserted.set()
        assert self.release.wait(WAIT), "the held append was never released"
        return ids

    def _held_call(self, conn: Any, columns: Any) -> Any:
        conn.execute("BEGIN")
        ids = self._held(conn, columns)
        conn.execute("COMMIT")
        return ids


def head_reaching(recorder: Any, wanted: int) -> int:
    """The recorder's head once it reaches `wanted`.

    The server is shared: a transaction of another database still in flight holds
    every follower of the cluster back for as long as it lasts, so wait for it.
    """
    deadline = time.monotonic() + WAIT
    head = recorder.max_notification_id() or 0
    while head < wanted and time.monotonic() < deadline:
        time.sleep(0.01)
        head = recorder.max_notification_id() or 0
    return int(head)


def stored_ids(engine: Engine, run_id: UUID) -> list[int]:
    """The notification ids of a run's committed events, read directly."""
    schema = engine.store.recorder.datastore.schema  # type: ignore[attr-defined]
    with connect() as conn:
        rows = conn.execute(
            f"SELECT notification_id FROM {schema}.stagetrail_events WHERE originator_id = %s "
            "ORDER BY notification_id",
            (run_id,),
        ).fetchall()
    return [row[0] for row in rows]


def in_thread(work: Any) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def three(postgres_url: str) -> Iterator[tuple[Engine, Engine, Engine]]:
    """Two writers and a follower on one new store."""
    with Engine(postgres_url) as a, Engine(postgres_url) as b, Engine(postgres_url) as follower:
        yield a, b, follower


@pytest.mark.parametrize("function", [True, False], ids=["function", "statements"])
class TestLateCommits:
    def test_the_follower_waits_for_a_held_transaction_then_folds_every_event_once(
        self, three: tuple[Engine, Engine, Engine], function: bool
    ) -> None:
        """While A's append is open, B's later commits go through but no follower passes A."""
        a, b, follower = three
        first = a.start_run(REVIEW)
        follower.projections.register(EventsPerRun)
        head_reaching(follower.store.recorder, stored_ids(a, first.id)[-1])
        follower.projections.catch_up()
        held = HeldCommit(a, function=function)
        started: list[Any] = []
        writer_a = in_thread(lambda: started.append(a.start_run(REVIEW)))
        assert held.inserted.wait(WAIT)
        later: list[Any] = []
        writer_b = in_thread(lambda: later.extend(b.start_run(REVIEW) for _ in range(3)))
        writer_b.join(WAIT)
        assert not writer_b.is_alive(), "B waited for A: the append took a table-wide lock"
        recorder = follower.store.recorder
        head = recorder.max_notification_id()
        assert head == max(n.id for n in recorder.select_notifications(start=0, limit=100))
        follower.projections.catch_up()
        assert [run.run_id for run in follower.runs()] == [first.id]  # not B's, after A's ids
        assert follower.projections.states(EventsPerRun.name, catch_up=False) == {str(first.id): 1}
        stop = threading.Event()
        following = in_thread(lambda: follower.projections.follow(stop, timeout=0.1))
        held.release.set()
        writer_a.join(WAIT)
        every = {first.id, started[0].id, *(run.id for run in later)}
        assert self._caught_up(follower, len(every))
        stop.set()
        following.join(WAIT)
        folded = follower.projections.states(EventsPerRun.name, catch_up=False)
        assert folded == {str(run_id): 1 for run_id in every}
        assert {run.run_id for run in follower.runs()} == every
        assert self._ids_of(follower, started[0].id) < self._ids_of(follower, later[0].id)

    def _caught_up(self, follower: Engine, runs: int) -> bool:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            statuses = follower.projections.status()
            if all(s.lag == 0 for s in statuses) and statuses[0].head > 0:
                states = follower.projections.states(EventsPerRun.name, catch_up=False)
                if sum(states.values()) == runs:
                    return True
            time.sleep(0.02)
        return False

    def _ids_of(self, engine: Engine, run_id: UUID) -> int:
        recorder = engine.store.recorder
        page = recorder.select_notifications(start=0, limit=1000, stop=None)
        return min(n.id for n in page if n.originator_id == run_id)

    def test_a_late_commit_holds_back_head_and_pages(
        self, postgres_url: str, function: bool
    ) -> None:
        """Rows committed after an open append's ids are neither in the head nor in a page."""
        with Engine(postgres_url) as a, Engine(postgres_url) as b:
            first = a.start_run(REVIEW)
            recorder = b.store.recorder
            before = head_reaching(recorder, stored_ids(a, first.id)[-1])
            held = HeldCommit(a, function=function)
            writer = in_thread(lambda: a.start_run(REVIEW))
            assert held.inserted.wait(WAIT)
            b.start_run(REVIEW)
            assert recorder.max_notification_id() == before
            assert [n.id for n in recorder.select_notifications(start=before, limit=10)] == [before]
            held.release.set()
            writer.join(WAIT)
            assert head_reaching(recorder, before + 2) == before + 2
            assert len(recorder.select_notifications(start=0, limit=10)) == 3


class TestOtherTransactions:
    def test_a_long_transaction_elsewhere_does_not_hold_followers_back(
        self, postgres_url: str
    ) -> None:
        """A transaction that wrote outside the store and stays open delays no reader."""
        other = f"{schema_of(postgres_url)}_other"
        with connect() as conn:
            conn.execute(f"CREATE SCHEMA {other}")
            conn.execute(f"CREATE TABLE {other}.t (x int)")
        try:
            with connect() as busy, Engine(postgres_url) as engine:
                busy.execute("BEGIN")
                busy.execute(f"INSERT INTO {other}.t VALUES (1)")  # it now has a transaction id
                recorder: Any = engine.store.recorder
                recorder.settle_seconds = 0.0  # answer at once: no waiting hides a hold-back
                run = engine.start_run(REVIEW)
                assert recorder.max_notification_id() == stored_ids(engine, run.id)[-1]
                assert [summary.run_id for summary in engine.runs()] == [run.id]
                busy.execute("ROLLBACK")
        finally:
            with connect() as conn:
                conn.execute(f"DROP SCHEMA {other} CASCADE")


class TestHorizonMovedBack:
    """A transaction older than a safe head that looks like an append only later (one that
    ended between a reader's snapshot and its look at the locks looks so too) lowers the
    horizon of the next read below that head: what the head covered must still be read."""

    def test_a_page_up_to_a_safe_head_holds_what_the_head_covered(self, postgres_url: str) -> None:
        """Events below a head the recorder answered are read even after an older
        transaction takes a write lock on the events table."""
        with connect() as busy, Engine(postgres_url) as engine:
            busy.execute("BEGIN")
            busy.execute("SELECT pg_current_xact_id()")  # older than the run's append
            recorder: Any = engine.store.recorder
            recorder.settle_seconds = 0.0
            run = engine.start_run(REVIEW)
            head = recorder.max_notification_id()
            assert head == stored_ids(engine, run.id)[-1]
            table = f"{schema_of(postgres_url)}.stagetrail_events"
            busy.execute(f"LOCK TABLE {table} IN ROW EXCLUSIVE MODE")
            page = recorder.select_notifications(start=0, limit=10, stop=head)
            assert [n.id for n in page] == stored_ids(engine, run.id)
            busy.execute("ROLLBACK")

    def test_a_catch_up_never_passes_over_an_event_its_head_covered(
        self, postgres_url: str
    ) -> None:
        """The run index folds a run whose events its head covered though the horizon moved
        back between the head and the page: it lists the run, then and later."""
        with connect() as busy, Engine(postgres_url) as writer, Engine(postgres_url) as reader:
            busy.execute("BEGIN")
            busy.execute("SELECT pg_current_xact_id()")
            run = writer.start_run(REVIEW)
            recorder: Any = reader.store.recorder
            recorder.settle_seconds = 0.0
            answer_head = recorder.max_notification_id
            table = f"{schema_of(postgres_url)}.stagetrail_events"

            def head_then_lock() -> int | None:
                head: int | None = answer_head()
                busy.execute(f"LOCK TABLE {table} IN ROW EXCLUSIVE MODE")
                recorder.max_notification_id = answer_head  # once
                return head

            recorder.max_notification_id = head_then_lock
            assert [summary.run_id for summary in reader.runs()] == [run.id]
            busy.execute("ROLLBACK")
            assert [summary.run_id for summary in reader.runs()] == [run.id]


class TestTheSection:
    def _held(self, schema: str) -> int:
        """Sessions holding the append section's advisory lock of `schema`."""
        key = append_lock(schema) & 0xFFFFFFFFFFFFFFFF
        with connect() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
                (key >> 32, key & 0xFFFFFFFF),
            ).fetchone()
        return int(row[0])

    def test_a_conflict_releases_the_section(self, postgres_url: str) -> None:
        """A version conflict leaves no session holding the section: the next append runs."""
        with Engine(postgres_url) as a, Engine(postgres_url) as b:
            run = a.start_run(REVIEW)
            stale = b.load(run.id)
            run.note("first", 1)
            with pytest.raises(ConcurrencyConflict):
                stale.note("second", 2)
            assert self._held(schema_of(postgres_url)) == 0
            other = in_thread(lambda: b.start_run(REVIEW))
            other.join(WAIT)
            assert not other.is_alive()
            assert [e.version for e in a.events(run.id)] == [1, 2]  # no gap, no overwrite

    def test_a_successful_append_holds_nothing(self, postgres_url: str) -> None:
        """After appends (single and batched) no session keeps the section."""
        with Engine(postgres_url) as engine:
            run = engine.start_run(REVIEW)
            with run.batch():
                run.note("a", 1)
                run.note("b", 2)
            assert self._held(schema_of(postgres_url)) == 0


OLD_META = "CREATE TABLE {schema}.stagetrail_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
OLD_EVENTS = (
    "CREATE TABLE {schema}.stagetrail_events (originator_id uuid NOT NULL, "
    "originator_version bigint NOT NULL, topic text, state bytea, notification_id bigserial, "
    "PRIMARY KEY (originator_id, originator_version))"
)
OLD_INDEX = (
    "CREATE UNIQUE INDEX stagetrail_events_notification_id_idx "
    "ON {schema}.stagetrail_events (notification_id ASC)"
)
OLD_APPEND = (
    "INSERT INTO {schema}.stagetrail_events (originator_id, originator_version, topic, state) "
    "SELECT * FROM unnest(%s::uuid[], %s::bigint[], %s::text[], %s::bytea[])"
)


def create_old_store(schema: str, runs: int) -> list[UUID]:
    """A store as the older release made it (its DDL, meta rows, locked appends); its runs."""
    with Engine("memory://") as scratch:
        ids = [scratch.start_run(REVIEW).id for _ in range(runs)]
        for run_id in ids:
            scratch.load(run_id).note("n", 1)
        rows = scratch.store.recorder.select_notifications(start=0, limit=1000)
    with connect() as conn, conn.transaction():
        conn.execute(f"CREATE SCHEMA {schema}")
        for ddl in (OLD_META, OLD_EVENTS, OLD_INDEX):
            conn.execute(ddl.format(schema=schema))
        for key, value in meta.new_meta(meta.AtRest()).items():
            conn.execute(f"INSERT INTO {schema}.stagetrail_meta VALUES (%s, %s)", (key, value))
    for row in rows:  # one append per event, each under the older release's lock
        with connect() as conn, conn.transaction():
            conn.execute(f"LOCK TABLE {schema}.stagetrail_events IN EXCLUSIVE MODE")
            conn.execute(
                OLD_APPEND.format(schema=schema),
                ([row.originator_id], [row.originator_version], [row.topic], [row.state]),
            )
    return ids


class TestUpgrade:
    def test_a_store_of_the_older_release_is_upgraded_in_place(self, postgres_url: str) -> None:
        """The first writable open adds tx_id (old rows 0), bumps the schema, reads every run."""
        schema = schema_of(postgres_url)
        old = create_old_store(schema, 3)
        with Engine(postgres_url, read_only=True) as reader:  # before: read as it is
            assert not reader.store.recorder.concurrent  # type: ignore[attr-defined]
            assert {run.run_id for run in reader.runs()} == set(old)
        with Engine(postgres_url) as engine:
            assert engine.store.recorder.concurrent  # type: ignore[attr-defined]
            assert engine.store.recorder.function  # type: ignore[attr-defined]
            new = engine.start_run(REVIEW)
            engine.projections.register(EventsPerRun)
            folded = engine.projections.states(EventsPerRun.name)
            assert {run.run_id for run in engine.runs()} == {*old, new.id}
        assert folded == {**{str(run_id): 2 for run_id in old}, str(new.id): 1}
        with connect() as conn:
            version = conn.execute(
                f"SELECT value FROM {schema}.stagetrail_meta WHERE key = 'schema_version'"
            ).fetchone()[0]
            tx_ids = conn.execute(
                f"SELECT {TX_COLUMN}::text::bigint FROM {schema}.stagetrail_events "
                "ORDER BY notification_id"
            ).fetchall()
        assert version == str(CONCURRENT_SCHEMA)
        assert [t for (t,) in tx_ids[:6]] == [0] * 6
        assert tx_ids[6][0] > 0

    def test_on_a_read_only_session_it_is_left_as_it_is_and_refuses_appends(
        self, postgres_url: str, writer_role: str
    ) -> None:
        """Opened for writing where every transaction is read-only, an older store opens, is
        read under its own rule, is not upgraded, and refuses an append naming the server."""
        from engine.errors import StoreReadOnly

        schema = schema_of(postgres_url)
        old = create_old_store(schema, 2)
        grant_writing(schema, writer_role)  # every right but a writable transaction
        with connect() as conn:
            conn.execute(f"ALTER ROLE {writer_role} SET default_transaction_read_only = on")
        with Engine(postgres_url.replace("postgres@", f"{writer_role}@")) as engine:
            assert not engine.store.recorder.concurrent  # type: ignore[attr-defined]
            assert {run.run_id for run in engine.runs()} == set(old)
            with pytest.raises(StoreError, match="PostgreSQL server is read-only") as caught:
                engine.load(old[0]).note("k", 2)
        assert isinstance(caught.value, StoreReadOnly)
        with connect() as conn:
            version = conn.execute(
                f"SELECT value FROM {schema}.stagetrail_meta WHERE key = 'schema_version'"
            ).fetchone()[0]
        assert version == "1"
        with Engine(postgres_url) as engine:  # nothing written
            assert engine.load(old[0]).version == 2

    def test_the_older_release_refuses_an_upgraded_store(self, postgres_url: str) -> None:
        """Its meta check (schema 1 at most) says the store is newer, so it never mixes in."""
        Engine(postgres_url).close()
        with connect() as conn:
            rows = dict(
                conn.execute(f"SELECT key, value FROM {schema_of(postgres_url)}.stagetrail_meta")
            )
        assert rows["schema_version"] == str(CONCURRENT_SCHEMA)
        with pytest.raises(StoreError, match="written by a newer stagetrail"):
            meta.settle(rows, meta.AtRest(), "-", newest=1)

    def test_reopening_an_upgraded_store_changes_nothing(self, postgres_url: str) -> None:
        """A second writable open finds the column and leaves the store as it was."""
        with Engine(postgres_url) as engine:
            run = engine.start_run(REVIEW)
        with Engine(postgres_url) as engine:
            assert [e.version for e in engine.events(run.id)] == [1]
            assert engine.runs()[0].run_id == run.id


def stored_run(engine: Engine) -> UUID:
    """The one run the store holds besides the ones the test knows (the held writer's)."""
    page = engine.store.recorder.select_notifications(start=0, limit=1)
    return UUID(str(page[0].originator_id))


class TestRunIndexIsFollowed:
    def test_the_run_index_follows_the_same_rule(self, postgres_url: str) -> None:
        """`runs` answers from the index, which reads only below the oldest open append."""
        with Engine(postgres_url) as a, Engine(postgres_url) as b:
            held = HeldCommit(a)
            writer = in_thread(lambda: a.start_run(REVIEW))
            assert held.inserted.wait(WAIT)
            later = b.start_run(REVIEW)
            assert b.runs() == []
            held.release.set()
            writer.join(WAIT)
            head_reaching(b.store.recorder, stored_ids(b, later.id)[-1])
            assert {run.run_id for run in b.runs()} == {later.id, stored_run(a)}
            assert RunIndex.name in b.projections.names


def drop_append_function(schema: str) -> None:
    """Make the store as a release before the append function left it."""
    with connect() as conn:
        conn.execute(f"DROP FUNCTION {schema}.{APPEND_FUNCTION}")


def has_function(schema: str) -> bool:
    with connect() as conn:
        return has_append_function(conn, schema)


class TestAppendFunction:
    def test_a_new_store_appends_by_one_call_of_its_function(self, postgres_url: str) -> None:
        """Single, batched and larger-than-shaped appends are calls, each stored once in order."""
        with Engine(postgres_url) as engine:
            recorder: Any = engine.store.recorder
            assert recorder.function
            assert has_function(schema_of(postgres_url))
            calls: list[int] = []
            call = recorder._execute_append

            def counted(conn: Any, columns: Any) -> Any:
                calls.append(len(columns[0]))
                return call(conn, columns)

            recorder._execute_append = counted
            run = engine.start_run(REVIEW)
            run.note("one", 1)
            with run.batch():
                for i in range(SHAPES + 4):  # whole arrays, past the shaped calls
                    run.note("many", i)
            notes = engine.events(run.id)[1:]
        assert calls == [1, 1, SHAPES + 4]
        assert [e.version for e in notes] == list(range(2, SHAPES + 7))
        assert [n.value for n in notes] == [1, *range(SHAPES + 4)]  # type: ignore[attr-defined]

    def test_a_store_without_the_function_is_given_it_on_a_writable_open(
        self, postgres_url: str
    ) -> None:
        """A store made before the function gets it under the creation lock; its runs go on."""
        schema = schema_of(postgres_url)
        with Engine(postgres_url) as engine:
            run = engine.start_run(REVIEW)
        drop_append_function(schema)
        with Engine(postgres_url, read_only=True) as reader:  # a reader creates nothing
            assert [e.version for e in reader.events(run.id)] == [1]
        assert not has_function(schema)
        with Engine(postgres_url) as engine:
            assert engine.store.recorder.function  # type: ignore[attr-defined]
            engine.load(run.id).note("after", 1)
            assert [e.version for e in engine.events(run.id)] == [1, 2]
        assert has_function(schema)

    def test_a_function_dropped_while_open_falls_back_to_statements(
        self, postgres_url: str
    ) -> None:
        """The append that finds it gone is written once, statement by statement."""
        with Engine(postgres_url) as engine, Engine(postgres_url) as other:
            run = engine.start_run(REVIEW)
            drop_append_function(schema_of(postgres_url))
            run.note("after", 1)
            assert not engine.store.recorder.function  # type: ignore[attr-defined]
            stale = other.load(run.id)
            run.note("again", 2)
            with pytest.raises(ConcurrencyConflict):
                stale.note("stale", 3)
            assert [e.version for e in engine.events(run.id)] == [1, 2, 3]

    def test_a_role_that_may_not_create_it_appends_statement_by_statement(
        self, postgres_url: str, writer_role: str
    ) -> None:
        """Without CREATE on the schema the open still writes: same rows, same conflicts."""
        schema = schema_of(postgres_url)
        with Engine(postgres_url) as owner:
            run = owner.start_run(REVIEW)
        drop_append_function(schema)
        grant_writing(schema, writer_role)
        url = postgres_url.replace("postgres@", f"{writer_role}@")
        with Engine(url) as engine, Engine(url) as other:
            assert not engine.store.recorder.function  # type: ignore[attr-defined]
            mine = engine.load(run.id)
            stale = other.load(run.id)
            mine.note("mine", 1)
            with pytest.raises(ConcurrencyConflict):
                stale.note("stale", 2)
            assert [e.version for e in engine.events(run.id)] == [1, 2]
        assert not has_function(schema)

    def test_a_role_that_may_not_execute_it_appends_statement_by_statement(
        self, postgres_url: str, writer_role: str
    ) -> None:
        """EXECUTE revoked from PUBLIC (a common hardening): the writer falls back, never fails."""
        schema = schema_of(postgres_url)
        with Engine(postgres_url) as owner:
            run = owner.start_run(REVIEW)
        with connect() as conn:
            conn.execute(
                f"REVOKE EXECUTE ON FUNCTION {schema}.{APPEND_FUNCTION}{APPEND_SIGNATURE} "
                "FROM PUBLIC"
            )
        grant_writing(schema, writer_role)
        url = postgres_url.replace("postgres@", f"{writer_role}@")
        with Engine(url) as engine:
            engine.load(run.id).note("mine", 1)
            assert [e.version for e in engine.events(run.id)] == [1, 2]
            assert not engine.store.recorder.function  # type: ignore[attr-defined]

    def test_execute_revoked_while_open_falls_back_to_statements(
        self, postgres_url: str, writer_role: str
    ) -> None:
        """The append that finds EXECUTE revoked is written once, statement by statement."""
        schema = schema_of(postgres_url)
        with Engine(postgres_url) as owner:
            run = owner.start_run(REVIEW)
        grant_writing(schema, writer_role)
        url = postgres_url.replace("postgres@", f"{writer_role}@")
        with Engine(url) as engine:
            assert engine.store.recorder.function  # type: ignore[attr-defined]
            with connect() as conn:
                conn.execute(
                    f"REVOKE EXECUTE ON FUNCTION {schema}.{APPEND_FUNCTION}{APPEND_SIGNATURE} "
                    "FROM PUBLIC"
                )
            engine.load(run.id).note("mine", 1)
            assert not engine.store.recorder.function  # type: ignore[attr-defined]
            engine.load(run.id).note("again", 2)
            assert [e.version for e in engine.events(run.id)] == [1, 2, 3]

    def test_a_function_another_role_planted_is_never_called(
        self, postgres_url: str, writer_role: str
    ) -> None:
        """A role with CREATE on the schema plants the function: the store's owner appends
        statement by statement, never running the planted code with its own rights."""
        schema = schema_of(postgres_url)
        with Engine(postgres_url) as owner:
            run = owner.start_run(REVIEW)
        drop_append_function(schema)  # a store an older release made
        grant_writing(schema, writer_role)
        with connect() as conn:
            conn.execute(f"GRANT CREATE ON SCHEMA {schema} TO {writer_role}")
            conn.execute(f"CREATE TABLE {schema}.ran_as (who text)")
            conn.execute(f"GRANT INSERT ON {schema}.ran_as TO {writer_role}")
            conn.execute(f"SET ROLE {writer_role}")
            conn.execute(
                f"CREATE FUNCTION {schema}.{APPEND_FUNCTION}{APPEND_SIGNATURE} "
                "RETURNS bigint[] LANGUAGE plpgsql AS $$ BEGIN "
                f"INSERT INTO {schema}.ran_as VALUES (current_user); RETURN NULL; END $$"
            )
        with Engine(postgres_url) as owner:
            owner.load(run.id).note("mine", 1)
            assert [e.version for e in owner.events(run.id)] == [1, 2]
        with connect() as conn:
            assert conn.execute(f"SELECT who FROM {schema}.ran_as").fetchall() == []


@pytest.fixture
def writer_role() -> Iterator[str]:
    """A new login role, dropped afterwards."""
    import uuid

    role = f"st_w_{uuid.uuid4().hex[:10]}"
    with connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    yield role
    with connect() as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def grant_writing(schema: str, role: str) -> None:
    """What a writer needs of an existing store, and no CREATE on its schema."""
    with connect() as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"
        )
        conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")


KILLED_WRITER = """
import os, signal, sys
import psycopg
from engine import Engine
from engine.store.postgres.recorder import APPEND_FUNCTION
from tests._helpers import REVIEW

url, mode, size, drop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
kill_at, batch = int(sys.argv[5]), int(sys.argv[6])
engine = Engine(url)
recorder = engine.store.recorder
if drop:  # dropped while the store is open: the first append falls back to statements
    with psycopg.connect(drop, autocommit=True) as conn:
        conn.execute(f"DROP FUNCTION {recorder.datastore.schema}.{APPEND_FUNCTION}")
run = engine.start_run(REVIEW)
assert not recorder.function, "the append function was called"
print(run.id, flush=True)
done = 0
insert = type(recorder)._execute_insert

def die():
    print("stopped", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

def killing(self, curs, columns, sync=None):
    if done + 1 < kill_at:
        return insert(self, curs, columns, sync)
    if mode == "section":  # the rows inserted, the section held: no release, no COMMIT
        for statement in self._before_insert:
            curs.execute(statement)
        curs.execute(self._insert_statement, columns)
        if sync is not None:  # pipelined: sent and answered
            sync()
        assert curs.fetchall()
        with psycopg.connect(url.split("?")[0], autocommit=True) as other:
            held = other.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND pid = %s", (curs.connection.info.backend_pid,)).fetchone()[0]
        assert held == 1, "killed outside the section"
        die()
    insert(self, curs, columns, sync)  # "commit": the rows inserted, the section left
    die()

type(recorder)._execute_insert = killing
while done <= kill_at:  # killed in batch `kill_at`: an exit 0 says the kill was never reached
    with run.batch():
        for item in range(batch):
            run.note("batch", [done, item, "x" * size])
    print(done, flush=True)  # acknowledged: committed before this line
    done += 1
"""
"""Appends batches statement by statement (function dropped, or a role that may not create
it), SIGKILLing itself inside the `kill_at`-th: in the section or before its COMMIT."""


def kill_statement_writer(
    url: str, mode: str, size: int, drop: str, kill_at: int
) -> tuple[str, int]:
    """Run KILLED_WRITER until it kills itself; its run id and its acknowledged batches."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    args = [url, mode, str(size), drop, str(kill_at), str(KILLED_BATCH)]
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, *args], stdout=subprocess.PIPE, text=True, cwd=root
    )
    assert child.stdout is not None
    lines = child.stdout.read().split()
    assert child.wait(timeout=WAIT) == -signal.SIGKILL
    assert lines[-1] == "stopped"
    return lines[0], len(lines) - 2


KILLED_BATCH = 10
BIG_NOTE = 110_000
"""A note of this many characters makes a batch bigger than the pipeline's limit."""


class TestStatementAppendKilled:
    @pytest.mark.slow
    @pytest.mark.parametrize("mode", ["section", "commit"])
    @pytest.mark.parametrize("size", [1, BIG_NOTE], ids=["pipelined", "big"])
    @pytest.mark.parametrize("how", ["dropped", "role"])
    def test_sigkill_mid_append_leaves_whole_batches_and_a_free_section(
        self, postgres_url: str, writer_role: str, mode: str, size: int, how: str
    ) -> None:
        """A statement-wise writer SIGKILLed holding the section or before its COMMIT leaves
        every acknowledged batch, nothing of the killed one, and a store that appends and
        verifies."""
        schema = schema_of(postgres_url)
        url, drop = postgres_url, POSTGRES_URL
        if how == "role":  # may not create the function: statements from its first append
            with Engine(postgres_url):
                pass
            drop_append_function(schema)
            grant_writing(schema, writer_role)
            url, drop = postgres_url.replace("postgres@", f"{writer_role}@"), ""
        run_id, acknowledged = kill_statement_writer(url, mode, size, drop, kill_at=3)
        assert acknowledged == 2
        deadline = time.monotonic() + WAIT
        while TestTheSection()._held(schema):  # the server ends the dead session, and its lock
            assert time.monotonic() < deadline, "the append section is still held"
            time.sleep(0.01)
        with Engine(url) as engine:
            notes = engine.events(run_id)[1:]
            assert [note.value[:2] for note in notes] == [  # type: ignore[attr-defined]
                [b, i] for b in range(acknowledged) for i in range(KILLED_BATCH)
            ]
            run = engine.load(run_id)
            with run.batch():
                run.note("after", 1)
                run.note("after", 2)
            assert run.version == 1 + acknowledged * KILLED_BATCH + 2
            assert engine.verify(run_id).ok
            assert [e.version for e in engine.events(run_id)] == list(range(1, run.version + 1))
