# Wrong types are what this module passes on purpose.
# mypy: disable-error-code="arg-type, dict-item"
"""The bad-input matrix: each bad value gets one clear one-line error, and nothing is written.

Through the library on every backend (memory, SQLite file, PostgreSQL schema) and
through the command line on SQLite and PostgreSQL. Each case records a run
first, then checks that the bad input left the store exactly as it was.
"""

from __future__ import annotations

import io
import json
import sqlite3
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from engine import (
    Engine,
    InvalidTransition,
    Pipeline,
    Run,
    RunNotFound,
    StagetrailError,
    StoreError,
)
from engine.cli.export_import import export_line
from engine.errors import (
    InvalidArgument,
    InvalidEvent,
    InvalidFork,
    InvalidPayload,
    InvalidRollback,
    PayloadTooLarge,
    PipelineError,
    RunAlreadyFinished,
    TaskError,
)
from events import NoteAdded
from projections import StateStack
from tests._helpers import REVIEW
from tests.cli._helpers import invoke

MiB = 1 << 20


def _self_containing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


Action = Callable[[Engine, Run], object]

# (case id, what it does to a fresh run, the error type, words the message must hold)
LIBRARY_CASES: list[tuple[str, Action, type[Exception], str]] = [
    # not strict JSON
    (
        "nan-result",
        lambda e, r: r.stage_completed("developer", float("nan")),
        InvalidPayload,
        "'result'",
    ),
    (
        "inf-in-params",
        lambda e, r: e.start_run(REVIEW, params={"x": [float("inf")]}),
        InvalidPayload,
        "inf",
    ),
    ("minus-inf-note", lambda e, r: r.note("k", {"v": float("-inf")}), InvalidPayload, "'value'"),
    (
        "inf-duration",
        lambda e, r: r.stage_completed("developer", duration=float("inf")),
        InvalidPayload,
        "'duration'",
    ),
    ("bytes-result", lambda e, r: r.stage_completed("developer", b"raw"), InvalidPayload, "bytes"),
    ("set-result", lambda e, r: r.stage_completed("developer", {1, 2}), InvalidPayload, "set"),
    ("int-key", lambda e, r: r.note("k", {1: "one"}), InvalidPayload, "int key"),
    (
        "tuple-key",
        lambda e, r: r.stage_completed("developer", {(1, 2): 3}),
        InvalidPayload,
        "tuple key",
    ),
    ("open-file", lambda e, r: r.note("k", io.StringIO("x")), InvalidPayload, "StringIO"),
    (
        "object-params",
        lambda e, r: e.start_run(REVIEW, params=object()),
        InvalidPayload,
        "'params'",
    ),
    (
        "self-containing",
        lambda e, r: r.note("k", _self_containing()),
        InvalidPayload,
        "nested too deeply",
    ),
    (
        "nested-5000-deep",
        lambda e, r: r.note("k", _deep(5000)),
        InvalidPayload,
        "nested too deeply",
    ),
    # text no store keeps
    (
        "nul-label-value",
        lambda e, r: e.start_run(REVIEW, labels={"team": "a\x00"}),
        InvalidPayload,
        "NUL",
    ),
    (
        "nul-label-key",
        lambda e, r: e.start_run(REVIEW, labels={"\x00": "a"}),
        InvalidPayload,
        "NUL",
    ),
    ("nul-note-key", lambda e, r: r.note("k\x00", 1), InvalidPayload, "'key'"),
    (
        "nul-error-type",
        lambda e, r: r.stage_failed("developer", "bad", error_type="Bad\x00"),
        InvalidPayload,
        "'error_type'",
    ),
    (
        "nul-deep-in-result",
        lambda e, r: r.stage_completed("developer", {"a": [{"b": "\x00"}]}),
        InvalidPayload,
        "result['a'][0]['b']",
    ),
    (
        "surrogate-label",
        lambda e, r: e.start_run(REVIEW, labels={"team": "\ud83d"}),
        InvalidPayload,
        "lone surrogate",
    ),
    (
        "surrogate-result-key",
        lambda e, r: r.stage_completed("developer", {"\udc00": 1}),
        InvalidPayload,
        "lone surrogate",
    ),
    (
        "surrogate-task-title",
        lambda e, r: r.add_task("t", title="\ud800"),
        InvalidPayload,
        "'title'",
    ),
    # too big
    ("oversized-note", lambda e, r: r.note("blob", "x" * MiB), PayloadTooLarge, "1,048,576 bytes"),
    (
        "oversized-params",
        lambda e, r: e.start_run(REVIEW, params=["y" * 1024] * 1100),
        PayloadTooLarge,
        "'params'",
    ),
    (
        "oversized-in-batch",
        lambda e, r: _batch(r, lambda: r.note("big", "z" * (2 * MiB))),
        PayloadTooLarge,
        "'value'",
    ),
    # wrong types
    ("stage-int", lambda e, r: r.stage_started(5), InvalidPayload, "'stage'"),
    (
        "duration-str",
        lambda e, r: r.stage_completed("developer", duration="fast"),
        InvalidPayload,
        "'duration'",
    ),
    (
        "duration-negative",
        lambda e, r: r.stage_completed("developer", duration=-1.0),
        InvalidEvent,
        "negative",
    ),
    ("labels-list", lambda e, r: e.start_run(REVIEW, labels=["team"]), InvalidPayload, "'labels'"),
    (
        "label-value-int",
        lambda e, r: e.start_run(REVIEW, labels={"n": 1}),
        InvalidPayload,
        "str to str",
    ),
    (
        "retryable-str",
        lambda e, r: r.stage_failed("developer", "x", outcome="aborted", retryable="no"),
        InvalidPayload,
        "'retryable'",
    ),
    ("amount-bool", lambda e, r: r.spend(True), InvalidPayload, "'amount'"),
    ("amount-negative", lambda e, r: r.spend(-3.0), InvalidEvent, "'amount'"),
    ("empty-unit", lambda e, r: r.spend(1.0, ""), InvalidEvent, "'unit'"),
    ("task-id-none", lambda e, r: r.add_task(None), InvalidPayload, "'task_id'"),
    ("rollback-steps-str", lambda e, r: r.rollback("1"), InvalidPayload, "'steps'"),
    (
        "functional-ok-int",
        lambda e, r: r.observe_progress(functional_ok=1),
        InvalidPayload,
        "'functional_ok'",
    ),
    # the run's rules
    ("unknown-stage", lambda e, r: r.stage_completed("deploy"), InvalidTransition, "'deploy'"),
    (
        "illegal-outcome",
        lambda e, r: r.stage_completed("developer", outcome="shipped"),
        InvalidTransition,
        "'shipped'",
    ),
    ("bad-finish-status", lambda e, r: r.finish("great"), InvalidEvent, "'status'"),
    ("rollback-too-deep", lambda e, r: r.rollback(3), InvalidRollback, "cannot roll back 3"),
    ("unknown-task", lambda e, r: r.task_completed("ghost"), TaskError, "'ghost'"),
    (
        "after-finish",
        lambda e, r: (r.finish("cancelled"), r.note("late", 1)),
        RunAlreadyFinished,
        "nothing may follow",
    ),
    # queries and ids
    ("unknown-run-id", lambda e, r: e.load(uuid.uuid4()), RunNotFound, "no run"),
    ("garbage-run-id", lambda e, r: e.events("not-a-run"), RunNotFound, "not-a-run"),
    ("limit-beyond-64-bits", lambda e, r: e.runs(limit=10**30), InvalidArgument, "'limit'"),
    ("limit-zero", lambda e, r: e.runs(limit=0), InvalidArgument, "'limit'"),
    ("since-naive", lambda e, r: e.runs(since=datetime(2026, 1, 1)), InvalidArgument, "'since'"),
    (
        "since-out-of-range",
        lambda e, r: e.runs(since=datetime.fromisoformat("9999-12-31T23:00:00-12:00")),
        InvalidArgument,
        "years 1 to 9999",
    ),
    ("at-negative", lambda e, r: e.project(r.id, StateStack, at=-1), InvalidArgument, "'at'"),
    ("unknown-status-filter", lambda e, r: e.runs(status="happy"), InvalidArgument, "'status'"),
    ("nul-pipeline-filter", lambda e, r: e.runs(pipeline="x\x00"), InvalidArgument, "'pipeline'"),
    ("nul-label-filter", lambda e, r: e.runs(label="team=core\x00"), InvalidArgument, "NUL"),
    (
        "surrogate-label-filter",
        lambda e, r: e.runs(label={"\ud800": "x"}),
        InvalidArgument,
        "surrogate",
    ),
    ("fork-at-zero", lambda e, r: e.fork(r.id, at=0), InvalidFork, "int >= 1"),
    ("fork-beyond", lambda e, r: e.fork(r.id, at=10**30), InvalidFork, "only"),
    # hostile tables
    (
        "table-nul-name",
        lambda e, r: Pipeline("p\x00", initial="a", transitions=[("a", "ok", "b")], final=["b"]),
        PipelineError,
        "NUL",
    ),
    (
        "table-surrogate-state",
        lambda e, r: Pipeline(
            "p", initial="a", transitions=[("a", "ok", "\udfff")], final=["\udfff"]
        ),
        PipelineError,
        "lone surrogate",
    ),
    (
        "table-unreachable",
        lambda e, r: Pipeline(
            "p", initial="a", transitions=[("a", "ok", "b"), ("c", "ok", "b")], final=["b"]
        ),
        PipelineError,
        "unreachable",
    ),
    (
        "table-duplicate-row",
        lambda e, r: Pipeline(
            "p", initial="a", transitions=[("a", "ok", "b"), ("a", "ok", "a")], final=["b"]
        ),
        PipelineError,
        "duplicate row",
    ),
    (
        "table-final-leaves",
        lambda e, r: Pipeline(
            "p", initial="a", transitions=[("a", "ok", "b"), ("b", "ok", "a")], final=["b"]
        ),
        PipelineError,
        "outgoing row",
    ),
    (
        "table-star-dest",
        lambda e, r: Pipeline("p", initial="a", transitions=[("a", "ok", "*")], final=["b"]),
        PipelineError,
        "'*' may only be a source",
    ),
    (
        "table-rows-str",
        lambda e, r: Pipeline("p", initial="a", transitions="a,ok,b", final=["b"]),
        PipelineError,
        "list of rows",
    ),
    (
        "table-states-twice",
        lambda e, r: Pipeline("p", initial="a", transitions=[("a", "ok", "b")], final=["b", "b"]),
        PipelineError,
        "twice",
    ),
    (
        "table-dict-not-mapping",
        lambda e, r: Pipeline.from_dict([1, 2]),
        PipelineError,
        "must be an object",
    ),
    (
        "table-dict-deep",
        lambda e, r: Pipeline.from_dict({"name": "p", "x": _deep(5000)}),
        PipelineError,
        "nested too deeply",
    ),
    (
        "table-dict-missing",
        lambda e, r: Pipeline.from_dict({"name": "p"}),
        PipelineError,
        "malformed",
    ),
]


def _batch(run: Run, body: Callable[[], object]) -> None:
    with run.batch():
        run.note("before", 1)
        body()


def snapshot(engine: Engine) -> tuple[int, list[str]]:
    """The store's newest notification id and every run's events, as export lines."""
    head = engine.store.recorder.max_notification_id() or 0
    runs = engine.runs(limit=1000)
    return head, [export_line(e) for s in runs for e in engine.store.stream(s.run_id)]


def start(engine: Engine) -> Run:
    """A run that has begun: one outcome on its stack."""
    run = engine.start_run(REVIEW, params={"card": "C-1"}, labels={"team": "core"})
    run.stage_completed("project_analysis", {"project_type": "python"})
    run.stage_started("code_review")
    run.stage_completed("code_review", {"critical": 0})
    return run


class TestLibrary:
    @pytest.mark.parametrize(
        ("action", "kind", "words"),
        [case[1:] for case in LIBRARY_CASES],
        ids=[case[0] for case in LIBRARY_CASES],
    )
    def test_one_clear_error_and_nothing_written(
        self, engine: Engine, action: Action, kind: type[Exception], words: str
    ) -> None:
        """Bad input raises its error on one line, naming the problem; the store is unchanged."""
        run = start(engine)
        before = snapshot(engine)
        with pytest.raises(kind) as caught:
            action(engine, run)
        message = str(caught.value)
        assert isinstance(caught.value, StagetrailError)
        assert words in message
        assert "\n" not in message
        if isinstance(caught.value, RunAlreadyFinished):
            before = (before[0] + 1, before[1])  # the finish itself was legal
            assert snapshot(engine)[1][-1].find("RunFinished") > 0
        else:
            assert snapshot(engine) == before
        assert engine.load(run.id).version in (4, 5)

    def test_the_matrix_has_at_least_forty_cases(self) -> None:
        """The issue asks for at least 40 library cases; each id names its case once."""
        ids = [case[0] for case in LIBRARY_CASES]
        assert len(ids) >= 40
        assert len(set(ids)) == len(ids)


# ---- the command line -------------------------------------------------------


def one_line_error(*args: str) -> str:
    """Run a command that must fail: exit 2, one line on stderr, no traceback."""
    result = invoke(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("stagetrail: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def recorded(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A SQLite or PostgreSQL store holding one run, and the run's id."""
    url = request.getfixturevalue(request.param)
    with Engine(url) as engine:
        return url, str(start(engine).id)


def _store_snapshot(url: str) -> tuple[int, list[str]]:
    with Engine(url, create=False) as engine:
        return snapshot(engine)


CLI_CASES: list[tuple[str, tuple[str, ...], str]] = [
    ("at-malformed", ("state", "{run}", "--at", "yesterday"), "--at 'yesterday': not a version"),
    ("at-far-past-span", ("state", "{run}", "--at", "999999999999d"), "before the year 1"),
    ("at-out-of-range", ("state", "{run}", "--at", "9999-12-31T23:59:59-14:00"), "years 1 to 9999"),
    ("at-negative", ("state", "{run}", "--at", "-3"), "a version is an int >= 0"),
    (
        "limit-beyond-64-bits",
        ("runs", "--limit", "99999999999999999999999"),
        "--limit 99999999999999999999999: must be at most 9223372036854775807",
    ),
    ("since-overflow", ("runs", "--since", "999999999999d"), "before the year 1"),
    ("since-garbage", ("runs", "--since", "soon"), "--since 'soon'"),
    ("label-malformed", ("runs", "--label", "=x"), "key=value"),
    ("status-unknown", ("runs", "--status", "happy"), "'status'"),
    ("unknown-run", ("show", "0000ffff"), "no run 0000ffff"),
    ("not-a-run-id", ("replay", "zz-top"), "no run zz-top"),
    ("fork-beyond", ("fork", "{run}", "--at", "99999999999999999999"), "only 4 events"),
    ("unknown-projection", ("state", "{run}", "--projection", "nope"), "nope"),
    (
        "store-url-unknown-option",
        ("runs", "--store", "sqlite:///x.db?colour=red"),
        "unknown option",
    ),
]


def _nested(depth: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value} if kind == "dict" else [value]
    return value


def _deepest_accepted(kind: str) -> int:
    """The deepest `kind` nesting a note's value takes (refused past it: a binary search)."""
    low, high = 1, 5000
    while low + 1 < high:
        middle = (low + high) // 2
        try:
            NoteAdded(run_id=uuid.uuid4(), version=1, key="k", value=_nested(middle, kind))
        except InvalidPayload:
            high = middle
        else:
            low = middle
    return low


class TestNesting:
    @pytest.mark.parametrize("kind", ["list", "dict"])
    def test_every_depth_a_note_takes_is_stored_and_read_back(
        self, engine: Engine, kind: str
    ) -> None:
        """Up to the depth refused (one InvalidPayload), the store writes each value and reads
        it back whole: no RecursionError while encoding or decoding a value one level less deep."""
        run = start(engine)
        kept, low, high = [], 1, 5000
        while low + 1 < high:
            middle = (low + high) // 2
            try:
                run.note("k", _nested(middle, kind))
            except InvalidPayload:
                high = middle
            else:
                kept.append(_nested(middle, kind))
                low = middle
        notes = [e.value for e in engine.store.stream(run.id) if isinstance(e, NoteAdded)]
        assert notes == kept

    def test_lists_and_dicts_nest_equally_deep(self) -> None:
        """The depth refused does not depend on the kind of container nested."""
        assert abs(_deepest_accepted("list") - _deepest_accepted("dict")) <= 1


class TestCommandLine:
    @pytest.mark.parametrize(
        ("args", "words"), [case[1:] for case in CLI_CASES], ids=[case[0] for case in CLI_CASES]
    )
    def test_one_line_error_and_store_unchanged(
        self, recorded: tuple[str, str], args: tuple[str, ...], words: str
    ) -> None:
        """Each bad option is one line on stderr, exit 2, naming it; the store is unchanged."""
        url, run_id = recorded
        before = _store_snapshot(url)
        argv = [arg.format(run=run_id) for arg in args]
        if "--store" not in argv:
            argv += ["--store", url]
        assert words in one_line_error(*argv)
        assert _store_snapshot(url) == before


def _lines(url: str) -> list[str]:
    with Engine(url) as engine:
        run = start(engine)
        run.finish("succeeded")
        other = start(engine)
        return [export_line(e) for r in (run, other) for e in engine.store.stream(r.id)]


def _edit(line: str, **state: Any) -> str:
    data = json.loads(line)
    data["state"].update(state)
    return json.dumps(data)


IMPORT_CASES: list[tuple[str, Callable[[list[str]], list[str]], str]] = [
    ("not-json", lambda ls: [*ls[:6], "{oops", *ls[6:]], "line 7, field -: not JSON"),
    ("truncated-last-line", lambda ls: [*ls[:-1], ls[-1][: len(ls[-1]) // 2]], "not JSON"),
    (
        "nan-result",
        lambda ls: [*ls[:1], _edit(ls[1], result=float("nan")), *ls[2:]],
        "line 2, field state.result",
    ),
    ("nul-in-late-run", lambda ls: [*ls[:-1], _edit(ls[-1], result={"a": "\x00"})], "NUL"),
    (
        "surrogate-in-late-run",
        lambda ls: [*ls[:-1], _edit(ls[-1], result="\ud800")],
        "lone surrogate",
    ),
    (
        "oversized-late-event",
        lambda ls: [*ls[:-1], _edit(ls[-1], result="x" * MiB)],
        "max_event_bytes",
    ),
    (
        "deeply-nested-line",
        lambda ls: [*ls[:-1], ls[-1][:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"],
        "nested too deeply",
    ),
    (
        "illegal-transition",
        lambda ls: [*ls[:1], _edit(ls[1], outcome="shipped"), *ls[2:]],
        "'shipped'",
    ),
    ("version-gap", lambda ls: [ls[0], *ls[2:]], "field version"),
    (
        "unknown-topic",
        lambda ls: [*ls[:-1], ls[-1].replace("stagetrail:", "other:", 1)],
        "unknown event type",
    ),
    (
        "bad-run-id",
        lambda ls: [*ls[:-1], json.dumps({**json.loads(ls[-1]), "run_id": "nope"})],
        "field run_id",
    ),
    ("newer-class-version", lambda ls: [*ls[:-1], _edit(ls[-1], class_version=99)], "newer"),
    ("not-utf8", lambda ls: [*ls[:-1], "\udcff" + ls[-1]], "not UTF-8"),
    (
        "nul-after-a-blank-line",
        lambda ls: [*ls[:-1], "", _edit(ls[-1], result={"a": "\x00"})],
        "line 10, field state.result",
    ),
    (
        "illegal-after-a-blank-line",
        lambda ls: [ls[0], "", _edit(ls[1], outcome="shipped"), *ls[2:]],
        "line 3, field state",
    ),
]


class TestImport:
    @pytest.mark.parametrize(
        ("corrupt", "words"),
        [case[1:] for case in IMPORT_CASES],
        ids=[case[0] for case in IMPORT_CASES],
    )
    def test_a_bad_export_imports_nothing(
        self,
        recorded: tuple[str, str],
        tmp_path: Path,
        corrupt: Callable[[list[str]], list[str]],
        words: str,
    ) -> None:
        """A corrupted export is one error naming the line; the target store is unchanged."""
        url, _ = recorded
        lines = corrupt(_lines(f"sqlite:///{tmp_path / 'source.db'}"))
        path = tmp_path / "bad.jsonl"
        path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        before = _store_snapshot(url)
        assert words in one_line_error("import", str(path), "--store", url)
        assert _store_snapshot(url) == before


class TestImportOfAStoredRun:
    def test_a_truncated_copy_names_the_truncation(
        self, recorded: tuple[str, str], tmp_path: Path
    ) -> None:
        """The first 3 lines of a stored run: the error says the file is truncated, at line 3."""
        url, run_id = recorded
        with Engine(url) as engine:
            lines = [export_line(e) for e in engine.store.stream(uuid.UUID(run_id))]
        path = tmp_path / "prefix.jsonl"
        path.write_text("\n".join(lines[:3]) + "\n")
        before = _store_snapshot(url)
        error = one_line_error("import", str(path), "--store", url)
        assert f"line 3: run {run_id} is already in the store with 4 events" in error
        assert "the file holds only its first 3 (lines 1-3): the file is truncated" in error
        assert "line 4" not in error
        assert _store_snapshot(url) == before

    def test_a_longer_copy_names_where_the_store_stops(
        self, recorded: tuple[str, str], tmp_path: Path
    ) -> None:
        """A store holding a run's first events: the error names the file's first line beyond."""
        url, run_id = recorded
        with Engine(url) as engine:
            lines = [export_line(e) for e in engine.store.stream(uuid.UUID(run_id))]
        short_store = f"sqlite:///{tmp_path / 'short.db'}"
        (tmp_path / "prefix.jsonl").write_text("\n".join(lines[:2]) + "\n")
        invoke("import", str(tmp_path / "prefix.jsonl"), "--unchained", "--store", short_store)
        (tmp_path / "full.jsonl").write_text("\n\n".join(lines) + "\n")  # blank lines between
        before = _store_snapshot(short_store)
        error = one_line_error("import", str(tmp_path / "full.jsonl"), "--store", short_store)
        assert f"line 5: run {run_id} is already in the store with only its first 2" in error
        assert "goes on to version 4" in error
        assert _store_snapshot(short_store) == before


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x93NUMPY not a database at all " * 200)


def _truncated(path: Path) -> None:
    with Engine(f"sqlite:///{path}") as engine:
        start(engine)
    path.write_bytes(path.read_bytes()[:1500])
    for extra in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        extra.unlink(missing_ok=True)


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER, total REAL)")
        conn.execute("INSERT INTO invoices VALUES (1, 9.5)")


def _newer_schema(path: Path) -> None:
    with Engine(f"sqlite:///{path}") as engine:
        start(engine)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE stagetrail_meta SET value = '99' WHERE key = 'schema_version'")


def _content(path: Path) -> object:
    """What a SQLite file holds (its tables' rows), or its bytes when it is not a database."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
            return {t: conn.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables}
    except sqlite3.DatabaseError:
        return path.read_bytes()


SQLITE_FILES: list[tuple[str, Callable[[Path], None], str]] = [
    ("garbage", _garbage, "not a stagetrail store"),
    ("truncated", _truncated, "store sqlite:///"),
    ("foreign", _foreign, "other tables (invoices)"),
    ("newer-schema", _newer_schema, "newer stagetrail"),
]


class TestSQLiteFiles:
    @pytest.mark.parametrize(
        ("make", "words"), [case[1:] for case in SQLITE_FILES], ids=[c[0] for c in SQLITE_FILES]
    )
    @pytest.mark.parametrize("command", [("runs",), ("import", "{file}"), ("show", "0")])
    def test_a_file_that_is_not_a_usable_store_is_one_error(
        self,
        tmp_path: Path,
        make: Callable[[Path], None],
        words: str,
        command: tuple[str, ...],
    ) -> None:
        """Reading or importing into it is one line naming the problem; its content is untouched."""
        path = tmp_path / "odd.db"
        make(path)
        export = tmp_path / "one.jsonl"
        export.write_text("\n".join(_lines(f"sqlite:///{tmp_path / 'source.db'}")) + "\n")
        before = _content(path)
        argv = [arg.format(file=export) for arg in command]
        assert words in one_line_error(*argv, "--store", f"sqlite:///{path}")
        assert _content(path) == before

    def test_the_library_says_the_same(self, tmp_path: Path) -> None:
        """Engine() on a garbage file raises one StoreError, not a database exception."""
        path = tmp_path / "odd.db"
        _garbage(path)
        with pytest.raises(StoreError, match="not a stagetrail store"):
            Engine(f"sqlite:///{path}")


EVERY_COMMAND = [
    ("runs",),
    ("show", "0123abcd"),
    ("state", "0123abcd"),
    ("replay", "0123abcd"),
    ("diff", "0123abcd", "--from", "1"),
    ("fork", "0123abcd", "--at", "1"),
    ("verify", "0123abcd"),
    ("export", "--all"),
    ("diagram", "0123abcd"),
    ("projections", "list"),
    ("projections", "status"),
    ("projections", "rebuild", "run_index"),
]


class TestEveryCommand:
    @pytest.mark.parametrize("command", EVERY_COMMAND, ids=" ".join)
    @pytest.mark.parametrize(
        "store",
        ["sqlite:///{tmp}/missing.db", "postgresql://nobody:pw@127.0.0.1:9/none?connect_timeout=1"],
        ids=["missing-sqlite-file", "unreachable-postgres"],
    )
    def test_a_store_error_is_one_line_from_every_command(
        self, tmp_path: Path, command: tuple[str, ...], store: str
    ) -> None:
        """Every command turns a StoreError into one line, exit 2, password masked."""
        error = one_line_error(*command, "--store", store.format(tmp=tmp_path))
        assert "store " in error
        assert ":pw@" not in error
        assert not (tmp_path / "missing.db").exists()
