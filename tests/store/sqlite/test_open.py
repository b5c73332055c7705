"""The SQLite store file: fleets opening it at once, read-only opens, refusals as one line."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import Engine, StoreError
from engine.errors import StoreFull, StoreReadOnly
from events import NoteAdded
from projections import Projection, on
from tests._helpers import REVIEW
from tests.store.postgres.test_open import open_together


def _snapshot(path: Path) -> tuple[bytes, list[str]]:
    """The file's bytes and the names beside it (a journal or WAL file would show)."""
    return path.read_bytes(), sorted(os.listdir(path.parent))


@pytest.mark.slow
class TestFleetStart:
    def test_workers_starting_together_on_a_new_file(self, tmp_path: Path) -> None:
        """4 processes creating one store and registering one projection at once, 5 trials."""
        for trial in range(5):
            url = f"sqlite:///{tmp_path / f'fleet{trial}.db'}"
            assert open_together(url, 4) == ["ok"] * 4
            with Engine(url) as engine:
                assert len(engine.runs()) == 4


class TestReadOnlyOpens:
    def test_another_programs_database_is_left_untouched(self, tmp_path: Path) -> None:
        """A read-only open of a foreign rollback-journal database changes no byte of it."""
        path = tmp_path / "app.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE invoices (id INTEGER)")
        conn.close()
        before = _snapshot(path)
        with pytest.raises(StoreError, match=r"holds other tables \(invoices\)"):
            Engine(f"sqlite:///{path}", read_only=True)
        assert _snapshot(path) == before
        with sqlite3.connect(path) as check:
            assert check.execute("PRAGMA journal_mode").fetchone()[0] == "delete"

    @pytest.mark.parametrize("create", [False, True])
    def test_a_foreign_database_keeps_its_journal_mode(self, tmp_path: Path, create: bool) -> None:
        """Even a command that may create a store refuses a foreign file before touching it."""
        path = tmp_path / "app.db"
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE invoices (id INTEGER)")
        conn.close()
        before = _snapshot(path)
        with pytest.raises(StoreError, match="not a stagetrail store"):
            Engine(f"sqlite:///{path}", create=create)
        assert _snapshot(path) == before

    def test_an_empty_file_stays_empty(self, tmp_path: Path) -> None:
        """A read-only open of a 0-byte file is refused and leaves it at 0 bytes."""
        path = tmp_path / "empty.db"
        path.touch()
        for read_only in (True, False):
            with pytest.raises(StoreError, match="is an empty file"):
                Engine(f"sqlite:///{path}", create=False, read_only=read_only)
        assert path.stat().st_size == 0
        assert os.listdir(tmp_path) == ["empty.db"]

    def test_a_file_that_is_not_sqlite_is_refused_unread(self, tmp_path: Path) -> None:
        """A text file is refused by its header, in one line, and not changed."""
        path = tmp_path / "notes.db"
        path.write_text("shopping list\n")
        with pytest.raises(StoreError, match="is not a SQLite database") as caught:
            Engine(f"sqlite:///{path}", read_only=True)
        assert "\n" not in str(caught.value)
        assert path.read_text() == "shopping list\n"

    def test_a_read_only_open_reads_without_writing(self, sqlite_url: str, tmp_path: Path) -> None:
        """read_only serves reads, the run index included; an append is a StoreReadOnly."""
        with Engine(sqlite_url) as writer:
            run = writer.start_run(REVIEW)
            writer.runs()  # the stored index is current up to here
            later = writer.start_run(REVIEW)  # ...and this run only folds in memory
        before = (tmp_path / "runs.db").read_bytes()
        with Engine(sqlite_url, read_only=True) as reader:
            assert reader.load(run.id).state == "project_analysis"
            assert [r.run_id for r in reader.runs()] == [later.id, run.id]
            assert {s.name: s.lag for s in reader.projections.status()}["run_index"] == 0
            with pytest.raises(StoreReadOnly, match="read-only") as caught:
                reader.load(run.id).note("k", 1)
        assert "\n" not in str(caught.value)
        assert (tmp_path / "runs.db").read_bytes() == before
        with Engine(sqlite_url) as writer:
            assert writer.load(run.id).version == 1


class TestReadCommandsOnAStore:
    def test_a_read_command_saves_the_index_it_caught_up(self, sqlite_url: str) -> None:
        """On a store it may write, `runs` saves the run index's progress for the next command."""
        from click.testing import CliRunner

        from engine.cli import main

        with Engine(sqlite_url) as engine:
            engine.start_run(REVIEW).stage_completed("project_analysis")
            assert {s.name: s.lag for s in engine.projections.status()}["run_index"] > 0
        assert CliRunner().invoke(main, ["runs", "--store", sqlite_url]).exit_code == 0
        with Engine(sqlite_url, read_only=True) as reader:
            assert {s.name: s.lag for s in reader.projections.status()}["run_index"] == 0

    def test_a_missing_file_is_not_writable(self, tmp_path: Path) -> None:
        """`writable` says no for a file that does not exist: the read-only open then says why."""
        from engine.store import writable

        assert writable(f"sqlite:///{tmp_path / 'none.db'}") is False
        assert writable("memory://") is True


class TestReadCommandsLeaveFilesAlone:
    @pytest.mark.parametrize("command", [["runs"], ["show", "abcd"], ["projections", "status"]])
    @pytest.mark.parametrize("kind", ["foreign", "empty"])
    def test_a_read_command_changes_no_byte(
        self, tmp_path: Path, kind: str, command: list[str]
    ) -> None:
        """A read command on another program's database or an empty file: one line, exit 2."""
        from click.testing import CliRunner

        from engine.cli import main

        path = tmp_path / "app.db"
        if kind == "foreign":
            with sqlite3.connect(path) as conn:
                conn.execute("CREATE TABLE invoices (id INTEGER)")
            conn.close()
        else:
            path.touch()
        before = _snapshot(path)
        result = CliRunner().invoke(main, [*command, "--store", f"sqlite:///{path}"])
        assert result.exit_code == 2
        assert result.stderr.count("\n") == 1
        assert "not a stagetrail store" in result.stderr
        assert _snapshot(path) == before


class NotesKept(Projection[list[str]]):
    """Keeps every note's value: a state as big as the notes."""

    name = "notes_kept"

    def initial(self) -> list[str]:
        return []

    @on(NoteAdded)
    def noted(self, state: list[str], event: NoteAdded) -> list[str]:
        return [*state, str(event.value)]


@pytest.fixture
def tiny_mount(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (skipped where this user may not mount)."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


class TestRefusals:
    def test_a_full_disk_is_one_line_and_writes_nothing(self, tiny_mount: Path) -> None:
        """Filling a 1 MiB filesystem gives StoreFull naming the cause; earlier events stay."""
        from click.testing import CliRunner

        from engine.cli import main

        url = f"sqlite:///{tiny_mount / 'runs.db'}"
        with Engine(url) as engine:
            engine.projections.register(NotesKept)  # before the disk is full
            run = engine.start_run(REVIEW)
            written = 0
            with pytest.raises(StoreFull, match="full") as caught:
                for index in range(1000):
                    run.note("fill", f"{index}" + "z" * 20_000)
                    written += 1
            assert "\n" not in str(caught.value)
            assert isinstance(caught.value, StoreError)
            assert run.version == 1 + written
            # a small save may still fit in the space SQLite keeps; ~480 KB of notes cannot
            with pytest.raises(StoreFull, match="projection storage failed") as saving:
                engine.projections.catch_up([NotesKept.name])
            assert "\n" not in str(saving.value)
        result = CliRunner().invoke(main, ["runs", "--json", "--store", url])
        assert result.exit_code == 0, result.stderr  # reads need no room
        assert json.loads(result.stdout)[0]["run_id"] == str(run.id)

    def test_a_file_gone_as_it_is_opened_is_one_store_error(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A store file gone by the time its identity is taken (removed as it was opened, for
        its ranges: `engine.store.sqlite.ranges.identity`) is one StoreError naming the store."""
        import engine.store.sqlite.open as sqlite_open

        url = f"sqlite:///{tmp_path / 'runs.db'}"
        with Engine(url):
            pass

        def gone(path: str) -> tuple[int, int]:
            raise FileNotFoundError(2, "No such file or directory", path)

        monkeypatch.setattr(sqlite_open, "identity", gone)
        with pytest.raises(StoreError, match="cannot open the store") as refused:
            Engine(url)
        assert refused.value.url == url

    def test_a_read_only_file_system_is_one_line(self, tiny_mount: Path) -> None:
        """A store on a file system remounted read-only reads, and refuses appends clearly."""
        url = f"sqlite:///{tiny_mount / 'runs.db'}"
        with Engine(url) as engine:
            run = engine.start_run(REVIEW)
        subprocess.run(["mount", "-o", "remount,ro", str(tiny_mount)], check=True)
        with Engine(url, read_only=True) as reader:
            assert reader.load(run.id).version == 1
            assert [r.run_id for r in reader.runs()] == [run.id]
        with pytest.raises(StoreError, match="read-only") as caught, Engine(url) as writer:
            writer.load(run.id).note("k", 1)
        assert "\n" not in str(caught.value)
