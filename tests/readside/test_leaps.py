from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine import Engine
from engine.readside import keeper, leaps
from engine.readside.leaps import LEAP_MIN, find_leap
from engine.readside.persistent import PAGE
from engine.run import Run
from engine.sharded import ShardedEngine
from engine.store.sqlite.upgrade import upgrade_in_place
from engine.store.views import Views
from projections import RunIndex
from tests._helpers import LOOP, hub_table
from tests.cli._helpers import ok
from tests.readside.test_keeper import KEY, record, record_hub

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
        """A long run recorded in commits of 250: its writer's summaries every interval."""
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


def everything(engine: Engine) -> tuple[dict[str, Any], list[Any], str]:
    """What the run index holds: its stored summaries (unsealed), `engine.runs()` and
    `stagetrail runs --json`."""
    views = engine.store.views
    assert views is not None
    listing = ok("runs", "--json", "--limit", "1000", "--store", engine.url)
    return views.states(RunIndex.name), engine.runs(limit=1000), listing


def sqlite_rows(url: str) -> list[list[tuple[Any, ...]]]:
    """The run index's raw rows in a SQLite file (no cipher: its sealing is deterministic)."""
    path = url.removeprefix("sqlite:///").split("?")[0]
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [
            db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("stagetrail_runs", "stagetrail_run_labels")
        ]


def varied(engine: Engine) -> list[Run]:
    """Runs a leap may pass over: a hub run with lone rollbacks, a short run between two
    stretches of a loop that then finishes, and a long run deleted at its end."""
    hub = engine.start_run(hub_table(hub=True), labels={"kind": "hub"})
    record_hub(hub, 2 * KEEP_INTERVAL + 700, 300)
    loop, short = engine.start_run(LOOP, labels={"kind": "loop"}), engine.start_run(LOOP)
    record(loop, 2 * KEEP_INTERVAL + 300, 250)
    record(short, 10, 10)
    record(loop, 2 * KEEP_INTERVAL, 250)
    loop.finish("succeeded", reason="done")
    gone = engine.start_run(LOOP)
    record(gone, 2 * KEEP_INTERVAL + 100, 300)
    gone.finish("deleted", reason="not wanted")
    return [hub, loop, short, gone]


class TestLeapStoresWhatPagesStore:
    def test_the_index_after_leaps_is_the_index_every_page_makes(
        self, leap_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Caught up with leaps, then rebuilt reading every page: the same stored summaries,
        listings and `runs --json` (on SQLite the same bytes), and fewer pages with leaps."""
        with Engine(leap_url) as engine:
            varied(engine)
        with Engine(leap_url) as engine:
            ends: list[int] = []
            engine.projections.rebuild(RunIndex.name, on_progress=lambda *a: ends.append(a[1]))
            leapt, raw = everything(engine), sqlite_rows(leap_url) if "sqlite" in leap_url else []
            monkeypatch.setattr(leaps, "LEAP_MIN", 10**12)
            pages: list[int] = []
            engine.projections.rebuild(RunIndex.name, on_progress=lambda *a: pages.append(a[1]))
            assert everything(engine) == leapt
            if raw:
                assert sqlite_rows(leap_url) == raw
        assert len(ends) < len(pages)  # the leaps were taken

    def test_a_sealed_store_leaps_to_the_same_index(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Under a cipher too, the leaps' index unseals to the one every page makes."""
        url = f"sqlite:///{tmp_path / 'sealed.db'}"
        with Engine(url, cipher_key=KEY) as engine:
            varied(engine)
            views = engine.store.views
            assert views is not None
            engine.projections.rebuild(RunIndex.name)
            leapt = views.states(RunIndex.name), engine.runs(limit=100)
            monkeypatch.setattr(leaps, "LEAP_MIN", 10**12)
            engine.projections.rebuild(RunIndex.name)
            assert (views.states(RunIndex.name), engine.runs(limit=100)) == leapt


class TestLeapBounds:
    def test_a_writer_appending_during_the_catch_up_is_not_passed(self, leap_url: str) -> None:
        """Summaries a writer stores while the catch-up runs lie past its head: after its
        first leap (onto the summary before a short run's events) no position passes that
        head, and the next catch-up folds the rest to the same summary."""
        with Engine(leap_url) as writer:
            run = writer.start_run(LOOP)
            record(run, 2 * KEEP_INTERVAL + 250, per_commit=250)
            record(writer.start_run(LOOP), 10, per_commit=10)
            record(run, KEEP_INTERVAL, per_commit=250)
            with Engine(leap_url) as reader:
                head, ends = reader.projections.head(), []

                def appending(_name: str, end: int, _head: int) -> None:
                    ends.append(end)
                    if len(ends) == 1:  # leapt to the summary at 4,000; 6,000's is the newest
                        record(run, 3 * KEEP_INTERVAL, per_commit=500)

                first = reader.projections.catch_up([RunIndex.name], on_progress=appending)
                assert ends[0] < head == max(ends)
                second = reader.projections.catch_up([RunIndex.name])
                total = first[RunIndex.name] + second[RunIndex.name]
                assert total == reader.projections.head()  # every event, once
        stored, folded = indexed(leap_url, run.id)
        assert stored == folded

    def test_no_leap_onto_summaries_of_an_older_generation_nor_over_erased_ids(
        self, sqlite_url: str
    ) -> None:
        """After a compaction erased a run whose events lay inside a long run, the long run's
        summaries are another generation's and its ids have a gap: the rebuild reads every
        page, and the index equals the fold."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, 2 * KEEP_INTERVAL + 250, per_commit=250)
            gone = engine.start_run(LOOP)
            record(gone, 10, per_commit=10)
            record(run, KEEP_INTERVAL, per_commit=250)
            gone.finish("deleted")
            assert engine.compact().runs == (gone.id,)
            record(run, KEEP_INTERVAL, per_commit=250)
            ends: list[int] = []
            engine.projections.rebuild(RunIndex.name, on_progress=lambda *a: ends.append(a[1]))
            events = len(engine.events(run.id))
        assert len(ends) == -(-events // PAGE)
        stored, folded = indexed(sqlite_url, run.id)
        assert stored == folded


class TestLeapAcrossLayouts:
    def test_a_store_upgraded_from_the_text_layout_leaps(self, tmp_path: Path) -> None:
        """A text-layout store rewritten compact keeps its ids and summaries: a fresh catch-up
        leaps over its long run to a summary equal to the fold."""
        path = tmp_path / "old.db"
        with Engine(f"sqlite:///{path}?layout=text") as engine:
            run = engine.start_run(LOOP)
            record(run, LONG - 1, per_commit=250)
        upgrade_in_place(str(path))
        ends, counts = caught_up(f"sqlite:///{path}")
        assert (len(ends), counts) == (2, {RunIndex.name: LONG})
        stored, folded = indexed(f"sqlite:///{path}", run.id)
        assert stored == folded

    def test_a_read_only_store_leaps_in_memory(self, tmp_path: Path) -> None:
        """A store opened read-only takes the writer's summary into memory: its listing
        equals the fold, and the file is left as it was."""
        path = tmp_path / "runs.db"
        with Engine(f"sqlite:///{path}") as engine:
            run = engine.start_run(LOOP)
            record(run, LONG - 1, per_commit=250)
        before = path.read_bytes()
        ends: list[int] = []
        with Engine(f"sqlite:///{path}", read_only=True) as reader:
            reader.projections.catch_up([RunIndex.name], on_progress=lambda *a: ends.append(a[1]))
            listed = reader.runs()
            folded = RunIndex().fold(reader.events(run.id))
        assert len(ends) == 2
        assert listed == [folded]
        assert path.read_bytes() == before


def seal_at(url: str, run_id: uuid.UUID, version: int, sealed: Callable[[Views], bytes]) -> None:
    """Store `sealed` as the run's `RunIndex` snapshot at `version`."""
    with Engine(url) as engine:
        views = engine.store.views
        assert views is not None
        key = (str(run_id), RunIndex.name, RunIndex().identity(), engine.store.generation())
        views.save_snapshots(*key, [(version, sealed(views))])


def summary_of(url: str, run_id: uuid.UUID, upto: int) -> Any:
    """RunIndex's encoded fold of the run's events up to `upto`."""
    with Engine(url) as engine:
        return RunIndex().encode(RunIndex().fold(engine.events(run_id)[:upto]))


class TestLeapRefusesWhatIsNotTheSummary:
    @pytest.mark.parametrize(
        "make",
        [
            lambda views, data, older, other: views.codec.seal(older),
            lambda views, data, older, other: views.codec.seal({**data, "run_id": other}),
            lambda views, data, older, other: views.codec.seal([data]),
            lambda views, data, older, other: views.codec.seal({"run_id": data["run_id"]}),
            lambda views, data, older, other: b"\x00not sealed at all",
        ],
        ids=["other-version", "other-run", "not-a-dict", "missing-fields", "garbage"],
    )
    def test_a_snapshot_that_is_not_the_runs_summary_is_not_taken(
        self, sqlite_url: str, make: Callable[[Views, Any, Any, str], bytes]
    ) -> None:
        """A stored snapshot whose JSON is not the run's summary at its version (or cannot be
        unsealed) is not taken: the pages are read, and the index equals the fold."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, LONG - 1, per_commit=250)
        at = LONG - 100
        data, older = summary_of(sqlite_url, run.id, at), summary_of(sqlite_url, run.id, at - 300)
        seal_at(sqlite_url, run.id, at, lambda views: make(views, data, older, str(uuid.uuid4())))
        _, counts = caught_up(sqlite_url)
        assert counts == {RunIndex.name: LONG}
        stored, folded = indexed(sqlite_url, run.id)
        assert stored == folded


def burn_ids(url: str, count: int) -> None:
    """Take `count` notification ids from the PostgreSQL store's sequence and never use them,
    as transactions rolled back do: a gap in the ids."""
    import psycopg
    from psycopg import sql

    base, schema = url.split("?schema=")
    table = f"{schema}.stagetrail_events"
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_get_serial_sequence(%s, 'notification_id')", (table,)
        ).fetchone()
        assert row is not None
        assert row[0] is not None
        for _ in range(count):
            conn.execute(sql.SQL("SELECT nextval({})").format(sql.Literal(row[0])))


class TestLeapOverGaps:
    def test_a_gap_in_the_ids_is_not_leapt_over(self, postgres_url: str) -> None:
        """Ids a rolled-back transaction took lie inside a long run: the leap lands on the
        summary before them, the pages read past them, and the index equals the fold."""
        with Engine(postgres_url) as engine:
            run = engine.start_run(LOOP)
            record(run, 2 * KEEP_INTERVAL + 250, per_commit=250)
            burn_ids(postgres_url, 5)
            record(run, 2 * KEEP_INTERVAL, per_commit=250)
            notification = engine.store.recorder.notification_id  # type: ignore[attr-defined]
            landed = notification(run.id, 2 * KEEP_INTERVAL)
            gap = notification(run.id, 4252) - notification(run.id, 4251) - 1
        ends, counts = caught_up(postgres_url)
        assert gap == 5
        assert ends[0] == landed
        assert counts == {RunIndex.name: 4 * KEEP_INTERVAL + 251}
        stored, folded = indexed(postgres_url, run.id)
        assert stored == folded


class TestLeapInShards:
    def test_a_shards_run_index_leaps_over_its_long_run(self, tmp_path: Path) -> None:
        """A long run recorded through a ``shards:`` URL: its shard's run index leaps, and the
        sharded listing equals the run's fold."""
        shards = [f"sqlite:///{tmp_path / name}.db" for name in ("a", "b")]
        layout = tmp_path / "shards.toml"
        layout.write_text(
            "[shards]\n" + "".join(f'{n} = "{u}"\n' for n, u in zip("ab", shards, strict=True)),
            encoding="utf-8",
        )
        with ShardedEngine(f"shards://{layout}") as sharded:
            run = sharded.start_run(LOOP)
            record(run, LONG - 1, per_commit=250)
            home = shards[sharded.layout.index_of(run.id)]
        ends, counts = caught_up(home)
        assert (len(ends), counts) == (2, {RunIndex.name: LONG})
        with ShardedEngine.for_reading(f"shards://{layout}") as sharded:
            assert sharded.runs() == [RunIndex().fold(sharded.events(run.id))]


class TestLeapRace:
    def test_a_leap_another_follower_forestalls_leaves_the_page_counted(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Another follower catches the index up between a page's commit and the leap after
        it: the leap is refused, yet the page this catch-up committed is counted and reported."""
        with Engine(sqlite_url) as engine:
            run = engine.start_run(LOOP)
            record(run, LONG - 1, per_commit=250)
        with Engine(sqlite_url) as engine, Engine(sqlite_url) as other:
            recorder = engine.store.recorder
            find = recorder.notification_id  # type: ignore[attr-defined]
            raced: list[dict[str, int]] = []

            def forestalled(run_id: uuid.UUID, version: int) -> int | None:
                if not raced:  # the other follower moves the position on first
                    raced.append(other.projections.catch_up([RunIndex.name]))
                return find(run_id, version)  # type: ignore[no-any-return]

            monkeypatch.setattr(recorder, "notification_id", forestalled)
            ends: list[int] = []
            counts = engine.projections.catch_up(
                [RunIndex.name], on_progress=lambda *a: ends.append(a[1])
            )
        assert raced == [{RunIndex.name: LONG - PAGE}]
        assert (counts, ends) == ({RunIndex.name: PAGE}, [PAGE])
        stored, folded = indexed(sqlite_url, run.id)
        assert stored == folded


class TestLeapCost:
    def test_a_page_where_runs_interleave_costs_one_id_query(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where two runs take turns of 500 events, each page asks for one notification id
        (the shortest leap's, refused) and no summary: no search for a leap that cannot be."""
        with Engine(sqlite_url) as engine:
            alternating(engine, 4 * KEEP_INTERVAL, per_commit=500)
        with Engine(sqlite_url) as engine:
            recorder = engine.store.recorder
            find = recorder.notification_id  # type: ignore[attr-defined]
            asked: list[int] = []

            def counted(run_id: uuid.UUID, version: int) -> int | None:
                asked.append(version)
                return find(run_id, version)  # type: ignore[no-any-return]

            monkeypatch.setattr(recorder, "notification_id", counted)
            ends: list[int] = []
            engine.projections.catch_up([RunIndex.name], on_progress=lambda *a: ends.append(a[1]))
        assert len(asked) <= len(ends)
