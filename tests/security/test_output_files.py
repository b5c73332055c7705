"""Files a command writes: never one it did not create unless --force, never the store it reads.

`stagetrail report RUN --html FILE` is the command that writes a file; every
other command writes to stdout. Each refused target is one line naming the
problem, and leaves the store, the target and its directory exactly as they were.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from engine import Engine
from tests._helpers import REVIEW
from tests.cli._helpers import invoke, ok

pytest.importorskip("jinja2", reason="the report needs the ui extra")


def _record(url: str) -> str:
    """Record one finished run into `url`; its id."""
    with Engine(url) as engine:
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis")
        run.finish("succeeded")
        return str(run.id)


def _refused(*args: str) -> str:
    """The one-line error of a refused command (exit 2)."""
    result = invoke(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("stagetrail: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def _listing(directory: Path) -> dict[str, bytes]:
    """Every file of `directory` and its bytes (a symlink: where it points)."""
    return {
        path.name: os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        for path in sorted(directory.iterdir())
    }


def _same(store: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    os.link(store, target)


def _symlink(store: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    target.symlink_to(store.name)


STORE_TARGETS: list[tuple[str, Callable[[Path], Path]]] = [
    ("the-file", lambda store: store),
    ("its-wal", lambda store: store.with_name(store.name + "-wal")),
    ("its-shm", lambda store: store.with_name(store.name + "-shm")),
    ("its-journal", lambda store: store.with_name(store.name + "-journal")),
    ("another-spelling", lambda store: store.parent / "." / store.name),
]


class TestTheStoreIsNeverTheTarget:
    @pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
    @pytest.mark.parametrize(
        "target", [t[1] for t in STORE_TARGETS], ids=[t[0] for t in STORE_TARGETS]
    )
    def test_report_refuses_the_store_and_its_companions(
        self, tmp_path: Path, target: Callable[[Path], Path], force: bool
    ) -> None:
        """The store's file, WAL, shared memory or journal is refused, even with --force."""
        store = tmp_path / "runs.db"
        url = f"sqlite:///{store}"
        run = _record(url)
        before = _listing(tmp_path)
        flags = ["--force"] if force else []
        error = _refused("report", run, "--html", str(target(store)), *flags, "--store", url)
        assert "is the store this command reads" in error
        assert _listing(tmp_path) == before
        assert ok("runs", "--store", url).count("succeeded") == 1

    @pytest.mark.parametrize("link", [_same, _symlink], ids=["hard-link", "symlink"])
    def test_another_name_for_the_store_is_refused(
        self, tmp_path: Path, link: Callable[[Path, Path], None]
    ) -> None:
        """A hard link or a symlink to the store is the store: refused, even with --force."""
        store = tmp_path / "runs.db"
        url = f"sqlite:///{store}"
        run = _record(url)
        alias = tmp_path / "alias.html"
        link(store, alias)
        before = _listing(tmp_path)
        error = _refused("report", run, "--html", str(alias), "--force", "--store", url)
        assert "is the store this command reads" in error
        assert _listing(tmp_path) == before

    def test_the_default_store_is_refused(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without --store, the default ./stagetrail.db is the store and is refused."""
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("STAGETRAIL_STORE", raising=False)
        run = _record("sqlite:///stagetrail.db")
        before = _listing(tmp_path)
        error = _refused("report", run[:8], "--html", "stagetrail.db", "--force")
        assert "is the store this command reads" in error
        assert _listing(tmp_path) == before

    def test_an_eventsourcing_sqlite_store_is_refused(self, tmp_path: Path) -> None:
        """An eventsourcing:// store's SQLite file is the store too."""
        store = tmp_path / "es.db"
        url = f"eventsourcing://eventsourcing.sqlite?SQLITE_DBNAME={store}"
        run = _record(url)
        before = _listing(tmp_path)
        error = _refused("report", run, "--html", str(store), "--force", "--store", url)
        assert "is the store this command reads" in error
        assert _listing(tmp_path) == before


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def recorded(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A SQLite or PostgreSQL store holding one finished run, and the run's id."""
    url = request.getfixturevalue(request.param)
    return url, _record(url)


class TestAnExistingFile:
    def test_it_is_kept_without_force(self, recorded: tuple[str, str], tmp_path: Path) -> None:
        """A file the command did not create is refused, named, and left as it was."""
        url, run = recorded
        target = tmp_path / "notes.html"
        target.write_text("my notes")
        before = _listing(tmp_path)
        error = _refused("report", run, "--html", str(target), "--store", url)
        assert "the file exists; give --force to replace it" in error
        assert _listing(tmp_path) == before

    def test_force_replaces_it(self, recorded: tuple[str, str], tmp_path: Path) -> None:
        """With --force the file is replaced by the report, and no temporary file is left."""
        url, run = recorded
        target = tmp_path / "notes.html"
        target.write_text("my notes")
        ok("report", run, "--html", str(target), "--force", "--store", url)
        assert target.read_text().startswith("<!doctype html>")
        assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tmp") == []

    def test_a_new_file_is_written_with_the_usual_permissions(
        self, recorded: tuple[str, str], tmp_path: Path
    ) -> None:
        """A new report is created as `open` would create it (the umask decides), not 0600."""
        url, run = recorded
        target = tmp_path / "new.html"
        ok("report", run, "--html", str(target), "--store", url)
        umask = os.umask(0)
        os.umask(umask)
        assert target.stat().st_mode & 0o777 == 0o666 & ~umask

    @pytest.mark.parametrize(
        ("name", "words"),
        [(".", "is a directory"), ("missing/report.html", "no directory")],
        ids=["a-directory", "no-directory"],
    )
    def test_an_unusable_target_is_one_line(
        self, recorded: tuple[str, str], tmp_path: Path, name: str, words: str
    ) -> None:
        """A directory, or a file in a missing directory, is refused before any work."""
        url, run = recorded
        before = _listing(tmp_path)
        error = _refused("report", run, "--html", str(tmp_path / name), "--store", url)
        assert words in error
        assert _listing(tmp_path) == before

    def test_an_unknown_run_leaves_no_file(self, recorded: tuple[str, str], tmp_path: Path) -> None:
        """A refused run writes nothing: no report, no temporary file."""
        url, _ = recorded
        before = sorted(os.listdir(tmp_path))
        _refused("report", "0000ffff", "--html", str(tmp_path / "r.html"), "--store", url)
        assert sorted(os.listdir(tmp_path)) == before
