"""The PostgreSQL recorder's lean read of a run's events as plain rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from engine import Engine
from engine.store.postgres.recorder import PostgresRecorder
from tests._helpers import REVIEW


@pytest.fixture
def stored(postgres_url: str) -> Iterator[tuple[Engine, uuid.UUID]]:
    """A PostgreSQL engine and a run of 6 events."""
    with Engine(postgres_url) as engine:
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis", {"score": 1})
        run.stage_completed("code_review")
        run.stage_failed("developer", "flaky")
        run.note("k", "v")
        run.stage_started("developer")
        yield engine, run.id


def recorder_of(engine: Engine) -> PostgresRecorder:
    """The engine's PostgreSQL recorder."""
    recorder = engine.store.recorder
    assert isinstance(recorder, PostgresRecorder)
    return recorder


class TestSelectRows:
    @pytest.mark.parametrize(("gt", "limit"), [(0, 1000), (2, 1000), (0, 3), (6, 10)])
    def test_the_same_bytes_as_select_events(
        self, stored: tuple[Engine, uuid.UUID], gt: int, limit: int
    ) -> None:
        """The lean read returns each event's version, topic and stored bytes after `gt`,
        at most `limit`, exactly as select_events does, as plain tuples."""
        engine, run_id = stored
        recorder = recorder_of(engine)
        rows = recorder.select_rows(run_id, gt=gt, limit=limit)
        events = recorder.select_events(run_id, gt=gt, limit=limit)
        assert rows == [(e.originator_version, e.topic, e.state) for e in events]
        assert all(type(row) is tuple and type(row[2]) is bytes for row in rows)

    def test_the_store_pages_rows_without_stored_events(
        self, stored: tuple[Engine, uuid.UUID], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run longer than a page reads, a page at a time, as the same rows as its
        StoredEvents, and through the lean read alone (no StoredEvent made)."""
        engine, run_id = stored
        monkeypatch.setattr("engine.store.event_store.PAGE", 4)
        events = [e for page in engine.store.stored_pages(run_id) for e in page]

        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError("the lean read went through select_events")

        monkeypatch.setattr(recorder_of(engine), "select_events", refused)
        pages = list(engine.store.stored_rows(run_id))
        assert [len(page) for page in pages] == [4, 2]
        assert [r for page in pages for r in page] == [
            (e.originator_version, e.topic, e.state) for e in events
        ]
