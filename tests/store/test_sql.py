"""The views' tables: a store whose views are of an older shape is folded again, never misread."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from engine import Engine, StoreError
from engine.store.sql import VIEWS_VERSION
from projections import RunIndex
from tests._helpers import REVIEW

DATA = Path(__file__).resolve().parent.parent / "data"

OLD_TABLES = (  # the views as the first releases created them (views version 1)
    "CREATE TABLE stagetrail_projections (name TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,"
    " last_error TEXT, updated TEXT)",
    "CREATE TABLE stagetrail_projection_states (name TEXT NOT NULL, key TEXT NOT NULL,"
    " state TEXT NOT NULL, PRIMARY KEY (name, key))",
    "CREATE TABLE stagetrail_runs (run_id TEXT PRIMARY KEY, pipeline TEXT NOT NULL,"
    " status TEXT NOT NULL, state TEXT NOT NULL, started TEXT NOT NULL, finished TEXT,"
    " parent_run_id TEXT, data TEXT NOT NULL)",
    "CREATE TABLE stagetrail_run_labels (key TEXT NOT NULL, value TEXT NOT NULL,"
    " run_id TEXT NOT NULL, PRIMARY KEY (key, value, run_id))",
    "CREATE TABLE stagetrail_snapshots (run_id TEXT NOT NULL, projection TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL,"
    " PRIMARY KEY (run_id, projection, fingerprint, version))",
)
GHOST = "00000000-0000-4000-8000-0000000000ff"
"""A run only the old views mention: served only if they were read as they are."""


def views_version(path: Path) -> str | None:
    """The views version the store's meta table records."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        row = db.execute("SELECT value FROM stagetrail_meta WHERE key='views_version'").fetchone()
    return None if row is None else str(row[0])


@pytest.fixture
def old_views(tmp_path: Path) -> tuple[str, list[str]]:
    """A copy of the first-schema store with views of the old shape, current for RunIndex's
    code and at the head; and the ids its run index must list."""
    path = tmp_path / "v1.db"
    shutil.copyfile(DATA / "v1_store.db", path)
    url = f"sqlite:///{path}"
    with Engine(url) as engine:
        listed = sorted(str(summary.run_id) for summary in engine.runs())
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("DELETE FROM stagetrail_meta WHERE key='views_version'")
        for table in ("projections", "projection_states", "runs", "run_labels", "snapshots"):
            db.execute(f"DROP TABLE stagetrail_{table}")
        for statement in OLD_TABLES:
            db.execute(statement)
        db.execute(
            "INSERT INTO stagetrail_projections VALUES (?, ?, NULL, NULL)",
            (RunIndex.name, RunIndex().identity()),
        )
        summary = {"run_id": GHOST, "pipeline": "ghost", "status": "running"}
        db.execute(
            "INSERT INTO stagetrail_runs VALUES (?, 'ghost', 'running', 's', '2026', NULL, NULL,"
            " ?)",
            (GHOST, json.dumps(summary)),
        )
    return url, listed


class TestViewsVersion:
    def test_a_new_store_records_the_views_version(self, tmp_path: Path) -> None:
        """Creating the views records their shape in the meta table."""
        path = tmp_path / "runs.db"
        with Engine(f"sqlite:///{path}"):
            pass
        assert views_version(path) == str(VIEWS_VERSION)

    def test_old_views_are_dropped_and_folded_again(self, old_views: tuple[str, list[str]]) -> None:
        """Opening for writing replaces views of the old shape; the run index lists every run."""
        url, listed = old_views
        with Engine(url, create=False) as engine:
            assert sorted(str(summary.run_id) for summary in engine.runs()) == listed
        assert GHOST not in listed
        assert views_version(Path(url.removeprefix("sqlite:///"))) == str(VIEWS_VERSION)

    def test_a_read_only_open_folds_past_old_views(self, old_views: tuple[str, list[str]]) -> None:
        """Read-only, views of the old shape are left as they are and not read."""
        url, listed = old_views
        with Engine(url, read_only=True) as engine:
            assert sorted(str(summary.run_id) for summary in engine.runs()) == listed
        assert views_version(Path(url.removeprefix("sqlite:///"))) is None

    def test_views_of_a_newer_release_are_left_alone(self, tmp_path: Path) -> None:
        """Views a newer stagetrail made are not dropped; projections say why they cannot run."""
        path = tmp_path / "runs.db"
        url = f"sqlite:///{path}"
        with Engine(url) as engine:
            run_id = engine.start_run(REVIEW).id
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute(
                "UPDATE stagetrail_meta SET value=? WHERE key='views_version'",
                (str(VIEWS_VERSION + 1),),
            )
        with Engine(url) as engine:
            assert engine.load(run_id).version == 1
            with pytest.raises(StoreError, match="newer stagetrail"):
                engine.runs()
        assert views_version(path) == str(VIEWS_VERSION + 1)
