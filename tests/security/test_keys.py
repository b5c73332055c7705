"""Cipher keys on every backend: a store written encrypted refuses a second key or none,
a plain store refuses a key, and a malformed key names the store it was given for.

An ``eventsourcing://`` store keeps the same meta rows as a SQLite or PostgreSQL
store (in its module's own ``stored_stagetrail_meta`` table) and checks them the
same way, so a refused writer never leaves events that break `runs` and
`export --all` for everyone else with ``Invalid cipher tag``.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine, StoreError
from tests._helpers import POSTGRES_URL, REVIEW, require_postgres
from tests.cli._helpers import invoke

KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64
OTHER_KEY = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="
MALFORMED_KEY = "not-base64!"


@pytest.fixture
def module_schema() -> Iterator[str]:
    """An empty PostgreSQL schema for eventsourcing's own PostgreSQL module, dropped after."""
    require_postgres()
    import psycopg

    schema = f"k_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield schema
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(params=["module-sqlite", "module-postgres", "sqlite", "postgres"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store several processes share: eventsourcing's SQLite or PostgreSQL module, or ours."""
    if request.param == "module-sqlite":
        return f"eventsourcing://eventsourcing.sqlite?SQLITE_DBNAME={tmp_path / 'es.db'}"
    if request.param == "module-postgres":
        schema = request.getfixturevalue("module_schema")
        return (
            "eventsourcing://eventsourcing.postgres?POSTGRES_DBNAME=test&POSTGRES_HOST=127.0.0.1"
            f"&POSTGRES_PORT=5432&POSTGRES_USER=postgres&POSTGRES_PASSWORD=&POSTGRES_SCHEMA={schema}"
        )
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}"
    return str(request.getfixturevalue("postgres_url"))


def _record(url: str, key: str | None) -> uuid.UUID:
    with Engine(url, cipher_key=key or "") as engine:
        run = engine.start_run(REVIEW, params={"card": "C-1"})
        run.stage_completed("project_analysis")
        return run.id


def _everything(url: str, key: str | None) -> tuple[int, list[str]]:
    """The newest notification id and every run's id, read with `key`."""
    with Engine(url, cipher_key=key or "") as engine:
        head = engine.store.recorder.max_notification_id() or 0
        return head, sorted(str(summary.run_id) for summary in engine.runs())


CASES = [
    ("second-key", KEY, OTHER_KEY, "STAGETRAIL_CIPHER_KEY is not the key this store"),
    ("no-key", KEY, None, "the store is encrypted: set STAGETRAIL_CIPHER_KEY"),
    ("key-for-plain", None, KEY, "not encrypted but STAGETRAIL_CIPHER_KEY is set"),
]


class TestOneKeyPerStore:
    @pytest.mark.parametrize(
        ("written", "given", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
    )
    def test_a_write_with_another_key_is_refused(
        self, shared_store: str, written: str | None, given: str | None, words: str
    ) -> None:
        """Opening to write with another key, or none, is one StoreError; nothing is written."""
        _record(shared_store, written)
        before = _everything(shared_store, written)
        with pytest.raises(StoreError, match=words) as caught:
            _record(shared_store, given)
        assert "\n" not in str(caught.value)
        assert str(caught.value).startswith(f"store {shared_store.split('&POSTGRES_PASSWORD')[0]}")
        assert _everything(shared_store, written) == before

    @pytest.mark.parametrize(
        ("written", "given", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
    )
    def test_the_command_line_stays_readable_for_the_key_holder(
        self, shared_store: str, written: str | None, given: str | None, words: str
    ) -> None:
        """After a refused `demo` with another key, `runs` and `export --all` still work."""
        run_id = _record(shared_store, written)
        refused = invoke("demo", "--store", shared_store, env=_env(given))
        assert refused.exit_code == 2, refused.stdout
        assert words in refused.stderr
        assert refused.stderr.count("\n") == 1
        listed = invoke("runs", "--store", shared_store, "--json", env=_env(written))
        assert listed.exit_code == 0, listed.stderr
        assert str(run_id) in listed.stdout
        exported = invoke("export", "--all", "--store", shared_store, env=_env(written))
        assert exported.exit_code == 0, exported.stderr
        assert len(exported.stdout.splitlines()) == 2


def _env(key: str | None) -> dict[str, str | None]:
    return {"STAGETRAIL_CIPHER_KEY": key, "STAGETRAIL_STORE": None}


class TestMalformedKey:
    @pytest.mark.parametrize("backend", ["memory", "module-sqlite", "sqlite", "postgres"])
    def test_the_error_names_the_store(
        self, backend: str, tmp_path: Path, request: pytest.FixtureRequest
    ) -> None:
        """A key that is not an AES key is one error naming the store, not `store -:`."""
        url = {
            "memory": "memory://",
            "module-sqlite": f"eventsourcing://eventsourcing.sqlite?SQLITE_DBNAME={tmp_path}/m.db",
            "sqlite": f"sqlite:///{tmp_path / 'runs.db'}",
        }.get(backend) or str(request.getfixturevalue("postgres_url"))
        with pytest.raises(StoreError, match="is not a valid AES key") as caught:
            Engine(url, cipher_key=MALFORMED_KEY)
        assert str(caught.value).startswith(f"store {url}: STAGETRAIL_CIPHER_KEY")
        assert not (tmp_path / "runs.db").exists()

    def test_the_command_line_says_the_same(self, tmp_path: Path) -> None:
        """`stagetrail runs` with a malformed key names its store on one line."""
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        _record(url, None)
        result = invoke("runs", "--store", url, env=_env(MALFORMED_KEY))
        assert result.exit_code == 2
        assert result.stderr.startswith(f"stagetrail: error: store {url}: STAGETRAIL_CIPHER_KEY")


class TestAModuleStoreFromBefore:
    """A store an earlier stagetrail wrote through a module, without meta rows."""

    @staticmethod
    def _without_meta(path: Path, key: str | None) -> str:
        url = f"eventsourcing://eventsourcing.sqlite?SQLITE_DBNAME={path}"
        _record(url, key)
        with sqlite3.connect(path) as conn:
            conn.execute("DROP TABLE stored_stagetrail_meta")
        return url

    def test_another_key_is_refused_by_its_first_event(self, tmp_path: Path) -> None:
        """Its first event does not read back with another key: refused, nothing written."""
        url = self._without_meta(tmp_path / "old.db", KEY)
        with pytest.raises(StoreError, match="written with another STAGETRAIL_CIPHER_KEY"):
            _record(url, OTHER_KEY)
        with pytest.raises(StoreError, match="written with another STAGETRAIL_CIPHER_KEY"):
            _record(url, None)
        assert _everything(url, KEY)[0] == 2

    def test_its_own_key_gets_the_meta_rows(self, tmp_path: Path) -> None:
        """The first writing open with the right key records the meta; then others are refused."""
        url = self._without_meta(tmp_path / "old.db", KEY)
        _record(url, KEY)
        with sqlite3.connect(tmp_path / "old.db") as conn:
            assert conn.execute("SELECT COUNT(*) FROM stored_stagetrail_meta").fetchone() == (1,)
        with pytest.raises(StoreError, match="not the key this store"):
            _record(url, OTHER_KEY)

    def test_a_read_only_open_checks_and_writes_nothing(self, tmp_path: Path) -> None:
        """Opened read-only, it is checked by its first event but given no meta rows."""
        url = self._without_meta(tmp_path / "old.db", KEY)
        with pytest.raises(StoreError, match="written with another STAGETRAIL_CIPHER_KEY"):
            Engine(url, cipher_key=OTHER_KEY, read_only=True)
        with Engine(url, cipher_key=KEY, read_only=True) as engine:
            assert len(engine.runs()) == 1
        with sqlite3.connect(tmp_path / "old.db") as conn:
            assert conn.execute("SELECT COUNT(*) FROM stored_stagetrail_meta").fetchone() == (0,)


class TestMetaIsNotAnEvent:
    def test_the_meta_rows_stay_out_of_the_notification_log(self, tmp_path: Path) -> None:
        """Projections follow the notification log: it holds the runs' events only."""
        url = f"eventsourcing://eventsourcing.sqlite?SQLITE_DBNAME={tmp_path / 'es.db'}"
        _record(url, KEY)
        with Engine(url, cipher_key=KEY) as engine:
            topics = {n.topic for n in engine.store.recorder.select_notifications(1, 100)}
        assert all(
            topic.startswith("stagetrail:") and topic != "stagetrail:meta" for topic in topics
        )
