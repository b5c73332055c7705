"""Any eventsourcing persistence module as a store: ``eventsourcing://TOPIC?SETTINGS``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import ConcurrencyConflict, Engine, StoreError
from tests._helpers import POSTGRES_URL, REVIEW, require_postgres


@pytest.fixture
def module_schema() -> Iterator[str]:
    """An empty PostgreSQL schema for eventsourcing's own PostgreSQL module, dropped after."""
    require_postgres()
    import psycopg

    schema = f"m_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield schema
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def module_urls(tmp_path: Path, schema: str) -> dict[str, str]:
    return {
        "sqlite": f"eventsourcing://eventsourcing.sqlite?SQLITE_DBNAME={tmp_path / 'es.db'}",
        "postgres": (
            "eventsourcing://eventsourcing.postgres?POSTGRES_DBNAME=test&POSTGRES_HOST=127.0.0.1"
            f"&POSTGRES_PORT=5432&POSTGRES_USER=postgres&POSTGRES_PASSWORD=&POSTGRES_SCHEMA={schema}"
        ),
    }


class TestPersistenceModules:
    @pytest.mark.parametrize("module", ["sqlite", "postgres"])
    def test_a_module_by_topic_records_and_reads_runs(
        self, module: str, tmp_path: Path, module_schema: str
    ) -> None:
        """eventsourcing's own recorders, chosen by topic: append, conflict, reload, runs()."""
        url = module_urls(tmp_path, module_schema)[module]
        with Engine(url) as first, Engine(url) as second:
            run = first.start_run(REVIEW, labels={"via": module})
            with run.batch():
                run.stage_completed("project_analysis")
                run.note("k", 1)
            stale = second.load(run.id)
            run.note("k", 2)
            with pytest.raises(ConcurrencyConflict):
                stale.note("k", 3)
            assert stale.refresh().version == 4
            assert [r.run_id for r in second.runs(label=f"via={module}")] == [run.id]
        with Engine(url) as reopened:
            assert reopened.load(run.id).state == "code_review"
            assert [e.version for e in reopened.events(run.id)] == [1, 2, 3, 4]

    def test_settings_can_stay_out_of_the_url(self, tmp_path: Path) -> None:
        """Settings given to Engine(settings=) reach the module (e.g. a password)."""
        path = tmp_path / "kept.db"
        with Engine("eventsourcing://eventsourcing.sqlite", settings={"SQLITE_DBNAME": str(path)}):
            pass
        assert path.exists()

    @pytest.mark.parametrize(
        ("url", "message"),
        [
            ("eventsourcing://", "name the persistence module"),
            ("eventsourcing://no_such_module_xyz", "cannot open persistence module"),
            ("eventsourcing://eventsourcing.sqlite", "cannot open persistence module"),
        ],
    )
    def test_a_bad_module_is_one_store_error(self, url: str, message: str) -> None:
        """An unknown topic or a missing setting is one StoreError line."""
        with pytest.raises(StoreError, match=message) as caught:
            Engine(url)
        assert "\n" not in str(caught.value)

    def test_a_password_setting_is_masked(self) -> None:
        """A password among the module's settings never shows in an error."""
        url = "eventsourcing://no_such_module_xyz?POSTGRES_PASSWORD=s3cret"
        with pytest.raises(StoreError) as caught:
            Engine(url)
        assert "s3cret" not in str(caught.value)
