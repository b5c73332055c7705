from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import pytest
from click.testing import CliRunner

from engine import Engine, StoreError
from engine.cli import main


def run_ids(url: str) -> list[UUID]:
    with Engine(url, create=False) as engine:
        notifications = engine.store.recorder.select_notifications(start=1, limit=10_000)
        return list(dict.fromkeys(UUID(str(n.originator_id)) for n in notifications))


def statuses(url: str) -> list[str | None]:
    with Engine(url, create=False) as engine:
        return [engine.load(run_id).status for run_id in run_ids(url)]


class TestDemo:
    def test_demo_records_into_the_default_store(self, tmp_path: Path) -> None:
        """`stagetrail demo` (the real console script) fills ./stagetrail.db and says so."""
        env = {k: v for k, v in os.environ.items() if k != "STAGETRAIL_STORE"}
        script = Path(sys.executable).parent / "stagetrail"
        done = subprocess.run(
            [str(script), "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
        )
        url = f"sqlite:///{tmp_path / 'stagetrail.db'}"
        recorded = run_ids(url)
        title = re.match(r"Recorded (\d+) runs(?: and (\d+) child runs)? into (\S+)\n", done.stdout)
        assert title is not None, done.stdout
        assert int(title.group(1)) + int(title.group(2) or 0) == len(recorded)
        assert title.group(3) == "sqlite:///stagetrail.db"
        with Engine(url, create=False) as engine:
            total = sum(len(engine.events(run_id)) for run_id in recorded)
        assert f"{total} events recorded" in done.stdout
        assert statuses(url)[:3] == ["succeeded", "succeeded", "failed"]

    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    def test_demo_into_a_chosen_store(self, backend: str, request: pytest.FixtureRequest) -> None:
        """--store sends the demo to a SQLite file or a PostgreSQL schema."""
        store_url = request.getfixturevalue(backend)
        result = CliRunner().invoke(main, ["demo", "--store", store_url])
        assert result.exit_code == 0, result.output
        assert "code-review" in result.output
        assert len(run_ids(store_url)) >= 3

    def test_demo_twice_adds_to_the_store(self, sqlite_url: str) -> None:
        """A second demo appends three more runs; nothing recorded before is touched."""
        runner = CliRunner()
        assert runner.invoke(main, ["demo", "--store", sqlite_url]).exit_code == 0
        first = run_ids(sqlite_url)
        assert runner.invoke(main, ["demo", "--store", sqlite_url]).exit_code == 0
        both = run_ids(sqlite_url)
        assert len(both) == 2 * len(first)
        assert both[: len(first)] == first

    def test_demo_ends_with_three_commands_that_work(self, sqlite_url: str) -> None:
        """The three suggested commands name recorded runs, and each of them succeeds."""
        result = CliRunner().invoke(main, ["demo", "--store", sqlite_url])
        assert result.exit_code == 0, result.output
        ending = result.stdout.split("Three commands worth trying next:\n")[1]
        commands = [line.strip() for line in ending.splitlines() if line.strip()]
        assert len(commands) == 3
        assert commands[0].startswith("stagetrail runs")
        for command in commands:
            args = shlex.split(command)
            assert args[-2:] == ["--store", sqlite_url]
            done = CliRunner().invoke(main, args[1:])
            assert done.exit_code == 0, (command, done.output)
        failed_run = commands[1].split()[2]
        assert any(str(run_id).startswith(failed_run) for run_id in run_ids(sqlite_url))

    def test_version(self) -> None:
        """--version prints the installed distribution's version."""
        result = CliRunner().invoke(main, ["--version"])
        assert result.exit_code == 0
        assert "0.1.0" in result.output


class TestErrors:
    def test_errors_are_one_line_and_exit_2(self) -> None:
        """A bad store URL prints one line on stderr, no traceback, exit code 2."""
        result = CliRunner().invoke(main, ["demo", "--store", "foo://nowhere"])
        assert result.exit_code == 2
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith("stagetrail: error: store foo://nowhere:")
        assert "Traceback" not in result.output

    def test_passwords_never_reach_the_terminal(self) -> None:
        """An unreachable PostgreSQL URL is reported with its password masked."""
        url = "postgresql://ann:s3cret@127.0.0.1:1/db?connect_timeout=2"
        result = CliRunner().invoke(main, ["demo", "--store", url])
        assert result.exit_code == 2
        assert "s3cret" not in result.output
        assert "ann:***@" in result.stderr

    def test_debug_shows_the_exception(self) -> None:
        """--debug lets the exception (and its traceback) through."""
        result = CliRunner().invoke(main, ["--debug", "demo", "--store", "foo://nowhere"])
        assert isinstance(result.exception, StoreError)
        assert result.exit_code == 1


READ_ONLY = [
    ["runs"],
    ["show", "abc"],
    ["state", "abc"],
    ["replay", "abc"],
    ["diff", "abc", "--from", "1"],
    ["fork", "abc", "--at", "1"],
    ["verify", "abc"],
    ["export", "--all"],
    ["diagram", "abc"],
    ["projections", "list"],
    ["projections", "status"],
    ["projections", "rebuild", "run_index"],
]


class TestStores:
    @pytest.mark.parametrize("args", READ_ONLY, ids=lambda args: " ".join(args[:2]))
    def test_commands_never_create_a_store(self, args: list[str], tmp_path: Path) -> None:
        """Every command but demo and import refuses a missing store and leaves no file."""
        path = tmp_path / "missing.db"
        result = CliRunner().invoke(main, [*args, "--store", f"sqlite:///{path}"])
        assert result.exit_code == 2
        assert result.stderr == (
            f"stagetrail: error: store sqlite:///{path}: no store at {path} "
            "(the file does not exist)\n"
        )
        assert not path.exists()

    def test_a_missing_postgres_schema_is_not_created(self, postgres_url: str) -> None:
        """A read command on a PostgreSQL schema with no store is refused; no schema appears."""
        import psycopg

        result = CliRunner().invoke(main, ["runs", "--store", postgres_url])
        assert result.exit_code == 2
        assert "no stagetrail store in schema" in result.stderr
        schema = postgres_url.rsplit("schema=", 1)[1]
        with psycopg.connect(postgres_url.split("?")[0]) as conn:
            found = conn.execute(
                "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
            ).fetchone()
        assert found is None

    def test_database_errors_are_one_line(self, sqlite_url: str) -> None:
        """A store whose run index table was replaced by a foreign one: one line, exit 2."""
        CliRunner().invoke(main, ["demo", "--store", sqlite_url])
        with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as db:
            db.execute("DROP TABLE stagetrail_runs")
            db.execute("CREATE TABLE stagetrail_runs (junk TEXT)")
        result = CliRunner().invoke(main, ["show", "abcd", "--store", sqlite_url])
        assert result.exit_code == 2
        assert result.stderr.startswith("stagetrail: error: ")
        assert result.stderr.count("\n") == 1

    def test_default_store_from_the_environment(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without --store, $STAGETRAIL_STORE names the store."""
        CliRunner().invoke(main, ["demo", "--store", sqlite_url])
        monkeypatch.setenv("STAGETRAIL_STORE", sqlite_url)
        result = CliRunner().invoke(main, ["runs", "--json"])
        assert result.exit_code == 0
        assert len(json.loads(result.stdout)) == len(run_ids(sqlite_url))

    def test_a_file_that_is_not_a_store(self, tmp_path: Path) -> None:
        """A file that is not a database, or a database of something else, is one clear line."""
        text = tmp_path / "notes.txt"
        text.write_text("hello\n" * 100)
        result = CliRunner().invoke(main, ["runs", "--store", f"sqlite:///{text}"])
        assert result.exit_code == 2
        assert "not a stagetrail store" in result.stderr
        other = tmp_path / "other.db"
        with sqlite3.connect(other) as db:
            db.execute("CREATE TABLE customers (id INTEGER)")
        result = CliRunner().invoke(main, ["show", "abc", "--store", f"sqlite:///{other}"])
        assert result.exit_code == 2
        assert "it holds other tables (customers)" in result.stderr

    def test_an_unreachable_postgres_store(self) -> None:
        """A server that does not answer is one line, exit 2, for a read command too."""
        url = "postgresql://ann:s3cret@127.0.0.1:1/db?connect_timeout=2"
        result = CliRunner().invoke(main, ["runs", "--store", url])
        assert result.exit_code == 2
        assert result.stderr.startswith("stagetrail: error: store postgresql://ann:***@127.0.0.1")
        assert "s3cret" not in result.output

    def test_debug_shows_the_traceback_of_a_read_command(self, tmp_path: Path) -> None:
        """--debug lets a missing-store error through with its traceback."""
        result = CliRunner().invoke(
            main, ["--debug", "runs", "--store", f"sqlite:///{tmp_path / 'x.db'}"]
        )
        assert isinstance(result.exception, StoreError)


class TestDecisionMarks:
    def test_supervisor_notes_count_as_decisions(self) -> None:
        """show marks gave_up and circuit_rejected notes as decisions, other notes not."""
        import uuid

        from engine.cli.show import is_decision
        from events import NoteAdded, RetryScheduled

        def note(key: str) -> NoteAdded:
            return NoteAdded(run_id=uuid.uuid4(), version=2, key=key, value=None)

        assert is_decision(note("gave_up"))
        assert is_decision(note("circuit_rejected"))
        assert not is_decision(note("strategy"))
        retry = RetryScheduled(run_id=uuid.uuid4(), version=3, stage="s", attempt=2, delay=1.0)
        assert is_decision(retry)
