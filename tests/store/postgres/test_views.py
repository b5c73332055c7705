"""The PostgreSQL views' reads after their pooled connections were terminated."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine import Engine
from engine.store.views import RunQuery
from tests._helpers import POSTGRES_URL, REVIEW, FailuresByType

WAIT = 30.0
"""Bound on waiting for terminated backends to be gone."""

READS: dict[str, Callable[[Engine, str], Any]] = {
    "resets_and_positions": lambda e, run: e.store.views.resets_and_positions(["run_index"]),  # type: ignore[union-attr]
    "positions": lambda e, run: e.store.views.positions(["run_index", FailuresByType.name]),  # type: ignore[union-attr]
    "resets": lambda e, run: e.store.views.resets(),  # type: ignore[union-attr]
    "max_tracking_id": lambda e, run: e.store.views.max_tracking_id("run_index"),  # type: ignore[union-attr]
    "current": lambda e, run: e.store.views.current(),  # type: ignore[union-attr]
    "fingerprint": lambda e, run: e.store.views.fingerprint("run_index"),  # type: ignore[union-attr]
    "errors": lambda e, run: e.store.views.errors(),  # type: ignore[union-attr]
    "runs": lambda e, run: e.store.views.runs(RunQuery()),  # type: ignore[union-attr]
    "run_ids": lambda e, run: e.store.views.run_ids(run[:4], 10),  # type: ignore[union-attr]
    "states": lambda e, run: e.store.views.states(FailuresByType.name),  # type: ignore[union-attr]
    "load": lambda e, run: e.store.views.load("run_index", [run]),  # type: ignore[union-attr]
    "snapshot": lambda e, run: e.store.views.snapshot(run, "p", "f", 0, 10),  # type: ignore[union-attr]
    "generation": lambda e, run: e.store.generation(),
    "stored_after": lambda e, run: e.store._backend.stored_after(uuid.UUID(run), 0),  # type: ignore[misc]
    "engine.runs": lambda e, run: [r.run_id for r in e.runs()],
    "projections.status": lambda e, run: [(s.name, s.lag) for s in e.projections.status()],
}
"""Every read-only query of the views (and the store's reads beside the recorder's)."""


@pytest.fixture
def named(postgres_url: str) -> Iterator[tuple[Engine, str, str]]:
    """An engine whose connections carry a name of their own; a run, folded; the name."""
    name = f"st_views_{uuid.uuid4().hex[:8]}"  # only this test's connections are terminated
    with Engine(f"{postgres_url}&application_name={name}") as engine:
        engine.projections.register(FailuresByType)
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", result={})
        run.stage_completed("code_review", result={})
        run.stage_failed("developer", error="boom", error_type="Timeout")
        engine.projections.catch_up()
        settled(engine)  # no connection the pool opens later escapes the test's terminations
        yield engine, str(run.id), name


def settled(engine: Engine) -> None:
    """Wait until the engine's pool opens no connection: none being opened, none lent out,
    no NOTIFY due to take one."""
    pool = engine.store.views.datastore.pool  # type: ignore[union-attr]
    notifier = engine.store.recorder.notifier  # type: ignore[attr-defined]
    deadline = time.monotonic() + WAIT
    while notifier.due or (stats := pool.get_stats())["pool_available"] < stats["pool_size"]:
        assert time.monotonic() < deadline, "the pool is still opening connections"
        time.sleep(0.01)


def terminate(name: str) -> int:
    """Terminate every server backend of connections named `name`, those the pool was still
    opening too; wait until they are gone. How many were terminated."""
    import psycopg

    terminated = 0
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        deadline = time.monotonic() + WAIT
        while left(conn, name):
            assert time.monotonic() < deadline, "terminated backends still there"
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (name,),
            ).fetchone()
            terminated += int(row[0]) if row else 0
            time.sleep(0.01)
    return terminated


def left(conn: Any, name: str) -> int:
    """How many server backends of connections named `name` are still there."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
    ).fetchone()
    return int(row[0]) if row else 0


class TestReadsAfterTerminatedConnections:
    @pytest.mark.parametrize("read", list(READS))
    def test_a_read_after_the_pooled_backends_died_answers_as_before(
        self, named: tuple[Engine, str, str], read: str
    ) -> None:
        """Every pooled connection terminated since its last use, a views read still answers,
        the same as before (on a fresh connection)."""
        engine, run, name = named
        before = READS[read](engine, run)
        assert terminate(name) >= 1
        assert READS[read](engine, run) == before

    def test_a_write_is_not_retried(self, named: tuple[Engine, str, str]) -> None:
        """A views write on a terminated connection fails, nothing written: only reads retry."""
        from engine import StoreError

        engine, _, name = named
        views = engine.store.views
        assert views is not None
        assert terminate(name) >= 1
        with pytest.raises(StoreError, match="projection storage failed"):
            views.reset(FailuresByType.name, "other code")
        assert views.fingerprint(FailuresByType.name) != "other code"


IDLE_TIMEOUT = "2s"
"""The server's idle_session_timeout for the connections opened after the engine's setup."""


class TestReadsAfterIdleSessionTimeout:
    @pytest.mark.parametrize("read", ["positions", "generation", "stored_after"])
    def test_a_read_after_the_server_ended_idle_sessions_answers_as_before(
        self, named: tuple[Engine, str, str], read: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every pooled session ended by the server's idle_session_timeout (57P05), a read still
        answers, the same as before (on a fresh connection)."""
        import psycopg

        engine, run, name = named
        before = READS[read](engine, run)
        monkeypatch.setenv("PGOPTIONS", f"-c idle_session_timeout={IDLE_TIMEOUT}")
        assert terminate(name) >= 1
        pool = engine.store.views.datastore.pool  # type: ignore[union-attr]
        pool.check()  # the pool's new sessions, each with the timeout
        settled(engine)
        deadline = time.monotonic() + WAIT
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            assert left(conn, name) == pool.get_stats()["pool_size"] >= 1
            while left(conn, name):  # the server ends each once it was idle that long
                assert time.monotonic() < deadline, "idle sessions still there"
                time.sleep(0.05)
        assert READS[read](engine, run) == before
