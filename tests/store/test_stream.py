"""A run's stream: events built as they are taken, a page read at a time, narrowed by folds."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine import Engine
from engine.store.errors import StoreError
from engine.store.event_store import PAGE
from engine.store.mapper import EventMapper
from engine.store.meta import EVENTS_TABLE
from engine.store.sqlite import compact, joined, recorder
from engine.store.sqlite.recorder import SQLiteRecorder
from events import Event, StageCompleted, StageFailed
from projections import BUILT_INS, TaskTable, handled_topics
from tests._helpers import LOOP
from tests.store.test_lean_read import KEY
from tests.store.test_schema_evolution import CHILD, OPEN, REVIEW, STORE

OUTCOMES = PAGE + 700
"""Outcomes recorded: the run spans three pages."""


@pytest.fixture(params=["memory", "sqlite", "sqlite-sealed", "postgres", "postgres-sealed"])
def sealed_or_not(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine over each backend, SQLite and PostgreSQL also compressed and encrypted."""
    kind = str(request.param)
    if kind == "memory":
        url = "memory://"
    elif kind.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    sealed = kind.endswith("-sealed")
    if sealed:
        url += ("&" if "?" in url else "?") + "compress=zlib"
    with Engine(url, cipher_key=KEY if sealed else None) as engine:
        yield engine


def recorded(engine: Engine) -> UUID:
    """A loop run of every kind of outcome, tasks, notes and a rollback, over three pages."""
    run = engine.start_run(LOOP, labels={"team": "a"})
    with run.batch():
        run.add_task("t1", title="first")
        for index in range(OUTCOMES):
            if index % 7 == 6:
                run.stage_failed("work", f"boom {index % 3}", error_type="Boom", duration=2.5)
            else:
                run.stage_started("work")
                run.stage_completed("work", {"n": index, "f": index / 8}, duration=1.0)
            if index % 500 == 0:
                run.note("strategy", {"at": index})
        run.task_started("t1")
        run.task_completed("t1", result={"ok": True})
        run.spend(0.25)
    run.rollback(steps=3, reason="undo")
    return run.id


def read_eagerly(engine: Engine, run_id: UUID) -> list[Event]:
    """The run's events by `Store.read`, a whole page decoded at once (not the stream)."""
    events: list[Event] = []
    while True:
        page = engine.store.read(run_id, gt=len(events), limit=PAGE)
        events += page
        if len(page) < PAGE:
            return events


class TestStreamFolds:
    def test_every_built_in_projection_folds_the_stream_as_the_events_read(
        self, sealed_or_not: Engine
    ) -> None:
        """Each built-in projection folds a stream (narrowed, built as taken) to the state the
        same events read page by page give, on every backend, sealed or not."""
        run_id = recorded(sealed_or_not)
        events = read_eagerly(sealed_or_not, run_id)
        assert list(sealed_or_not.store.stream(run_id)) == events
        for cls in BUILT_INS:
            streamed = cls().fold(sealed_or_not.store.stream(run_id))
            assert streamed == cls().fold(events), cls.name

    def test_a_narrowed_stream_gives_the_events_of_its_topics_only(
        self, sealed_or_not: Engine
    ) -> None:
        """`narrowed` keeps every event of the topics given, in order, and nothing else."""
        run_id = recorded(sealed_or_not)
        events = read_eagerly(sealed_or_not, run_id)
        topics = {StageFailed.topic, StageCompleted.topic}
        narrowed = list(sealed_or_not.store.stream(run_id).narrowed(topics))
        assert narrowed == [event for event in events if event.topic in topics]
        assert len(narrowed) == OUTCOMES


EDGES = [-(2**40), -64, -63, -2, -1, 0, 1, 2, 61, 62, 63, 64, 65, 127, 128, 2**40]
"""Topic ids at the edges of a mask's bits (a compact store's ids are positive)."""


class TestNarrowing:
    def test_pages_all_or_partly_of_the_topics_give_those_events_in_order(
        self, sqlite_url: str
    ) -> None:
        """A narrowed stream whose first page holds an event of a topic left out, and whose
        later pages hold none, gives every event of the topics kept, in order."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            events = read_eagerly(engine, run_id)
            kept = {event.topic for event in events} - {events[0].topic}
            narrowed = list(engine.store.stream(run_id).narrowed(kept))
        assert narrowed == events[1:]
        assert events[0].topic not in {event.topic for event in events[1:]}

    @pytest.mark.parametrize("below", [64, 0])
    def test_pages_narrowed_by_a_mask_or_an_in_list_give_the_same_events(
        self, sqlite_url: str, below: int, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A narrowed stream gives every event of its topics, in order, whether its pages are
        narrowed by a mask of topic ids or (ids not all below `joined.MASKED`) an IN list."""
        monkeypatch.setattr(joined, "MASKED", below)
        used: list[bool] = []
        real = joined.statement

        def statement(*args: Any) -> str:
            used.append(args[-1])
            return real(*args)

        monkeypatch.setattr(recorder, "joined_statement", statement)
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            events = read_eagerly(engine, run_id)
            for kept in ({StageFailed.topic}, {StageCompleted.topic, StageFailed.topic}):
                narrowed = list(engine.store.stream(run_id).narrowed(kept))
                assert narrowed == [event for event in events if event.topic in kept]
        assert used
        assert set(used) == {below > 0}

    @settings(max_examples=200, deadline=None)
    @example(EDGES, {0, 1, 2, 62}).via("every edge, keys a mask holds")
    @example(EDGES, {1, 63}).via("a key past the mask")
    @example(EDGES, {-1, 2}).via("a negative key")
    @given(
        st.lists(st.sampled_from(EDGES) | st.integers(-2, 130), min_size=1, max_size=40),
        st.sets(st.sampled_from(EDGES) | st.integers(-2, 70), max_size=6),
    )
    def test_a_mask_wants_the_rows_an_in_list_wants(
        self, topics: list[int], keys: set[int]
    ) -> None:
        """A page narrowed by a mask (every key a topic id in 0…62) keeps the rows of exactly
        the topic ids an IN list keeps, whatever ids the rows hold (62, 63, 64, far beyond,
        negative); other keys are narrowed by the IN list."""
        wanted = sorted(keys)
        assert joined.masked(wanted) == all(0 <= key <= 62 for key in wanted)
        connection = sqlite3.connect(":memory:")
        for create in compact.create_statements(EVENTS_TABLE):
            connection.execute(create)
        run = bytes(16)
        connection.executemany(
            f"INSERT INTO {EVENTS_TABLE} VALUES (?, ?, ?, ?)",
            [(run, version, topic, b"{}") for version, topic in enumerate(topics, 1)],
        )
        pages = []
        for mask in {False, joined.masked(wanted)}:
            statement = joined.statement(
                EVENTS_TABLE, False, False, len(wanted), compact.TOPICS_TABLE, mask
            )
            params = joined.parameters(run, None, None, 100, wanted, mask)
            pages.append(connection.execute(statement, params).fetchone())
        connection.close()
        held = [str(topic) for topic in topics if topic in keys]
        assert {page[4] for page in pages} == {",".join(held) or None}
        assert len(set(pages)) == 1

    def test_a_fold_decodes_only_the_events_its_handlers_take(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fold of a stream has the mapper build only the events of its handled topics."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            expected = TaskTable().fold(read_eagerly(engine, run_id))
            mapper = engine.store.mapper
            decoded, topics = mapper.decoded, set[str]()

            def counted(run: UUID, rows: Any, *rest: Any) -> Iterator[Event]:
                topics.update(row[1] for row in rows)
                return decoded(run, rows, *rest)

            monkeypatch.setattr(mapper, "decoded", counted)
            assert TaskTable().fold(engine.store.stream(run_id)) == expected
        handled = handled_topics(TaskTable())
        assert handled is not None
        assert topics
        assert topics <= handled

    def test_a_stream_already_begun_is_not_narrowed(self, sqlite_url: str) -> None:
        """Once an event was taken, `narrowed` gives the stream itself, which goes on."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            stream = engine.store.stream(run_id)
            first = next(stream)
            assert stream.narrowed({StageFailed.topic}) is stream
            assert [first, *stream] == read_eagerly(engine, run_id)


class TestLaziness:
    def test_a_page_is_read_only_when_the_stream_reaches_it(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Nothing is read before the first event is taken, the next page only after the
        page before it was taken whole: a fold holds one page of rows at a time."""
        with Engine(sqlite_url) as engine:
            run_id = recorded(engine)
            recorder: Any = engine.store.recorder
            select, reads = recorder.select_rows, []

            def counted(*args: Any, **kwargs: Any) -> Any:
                reads.append(kwargs.get("gt"))
                return select(*args, **kwargs)

            monkeypatch.setattr(recorder, "select_rows", counted)
            stream = engine.store.stream(run_id)
            assert reads == []
            for _ in range(PAGE):
                next(stream)
            assert reads == [0]
            next(stream)
            assert reads == [0, PAGE]

    def test_an_unreadable_event_fails_the_stream_where_it_is_reached(self, tmp_path: Path) -> None:
        """The events before an unreadable one are given; it fails naming its run and version."""
        path = tmp_path / "runs.db"
        with Engine(f"sqlite:///{path}") as engine:
            run_id = recorded(engine)
            expected = read_eagerly(engine, run_id)[: PAGE + 9]
        with sqlite3.connect(path) as connection:
            connection.execute(
                f"UPDATE {EVENTS_TABLE} SET state = ? WHERE originator_version = ?",
                (b'{"stage": 5}', PAGE + 10),
            )
        connection.close()
        taken: list[Event] = []
        with (
            Engine(f"sqlite:///{path}", create=False) as engine,
            pytest.raises(StoreError, match=rf"run {run_id} version {PAGE + 10}"),
        ):
            taken.extend(engine.store.stream(run_id))  # keeps what it took before
        assert taken == expected


class TestUpcasting:
    @pytest.mark.parametrize("run_id", [REVIEW, CHILD, OPEN])
    def test_a_stream_of_first_schema_events_folds_as_each_event_decoded_alone(
        self, tmp_path: Path, run_id: UUID
    ) -> None:
        """Events of the oldest class versions stream upcast, as `to_domain_event` decodes
        each alone, and every built-in projection folds them to the same state."""
        copy = tmp_path / "v1.db"
        shutil.copyfile(STORE, copy)
        with Engine(f"sqlite:///{copy}") as engine:
            mapper = engine.store.mapper
            alone = [mapper.to_domain_event(s) for s in engine.store.stored_stream(run_id)]
            assert len(alone) > 2
            assert list(engine.store.stream(run_id)) == alone
            for cls in BUILT_INS:
                assert cls().fold(engine.store.stream(run_id)) == cls().fold(alone), cls.name


class TestJoinedPages:
    @pytest.mark.parametrize("layout", ["compact", "text"])
    def test_a_page_the_database_joins_reads_as_its_rows_would(
        self, tmp_path: Path, layout: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A stream read as pages SQLite joins into one JSON array gives the events a read of
        rows gives, ints beyond 64 bits exact (that page read as rows), narrowed or not."""
        url = f"sqlite:///{tmp_path / 'runs.db'}?layout={layout}"
        with Engine(url) as engine:
            run_id = recorded(engine)
            engine.resume(run_id).stage_completed("work", {"big": 2**70, "neg": -(2**64)})
            joined = list(engine.store.stream(run_id))
            narrowed = list(engine.store.stream(run_id).narrowed({StageFailed.topic}))
            monkeypatch.setattr(EventMapper, "reads_joined", False)
            rows = list(engine.store.stream(run_id))
        assert joined == rows
        assert joined[-1].result == {"big": 2**70, "neg": -(2**64)}  # type: ignore[attr-defined]
        assert narrowed == [event for event in rows if type(event) is StageFailed]


RAW_RESULTS = [
    b'{"s":"a\\"b\\\\c\\n\\t\\u00e9\\ud83d\\ude00\\u2028\\/"}',
    '{"k":"\u00e9\u4e2d\U0001f600"}'.encode(),
    b'{"big":123456789012345678901234567890,"neg":-12345678901234567890}',
    b'{"f":1e400}',
    b'{"z":-0.0,"e":1E-7,"g":0.1,"h":1.0e+2}',
    b'{"n":NaN}',
    b'{"d":1,"d":2}',
    b"[" * 1022 + b"1" + b"]" * 1022,
    b"[" * 1023 + b"1" + b"]" * 1023,
    b'"scalar"',
    b'{ "x" : [ 1 , 2 ] }\n',
    b'{"k":"\xff"}',
    b'{"k":"\\ud800"}',
]
"""Results spliced into a stored state by hand: escapes, unicode, long ints, floats JSON's
and orjson's readers differ on, duplicate keys, deep nesting, a scalar, blanks, bad UTF-8."""
WHOLE_STATES: list[list[bytes | None]] = [
    [None],
    [b""],
    [b"[]"],
    [b"1"],
    [None, b"{}}"],
    [b"", b"{},{}"],
    [None, b"GLUED"],
    [b"GLUED", None],
]
"""States replacing those of versions 3 (and 4) whole; GLUED: version 5's state twice, with a
comma between (two JSON values in one state, a NULL or empty one beside it)."""

_STORABLE = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")
"""Characters a result may hold (the store refuses a NUL and a lone surrogate)."""


def _outcome(engine: Engine, run_id: UUID, topics: frozenset[str] | None) -> Any:
    """What a stream of the run gives: its events, or the type and text of its error."""
    stream = engine.store.stream(run_id)
    try:
        return list(stream if topics is None else stream.narrowed(topics))
    except Exception as error:  # compared, not hidden: both ways must fail alike
        return (type(error).__name__, str(error))


def _both_ways(
    engine: Engine, run_id: UUID, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[Any], list[Any]]:
    """Each stream (whole, narrowed) read as joined pages, then read as rows."""
    narrowed = frozenset({StageCompleted.topic})
    joined = [_outcome(engine, run_id, topics) for topics in (None, narrowed)]
    with monkeypatch.context() as patch:
        patch.setattr(EventMapper, "reads_joined", False)
        rows = [_outcome(engine, run_id, topics) for topics in (None, narrowed)]
    return joined, rows


def _small_run(engine: Engine) -> UUID:
    run = engine.start_run(LOOP)
    for index in range(6):
        run.stage_completed("work", {})
        if index == 2:
            run.stage_failed("work", "boom", error_type="Boom")
    return run.id


class TestJoinedPagesAsRows:
    @pytest.mark.parametrize("layout", ["compact", "text"])
    @pytest.mark.parametrize("raw", RAW_RESULTS)
    def test_a_result_spliced_by_hand_reads_as_its_row_reads(
        self, tmp_path: Path, layout: str, raw: bytes, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Stored JSON the serializer would not write reads joined as it reads row by row:
        the same events, or the same error."""
        path = tmp_path / "runs.db"
        with Engine(f"sqlite:///{path}?layout={layout}") as engine:
            run_id = _small_run(engine)
            with sqlite3.connect(path) as db:
                db.execute(
                    f"UPDATE {EVENTS_TABLE} SET state=CAST(replace(CAST(state AS TEXT),"
                    " '\"result\":{}', ?) AS BLOB) WHERE originator_version=3",
                    (b'"result":' + raw,),
                )
            joined, rows = _both_ways(engine, run_id, monkeypatch)
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(10_000)  # results nested 1,023 deep compared
        try:
            assert joined == rows
        finally:
            sys.setrecursionlimit(limit)
        assert isinstance(rows[0], tuple) or len(rows[0]) == 8

    @pytest.mark.parametrize("layout", ["compact", "text"])
    @pytest.mark.parametrize("states", WHOLE_STATES)
    def test_a_state_null_empty_or_glued_reads_as_its_row_reads(
        self,
        tmp_path: Path,
        layout: str,
        states: list[bytes | None],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A NULL, empty, non-object or glued state (a NULL beside two values in one state
        adds up to as many values as rows) reads joined as row by row: here an error naming
        the run and version, never another event's state."""
        path = tmp_path / "runs.db"
        with Engine(f"sqlite:///{path}?layout={layout}") as engine:
            run_id = _small_run(engine)
            with sqlite3.connect(path) as db:
                (fifth,) = db.execute(
                    f"SELECT state FROM {EVENTS_TABLE} WHERE originator_version=5"
                ).fetchone()
                for version, state in enumerate(states, 3):
                    glued = None if state is None else state.replace(b"GLUED", fifth + b"," + fifth)
                    db.execute(
                        f"UPDATE {EVENTS_TABLE} SET state=? WHERE originator_version=?",
                        (glued, version),
                    )
            joined, rows = _both_ways(engine, run_id, monkeypatch)
        assert joined == rows
        assert rows[0][0] == "StoreError"
        assert f"run {run_id} version " in rows[0][1]

    @given(
        results=st.lists(
            st.recursive(
                st.none()
                | st.booleans()
                | st.integers()
                | st.floats(allow_nan=False, allow_infinity=False)
                | st.text(_STORABLE),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(_STORABLE), inner, max_size=3)
                ),
                max_leaves=8,
            ),
            min_size=1,
            max_size=6,
        )
    )
    @settings(
        max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    def test_any_json_results_read_joined_as_row_by_row(
        self, tmp_path_factory: pytest.TempPathFactory, results: list[Any]
    ) -> None:
        """Results of any JSON (escapes, unicode, ints beyond 64 bits, -0.0, tiny and huge
        floats, nesting) read joined exactly as row by row, whole and narrowed."""
        path = tmp_path_factory.mktemp("joined") / "runs.db"
        with Engine(f"sqlite:///{path}") as engine, pytest.MonkeyPatch.context() as patch:
            run = engine.start_run(LOOP)
            for result in results:
                run.stage_completed("work", {"r": result})
            joined, rows = _both_ways(engine, run.id, patch)
        assert joined == rows
        assert [event.result["r"] for event in joined[1]] == results

    def test_a_topic_first_stored_between_the_two_reads_of_a_narrowed_page_is_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A compact store's narrowed page reads its topics' ids, then the page: an event of
        a wanted topic another process stores first in between is in the stream, not
        dropped as a topic not asked for."""
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        with Engine(url) as engine, Engine(url) as other:
            run = engine.start_run(LOOP)
            run.stage_completed("work", {})
            recorder = type(engine.store.recorder)
            assert issubclass(recorder, SQLiteRecorder)
            keys = recorder.topic_keys
            appended: list[bool] = []

            def then_appended(self: Any, topics: Any) -> Any:
                found = keys(self, topics)
                if not appended:
                    appended.append(True)
                    other.resume(run.id).stage_failed("work", "boom", error_type="Boom")
                return found

            monkeypatch.setattr(recorder, "topic_keys", then_appended)
            failed = list(engine.store.stream(run.id).narrowed({StageFailed.topic}))
        assert appended == [True]
        assert [type(event) for event in failed] == [StageFailed]

    def test_a_page_longer_than_sqlite_s_longest_string_reads_as_rows(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A page whose joined states SQLite cannot hold in one string (SQLITE_TOOBIG) is read
        as rows, as before: not an error."""
        with Engine(f"sqlite:///{tmp_path / 'runs.db'}") as engine:
            run = engine.start_run(LOOP)
            for index in range(20):
                run.stage_completed("work", {"pad": "x" * 400, "n": index})
            expected = _both_ways(engine, run.id, monkeypatch)[1]
            store_recorder = engine.store.recorder
            assert isinstance(store_recorder, SQLiteRecorder)
            readers = store_recorder.readers
            connection = readers.borrow()
            connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 4000)  # a row fits, the page not
            readers.give_back(connection)
            got = _outcome(engine, run.id, None)
        assert got == expected[0]
        assert len(got) == 21
