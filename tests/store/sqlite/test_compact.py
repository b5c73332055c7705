"""New SQLite stores keep events compact: run ids as 16 bytes, topics as ids."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent

from engine import Engine, StoreError
from engine.store import meta
from engine.store.sqlite.compact import CompactRecorder
from engine.store.sqlite.datastore import Datastore
from projections import StateStack
from tests._helpers import REVIEW


@pytest.fixture(autouse=True)
def default_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """New stores get the default layout, whatever the environment running the tests says."""
    monkeypatch.delenv("STAGETRAIL_SQLITE_LAYOUT", raising=False)


def record(url: str) -> uuid.UUID:
    """A short review run recorded into the store at `url`."""
    with Engine(url) as engine:
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", {"score": 1})
        run.stage_completed("code_review")
        run.stage_failed("developer", "flaky")
        return run.id


def rows(path: Path, sql: str) -> list[Any]:
    """The rows a plain SQL query reads from the file."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(sql).fetchall()


class TestTheLayout:
    def test_a_new_store_keeps_ids_as_blobs_and_topics_as_ids(self, tmp_path: Path) -> None:
        """Run ids are the UUID's 16 bytes, topics integers naming stagetrail_topics rows."""
        path = tmp_path / "new.db"
        run_id = record(f"sqlite:///{path}")
        assert rows(path, "SELECT DISTINCT originator_id FROM stagetrail_events") == [
            (run_id.bytes,)
        ]
        topics = dict(rows(path, "SELECT id, topic FROM stagetrail_topics"))
        stored = rows(path, "SELECT topic FROM stagetrail_events ORDER BY rowid")
        assert [topics[t] for (t,) in stored][:2] == [
            "stagetrail:RunStarted",
            "stagetrail:StageCompleted",
        ]
        found = dict(rows(path, "SELECT key, value FROM stagetrail_meta"))
        assert found[meta.LAYOUT] == meta.COMPACT
        assert found["schema_version"] == str(meta.COMPACT_SCHEMA)

    def test_the_same_run_takes_fewer_bytes_than_the_text_layout(self, tmp_path: Path) -> None:
        """The events table and its key index hold less than the text layout's, per event."""
        sizes = {}
        for layout in ("compact", "text"):
            path = tmp_path / f"{layout}.db"
            record(f"sqlite:///{path}?layout={layout}")
            sizes[layout] = rows(
                path,
                "SELECT sum(length(originator_id) + length(CAST(topic AS BLOB))) "
                "FROM stagetrail_events",
            )[0][0]
        assert sizes["compact"] < sizes["text"] / 2

    def test_a_row_of_the_text_layout_is_refused(self, tmp_path: Path) -> None:
        """A writer that still thinks the table holds text ids fails instead of mixing them."""
        path = tmp_path / "new.db"
        run_id = record(f"sqlite:///{path}")
        with (
            contextlib.closing(sqlite3.connect(path)) as db,
            pytest.raises(sqlite3.IntegrityError, match="CHECK"),
        ):
            db.execute(
                "INSERT INTO stagetrail_events VALUES (?, 99, 'stagetrail:StageStarted', x'7b7d')",
                (run_id.hex,),
            )

    def test_the_environment_or_the_url_can_ask_for_the_text_layout(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """STAGETRAIL_SQLITE_LAYOUT=text (or ?layout=text) makes a store older releases read."""
        monkeypatch.setenv("STAGETRAIL_SQLITE_LAYOUT", "text")
        path = tmp_path / "text.db"
        record(f"sqlite:///{path}")
        assert rows(path, "SELECT DISTINCT typeof(originator_id) FROM stagetrail_events") == [
            ("text",)
        ]
        found = dict(rows(path, "SELECT key, value FROM stagetrail_meta"))
        assert meta.settle(found, meta.AtRest(), "-").layout == meta.TEXT

    def test_an_unknown_layout_is_one_clear_error(self, tmp_path: Path) -> None:
        """layout=wide is refused naming the choices, and no file is created."""
        path = tmp_path / "x.db"
        with pytest.raises(StoreError, match=r"layout=.wide..*compact or text"):
            Engine(f"sqlite:///{path}?layout=wide")
        assert not path.exists()

    def test_a_release_before_compact_storage_refuses_the_store(self, tmp_path: Path) -> None:
        """The meta table says schema 2: a reader of schema 1 says it is too new."""
        path = tmp_path / "new.db"
        record(f"sqlite:///{path}")
        found = dict(rows(path, "SELECT key, value FROM stagetrail_meta"))
        with pytest.raises(StoreError, match="newer stagetrail"):
            meta.settle(found, meta.AtRest(), "-", newest=1)


class TestReadingIt:
    def test_notifications_carry_uuids_and_topic_texts(self, tmp_path: Path) -> None:
        """eventsourcing's notifications read back UUIDs and topics, filtered by topic too."""
        url = f"sqlite:///{tmp_path / 'new.db'}"
        run_id = record(url)
        with Engine(url) as engine:
            recorder = engine.store.recorder
            assert isinstance(recorder, CompactRecorder)
            every = recorder.select_notifications(start=1, limit=100)
            assert {n.originator_id for n in every} == {run_id}
            assert [n.id for n in every] == list(range(1, len(every) + 1))
            failed = recorder.select_notifications(
                start=1, limit=100, topics=["stagetrail:StageFailed"]
            )
            assert [n.topic for n in failed] == ["stagetrail:StageFailed"]
            assert recorder.select_notifications(start=1, limit=100, topics=["nope"]) == []

    def test_notification_rows_are_the_notifications_fields(self, tmp_path: Path) -> None:
        """A page read as rows holds the ids, runs and (version, topic, state) of the same
        page read as notifications: after `start`, up to `stop`, at most `limit`."""
        url = f"sqlite:///{tmp_path / 'new.db'}"
        record(url)
        record(url)
        with Engine(url) as engine:
            recorder = engine.store.recorder
            assert isinstance(recorder, CompactRecorder)
            page = recorder.select_notifications(start=2, limit=5, stop=8, inclusive_of_start=False)
            ids, runs, read = recorder.select_notification_rows(2, 5, 8)
            assert ids == [n.id for n in page] == [3, 4, 5, 6, 7]
            assert runs == [n.originator_id for n in page]
            assert read == [(n.originator_version, n.topic, n.state) for n in page]
            assert len({id(run) for run in runs}) == 2  # one UUID object a run
            assert recorder.select_notification_rows(8, 5, 8) == ([], [], [])

    def test_notification_rows_skip_erased_events_as_notifications_do(self, tmp_path: Path) -> None:
        """With events erased (gaps in the ids), every page read as rows, from any start, up to
        any stop, of any limit, is the same page read as notifications."""
        path = tmp_path / "new.db"
        url = f"sqlite:///{path}"
        for _ in range(3):
            record(url)
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("DELETE FROM stagetrail_events WHERE rowid IN (2, 5, 6, 7, 12)")
        with Engine(url) as engine:
            recorder = engine.store.recorder
            assert isinstance(recorder, CompactRecorder)
            for start in range(14):
                for stop in range(start, 15):
                    for limit in (1, 2, 3, 100):
                        page = recorder.select_notifications(
                            start=start, limit=limit, stop=stop, inclusive_of_start=False
                        )
                        ids, runs, read = recorder.select_notification_rows(start, limit, stop)
                        assert ids == [n.id for n in page]
                        assert runs == [n.originator_id for n in page]
                        assert read == [(n.originator_version, n.topic, n.state) for n in page]

    def test_another_process_topics_are_learnt_on_read(self, tmp_path: Path) -> None:
        """A topic first written by another engine is named when this one reads it."""
        url = f"sqlite:///{tmp_path / 'new.db'}"
        run_id = record(url)
        with Engine(url) as reader:
            assert reader.project(run_id, StateStack).depth >= 1
            with Engine(url) as writer:
                writer.load(run_id).note("k", "v")
            assert reader.events(run_id)[-1].topic == "stagetrail:NoteAdded"


class TestWritingIt:
    def test_a_recorder_without_a_writing_connection_is_one_clear_error(
        self, tmp_path: Path
    ) -> None:
        """Made without `writer`, an append raises a StoreError naming it (an assert would
        vanish under python -O), and nothing is written."""
        path = tmp_path / "new.db"
        run_id = record(f"sqlite:///{path}")
        count = rows(path, "SELECT count(*) FROM stagetrail_events")
        datastore = Datastore(str(path), read_only=False)
        try:
            recorder = CompactRecorder(datastore, meta.EVENTS_TABLE, timeout=1)
            stored = StoredEvent(run_id, 99, "stagetrail:NoteAdded", b"{}")
            with pytest.raises(StoreError, match=r"writing connection.*writer=None"):
                recorder.insert_events([stored])
        finally:
            datastore.close()
        assert rows(path, "SELECT count(*) FROM stagetrail_events") == count
