"""A PostgreSQL or SQLite run's chain checked by ranges of versions: the report page by page
gives."""

from __future__ import annotations

import base64
import contextlib
import logging
import multiprocessing
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from uuid import UUID

import pytest

import engine.store.chain_workers as chain_workers
import engine.store.postgres.ranges as ranges_module
import engine.verify as verify
from engine import Engine, Run
from engine.errors import InvalidArgument, RunBeingErased
from engine.store.chain import Chain
from engine.store.chain_workers import ChainWorkers, Followed, RangeReading, check_range
from engine.store.errors import StoreError
from engine.store.event_store import PAGE
from engine.store.meta import EVENTS_TABLE
from engine.verify import RunRanges, VerifyReport, verify_chain
from tests._helpers import POSTGRES_URL, REVIEW
from tests.audit.tampering import Rows

KEY = "the writers' secret"
CIPHER_KEY = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="  # 32 bytes, base64
RANGE = 1500
"""The ranges' length in these tests: not a multiple of a page, so their ends are not a
page's. After the first page, the ranges are 1001-2500, 2501-4000, 4001-5500, 5501-6050."""
EVENTS = 6 * PAGE + 50


@pytest.fixture(autouse=True)
def short_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges of `RANGE` versions, so a run of a few pages spans several."""
    monkeypatch.setattr(verify, "RANGE", RANGE)


@pytest.fixture
def checked_here(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The ranges (first and last version) this process checks itself, in order."""
    checked: list[tuple[int, int]] = []

    def spied(chain: Chain, run_id: UUID, reading: RangeReading, first: int, last: int) -> Followed:
        checked.append((first, last))
        return check_range(chain, run_id, reading, first, last)

    monkeypatch.setattr(verify, "check_range", spied)
    return checked


STORES = {
    "plain": ("", None, None),
    "keyed": ("", KEY, None),
    "compressed and encrypted": ("&compress=zlib", None, CIPHER_KEY),
}


BACKENDS = ("postgres", "sqlite", "sqlite-text")
"""PostgreSQL, a SQLite file, and one of the layout written before compact storage (run ids
as hex text, topics in full)."""


@pytest.fixture(
    params=[(backend, store) for backend in BACKENDS for store in STORES],
    ids=[f"{backend}-{store}" for backend in BACKENDS for store in STORES],
)
def long_run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Engine, str, UUID]]:
    """A run of six pages and a bit in PostgreSQL or a SQLite file (either layout): plain
    links, keyed, or compressed and encrypted; its engine and its store's URL (what `Rows`
    edits)."""
    backend, store = request.param
    options, chain_key, cipher_key = STORES[store]
    if backend.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'ranges.db'}"
        layout = "?layout=text&" if backend == "sqlite-text" else "?"
        options = layout + options.removeprefix("&") if options else layout.rstrip("?&")
    else:
        url = str(request.getfixturevalue("postgres_url"))
    with Engine(url + options, chain_key=chain_key, cipher_key=cipher_key) as engine:
        run = engine.start_run(REVIEW)
        for start in range(0, EVENTS - 1, 500):
            with run.batch():
                for index in range(start, min(start + 500, EVENTS - 1)):
                    run.note("step", f"s{index}")
        yield engine, url, run.id


def written(engine: Engine, events: int = EVENTS) -> Run:
    """A run of `events` events (notes after its start) written in one batch."""
    run = engine.start_run(REVIEW)
    with run.batch():
        for index in range(events - 1):
            run.note("step", f"s{index}")
    return run


def paged(engine: Engine, run_id: UUID) -> VerifyReport:
    """The chain of `run_id` checked page by page, as a store that reads no ranges does."""
    store = engine.store
    linked = store.must_link_from(run_id)
    return verify_chain(run_id, store.stored_rows(run_id), store.mapper, must_link_from=linked)


def ranged(
    engine: Engine,
    run_id: UUID,
    workers: int = 0,
    newest: int = EVENTS,
    resumed: list[int] | None = None,
) -> VerifyReport:
    """The chain of `run_id` checked by ranges up to version `newest`, with `workers`; the
    versions after which it read page by page appended to `resumed`."""
    store = engine.store
    reading = store.range_reading()
    assert reading is not None

    def rows_after(gt: int) -> Iterator[list[tuple[int, str, bytes]]]:
        if resumed is not None:
            resumed.append(gt)
        return store.stored_rows(run_id, gt)

    ranges = RunRanges(reading, newest, rows_after)
    linked = store.must_link_from(run_id)
    return verify_chain(
        run_id, store.stored_rows(run_id), store.mapper, must_link_from=linked,
        workers=workers, ranges=ranges,
    )  # fmt: skip


def edit(rows: Rows, run_id: UUID, *versions: int) -> None:
    """Change one character of each event's stored JSON (a compressed or encrypted event's
    stored bytes: one bit of the last, so it no longer decodes)."""
    for version in versions:
        topic, state = rows.get(run_id, version)
        if b'"s' in state:
            rows.put(run_id, version, topic, state.replace(b'"s', b'"S', 1))
        else:
            rows.put(run_id, version, topic, state[:-1] + bytes([state[-1] ^ 1]))


TAMPERING: dict[str, tuple[Callable[[Rows, UUID], None], list[int], list[int]]] = {
    "an edit in the first page": (lambda rows, run: edit(rows, run, 7), [7], []),
    "an edit of the first page's last event": (
        lambda rows, run: edit(rows, run, PAGE), [PAGE], [],
    ),
    "an edit of the first range's first event": (
        lambda rows, run: edit(rows, run, PAGE + 1), [PAGE + 1], [PAGE],
    ),
    "an edit of a range's last event": (
        lambda rows, run: edit(rows, run, PAGE + RANGE), [PAGE + RANGE], [PAGE],
    ),
    "an edit of a range's first event": (
        lambda rows, run: edit(rows, run, PAGE + RANGE + 1), [PAGE + RANGE + 1], [PAGE + RANGE],
    ),
    "an edit of the last event": (
        lambda rows, run: edit(rows, run, EVENTS), [EVENTS], [PAGE + 3 * RANGE],
    ),
    "a range's first event deleted": (
        lambda rows, run: rows.delete(run, PAGE + 2 * RANGE + 1),
        [PAGE + 2 * RANGE + 1],
        [PAGE + 2 * RANGE],
    ),
    "the last event deleted": (
        lambda rows, run: rows.delete(run, EVENTS), [], [PAGE + 3 * RANGE],
    ),
    "events swapped across ranges": (
        lambda rows, run: rows.swap(run, PAGE + RANGE, PAGE + RANGE + 1),
        [PAGE + RANGE, PAGE + RANGE + 1, PAGE + RANGE + 2],
        [PAGE],
    ),
    "an event inserted after the last": (
        lambda rows, run: rows.insert(run, EVENTS + 1, *rows.get(run, EVENTS)),
        [EVENTS + 1],
        [EVENTS],
    ),
    "edits in the second and the last range": (
        lambda rows, run: edit(rows, run, PAGE + RANGE + 9, EVENTS - 1),
        [PAGE + RANGE + 9, EVENTS - 1],
        [PAGE + RANGE],
    ),
}  # fmt: skip
"""Each tampering, the versions the check names, and the version after which it reads the
rest of the run page by page (the first range that does not follow on; the run's end when
all do; none when the first page already is not on course)."""


class TestChainRanges:
    def test_an_intact_run_gets_the_page_by_page_report(
        self, long_run: tuple[Engine, str, UUID], checked_here: list[tuple[int, int]]
    ) -> None:
        """Read by ranges, an intact run is intact with the head and count of events the
        check page by page gives, every version after the first page read by a range."""
        engine, _, run_id = long_run
        resumed: list[int] = []
        report = ranged(engine, run_id, resumed=resumed)
        assert (report.ok, report.chain, report.events) == (True, "intact", EVENTS)
        assert report == paged(engine, run_id)
        assert checked_here == [(1001, 2500), (2501, 4000), (4001, 5500), (5501, EVENTS)]
        assert resumed == [EVENTS]  # every range followed on: only what is past the newest

    def test_engine_verify_reads_by_ranges(
        self, long_run: tuple[Engine, str, UUID], checked_here: list[tuple[int, int]]
    ) -> None:
        """`Engine.verify(chain_only=True)` on PostgreSQL and SQLite checks the run by ranges."""
        engine, _, run_id = long_run
        report = engine.verify(run_id, chain_only=True)
        assert (report.ok, report.chain, report.events) == (True, "intact", EVENTS)
        assert [first for first, _ in checked_here] == [1001, 2501, 4001, 5501]

    @pytest.mark.parametrize("tampering", list(TAMPERING), ids=list(TAMPERING))
    def test_tampering_is_named_at_the_same_versions(
        self, long_run: tuple[Engine, str, UUID], tampering: str
    ) -> None:
        """Rows edited, deleted, swapped or inserted by SQL in the first page, at a range's
        ends or in the last are named at the versions the check page by page names; the
        ranges before the first tampered one are taken as checked, the rest read page by page."""
        engine, url, run_id = long_run
        tamper, expected, resumed_after = TAMPERING[tampering]
        tamper(Rows(url), run_id)
        resumed: list[int] = []
        alone, by_ranges = paged(engine, run_id), ranged(engine, run_id, resumed=resumed)
        assert sorted({p.version for p in alone.problems}) == expected
        assert by_ranges == alone
        assert resumed == resumed_after
        assert by_ranges.ok == (not expected)

    def test_workers_reading_ranges_get_the_same_report(
        self, long_run: tuple[Engine, str, UUID], checked_here: list[tuple[int, int]]
    ) -> None:
        """A worker process reads and checks ranges itself (the first two, at least, and they
        follow on: a worker that failed would send the check page by page from the first
        range): intact, then with an edit of a range's first event and one in the last
        range, the report page by page gives."""
        engine, url, run_id = long_run
        resumed: list[int] = []
        helped = ranged(engine, run_id, workers=1, resumed=resumed)
        assert (helped.chain, helped.events) == ("intact", EVENTS)
        assert helped == paged(engine, run_id)
        assert resumed == [EVENTS]
        workers = {(PAGE + 1, PAGE + RANGE), (PAGE + RANGE + 1, PAGE + 2 * RANGE)}
        assert not workers & set(checked_here)  # the first two ranges went to the worker
        rows = Rows(url)
        edit(rows, run_id, PAGE + 2 * RANGE + 1)
        edit(rows, run_id, EVENTS - 3)
        resumed.clear()
        helped = ranged(engine, run_id, workers=1, resumed=resumed)
        assert sorted({p.version for p in helped.problems}) == [PAGE + 2 * RANGE + 1, EVENTS - 3]
        assert helped == paged(engine, run_id)
        assert resumed == [PAGE + 2 * RANGE]

    def test_a_run_grown_past_the_newest_read_is_read_to_its_end(
        self, long_run: tuple[Engine, str, UUID]
    ) -> None:
        """Events stored after the newest the check began from are read page by page."""
        engine, _, run_id = long_run
        report = ranged(engine, run_id, newest=PAGE + RANGE + 3)
        assert (report.ok, report.chain, report.events) == (True, "intact", EVENTS)
        assert report.head == paged(engine, run_id).head


class TestChainRangesShort:
    def test_a_run_shorter_than_a_range_past_its_first_page_is_read_page_by_page(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A run with fewer than `RANGE` events past its first page is read page by page, no
        connection of its own opened: connecting costs more than the queries a range saves
        (`verify --all` of many runs of a few thousand events was slower by ranges)."""
        connected: list[object] = []
        opened = ranges_module.RangeReader._connected

        def spied(reader: ranges_module.RangeReader) -> object:
            connected.append(reader)
            return opened(reader)

        monkeypatch.setattr(ranges_module.RangeReader, "_connected", spied)
        with Engine(postgres_url) as engine:
            run = written(engine, PAGE + RANGE - 1)
            resumed: list[int] = []
            report = ranged(engine, run.id, newest=PAGE + RANGE - 1, resumed=resumed)
            assert (report.ok, report.events, resumed, connected) == (
                True,
                PAGE + RANGE - 1,
                [],
                [],
            )
            assert report == paged(engine, run.id)
            run.note("step", "one more: a whole range past the first page")
            report = ranged(engine, run.id, newest=PAGE + RANGE, resumed=resumed)
            assert (report.ok, report.events, resumed) == (True, PAGE + RANGE, [PAGE + RANGE])
            assert len(connected) == 1


class TestChainRangesReads:
    def test_a_server_side_cursor_reads_what_chunked_rows_read(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With a libpq older than chunked rows, a range is paged by a server-side cursor:
        the same report, intact and with an edit of a range's last event."""
        monkeypatch.setattr(ranges_module, "_chunked", lambda: False)
        with Engine(postgres_url) as engine:
            run = written(engine)
            resumed: list[int] = []
            report = ranged(engine, run.id, resumed=resumed)
            assert (report.ok, report.events, resumed) == (True, EVENTS, [EVENTS])
            edit(Rows(postgres_url), run.id, PAGE + RANGE)
            resumed.clear()
            report = ranged(engine, run.id, resumed=resumed)
            assert ([p.version for p in report.problems], resumed) == ([PAGE + RANGE], [PAGE])
            assert report == paged(engine, run.id)

    def test_a_range_that_cannot_be_read_is_read_page_by_page(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A range whose own connection fails is read again through the store, page by page,
        with the same report (the store's read says why, if it fails too)."""
        with Engine(postgres_url) as engine:
            run = written(engine)

            def refused(reader: object) -> None:
                raise StoreError("postgresql://***", "cannot connect")

            monkeypatch.setattr(ranges_module.RangeReader, "_connected", refused)
            resumed: list[int] = []
            report = ranged(engine, run.id, resumed=resumed)
            assert (report.ok, report.events, resumed) == (True, EVENTS, [PAGE])
            assert report == paged(engine, run.id)

    def test_the_ranges_connection_is_closed_before_the_rest_is_read_page_by_page(
        self, postgres_url: str
    ) -> None:
        """Once the ranges are done, the connection they were read over is closed before the
        rest of the run (here, what was stored past the newest) is read page by page."""
        with Engine(postgres_url) as engine:
            run = written(engine)
            store = engine.store
            reading = store.range_reading()
            assert reading is not None
            reader = reading.reader
            assert isinstance(reader, ranges_module.RangeReader)
            connected: list[bool] = []

            def rows_after(gt: int) -> Iterator[list[tuple[int, str, bytes]]]:
                connected.append(reader._connection is not None)
                return store.stored_rows(run.id, gt)

            ranges = RunRanges(reading, PAGE + RANGE + 3, rows_after)
            linked = store.must_link_from(run.id)
            report = verify_chain(
                run.id, store.stored_rows(run.id), store.mapper, must_link_from=linked,
                ranges=ranges,
            )  # fmt: skip
            assert (report.ok, report.events, connected) == (True, EVENTS, [False])


class TestChainRangesUnchained:
    def test_a_run_stripped_of_its_first_links_gets_the_page_by_page_report(
        self, postgres_url: str
    ) -> None:
        """A run whose first events lost their links (as a store written before chaining)
        is not read by ranges: partial, or broken where the store links every event."""
        with Engine(postgres_url) as engine:
            run = engine.start_run(REVIEW)
            with run.batch():
                for index in range(4 * PAGE):
                    run.note("step", f"s{index}")
            Rows(postgres_url).strip(run.id, range(1, PAGE + 200))
            report = ranged(engine, run.id, newest=4 * PAGE)
            assert len(report.problems) == PAGE + 200
            assert report == paged(engine, run.id)

    def test_keyed_links_without_the_key_are_unchecked(self, postgres_url: str) -> None:
        """Keyed links read without the chain key are ``unchecked``, as page by page."""
        with Engine(postgres_url, chain_key=KEY) as engine:
            run = engine.start_run(REVIEW)
            with run.batch():
                for index in range(3 * PAGE):
                    run.note("step", f"s{index}")
        with Engine(postgres_url, read_only=True) as engine:
            report = ranged(engine, run.id, newest=3 * PAGE + 1)
            assert (report.chain, report.events) == ("unchecked", 3 * PAGE + 1)
            assert report == paged(engine, run.id)


class TestChainRangesErased:
    def test_a_run_whose_erasure_begins_while_checked_by_ranges_is_refused(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A deleted run whose newest events but the last are erased (as a compaction takes
        them) while `Engine.verify` reads it by ranges is refused with `RunBeingErased`."""
        with Engine(postgres_url) as engine:
            run = written(engine, EVENTS - 1)
            run.finish("deleted")
            checked: list[int] = []

            def erasing(*args: object) -> object:
                if not checked:  # after the first page, before the first range
                    rows = Rows(postgres_url)
                    for version in range(EVENTS - 100, EVENTS):
                        rows.delete(run.id, version)
                checked.append(args[3])  # type: ignore[arg-type]
                return check_range(*args)  # type: ignore[arg-type]

            monkeypatch.setattr(verify, "check_range", erasing)
            with pytest.raises(RunBeingErased) as refused:
                engine.verify(run.id, chain_only=True)
            assert refused.value.run_id == run.id
            assert checked == [1001, 2501, 4001, 5501]  # the hole is found in the last range


class TestChainRangesSQLiteFile:
    def test_a_store_opened_by_a_relative_path_is_read_from_that_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A SQLite store opened by a relative path is read by ranges from the file it opened
        after the working directory changed, not from a file of the same name there (here an
        untampered copy, which made an edited run intact)."""
        opened, elsewhere = tmp_path / "opened", tmp_path / "elsewhere"
        opened.mkdir()
        elsewhere.mkdir()
        monkeypatch.chdir(opened)
        with Engine("sqlite:///ranges.db") as engine:
            run = written(engine)
            with (
                contextlib.closing(sqlite3.connect(opened / "ranges.db")) as source,
                contextlib.closing(sqlite3.connect(elsewhere / "ranges.db")) as copy,
            ):
                source.backup(copy)
            edit(Rows(f"sqlite:///{opened / 'ranges.db'}"), run.id, PAGE + RANGE + 9)
            monkeypatch.chdir(elsewhere)
            report = engine.verify(run.id, chain_only=True)
            assert (report.chain, [p.version for p in report.problems]) == (
                "broken",
                [PAGE + RANGE + 9],
            )
            assert report == paged(engine, run.id)

    def test_a_store_file_replaced_since_it_was_opened_is_not_read_by_ranges(
        self, tmp_path: Path
    ) -> None:
        """A store whose file was replaced since it was opened (here by an untampered copy)
        is not read by ranges from the new file, in this process or a worker: the report is
        the one page by page gives of the file the store holds open, not a mix of both."""
        path, clean = tmp_path / "ranges.db", tmp_path / "clean.db"
        with Engine(f"sqlite:///{path}") as engine:
            run = written(engine)
            assert engine.verify(run.id, chain_only=True).ok  # a reading connection kept open
            with (
                contextlib.closing(sqlite3.connect(path)) as source,
                contextlib.closing(sqlite3.connect(clean)) as copy,
            ):
                source.backup(copy)
            edit(Rows(f"sqlite:///{path}"), run.id, PAGE + RANGE + 9)
            with contextlib.closing(sqlite3.connect(path)) as folded:
                folded.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            clean.replace(path)
            expected = paged(engine, run.id)
            assert [p.version for p in expected.problems] == [PAGE + RANGE + 9]
            assert engine.verify(run.id, chain_only=True) == expected
            assert ranged(engine, run.id, workers=1) == expected


class TestChainRangesShortRuns:
    def test_a_run_shorter_than_a_range_makes_no_reading(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`Engine.verify(chain_only=True)` of a run shorter than a range makes no range
        reading (it would read page by page anyway): `verify --all` over many small runs
        pays nothing for ranges."""
        with Engine(sqlite_url) as engine:
            made: list[object] = []
            make = engine.store.range_reading

            def counted() -> RangeReading | None:
                made.append(None)
                return make()

            monkeypatch.setattr(engine.store, "range_reading", counted)
            short, long = written(engine, 5), written(engine, PAGE + RANGE)
            assert engine.verify(short.id, chain_only=True).ok
            assert made == []
            assert engine.verify(long.id, chain_only=True).ok
            assert len(made) == 1


class TestChainRangesSecrets:
    def test_a_workers_command_line_and_environment_hold_no_key(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A worker reading ranges of an encrypted, keyed store is given its keys through the
        pipe `spawn` starts it with: neither key is in its command line or environment."""
        seen: list[bytes] = []
        settled = verify._ranged

        def looked(future: Future[Followed], pool: ChainWorkers | None) -> Followed:
            for child in multiprocessing.active_children():
                for part in ("cmdline", "environ"):
                    seen.append(Path(f"/proc/{child.pid}/{part}").read_bytes())
            return settled(future, pool)

        monkeypatch.setattr(verify, "_ranged", looked)
        for name in ("STAGETRAIL_CIPHER_KEY", "STAGETRAIL_CHAIN_KEY"):  # a worker inherits them
            monkeypatch.delenv(name, raising=False)
        options = "&compress=zlib"
        with Engine(postgres_url + options, chain_key=KEY, cipher_key=CIPHER_KEY) as engine:
            run = written(engine)
            report = ranged(engine, run.id, workers=1)
        assert (report.ok, report.events) == (True, EVENTS)
        assert seen  # the worker was looked at while it checked
        for secret in (KEY.encode(), CIPHER_KEY.encode(), base64.b64decode(CIPHER_KEY)):
            assert not any(secret in text for text in seen)


class _Waiting(Future[Followed]):
    """A worker's answer that comes only once waited for (a stalled worker until then)."""

    def __init__(self, answer: Callable[[], Followed]) -> None:
        super().__init__()
        self.answer = answer

    def result(self, timeout: float | None = None) -> Followed:
        """The answer, found now if not yet."""
        if not self.done():
            self.set_result(self.answer())
        return super().result(timeout)


class _StalledWorkers:
    """`ChainWorkers` whose worker answers nothing until waited for."""

    def __init__(
        self, chain: Chain, run_id: UUID, workers: int, reading: RangeReading, timeout: float
    ) -> None:
        self.workers = workers
        self.checking = (chain, run_id, reading)

    def wait(self, future: _Waiting) -> bool:
        """The answer, found when waited for (within any timeout)."""
        future.result()
        return True

    def submit_range(self, first: int, last: int) -> _Waiting:
        """A range the worker has not checked yet."""
        return _Waiting(lambda: check_range(*self.checking, first, last))

    def close(self) -> None:
        """Nothing to stop."""


class TestChainRangesHeld:
    def test_a_stalled_worker_bounds_the_ranges_held(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """While a worker does not answer, this process checks ranges itself only until
        `_HELD` are held, then waits for the oldest: the same report, the ranges held bounded."""
        monkeypatch.setattr(verify, "RANGE", 100)
        monkeypatch.setattr(verify, "ChainWorkers", _StalledWorkers)
        held: list[int] = []
        settle = verify._Ranges._settle

        def counted(ranges: verify._Ranges, *, wait: bool, keep: int = 0) -> bool:
            held.append(len(ranges.held))
            return settle(ranges, wait=wait, keep=keep)

        monkeypatch.setattr(verify._Ranges, "_settle", counted)
        with Engine(postgres_url) as engine:
            run = written(engine)
            report = ranged(engine, run.id, workers=1)
            assert (report.ok, report.events) == (True, EVENTS)
            assert report == paged(engine, run.id)
        assert len(held) > verify._HELD  # more ranges than may be held
        assert max(held) == verify._HELD + 1


class _TableLock(logging.Handler):
    """The events table of a PostgreSQL schema locked by a connection of the test (every read
    of it waits), released when a chain worker is reported stopped (a warning logged)."""

    def __init__(self, url: str) -> None:
        super().__init__(logging.WARNING)
        import psycopg

        self.schema = url.split("schema=", 1)[1]
        self.connection = psycopg.connect(POSTGRES_URL)
        self.records: list[logging.LogRecord] = []

    def take(self) -> None:
        """Lock the table until `release` (ACCESS EXCLUSIVE: reads wait too)."""
        self.connection.execute(
            f'LOCK TABLE "{self.schema}".{EVENTS_TABLE} IN ACCESS EXCLUSIVE MODE'
        )

    def release(self) -> None:
        """End the lock's transaction."""
        self.connection.rollback()

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record; release the lock (the worker was stopped: this process reads now)."""
        self.records.append(record)
        self.release()


class TestChainRangesHungWorker:
    def test_a_worker_whose_read_waits_on_a_lock_is_stopped_and_its_ranges_read_here(
        self, postgres_url: str
    ) -> None:
        """A worker whose range read waits on a lock another connection holds neither answers
        nor dies: after `worker_timeout` seconds every worker is stopped, a warning names the
        run, and its ranges are read here: the report page by page gives (before, verify
        waited for the worker for ever)."""
        chain_logger = logging.getLogger(chain_workers.__name__)
        with Engine(postgres_url) as engine:
            run = written(engine, PAGE + 2 * RANGE)  # two ranges: both go to the one worker
            store = engine.store
            lock = _TableLock(postgres_url)
            chain_logger.addHandler(lock)

            def first_page_then_locked() -> Iterator[list[tuple[int, str, bytes]]]:
                first = next(store.stored_rows(run.id))  # a query of its own, ended
                lock.take()  # before any worker reads: each of its reads waits
                yield first

            reading = store.range_reading()
            assert reading is not None
            ranges = RunRanges(reading, PAGE + 2 * RANGE, lambda gt: store.stored_rows(run.id, gt))
            try:
                report = verify_chain(
                    run.id, first_page_then_locked(), store.mapper,
                    must_link_from=store.must_link_from(run.id), workers=1, ranges=ranges,
                    worker_timeout=3,
                )  # fmt: skip
            finally:
                chain_logger.removeHandler(lock)
                lock.release()
                lock.connection.close()
            assert (report.ok, report.chain, report.events) == (True, "intact", PAGE + 2 * RANGE)
            assert report == paged(engine, run.id)
        [stopped] = lock.records
        assert str(run.id) in stopped.getMessage()
        assert "did not answer within 3" in stopped.getMessage()

    def test_a_worker_timeout_must_be_seconds_above_zero(self, postgres_url: str) -> None:
        """`Engine.verify` refuses a `worker_timeout` that is not a number of seconds above 0, or
        is past the longest wait a thread can make (`threading.TIMEOUT_MAX`), naming it."""
        with Engine(postgres_url) as engine:
            run = written(engine, 3)
            for bad in (0, -1, float("inf"), float("nan"), "5", True, 1e10):
                with pytest.raises(InvalidArgument) as refused:
                    engine.verify(run.id, chain_only=True, worker_timeout=bad)  # type: ignore[arg-type]
                assert refused.value.argument == "worker_timeout"
            assert engine.verify(run.id, chain_only=True, workers=1, worker_timeout=0.5).ok
