"""The PostgreSQL recorder under load and faults: big appends, lost connections, racing opens."""

from __future__ import annotations

import multiprocessing
import random
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import ConcurrencyConflict, Engine, Run, StoreError
from engine.errors import OutcomeUnknown
from events import NoteAdded
from tests._helpers import POSTGRES_URL, REVIEW, FailuresByType

ROOT = Path(__file__).resolve().parents[3]

BIG_BATCH = textwrap.dedent(
    """
    import sys
    from engine import Engine
    from tests._helpers import REVIEW

    with Engine(sys.argv[1]) as engine:
        run = engine.start_run(REVIEW)
        with run.batch():
            for index in range(120):  # 120 results of 100 KB each: a 12 MB transaction
                run.note("result", f"{index:03d}" + "x" * 100_000)
        print(run.id)
    """
)


class TestBigAppends:
    def test_a_12_mb_batch_returns_and_blocks_no_writer(self, postgres_url: str) -> None:
        """A 12 MB batch commits (psycopg's pipeline hung on it holding the table lock)."""
        done = subprocess.run(  # a process, so a hang is killed and its lock released
            [sys.executable, "-c", BIG_BATCH, postgres_url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.strip()
        with Engine(postgres_url) as engine:
            notes = engine.events(run_id)[1:]
            other = engine.start_run(REVIEW)  # another writer gets the lock at once
            other.note("after", 1)
        assert [n.value[:3] for n in notes] == [f"{i:03d}" for i in range(120)]  # type: ignore[attr-defined]
        assert all(len(n.value) == 100_003 for n in notes)  # type: ignore[attr-defined]

    def test_a_big_and_a_small_append_share_a_store(self, postgres_url: str) -> None:
        """Appends above the pipeline limit go statement by statement, below it pipelined."""
        from engine.store.postgres.recorder import PIPELINE_BYTES

        with Engine(postgres_url) as engine:
            run = engine.start_run(REVIEW)
            with run.batch():
                for _ in range(3):
                    run.note("big", "y" * (PIPELINE_BYTES // 2))
            run.note("small", 1)
            values = [e.value for e in engine.events(run.id)[1:]]  # type: ignore[attr-defined]
        assert [len(v) if isinstance(v, str) else v for v in values] == [
            PIPELINE_BYTES // 2,
            PIPELINE_BYTES // 2,
            PIPELINE_BYTES // 2,
            1,
        ]


def _terminate_connections(name: str, stop: threading.Event, killed: list[int]) -> None:
    """Terminate, at random moments, the busy server backends of connections named `name`.

    Busy ones only (running a statement or inside a transaction): that is where an
    append's commit is, and idle pool connections killed between appends would
    only test the pool's reconnection. `killed[0]` counts the terminations.
    """
    import psycopg

    rng = random.Random(11)
    with psycopg.connect(POSTGRES_URL, autocommit=True, application_name="killer") as conn:
        while not stop.is_set():
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND state <> 'idle' AND pid <> pg_backend_pid()",
                (name,),
            ).fetchone()
            killed[0] += row[0] if row else 0
            stop.wait(rng.uniform(0.001, 0.02))


def _append_following_the_advice(
    engine: Engine, run: Run, key: str, value: int, stats: dict[str, int]
) -> None:
    """Record one note as docs/reliability.md advises for each error an append may raise."""
    check = ""  # what to do first on the next turn: "" (append), "refresh", "unknown"
    while True:
        try:
            if check:
                run.refresh()
                if check == "unknown" and _newest_is(engine, run, key, value):
                    return  # the lost append was stored
                check = ""
            run.note(key, value)
            return
        except ConcurrencyConflict:
            stats["conflicts"] += 1
            check = "refresh"
        except OutcomeUnknown:
            stats["unknown"] += 1
            check = "unknown"
        except StoreError:
            stats["store_errors"] += 1  # nothing written (or a read failed): try again


def _newest_is(engine: Engine, run: Run, key: str, value: int) -> bool:
    newest = engine.store.last(run.id)
    return isinstance(newest, NoteAdded) and (newest.key, newest.value) == (key, value)


@pytest.mark.slow
class TestLostConnections:
    APPENDS = 1200
    TERMINATIONS = 100
    MOST = 50_000

    def test_terminated_backends_lose_and_double_nothing(self, postgres_url: str) -> None:
        """≥ 1,200 appends and ≥ 100 terminations of their backends: each stored once."""
        name = f"st_fault_{uuid.uuid4().hex[:8]}"  # only this test's connections are terminated
        stop = threading.Event()
        killed = [0]
        stats = {"conflicts": 0, "unknown": 0, "store_errors": 0}
        with Engine(f"{postgres_url}&application_name={name}") as engine:
            run = engine.start_run(REVIEW)
            killer = threading.Thread(target=_terminate_connections, args=(name, stop, killed))
            killer.start()
            appended = 0
            try:  # at least APPENDS, and on until TERMINATIONS backends were terminated
                while appended < self.MOST and (
                    appended < self.APPENDS or killed[0] < self.TERMINATIONS
                ):
                    _append_following_the_advice(engine, run, "n", appended, stats)
                    appended += 1
            finally:
                stop.set()
                killer.join()
            recovered = dict(engine.store.recorder.recovered)  # type: ignore[attr-defined]
        with Engine(postgres_url) as reader:
            notes = reader.events(run.id)[1:]
        values = [note.value for note in notes]  # type: ignore[attr-defined]
        print(f"appends={appended} terminated={killed[0]} recovered={recovered} advice={stats}")
        assert values == list(range(appended))  # none lost, none doubled, in order
        assert [note.version for note in notes] == list(range(2, appended + 2))
        assert appended >= self.APPENDS
        assert killed[0] >= self.TERMINATIONS
        assert recovered["stored"] + recovered["absent"] >= self.TERMINATIONS // 2
        assert stats["conflicts"] == 0  # a writer never conflicts with its own append


def _open_new_store(url: str, barrier: object, results: object) -> None:
    try:
        barrier.wait()  # type: ignore[attr-defined]
        with Engine(url) as engine:
            engine.start_run(REVIEW)
            engine.projections.register(FailuresByType)
        results.put("ok")  # type: ignore[attr-defined]
    except BaseException as error:  # report anything to the parent
        results.put(f"{type(error).__name__}: {error}")  # type: ignore[attr-defined]


def open_together(url: str, workers: int) -> list[str]:
    """Open the same new store from `workers` processes released at one instant."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers)
    results = context.Queue()
    processes = [
        context.Process(target=_open_new_store, args=(url, barrier, results))
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    return outcomes


@pytest.fixture
def fresh_schemas() -> Iterator[list[str]]:
    """Names of schemas the test creates; dropped after it."""
    import psycopg

    names: list[str] = []
    yield names
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for name in names:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.mark.slow
class TestFleetStart:
    def test_workers_starting_together_on_an_empty_postgres(
        self, postgres_url: str, fresh_schemas: list[str]
    ) -> None:
        """4 workers opening one new schema at once, 5 trials: every one starts."""
        base = postgres_url.split("?")[0]
        for _ in range(5):
            schema = f"t_{uuid.uuid4().hex[:16]}"
            fresh_schemas.append(schema)
            outcomes = open_together(f"{base}?schema={schema}", 4)
            assert outcomes == ["ok"] * 4


@pytest.fixture
def reader_url(postgres_url: str) -> Iterator[str]:
    """The store's URL as a new role that may only read it (read-only transactions too)."""
    import psycopg

    base = postgres_url.split("?schema=")[0]
    role = f"st_ro_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"ALTER ROLE {role} SET default_transaction_read_only = on")  # as a replica
    yield f"{postgres_url.replace('postgres@', f'{role}@')}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")


def grant_reading(postgres_url: str, reader_url: str) -> None:
    import psycopg

    base, schema = postgres_url.split("?schema=")
    role = reader_url.split("://", 1)[1].split("@", 1)[0]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")


READ_COMMANDS = [
    ["runs"],
    ["runs", "--json", "--label", "team=core"],
    ["show", "{run}"],
    ["state", "{run}"],
    ["state", "{run}", "--at", "2", "--projection", "retry_counts"],
    ["replay", "{run}"],
    ["diff", "{run}", "--from", "1", "--to", "3"],
    ["verify", "{run}"],
    ["export", "--all"],
    ["diagram", "{run}"],
    ["projections", "list"],
    ["projections", "status"],
]


class TestReadOnlyRole:
    @pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: " ".join(c))
    def test_every_read_command_works_for_a_read_only_role(
        self, postgres_url: str, reader_url: str, command: list[str]
    ) -> None:
        """A role that can only SELECT, in read-only transactions, serves each read command."""
        from click.testing import CliRunner

        from engine.cli import main

        with Engine(postgres_url) as owner:
            run = owner.start_run(REVIEW, labels={"team": "core"})
            run.stage_completed("project_analysis")
            run.stage_completed("code_review")
            run.stage_failed("developer", error="flaky")
            owner.runs()  # the stored index is current up to here...
            later = owner.start_run(REVIEW, labels={"team": "core"})  # ...this run is newer
        grant_reading(postgres_url, reader_url)
        args = [part.replace("{run}", str(run.id)) for part in command]
        result = CliRunner().invoke(main, [*args, "--store", reader_url])
        assert result.exit_code == 0, result.output
        if command[0] == "runs":
            assert str(later.id)[:8] in result.output
            assert str(run.id)[:8] in result.output

    def test_only_the_owner_is_told_it_may_write(self, postgres_url: str, reader_url: str) -> None:
        """`writable` is True for the owner, False for the read-only role and a missing store."""
        from engine.store import writable

        with Engine(postgres_url) as owner:
            owner.start_run(REVIEW)
        grant_reading(postgres_url, reader_url)
        missing = postgres_url.split("?schema=")[0] + f"?schema=t_{uuid.uuid4().hex[:12]}"
        assert (writable(postgres_url), writable(reader_url), writable(missing)) == (
            True,
            False,
            False,
        )

    def test_a_read_only_role_cannot_write_and_says_so(
        self, postgres_url: str, reader_url: str
    ) -> None:
        """An append through the read-only role is StoreReadOnly, in one line; nothing written."""
        from engine.errors import StoreReadOnly

        with Engine(postgres_url) as owner:
            run = owner.start_run(REVIEW)
        grant_reading(postgres_url, reader_url)
        with Engine(reader_url, read_only=True) as reader:
            with pytest.raises(StoreReadOnly, match="read-only") as caught:
                reader.load(run.id).note("k", 1)
            assert [r.run_id for r in reader.runs()] == [run.id]  # folded in memory
            assert {s.name: s.lag for s in reader.projections.status()}["run_index"] == 0
        assert "\n" not in str(caught.value)
        with Engine(postgres_url) as owner:
            assert owner.load(run.id).version == 1


@pytest.fixture
def own_database() -> Iterator[str]:
    """A database of the test's own (its settings are the test's to change), dropped after."""
    import psycopg

    from tests._helpers import require_postgres

    require_postgres()
    name = f"st_db_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield name
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def set_read_only(database: str, on: bool) -> None:
    """Make every new session's transactions in `database` read-only (as on a standby), or not."""
    import psycopg

    setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {database} {setting}")


class TestReadOnlyServer:
    def test_a_store_without_its_function_opens_reads_and_refuses_appends_clearly(
        self, own_database: str
    ) -> None:
        """Opened for writing on a read-only server, a store without its append function
        opens and reads; an append is one StoreReadOnly naming the read-only server."""
        import psycopg

        from engine.errors import StoreReadOnly
        from engine.store.postgres.recorder import APPEND_FUNCTION, has_append_function

        base = POSTGRES_URL.rsplit("/", 1)[0] + f"/{own_database}"
        url = f"{base}?schema=s"
        with Engine(url) as owner:
            run = owner.start_run(REVIEW)
            run.note("k", 1)
        with psycopg.connect(base, autocommit=True) as conn:  # as a release before it left it
            conn.execute(f"DROP FUNCTION s.{APPEND_FUNCTION}")
        set_read_only(own_database, True)
        with Engine(url) as engine:
            assert [note.value for note in engine.events(run.id)[1:]] == [1]  # type: ignore[attr-defined]
            assert [r.run_id for r in engine.runs()] == [run.id]
            with pytest.raises(StoreReadOnly, match="PostgreSQL server is read-only") as caught:
                engine.load(run.id).note("k", 2)
        assert "\n" not in str(caught.value)
        assert "default_transaction_read_only" in str(caught.value)
        set_read_only(own_database, False)
        with Engine(url) as owner:  # nothing was written; writable again, it gets its function
            assert owner.load(run.id).version == 2
        with psycopg.connect(base, autocommit=True) as conn:
            assert has_append_function(conn, "s")

    def test_compact_on_a_read_only_server_is_refused_not_reported_done(
        self, own_database: str
    ) -> None:
        """Opened for writing on a read-only server, `compact` of a deleted run raises one
        StoreReadOnly naming the server and erases nothing (not a report of runs removed)."""
        from engine.errors import StoreReadOnly

        url = POSTGRES_URL.rsplit("/", 1)[0] + f"/{own_database}?schema=s"
        with Engine(url) as owner:
            run = owner.start_run(REVIEW)
            run.note("k", 1)
            run.finish("deleted")
        set_read_only(own_database, True)
        with (
            Engine(url) as engine,
            pytest.raises(StoreReadOnly, match="PostgreSQL server was read-only") as caught,
        ):
            engine.compact()
        assert "\n" not in str(caught.value)
        set_read_only(own_database, False)
        with Engine(url) as owner:  # every event of the run still stored
            assert [e.version for e in owner.events(run.id)] == [1, 2, 3]

    def test_creating_a_store_on_a_read_only_server_is_one_store_read_only(
        self, own_database: str
    ) -> None:
        """No store yet on a read-only server: creating one raises one StoreReadOnly naming the
        read-only server and its setting, and nothing is created."""
        import psycopg

        from engine.errors import StoreReadOnly

        base = POSTGRES_URL.rsplit("/", 1)[0] + f"/{own_database}"
        set_read_only(own_database, True)
        with pytest.raises(StoreReadOnly, match="PostgreSQL server is read-only") as caught:
            Engine(f"{base}?schema=s", create=True)
        assert "\n" not in str(caught.value)
        assert "default_transaction_read_only" in str(caught.value)
        with psycopg.connect(base, autocommit=True) as conn:
            assert conn.execute("SELECT to_regnamespace('s')").fetchone() == (None,)
