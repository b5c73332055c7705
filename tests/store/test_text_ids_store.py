"""A store written before compact storage (text run ids, full topics) still works.

It opens, reads, verifies and appends.

`tests/data/text_ids_store.db` was written once by `tests/data/make_text_ids_store.py`
with the code of that time and is checked in; each test works on a copy.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from engine import Engine
from engine.readside import persistent
from events import StageCompleted
from projections import Projection, RetryCounts, RunIndex, StateStack

DATA = Path(__file__).resolve().parent.parent / "data"
STORE = DATA / "text_ids_store.db"
LONG = UUID("00000000-0000-4000-8000-0000000000a1")
SHORT = UUID("00000000-0000-4000-8000-0000000000a2")
OPEN = UUID("00000000-0000-4000-8000-0000000000a3")
LONG_EVENTS = 600


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A copy of the checked-in store."""
    copy = tmp_path / "old.db"
    shutil.copyfile(STORE, copy)
    return f"sqlite:///{copy}"


class TestTheCheckedInStore:
    def test_it_keys_runs_by_text_and_names_full_topics(self, tmp_path: Path) -> None:
        """The file holds the old shapes: run ids as hex text, topics in full, a stored snapshot."""
        copy = tmp_path / "old.db"  # a WAL file: even a read-only open writes its -shm beside it
        shutil.copyfile(STORE, copy)
        with contextlib.closing(sqlite3.connect(copy)) as db:
            kinds = db.execute(
                "SELECT DISTINCT typeof(originator_id), substr(topic, 1, 11) FROM stagetrail_events"
            ).fetchall()
            snapshots = db.execute("SELECT count(*) FROM stagetrail_snapshots").fetchone()[0]
        assert kinds == [("text", "stagetrail:")]
        assert snapshots >= 1


class TestReadingIt:
    def test_runs_load_fold_and_verify(self, url: str) -> None:
        """Each run loads, its projections fold at any version, and verify finds no problem."""
        with Engine(url) as engine:
            assert {s.run_id for s in engine.runs()} == {LONG, SHORT, OPEN}
            assert engine.load(LONG).version == LONG_EVENTS
            assert engine.project(LONG, StateStack, at=550).depth == 549
            counts = engine.project(LONG, RetryCounts)
            assert counts.attempts("work") == LONG_EVENTS - 1
            assert engine.project(SHORT, StateStack).depth == 2
            for run_id in (LONG, SHORT, OPEN):
                assert engine.verify(run_id).ok

    def test_a_run_is_appended_to_and_read_back(self, url: str) -> None:
        """A run of the old store takes new events, which a new engine reads back."""
        with Engine(url) as engine:
            run = engine.load(OPEN)
            run.stage_completed("work", {"step": 2}, duration=1.0)
        with Engine(url) as engine:
            events = engine.events(OPEN)
            assert isinstance(events[-1], StageCompleted)
            assert events[-1].result == {"step": 2}
            assert engine.verify(OPEN).ok

    @pytest.mark.parametrize("page", [7, 2000])
    def test_persistent_projections_catch_up_as_each_run_folds(
        self, url: str, page: int, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Caught up over the old store's notifications (read as objects: its recorder has no
        rows of its own), each run's persistent state is the fold of its events."""
        monkeypatch.setattr(persistent, "PAGE", page)  # pages of one run, and of all three
        with Engine(url) as engine:
            engine.projections.register(RetryCounts)
            engine.projections.register(RunIndex)
            engine.projections.catch_up()
            for run_id in (LONG, SHORT, OPEN):
                kinds: list[Projection[Any]] = [RetryCounts(), RunIndex()]
                for kind in kinds:
                    stored = engine.projections.get(kind.name, run_id, catch_up=False)
                    assert kind.encode(stored) == kind.encode(kind.fold(engine.events(run_id)))
