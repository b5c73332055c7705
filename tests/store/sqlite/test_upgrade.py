"""`stagetrail upgrade`: an older store rewritten compact only when asked, checked after.

Every test works on a copy of `tests/data/text_ids_store.db` (written by the code
before compact storage, checked in).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from uuid import UUID

import pytest

from engine import Engine, StoreError
from engine.store import upgrade_copy, upgrade_in_place
from engine.store.sqlite.upgrade import layout_of
from events import StageCompleted
from projections import RetryCounts, StateStack
from tests.cli._helpers import invoke

DATA = Path(__file__).resolve().parents[2] / "data"
LONG = UUID("00000000-0000-4000-8000-0000000000a1")
OPEN = UUID("00000000-0000-4000-8000-0000000000a3")


@pytest.fixture(autouse=True)
def default_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """New stores get the default layout, whatever the environment running the tests says."""
    monkeypatch.delenv("STAGETRAIL_SQLITE_LAYOUT", raising=False)


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """A copy of the checked-in text-layout store."""
    copy = tmp_path / "old.db"
    shutil.copyfile(DATA / "text_ids_store.db", copy)
    return copy


def notifications(path: Path) -> list[tuple[object, ...]]:
    """Every event of the store as eventsourcing's notifications give it: id, run, version,
    topic, stored bytes."""
    with Engine(f"sqlite:///{path}", read_only=True) as engine:
        page = engine.store.recorder.select_notifications(start=1, limit=10_000)
        return [(n.id, n.originator_id, n.originator_version, n.topic, n.state) for n in page]


def digest(path: Path) -> str:
    """The SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def column_types(path: Path) -> list[tuple[str, str]]:
    """The SQL types the events table holds for run ids and topics."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(
            "SELECT DISTINCT typeof(originator_id), typeof(topic) FROM stagetrail_events"
        ).fetchall()


class TestOpeningAnOlderStore:
    def test_a_writable_open_and_an_append_leave_its_layout(self, old: Path) -> None:
        """Opening and appending keep the text layout: nothing is rewritten silently."""
        with Engine(f"sqlite:///{old}") as engine:
            assert "text" in engine.store.upgrade_available
            engine.load(OPEN).stage_completed("work", {"step": 2}, duration=1.0)
        assert layout_of(str(old)) == "text"
        assert column_types(old) == [("text", "text")]

    def test_no_upgrade_is_offered_where_the_text_layout_is_asked_for(
        self, old: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With ?layout=text or STAGETRAIL_SQLITE_LAYOUT=text the older layout is wanted."""
        with Engine(f"sqlite:///{old}?layout=text") as engine:
            assert engine.store.upgrade_available == ""
        monkeypatch.setenv("STAGETRAIL_SQLITE_LAYOUT", "text")
        with Engine(f"sqlite:///{old}") as engine:
            assert engine.store.upgrade_available == ""

    def test_a_new_store_has_no_upgrade(self, tmp_path: Path) -> None:
        """A store created now is compact: no upgrade is offered."""
        with Engine(f"sqlite:///{tmp_path / 'new.db'}") as engine:
            assert engine.store.upgrade_available == ""

    def test_the_cli_says_an_upgrade_is_available_in_one_line(self, old: Path) -> None:
        """`stagetrail runs` on an older store prints one notice naming the upgrade command,
        and leaves the events' layout as it was."""
        result = invoke("runs", "--store", f"sqlite:///{old}")
        assert result.exit_code == 0, result.stderr
        notes = [line for line in result.stderr.splitlines() if "stagetrail upgrade" in line]
        assert len(notes) == 1
        assert notes[0].startswith("note: ")
        assert column_types(old) == [("text", "text")]


class TestUpgradeToACopy:
    def test_the_copy_holds_the_same_events_compact_and_the_store_is_untouched(
        self, old: Path, tmp_path: Path
    ) -> None:
        """Every notification (id, run, version, topic, bytes) is the same; the source's
        bytes are unchanged; the copy keeps ids as BLOBs and topics as integers."""
        before, target = digest(old), tmp_path / "new.db"
        done = upgrade_copy(str(old), str(target))
        assert digest(old) == before
        assert notifications(target) == notifications(old)
        assert done.events == len(notifications(old))
        assert column_types(target) == [("blob", "integer")]
        assert layout_of(str(target)) == "compact"

    def test_the_copy_opens_reads_verifies_and_appends(self, old: Path, tmp_path: Path) -> None:
        """The upgraded store folds, verifies and takes new events like a new one."""
        target = tmp_path / "new.db"
        upgrade_copy(str(old), str(target))
        with Engine(f"sqlite:///{target}") as engine:
            assert engine.store.upgrade_available == ""
            assert engine.project(LONG, StateStack, at=550).depth == 549
            assert engine.project(LONG, RetryCounts).attempts("work") == 599
            engine.load(OPEN).stage_completed("work", {"step": 2}, duration=1.0)
        with Engine(f"sqlite:///{target}") as engine:
            last = engine.events(OPEN)[-1]
            assert isinstance(last, StageCompleted)
            assert last.result == {"step": 2}
            assert all(engine.verify(run).ok for run in (LONG, OPEN))

    def test_exports_of_the_store_and_of_its_copy_are_the_same_bytes(
        self, old: Path, tmp_path: Path
    ) -> None:
        """`stagetrail export --all` gives identical bytes before and after the upgrade, and
        importing that export into a new (compact) store exports the same bytes again."""
        target, again = tmp_path / "new.db", tmp_path / "again.db"
        upgrade_copy(str(old), str(target))
        before = invoke("export", "--all", "--store", f"sqlite:///{old}").stdout
        after = invoke("export", "--all", "--store", f"sqlite:///{target}").stdout
        assert len(before.splitlines()) >= 613  # every event of the three runs
        assert after == before
        dump = tmp_path / "runs.jsonl"
        dump.write_text(before)
        assert invoke("import", str(dump), "--store", f"sqlite:///{again}").exit_code == 0
        assert invoke("export", "--all", "--store", f"sqlite:///{again}").stdout == before

    def test_the_first_release_s_store_upgrades_too(self, tmp_path: Path) -> None:
        """tests/data/v1_store.db (schema 1, no views, no chain rows) upgrades and verifies."""
        source, target = tmp_path / "v1.db", tmp_path / "v1c.db"
        shutil.copyfile(DATA / "v1_store.db", source)
        upgrade_copy(str(source), str(target))
        assert notifications(target) == notifications(source)
        with Engine(f"sqlite:///{target}") as engine:
            reports = [engine.verify(summary.run_id) for summary in engine.runs()]
        assert len(reports) == 3
        assert all(report.ok for report in reports)

    def test_an_existing_target_is_refused(self, old: Path, tmp_path: Path) -> None:
        """upgrade never overwrites a file: the target must be new, and is left as it was."""
        target = tmp_path / "taken.db"
        target.write_bytes(b"mine")
        with pytest.raises(StoreError, match="exists"):
            upgrade_copy(str(old), str(target))
        assert target.read_bytes() == b"mine"

    def test_a_compact_store_has_nothing_to_upgrade(self, tmp_path: Path) -> None:
        """A compact store is refused with a clear error, and no target is written."""
        new = tmp_path / "new.db"
        Engine(f"sqlite:///{new}").close()
        with pytest.raises(StoreError, match="compact already"):
            upgrade_copy(str(new), str(tmp_path / "copy.db"))
        assert not (tmp_path / "copy.db").exists()


class TestUpgradeInPlace:
    def test_the_store_becomes_compact_with_the_same_events(self, old: Path) -> None:
        """In place: the same notifications, now compact, the file no larger."""
        events, size = notifications(old), old.stat().st_size
        done = upgrade_in_place(str(old))
        assert notifications(old) == events
        assert column_types(old) == [("blob", "integer")]
        assert done.bytes_after <= size

    def test_a_writer_opened_before_is_refused_and_a_new_one_appends(self, old: Path) -> None:
        """An engine that opened the text layout cannot write into the compact table: one
        StoreError saying to reopen, nothing written; an engine opened after appends."""
        url = f"sqlite:///{old}"
        with Engine(url) as stale:
            run = stale.load(OPEN)
            upgrade_in_place(str(old))
            with pytest.raises(StoreError, match="open the store again"):
                run.stage_completed("work", {"step": 2}, duration=1.0)
        count = len(notifications(old))
        with Engine(url) as fresh:
            fresh.load(OPEN).stage_completed("work", {"step": 2}, duration=1.0)
        assert len(notifications(old)) == count + 1
        assert column_types(old) == [("blob", "integer")]

    def test_a_run_id_that_is_no_uuid_stops_it_with_nothing_changed(self, old: Path) -> None:
        """A row the rewrite cannot convert rolls the whole upgrade back."""
        with contextlib.closing(sqlite3.connect(old)) as db, db:
            db.execute(
                "UPDATE stagetrail_events SET originator_id='not-a-uuid' WHERE rowid=("
                "SELECT MAX(rowid) FROM stagetrail_events)"
            )
        with pytest.raises(StoreError, match="nothing changed"):
            upgrade_in_place(str(old))
        assert layout_of(str(old)) == "text"
        assert column_types(old) == [("text", "text")]


class TestTheCommand:
    def test_it_refuses_without_to_or_in_place(self, old: Path) -> None:
        """Without --to or --in-place nothing is written and the usage names both."""
        before = digest(old)
        result = invoke("upgrade", "--store", f"sqlite:///{old}")
        assert result.exit_code == 2
        assert "--to PATH" in result.stderr
        assert "--in-place" in result.stderr
        assert digest(old) == before

    def test_to_writes_the_copy_and_verifies_it(self, old: Path, tmp_path: Path) -> None:
        """--to writes the compact copy, then verifies every run of it (JSON: ok)."""
        target = tmp_path / "new.db"
        result = invoke("upgrade", "--store", f"sqlite:///{old}", "--to", str(target), "--json")
        assert result.exit_code == 0, (result.stdout, result.stderr)
        report = json.loads(result.stdout)
        assert report["ok"]
        assert report["runs"] == 3
        assert column_types(target) == [("blob", "integer")]

    def test_a_store_other_than_sqlite_is_refused(self) -> None:
        """Only SQLite stores have this upgrade: another URL is one clear error."""
        result = invoke("upgrade", "--store", "memory://", "--in-place")
        assert result.exit_code != 0
        assert "only a SQLite store" in result.stderr
