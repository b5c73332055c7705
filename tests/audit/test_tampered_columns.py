"""Event rows whose columns hold another type than stagetrail writes (a state that is NULL or
text, a version that is not a whole number): `verify` names the version, every other read
refuses the run with one error naming it (issue 29)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from engine import Engine, StoreError
from engine.errors import RunErasedWhileRead
from engine.store.chain import StoredRow
from engine.store.event_store import PAGE, Store
from tests._helpers import REVIEW
from tests.audit.tampering import Rows
from tests.audit.test_chain import noted, recorded
from tests.cli._helpers import invoke

LAYOUTS = ("sqlite", "sqlite-text", "postgres")


@pytest.fixture(params=LAYOUTS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """A store's URL and the URL `Rows` edits: PostgreSQL, or a SQLite file of either layout."""
    if request.param == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
        return url, url
    path = f"sqlite:///{tmp_path / 'runs.db'}"
    return path + ("?layout=text" if request.param == "sqlite-text" else ""), path


class TestAStateThatIsNoBytes:
    """A row's state set to NULL (or, in SQLite, to text): reported, never a TypeError."""

    @pytest.mark.parametrize(
        ("store", "kind"),
        [(layout, kind) for layout in LAYOUTS for kind in ("NULL", "text")
         if (layout, kind) != ("postgres", "text")],  # a bytea column holds no text
        indirect=["store"],
    )  # fmt: skip
    def test_verify_names_its_version(self, store: tuple[str, str], kind: str) -> None:
        """The whole verify and the chain alone report the event unreadable and the chain
        broken at its version; the events before and after it are checked."""
        url, edited = store
        with Engine(url) as engine:
            run_id = recorded(engine)
            rows = Rows(edited)
            topic, state = rows.get(run_id, 3)
            rows.put(run_id, 3, topic, None if kind == "NULL" else state.decode())  # type: ignore[arg-type]
            for report in (engine.verify(run_id), engine.verify(run_id, chain_only=True)):
                assert report.chain == "broken"
                assert report.problems[0].version == 3
                found = {(p.version, p.check) for p in report.problems}
                assert {(3, "chain"), (3, "format")} <= found
                assert kind in next(p.message for p in report.problems if p.check == "format")
                assert all(p.version >= 3 for p in report.problems)

    def test_in_a_long_page_it_is_named(self, store: tuple[str, str]) -> None:
        """A NULL state in the middle of a page's big chunk is named at its version, alone
        and in the whole verify, and nothing after it is reported broken but the next."""
        url, edited = store
        with Engine(url) as engine:
            run = noted(engine, PAGE + 199)
            rows = Rows(edited)
            topic, _ = rows.get(run.id, 301)
            rows.put(run.id, 301, topic, None)  # type: ignore[arg-type]
            for report in (engine.verify(run.id), engine.verify(run.id, chain_only=True)):
                assert report.chain == "broken"
                assert {p.version for p in report.problems} <= {301, 302}
                assert (301, "format") in {(p.version, p.check) for p in report.problems}

    def test_reading_it_is_one_clear_store_error(self, store: tuple[str, str]) -> None:
        """`events` and `load` raise a `StoreError` naming the run, the version and NULL."""
        url, edited = store
        with Engine(url) as engine:
            run_id = recorded(engine)
            engine.projections.catch_up()
            rows = Rows(edited)
            topic, _ = rows.get(run_id, 3)
            rows.put(run_id, 3, topic, None)  # type: ignore[arg-type]
            for read in (engine.events, engine.load):
                with pytest.raises(StoreError) as refused:
                    read(run_id)
                message = str(refused.value)
                assert f"run {run_id} version 3" in message
                assert "NULL" in message
                assert "TypeError" not in message
            shown = invoke("show", str(run_id), "--store", url)
            assert shown.exit_code != 0
            assert f"run {run_id} version 3" in shown.output
            assert "NULL" in shown.output


class TestAVersionThatIsNoWholeNumber:
    """SQLite keeps a version set to 3.5 as REAL: the chain breaks there, it is not intact."""

    @pytest.mark.parametrize("events", [8, PAGE + 199])
    def test_the_chain_breaks_at_its_version(self, tmp_path: Path, events: int) -> None:
        """A version in the middle of a page edited to a number that is not whole breaks the
        chain at the version it replaced, alone and in the whole verify, either layout."""
        for layout in ("compact", "text"):
            path = f"sqlite:///{tmp_path / f'{layout}.db'}"
            with Engine(f"{path}?layout={layout}") as engine:
                run = engine.start_run(REVIEW)
                with run.batch():
                    for index in range(events - 1):
                        run.note("step", f"s{index}")
                middle = events // 2
                Rows(path).renumber(run.id, middle, middle + 0.5)
                for report in (engine.verify(run.id), engine.verify(run.id, chain_only=True)):
                    assert report.chain == "broken", layout
                    chain = [p for p in report.problems if p.check == "chain"]
                    assert [p.version for p in chain] == [middle], layout
                    assert str(middle + 0.5) in chain[0].message

    @pytest.mark.parametrize("new", ["abc", b"\x01"], ids=["text", "blob"])
    def test_a_version_edited_to_text_is_reported(self, tmp_path: Path, new: object) -> None:
        """A version edited to text or a blob (kept as is, sorted after every number) is
        reported where it is missing and where it is read, never a TypeError, whatever
        newest event it makes of the run."""
        for layout in ("compact", "text"):
            path = f"sqlite:///{tmp_path / f'{layout}.db'}"
            with Engine(f"{path}?layout={layout}") as engine:
                run_id = recorded(engine)
                Rows(path).renumber(run_id, 3, new)
                alone = engine.verify(run_id, chain_only=True)
                assert alone.chain == "broken", layout
                assert [p.version for p in alone.problems] == [3, 9], layout
                assert repr(new) in alone.problems[1].message
                whole = engine.verify(run_id)
                assert (whole.chain, whole.problems[0].version) == ("broken", 3), layout


def erased_after_the_first_page(url: str, doomed: UUID, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of `doomed`'s stored rows is followed, once its first page is read, by a
    compaction of the store by another engine (which erases the run)."""
    rows = Store.stored_rows

    def erasing(store: Store, run_id: UUID, gt: int = 0) -> Iterator[list[StoredRow]]:
        for number, page in enumerate(rows(store, run_id, gt)):
            yield page
            if run_id == doomed and number == 0:
                with Engine(url) as other:
                    assert other.compact().runs == (doomed,)

    monkeypatch.setattr(Store, "stored_rows", erasing)


class TestErasedWhileVerified:
    @pytest.mark.parametrize("chain_only", [False, True], ids=["whole", "chain-only"])
    def test_it_is_refused_not_passed(
        self, shared_url: str, monkeypatch: pytest.MonkeyPatch, chain_only: bool
    ) -> None:
        """A deleted run a compaction erases after verify read its first page is refused with
        `RunErasedWhileRead` naming the first version it no longer found, as a fold is, never
        reported sound with only the events read."""
        with Engine(shared_url) as engine:
            doomed = noted(engine, PAGE + 10)
            doomed.finish("deleted")
            erased_after_the_first_page(shared_url, doomed.id, monkeypatch)
            with pytest.raises(RunErasedWhileRead) as refused:
                engine.verify(doomed.id, chain_only=chain_only)
            assert (refused.value.run_id, refused.value.version) == (doomed.id, PAGE + 1)

    def test_a_run_not_deleted_reads_its_newest_once(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A sound run that is not deleted is verified with one read of its newest event:
        only a deleted run can be erased while it is checked."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            reads: list[Any] = []
            newest = Store.newest

            def counted(store: Store, run: UUID) -> Any:
                reads.append(run)
                return newest(store, run)

            monkeypatch.setattr(Store, "newest", counted)
            assert engine.verify(run_id).ok
            assert engine.verify(run_id, chain_only=True).ok
            assert reads == [run_id, run_id]
