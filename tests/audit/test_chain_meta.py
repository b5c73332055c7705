"""The store's meta table records its hash chain: mode, key check and where chaining began."""

from __future__ import annotations

import shutil
from pathlib import Path
from uuid import UUID

import pytest

from engine import Engine
from engine.store import ChainKeyMismatch, StoreError
from engine.store.chain import split
from tests.audit.tampering import Rows
from tests.audit.test_chain import KEY, recorded

DATA = Path(__file__).resolve().parent.parent / "data"


class TestStrippedLinks:
    def test_links_stripped_and_a_payload_edited_are_broken_at_its_version(
        self, shared_url: str
    ) -> None:
        """A keyed run stripped of every link, then edited, is broken, not unchained."""
        with Engine(shared_url, chain_key=KEY) as engine:
            run_id = recorded(engine)
        rows = Rows(shared_url)
        rows.strip(run_id, range(1, 9))
        rows.edit(run_id, 2, b"python", b"rust!!")
        with Engine(shared_url, chain_key=KEY, read_only=True) as engine:
            report = engine.verify(run_id)
        assert report.chain == "broken"
        broken = [p.version for p in report.problems if p.check == "chain"]
        assert broken == list(range(1, 9))
        assert "its link was removed" in report.problems[0].message

    def test_a_plain_store_stripped_of_links_is_broken_too(self, shared_url: str) -> None:
        """Without a chain key, a run of a store created chained may not lose its links either."""
        with Engine(shared_url) as engine:
            run_id = recorded(engine)
        Rows(shared_url).strip(run_id, range(5, 9))
        with Engine(shared_url, read_only=True) as engine:
            report = engine.verify(run_id)
        assert [p.version for p in report.problems if p.check == "chain"] == [5, 6, 7, 8]


class TestWritersKey:
    @pytest.mark.parametrize(
        ("first", "then", "wording"),
        [
            (KEY, "another", "not the one this store's hash chain was recorded with"),
            (KEY, None, "the store's hash chain is keyed"),
            (None, KEY, "the store's hash chain is plain"),
        ],
    )
    def test_a_writer_with_another_key_is_refused_and_nothing_written(
        self, shared_url: str, first: str | None, then: str | None, wording: str
    ) -> None:
        """A writable open with a key other than the recorded one (or none, or one) is refused."""
        with Engine(shared_url, chain_key=first) as engine:
            recorded(engine)
        rows = Rows(shared_url)
        before = rows.everything()
        with pytest.raises(ChainKeyMismatch, match=wording) as caught:
            Engine(shared_url, chain_key=then)
        assert isinstance(caught.value, StoreError)
        assert caught.value.recorded == ("keyed" if first else "plain")
        assert rows.everything() == before

    def test_the_recorded_key_still_writes(self, shared_url: str) -> None:
        """The right key opens the store writable and its runs stay intact."""
        with Engine(shared_url, chain_key=KEY) as engine:
            run_id = recorded(engine)
        with Engine(shared_url, chain_key=KEY) as engine:
            assert engine.verify(run_id).chain == "intact"


class TestOldStore:
    @pytest.fixture
    def old(self, tmp_path: Path) -> str:
        copy = tmp_path / "v1.db"
        shutil.copy(DATA / "v1_store.db", copy)
        return f"sqlite:///{copy}"

    def test_an_old_store_reads_and_verifies_unchained(self, old: str) -> None:
        """A store written before chaining, opened writable by this release, stays unchained."""
        with Engine(old, chain_key=KEY) as engine:
            summaries = engine.runs()
            assert summaries
            for summary in summaries:
                report = engine.verify(summary.run_id)
                assert (report.ok, report.chain) == (True, "unchained")

    def test_new_events_of_an_old_store_are_chained_and_must_stay_so(self, old: str) -> None:
        """After the upgrade, appended events are chained; stripping their links is broken."""
        open_run = UUID("00000000-0000-4000-8000-00000000000c")
        with Engine(old, chain_key=KEY) as engine:
            before = engine.load(open_run).version
            engine.resume(open_run).note("audit", "continued")
            new_run = recorded(engine)
            report = engine.verify(open_run)
            assert (report.ok, report.chain, report.chained_from) == (True, "partial", before + 1)
            assert engine.verify(new_run).chain == "intact"
            newest = engine.load(open_run).version
        rows = Rows(old)
        assert split(rows.get(open_run, newest)[1]) is not None
        rows.strip(open_run, range(before + 1, newest + 1))
        rows.strip(new_run, range(1, 9))
        with Engine(old, chain_key=KEY, read_only=True) as engine:
            report = engine.verify(open_run)
            stripped = [p.version for p in report.problems if p.check == "chain"]
            assert stripped == list(range(before + 1, newest + 1))
            assert engine.verify(new_run).chain == "broken"
        with pytest.raises(ChainKeyMismatch):
            Engine(old, chain_key="another")
