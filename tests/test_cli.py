from __future__ import annotations

import os
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
        assert "Recorded 3 runs into sqlite:///stagetrail.db" in done.stdout
        assert "34 events recorded" in done.stdout
        url = f"sqlite:///{tmp_path / 'stagetrail.db'}"
        assert statuses(url) == ["succeeded", "succeeded", "failed"]

    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    def test_demo_into_a_chosen_store(self, backend: str, request: pytest.FixtureRequest) -> None:
        """--store sends the demo to a SQLite file or a PostgreSQL schema."""
        store_url = request.getfixturevalue(backend)
        result = CliRunner().invoke(main, ["demo", "--store", store_url])
        assert result.exit_code == 0, result.output
        assert "code-review" in result.output
        assert len(run_ids(store_url)) == 3

    def test_demo_twice_adds_to_the_store(self, sqlite_url: str) -> None:
        """A second demo appends three more runs; nothing recorded before is touched."""
        runner = CliRunner()
        assert runner.invoke(main, ["demo", "--store", sqlite_url]).exit_code == 0
        first = run_ids(sqlite_url)
        assert runner.invoke(main, ["demo", "--store", sqlite_url]).exit_code == 0
        both = run_ids(sqlite_url)
        assert len(both) == 6
        assert both[:3] == first

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
