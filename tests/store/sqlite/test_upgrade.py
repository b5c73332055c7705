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
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import UUID

import pytest

from engine import Engine, StoreError
from engine.store import upgrade_copy, upgrade_in_place
from engine.store.sqlite import upgrade
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


STALE_READS: dict[str, Callable[[Engine], object]] = {
    "the newest event": lambda engine: engine.store.last(OPEN),
    "a run's events": lambda engine: engine.store.read(OPEN),
    "the stored events verify reads": lambda engine: engine.store.stored_events(OPEN),
    "loading a run": lambda engine: engine.load(OPEN),
    "verifying a run": lambda engine: engine.verify(OPEN),
    "where a run's chain starts": lambda engine: engine.store.must_link_from(OPEN),
    "a page of notifications": lambda engine: engine.store.recorder.select_notifications(1, 10),
    "notifications of a topic": lambda engine: engine.store.recorder.select_notifications(
        1, 10, topics=["stagetrail:StageCompleted"]
    ),
    "erasing a run": lambda engine: engine.store.erase([OPEN]),
}


class TestAProcessThatOpenedTheStoreBefore:
    @pytest.mark.parametrize("use", STALE_READS.values(), ids=list(STALE_READS))
    def test_its_reads_are_refused_saying_to_open_the_store_again(
        self, old: Path, use: Callable[[Engine], object]
    ) -> None:
        """An engine that opened the text layout gets the StoreError its appends get, never
        "no such run", an empty answer or a TypeError; the store keeps every event."""
        events = notifications(old)
        with Engine(f"sqlite:///{old}") as stale:
            upgrade_in_place(str(old))
            with pytest.raises(StoreError, match=r"upgraded the store .* open the store again"):
                use(stale)
        assert notifications(old) == events

    def test_runs_are_refused_once_the_index_must_catch_up(self, old: Path) -> None:
        """Listing runs after another process appended reads notifications: refused too."""
        with Engine(f"sqlite:///{old}") as stale:
            assert len(stale.runs()) == 3
            upgrade_in_place(str(old))
            with Engine(f"sqlite:///{old}") as fresh:
                fresh.load(OPEN).stage_completed("work", {"step": 2}, duration=1.0)
            with pytest.raises(StoreError, match="open the store again"):
                stale.runs()

    def test_a_text_store_still_answers_no_such_run(self, old: Path) -> None:
        """Before any upgrade, a run not stored is None and an empty page is empty."""
        with Engine(f"sqlite:///{old}") as engine:
            assert engine.store.last(UUID(int=7)) is None
            assert engine.store.recorder.select_notifications(10_000, 10) == []
            assert engine.store.recorder.select_notifications(1, 10, topics=["nope"]) == []


def lock_while_packing(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Another connection holds the write lock while the file is packed (after the rewrite
    committed), so the VACUUM gives up after a tenth of a second."""
    pack = upgrade._pack

    def pack_while_locked(connection: sqlite3.Connection) -> None:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            connection.execute("PRAGMA busy_timeout = 100")
            pack(connection)

    monkeypatch.setattr(upgrade, "_pack", pack_while_locked)


@contextlib.contextmanager
def locked_after_the_rewrite(monkeypatch: pytest.MonkeyPatch, path: Path) -> Iterator[None]:
    """Another connection takes the write lock as soon as the rewrite commits and keeps it
    until the block ends, so the VACUUM after it gives up in a tenth of a second."""
    held: list[sqlite3.Connection] = []
    rewrite = upgrade._rewrite

    def rewrite_then_lock(target: str) -> int:
        moved = rewrite(target)
        held.append(sqlite3.connect(path, isolation_level=None))
        held[-1].execute("BEGIN IMMEDIATE")
        return moved

    monkeypatch.setattr(upgrade, "_rewrite", rewrite_then_lock)
    monkeypatch.setattr(upgrade, "LOCK_TIMEOUT", 0.1)
    try:
        yield
    finally:
        for connection in held:
            connection.close()


def renumber_after_vacuum(monkeypatch: pytest.MonkeyPatch) -> None:
    """The VACUUM step followed by what a renumbering VACUUM would do: the events' rowids
    changed (here all moved by a million)."""

    def renumbering(connection: sqlite3.Connection) -> None:
        connection.execute("VACUUM")
        connection.execute("UPDATE stagetrail_events SET rowid = rowid + 1000000")

    monkeypatch.setattr(upgrade, "_pack", renumbering)


class TestPackingTheFile:
    def test_a_store_locked_while_it_is_packed_is_upgraded_and_says_so(
        self, old: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The rewrite committed, a failed VACUUM is no "nothing changed": the result says
        why the file was not packed, and the store is compact with every event."""
        events = notifications(old)
        lock_while_packing(monkeypatch, old)
        done = upgrade_in_place(str(old))
        assert "locked" in done.not_packed
        assert done.events == len(events)
        assert layout_of(str(old)) == "compact"
        assert notifications(old) == events

    def test_the_command_says_upgraded_not_packed_and_still_verifies(
        self, old: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`upgrade --in-place` exits 0 with one note naming the failed packing and the
        usable store, then the verification report of every run, read while the other
        process still holds the write lock."""
        with locked_after_the_rewrite(monkeypatch, old):
            result = invoke("upgrade", "--store", f"sqlite:///{old}", "--in-place")
        assert result.exit_code == 0, (result.stdout, result.stderr)
        assert "nothing changed" not in result.stderr
        assert "upgraded; packing the file failed: database is locked" in result.stderr
        assert "usable" in result.stderr
        assert "3 runs" in result.stdout
        assert "no problems" in result.stdout

    def test_events_after_a_gap_keep_their_notification_ids(self, old: Path) -> None:
        """A store with a hole in its notification ids (an erased run) keeps every id."""
        with Engine(f"sqlite:///{old}") as engine:
            assert engine.store.erase([UUID("00000000-0000-4000-8000-0000000000a2")]) > 0
        events = notifications(old)
        ids = [event[0] for event in events]
        assert ids != list(range(1, len(ids) + 1))  # there is a gap to close
        upgrade_in_place(str(old))
        assert notifications(old) == events

    def test_a_renumbering_vacuum_in_place_fails_loudly(
        self, old: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Changed notification ids are one StoreError saying what to rebuild."""
        renumber_after_vacuum(monkeypatch)
        with pytest.raises(StoreError, match=r"notification ids .* projections rebuild"):
            upgrade_in_place(str(old))

    def test_a_renumbering_vacuum_of_the_copy_deletes_it(
        self, old: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The copy whose notification ids changed is deleted; the store is untouched."""
        before, target = digest(old), tmp_path / "new.db"
        renumber_after_vacuum(monkeypatch)
        with pytest.raises(StoreError, match=r"notification ids .* copy was deleted"):
            upgrade_copy(str(old), str(target))
        assert not target.exists()
        assert digest(old) == before


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
