"""A run's events stream from plain rows, decoded a page at a time, sealed or not."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent

from engine import Engine
from engine.store.errors import StoreError
from engine.store.meta import EVENTS_TABLE
from events import Event
from projections import BUILT_INS
from tests._helpers import LOOP

KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64


def recorded(engine: Engine, outcomes: int) -> list[Event]:
    """A loop run of `outcomes` outcomes (1 in 7 failed, one rollback), as read back."""
    run = engine.start_run(LOOP, labels={"team": "a"})
    with run.batch():
        for index in range(outcomes):
            if index % 7 == 6:
                run.stage_failed("work", f"boom {index}", error_type="Boom", duration=2.5)
            else:
                run.stage_completed(
                    "work", {"n": index, "f": index / 8, "s": "é\u2028"}, duration=1.0
                )
    run.rollback(steps=3, reason="undo")
    return list(engine.store.stream(run.id))


def states(engine: Engine, run_id: Any) -> dict[str, Any]:
    """Every built-in projection folded over the run's stream."""
    return {cls.name: cls().fold(engine.store.stream(run_id)) for cls in BUILT_INS}


class TestSealedStoreFold:
    def test_a_fold_over_an_encrypted_compressed_store_equals_a_plain_one(
        self, tmp_path: Path
    ) -> None:
        """The same events in a plain and an encrypted, compressed store fold to equal states."""
        with Engine(f"sqlite:///{tmp_path / 'plain.db'}") as plain:
            events = recorded(plain, 2500)
            expected = states(plain, events[0].run_id)
        sealed_url = f"sqlite:///{tmp_path / 'sealed.db'}?compress=zlib"
        with Engine(sealed_url, cipher_key=KEY) as sealed:
            sealed.store.append(events)
            assert list(sealed.store.stream(events[0].run_id)) == events
            assert states(sealed, events[0].run_id) == expected
        with sqlite3.connect(tmp_path / "sealed.db") as connection:
            stored = [row[0] for row in connection.execute(f"SELECT state FROM {EVENTS_TABLE}")]
        connection.close()
        assert len(stored) == len(events)
        assert not any(b"boom" in state or b"work" in state for state in stored)

    def test_a_sealed_page_is_decoded_as_a_page(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Encrypted and compressed pages decode in one pass, never event by event."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}?compress=zlib", cipher_key=KEY) as engine:
            events = recorded(engine, 50)

            def refused(stored_event: StoredEvent) -> None:
                raise AssertionError("decoded event by event")

            monkeypatch.setattr(engine.store.mapper, "to_domain_event", refused)
            assert list(engine.store.stream(events[0].run_id)) == events

    def test_a_tampered_sealed_event_is_named(self, tmp_path: Path) -> None:
        """A sealed row the cipher refuses fails the read naming its run and version."""
        path = tmp_path / "s.db"
        with Engine(f"sqlite:///{path}?compress=zlib", cipher_key=KEY) as engine:
            run_id = recorded(engine, 20)[0].run_id
        with sqlite3.connect(path) as connection:
            query = f"SELECT state FROM {EVENTS_TABLE} WHERE originator_version = 9"
            (state,) = connection.execute(query).fetchone()
            connection.execute(
                f"UPDATE {EVENTS_TABLE} SET state = ? WHERE originator_version = 9",
                (bytes(state[:-1]) + bytes([state[-1] ^ 1]),),
            )
        connection.close()
        url = f"sqlite:///{path}?compress=zlib"
        with (
            Engine(url, cipher_key=KEY) as engine,
            pytest.raises(StoreError, match=rf"run {run_id} version 9"),
        ):
            list(engine.store.stream(run_id))


class TestLeanStream:
    def test_the_stream_reads_rows_not_stored_events(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On SQLite a run's stream makes no `StoredEvent` per event: it reads plain rows."""
        with Engine(f"sqlite:///{tmp_path / 's.db'}") as engine:
            events = recorded(engine, 1200)

            def refused(*args: Any, **kwargs: Any) -> None:
                raise AssertionError("read as StoredEvents")

            monkeypatch.setattr(engine.store.recorder, "select_events", refused)
            assert list(engine.store.stream(events[0].run_id)) == events
            assert engine.store.read(events[0].run_id, gt=5, lte=8) == events[5:8]
