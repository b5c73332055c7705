from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent

from engine import Engine, StoreError
from engine.store.urls import mask
from events import RunStarted
from tests._helpers import REVIEW, require_postgres

KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64


def raw_rows(path: Path) -> list[bytes]:
    with sqlite3.connect(path) as conn:
        return [row[0] for row in conn.execute("SELECT state FROM stagetrail_events")]


class TestURLs:
    @pytest.mark.parametrize(
        ("url", "message"),
        [
            ("foo://x", "unsupported store URL; use one of"),
            ("runs.db", "did you mean sqlite:///runs.db?"),
            ("sqlite://", "a SQLite URL is sqlite:///"),
            ("sqlite://host/runs.db", "a SQLite URL is sqlite:///"),
            ("postgresql://localhost", "names no database"),
            ("postgresql://localhost:port/db", "malformed PostgreSQL URL"),
            ("memory://?compress=lz4", "compress='lz4' is not supported"),
            ("sqlite:///x.db?schema=s", "unknown option 'schema'"),
            ("postgresql://h/db?connect_timeout=soon", "connect_timeout='soon' must be"),
        ],
    )
    def test_bad_urls_raise_one_store_error(self, url: str, message: str) -> None:
        """Each malformed or unsupported URL raises a StoreError saying what to write."""
        with pytest.raises(StoreError, match="store ") as caught:
            Engine(url)
        assert message in str(caught.value)
        assert isinstance(caught.value, OSError)

    def test_passwords_are_masked(self) -> None:
        """mask() hides the password and nothing else; a parsed URL's repr hides it too."""
        assert mask("postgresql://ann:s3cret@db:5432/runs") == "postgresql://ann:***@db:5432/runs"
        assert mask("sqlite:///runs.db") == "sqlite:///runs.db"
        from engine.store.urls import parse

        assert "s3cret" not in repr(parse("postgresql://ann:s3cret@db:5432/runs"))

    @pytest.mark.parametrize(
        "url",
        [
            "postgresql://ann:s3cret@[::1/test",
            "postgresql://ann@h/db?password=s3cret",
            "postgresql://ann:s3cret@h/db?nonsense=1",
            "postgresql://ann:s3cr/et@h/db",
            "postgresql:/ann:s3cret@h/db",
            "ann:s3cret@h/db",
            "postgresql://ann@h/db?sslpassword=s3cret",
            "sqlite:///x.db?PASS%57ORD=s3cret",
        ],
    )
    def test_passwords_are_masked_in_url_errors(self, url: str) -> None:
        """A URL refused for its form never shows its password."""
        with pytest.raises(StoreError) as caught:
            Engine(url)
        assert "s3cret" not in str(caught.value)
        assert "***" in str(caught.value)

    def test_an_unreachable_server_is_one_clear_error(self) -> None:
        """A refused connection is a StoreError that never shows the password."""
        with pytest.raises(StoreError, match="cannot connect to PostgreSQL") as caught:
            Engine("postgresql://ann:s3cret@127.0.0.1:1/runs?connect_timeout=2")
        assert "s3cret" not in str(caught.value)
        assert "ann:***@127.0.0.1:1" in str(caught.value)
        assert caught.value.__cause__ is None


class TestSQLiteFiles:
    def test_a_file_that_is_not_a_database(self, tmp_path: Path) -> None:
        """Opening a text file as a store raises StoreError, not a driver traceback."""
        path = tmp_path / "notes.txt"
        path.write_text("this is not a database, just some notes\n" * 100)
        with pytest.raises(StoreError, match="not a stagetrail store"):
            Engine(f"sqlite:///{path}")

    def test_a_foreign_sqlite_database(self, tmp_path: Path) -> None:
        """A SQLite file holding other tables is refused and left untouched."""
        path = tmp_path / "other.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE invoices (id INTEGER)")
        with pytest.raises(StoreError, match=r"holds other tables \(invoices\)"):
            Engine(f"sqlite:///{path}")
        with sqlite3.connect(path) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert tables == {"invoices"}

    def test_read_only_open_never_creates(self, tmp_path: Path) -> None:
        """create=False on a missing file raises and creates nothing."""
        path = tmp_path / "missing.db"
        with pytest.raises(StoreError, match="does not exist"):
            Engine(f"sqlite:///{path}", create=False)
        assert not path.exists()

    def test_read_only_open_of_an_existing_store(self, sqlite_url: str) -> None:
        """create=False opens a store that exists."""
        with Engine(sqlite_url) as writer:
            run = writer.start_run(REVIEW)
        with Engine(sqlite_url, create=False) as reader:
            assert reader.load(run.id).state == "project_analysis"

    def test_a_directory_is_not_a_store(self, tmp_path: Path) -> None:
        """A directory path is refused with a clear error."""
        with pytest.raises(StoreError, match="is a directory"):
            Engine(f"sqlite:///{tmp_path}")

    def test_missing_parent_directory(self, tmp_path: Path) -> None:
        """A store in a directory that does not exist is refused, naming it."""
        with pytest.raises(StoreError, match="no directory"):
            Engine(f"sqlite:///{tmp_path / 'nope' / 'runs.db'}")

    def test_newer_schema_is_refused(self, sqlite_url: str, tmp_path: Path) -> None:
        """A store stamped with a newer schema version asks for an upgrade."""
        Engine(sqlite_url).close()
        with sqlite3.connect(tmp_path / "runs.db") as conn:
            conn.execute("UPDATE stagetrail_meta SET value='99' WHERE key='schema_version'")
        with pytest.raises(StoreError, match=r"newer stagetrail.*upgrade stagetrail"):
            Engine(sqlite_url)

    def test_durable_settings(self, sqlite_url: str, tmp_path: Path) -> None:
        """The file is in WAL mode and our connections sync every commit (FULL)."""
        with Engine(sqlite_url) as engine:
            engine.start_run(REVIEW)
            datastore = engine.store.recorder.datastore  # type: ignore[attr-defined]
            with datastore.transaction(commit=False) as cursor:
                cursor.execute("PRAGMA synchronous")
                assert cursor.fetchone()[0] == 2
        with sqlite3.connect(tmp_path / "runs.db") as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


class TestPostgres:
    def test_newer_schema_is_refused(self, postgres_url: str) -> None:
        """A PostgreSQL store stamped with a newer schema version is refused."""
        import psycopg

        Engine(postgres_url).close()
        base, schema = postgres_url.split("?schema=")
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(
                f"UPDATE {schema}.stagetrail_meta SET value='99' WHERE key='schema_version'"
            )
        with pytest.raises(StoreError, match="newer stagetrail"):
            Engine(postgres_url)

    def test_read_only_open_of_a_missing_store(self, postgres_url: str) -> None:
        """create=False in a schema without a store raises StoreError."""
        with pytest.raises(StoreError, match="no stagetrail store in schema"):
            Engine(postgres_url, create=False)

    @pytest.mark.parametrize("schema", ["a;drop", "Runs", "9lives"])
    def test_bad_schema_names_are_refused(self, schema: str) -> None:
        """A schema name that is not a lower-case identifier is refused before connecting."""
        require_postgres()
        with pytest.raises(StoreError, match="lower-case letters, digits and _"):
            Engine(f"postgresql://postgres@127.0.0.1:5432/test?schema={schema}")

    def test_libpq_options_reach_every_connection(self, postgres_url: str) -> None:
        """application_name (like sslmode) is passed to the probe and to the pool."""
        import psycopg

        name = f"st_{uuid.uuid4().hex[:8]}"
        with Engine(f"{postgres_url}&application_name={name}") as engine:
            engine.start_run(REVIEW)
            with psycopg.connect(postgres_url.split("?")[0]) as conn:
                seen = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
                ).fetchone()
        assert seen is not None
        assert seen[0] >= 1

    def test_sslmode_is_honoured(self, postgres_url: str) -> None:
        """sslmode=require against a server without SSL fails with libpq's reason."""
        with pytest.raises(StoreError, match="SSL"):
            Engine(f"{postgres_url}&sslmode=require")

    def test_a_read_only_role_reads_but_cannot_write(self, postgres_url: str) -> None:
        """A role with USAGE and SELECT opens an existing store; its appends are StoreErrors."""
        import psycopg

        with Engine(postgres_url) as owner:
            run = owner.start_run(REVIEW)
        base, schema = postgres_url.split("?schema=")
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(
                "DO $$ BEGIN CREATE ROLE stagetrail_reader LOGIN; "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
            conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO stagetrail_reader")
            conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO stagetrail_reader")
        url = postgres_url.replace("postgres@", "stagetrail_reader@")
        with Engine(url, create=False) as reader:
            loaded = reader.load(run.id)
            assert loaded.state == "project_analysis"
            with pytest.raises(StoreError, match="append failed, nothing written"):
                loaded.note("k", 1)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM stagetrail_reader")
            conn.execute(f"REVOKE ALL ON SCHEMA {schema} FROM stagetrail_reader")

    def test_a_keyword_schema_is_refused_before_anything_is_created(self) -> None:
        """?schema=user is refused by name, and no half-made schema is left behind."""
        require_postgres()
        import psycopg

        from tests._helpers import POSTGRES_URL

        with pytest.raises(StoreError, match="'user' is an SQL keyword"):
            Engine(f"{POSTGRES_URL}?schema=user")
        with psycopg.connect(POSTGRES_URL) as conn:
            found = conn.execute(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'user'"
            ).fetchone()
        assert found == (0,)

    def test_missing_rights_are_a_store_error(self, postgres_url: str) -> None:
        """A role that may not create the schema gets a StoreError, not a psycopg traceback."""
        import psycopg

        base = postgres_url.split("?")[0]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(
                "DO $$ BEGIN CREATE ROLE stagetrail_noperm LOGIN; "
                "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            )
        url = postgres_url.replace("postgres@", "stagetrail_noperm@")
        with pytest.raises(StoreError, match="permission denied") as caught:
            Engine(url)
        assert caught.value.__cause__ is None


class TestAtRest:
    def test_encrypted_store_needs_its_key(self, tmp_path: Path) -> None:
        """Events are encrypted on disk; no key, or a wrong key, is a clear error."""
        url = f"sqlite:///{tmp_path / 'secret.db'}"
        with Engine(url, cipher_key=KEY) as engine:
            run = engine.start_run(REVIEW, params={"card": "TOP-SECRET"})
        assert not any(b"TOP-SECRET" in row for row in raw_rows(tmp_path / "secret.db"))
        with pytest.raises(StoreError, match="encrypted: set STAGETRAIL_CIPHER_KEY"):
            Engine(url, cipher_key="")
        wrong = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA="
        with pytest.raises(StoreError, match="not the key this store"):
            Engine(url, cipher_key=wrong)
        with Engine(url, cipher_key=KEY) as engine:
            first = engine.events(run.id)[0]
        assert isinstance(first, RunStarted)
        assert first.params == {"card": "TOP-SECRET"}

    def test_key_from_the_environment(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """$STAGETRAIL_CIPHER_KEY turns encryption on; a plain store refuses a key."""
        plain = f"sqlite:///{tmp_path / 'plain.db'}"
        Engine(plain).close()
        monkeypatch.setenv("STAGETRAIL_CIPHER_KEY", KEY)
        with pytest.raises(StoreError, match="not encrypted but STAGETRAIL_CIPHER_KEY is set"):
            Engine(plain)

    def test_compression_is_decided_at_creation(self, tmp_path: Path) -> None:
        """compress=zlib at creation compresses events; later opens need no option."""
        url = f"sqlite:///{tmp_path / 'small.db'}"
        with Engine(f"{url}?compress=zlib") as engine:
            run = engine.start_run(REVIEW, params={"text": "a" * 5000})
        assert all(len(row) < 1000 for row in raw_rows(tmp_path / "small.db"))
        with Engine(url) as engine:
            assert engine.load(run.id).version == 1


class TestOldAndNewEvents:
    def test_an_old_format_event_is_upcast_on_load(self, engine: Engine) -> None:
        """A version-1 RunStarted written by an older release loads with today's fields."""
        run_id = uuid.uuid4()
        old_state = {
            "timestamp": "2025-06-01T12:00:00+00:00",
            "pipeline": REVIEW.name,
            "table": REVIEW.to_dict(),
            "params": {"card": "OLD-1"},
            "parent_run_id": None,
        }
        engine.store.recorder.insert_events(
            [StoredEvent(run_id, 1, RunStarted.topic, json.dumps(old_state).encode())]
        )
        first = engine.events(run_id)[0]
        assert isinstance(first, RunStarted)
        assert (first.labels, first.forked_from, first.params) == ({}, None, {"card": "OLD-1"})
        loaded = engine.load(run_id)
        loaded.stage_completed("project_analysis")
        assert loaded.state == "code_review"

    def test_an_event_from_a_newer_release_is_a_store_error(self, engine: Engine) -> None:
        """An event whose class version is newer than this code names run and version."""
        run = engine.start_run(REVIEW)
        state = {"timestamp": "2026-01-01T00:00:00+00:00", "key": "k", "value": 1}
        state["class_version"] = 9
        engine.store.recorder.insert_events(
            [StoredEvent(run.id, 2, "stagetrail:NoteAdded", json.dumps(state).encode())]
        )
        with pytest.raises(StoreError, match=f"run {run.id} version 2.*upgrade stagetrail"):
            engine.events(run.id)


class TestReads:
    @pytest.mark.parametrize(
        ("query", "versions"),
        [
            ({}, [1, 2, 3, 4, 5]),
            ({"gt": 2}, [3, 4, 5]),
            ({"lte": 3}, [1, 2, 3]),
            ({"gt": 1, "lte": 4}, [2, 3, 4]),
            ({"limit": 2}, [1, 2]),
            ({"gt": 3, "limit": 5}, [4, 5]),
            ({"gt": 5}, []),
            ({"lte": 0}, []),
        ],
        ids=str,
    )
    def test_read_selects_versions(
        self, engine: Engine, query: dict[str, Any], versions: list[int]
    ) -> None:
        """Store.read returns the versions `gt < v <= lte`, oldest first, at most `limit`."""
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", {"score": 1})
        run.stage_completed("code_review")
        run.stage_failed("developer", "flaky")
        run.note("k", "v")
        events = engine.store.read(run.id, **query)
        assert [e.version for e in events] == versions
        assert all(e.run_id == run.id for e in events)

    def test_a_run_id_given_as_text_reads_the_run(self, engine: Engine) -> None:
        """read, last and stream take a run id as text too, and give events with UUID ids."""
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis")
        text: Any = str(run.id)
        assert [e.version for e in engine.store.read(text)] == [1, 2]
        assert [e.version for e in engine.store.stream(text)] == [1, 2]
        last = engine.store.last(text)
        assert last is not None
        assert last.version == 2
        assert last.run_id == run.id
        assert all(type(e.run_id) is type(run.id) for e in engine.store.read(text))

    def test_last_and_an_unknown_run(self, engine: Engine) -> None:
        """last gives the newest event; an unknown run reads as nothing on every backend."""
        run = engine.start_run(REVIEW)
        run.note("k", "v")
        newest = engine.store.last(run.id)
        assert newest is not None
        assert newest.version == 2
        assert engine.store.last(uuid.uuid4()) is None
        assert engine.store.read(uuid.uuid4()) == []
