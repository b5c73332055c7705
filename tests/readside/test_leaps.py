from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from engine import Engine
from engine.readside import keeper
from engine.readside.leaps import LEAP_MIN, find_leap
from engine.readside.persistent import PAGE
from engine.run import Run
from engine.store.views import Views
from projections import RunIndex
from tests._helpers import LOOP
from tests.readside.test_keeper import KEY, record

KEEP_INTERVAL = 2_000
"""The writers' keep interval here: a snapshot every page of the catch-up."""
LONG = 5 * KEEP_INTERVAL + 250
"""A long run's events: its newest snapshot lies `LONG - 250` events in."""


@pytest.fixture(autouse=True)
def short_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers keep a snapshot every `KEEP_INTERVAL` events in these tests."""
    monkeypatch.setattr(keeper, "KEEP_INTERVAL", KEEP_INTERVAL)


@pytest.fixture(params=["compact", "text", "postgres"])
def leap_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store of each kind whose recorder finds notification ids: SQLite's two layouts and
    PostgreSQL."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    layout = "?layout=text" if request.param == "text" else ""
    return f"sqlite:///{tmp_path / 'runs.db'}{layout}"


def caught_up(url: str, **options: str) -> tuple[list[int], dict[str, int]]:
    """A fresh engine's catch-up of the run index: the positions it reported, and its counts."""
    ends: list[int] = []
    with Engine(url, **options) as fresh:  # type: ignore[arg-type]
        counts = fresh.projections.catch_up(
            [RunIndex.name], on_progress=lambda name, end, head: ends.append(end)
        )
    return ends, counts


def indexed(url: str, run_id: uuid.UUID) -> tuple[object, object]:
    """The run's summary as the run index stored it, and RunIndex's fold of its events."""
    with Engine(url) as engine:
        stored = engine.projections.get(RunIndex.name, run_id, catch_up=False)
        return stored, RunIndex().fold(engine.events(run_id))


def alternating(engine: Engine, outcomes: int, per_commit: int) -> tuple[Run, Run]:
    """Two runs recorded commit by commit in turn: their notifications interleave."""
    first, second = engine.start_run(LOOP), engine.start_run(LOOP)
    for _ in range(0, outcomes, per_commit):
        record(first, per_commit, per_commit)
        record(second, per_commit, per_commit)
    return first, second


def finder(engine: Engine) -> tuple[Any, Views]:
    """The store's recorder (which finds notification ids) and its views."""
    views = engine.store.views
    assert views is not None  # a SQLite or PostgreSQL store
    return engine.store.recorder, views


class TestCatchUpLeap:
    def test_a_fresh_catch_up_leaps_over_a_long_run(self, leap_url: str) -> None:
        """A fresh run index reads one page, leaps onto the writer's newest summary and reads
        the rest: its summary equals RunIndex's fold of every event, its count all of them."""
        with Engine(leap_url) as engine:
            run = engine.start_run(LOOP)
            record(run, LONG - 1, per_commit=250)
        ends, counts = caught_up(leap_url)
        assert counts == {RunIndex.name: LONG}
        assert len(ends) == 2  # a page, the leap; then the 250 after the snapshot's event
        stored, folded = indexed(leap_url, run.id)
        assert stored == folded

    def test_runs_whose_commits_interleave_are_read_page_by_page(self, leap_url: str) -> None:
        """Where another run's events lie between a page and the summary stored ahead, no leap
        is taken: every page is read, and both summaries equal their folds."""
        with Engine(leap_url) as engine:
            first, second = alternating(engine, LONG // 2, per_commit=500)
            total = len(engine.events(first.id)) + len(engine.events(second.id))
        ends, counts = caught_up(leap_url)
        assert counts == {RunIndex.name: total}
        assert len(ends) == -(-total // PAGE)
        for run in (first, second):
            stored, folded = indexed(leap_url, run.id)
            assert stored == folded

    def test_a_leap_lands_before_another_runs_events_and_leaps_again_after(
        self, leap_url: str
    ) -> None:
        """A short run's events in the middle of a long run: the first leap lands on the newest
        summary before them, the page after reads them, and a second leap goes on."""
        with Engine(leap_url) as engine:
            run = engine.start_run(LOOP)
            record(run, 2 * KEEP_INTERVAL + 250, per_commit=250)
            short = engine.start_run(LOOP)
            record(short, 10, per_commit=10)
            record(run, LONG - 2 * KEEP_INTERVAL - 251, per_commit=250)
            notification = engine.store.recorder.notification_id  # type: ignore[attr-defined]
            landed = notification(run.id, 2 * KEEP_INTERVAL)
        ends, counts = caught_up(leap_url)
        assert counts == {RunIndex.name: LONG + 11}
        assert ends[0] == landed
        assert len(ends) == 3  # without leaps: 6 pages
        for run_id in (run.id, short.id):
            stored, folded = indexed(leap_url, run_id)
            assert stored == folded

    def test_a_leap_takes_the_summary_sealed_by_the_stores_cipher(self, tmp_path: Path) -> None:
        """Under a cipher the writer's summary is unsealed for the leap and saved sealed again:
        the index equals the fold, and no plain text of the run reaches the file."""
        url = f"sqlite:///{tmp_path / 'sealed.db'}"
        with Engine(url, cipher_key=KEY) as engine:
            run = engine.start_run(LOOP)
            record(run, LONG - 1, per_commit=250)
        ends, _ = caught_up(url, cipher_key=KEY)
        assert len(ends) == 2
        with Engine(url, cipher_key=KEY) as engine:
            stored = engine.projections.get(RunIndex.name, run.id, catch_up=False)
            assert stored == RunIndex().fold(engine.events(run.id))
        assert b'"state_codes"' not in (tmp_path / "sealed.db").read_bytes()


class TestFindLeap:
    def setup_run(self, url: str) -> uuid.UUID:
        with Engine(url) as engine:
            run = engine.start_run(LOOP)
            record(run, LONG - 1, per_commit=250)
            return run.id

    def test_the_leap_lands_on_the_newest_summary_at_or_before_stop(self, leap_url: str) -> None:
        """From a page ending at event 2,000, a stop at event 5,000's id leaps onto the summary
        of event 4,000 (not 10,000's, beyond the stop): 2,000 events passed, to its id."""
        run_id = self.setup_run(leap_url)
        with Engine(leap_url) as engine:
            recorder, views = finder(engine)
            page = engine.events(run_id)[:PAGE]
            end = recorder.notification_id(run_id, PAGE)
            stop = recorder.notification_id(run_id, 5000)
            found = find_leap(recorder, views, page, end, stop, engine.store.generation())
            assert found is not None
            assert (found.run_id, found.passed) == (run_id, 4000 - PAGE)
            assert found.target == recorder.notification_id(run_id, 4000)
            assert found.summary == RunIndex().encode(RunIndex().fold(engine.events(run_id)[:4000]))

    @pytest.mark.parametrize(
        ("stop_version", "generation_step"),
        [(3999, 0), (LONG, 1)],
        ids=["too-near", "other-generation"],
    )
    def test_no_leap_without_a_summary_far_enough_ahead_of_this_generation(
        self, leap_url: str, stop_version: int, generation_step: int
    ) -> None:
        """No leap when the newest summary before the stop passes fewer than `LEAP_MIN` events,
        nor onto summaries of another erasure generation than the catch-up's."""
        assert LEAP_MIN <= 4000 - PAGE  # the first test's leap, for comparison
        run_id = self.setup_run(leap_url)
        with Engine(leap_url) as engine:
            recorder, views = finder(engine)
            page = engine.events(run_id)[:PAGE]
            end = recorder.notification_id(run_id, PAGE)
            stop = recorder.notification_id(run_id, stop_version)
            generation = engine.store.generation() + generation_step
            assert find_leap(recorder, views, page, end, stop, generation) is None

    def test_no_leap_where_another_runs_events_lie_between(self, leap_url: str) -> None:
        """A page that ends inside a run whose stored summary lies beyond another run's events
        gives no leap, though the summary is far enough ahead."""
        with Engine(leap_url) as engine:
            first, _ = alternating(engine, 3 * KEEP_INTERVAL, per_commit=KEEP_INTERVAL)
            recorder, views = finder(engine)
            page = engine.events(first.id)[:KEEP_INTERVAL]
            end = recorder.notification_id(first.id, KEEP_INTERVAL)
            head = engine.projections.head()
            assert find_leap(recorder, views, page, end, head, engine.store.generation()) is None
