"""Recorded text never drives the terminal: every command shows control characters as escapes."""

from __future__ import annotations

import json
import re
from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import Engine, Pipeline
from engine.cli import common
from engine.cli.common import clean, json_line
from tests.cli._helpers import invoke

TITLE = "\x1b]0;pwned\x07"  # OSC: sets the window title
CLEAR = "\x1b[2J\x1b[H"  # CSI: clears the screen
LINK = "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\"  # OSC 8 hyperlink
CSI8 = "\x9b31m"  # the one-byte C1 CSI
BIDI = "\u202e"  # right-to-left override
MARKUP = "[link=http://evil.example]rich markup[/link]"

HOSTILE = Pipeline(
    "evil" + TITLE,
    initial="plan" + CLEAR,
    transitions=[
        ("plan" + CLEAR, "ok" + CSI8, "build" + BIDI),
        ("build" + BIDI, "failed", "build" + BIDI),
        ("build" + BIDI, "completed", "done" + LINK),
    ],
    final=["done" + LINK],
)

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def record_hostile(url: str) -> tuple[UUID, UUID]:
    """A run whose every recorded str carries an escape sequence, and a fork of it."""
    with Engine(url) as engine:
        run = engine.start_run(
            HOSTILE, params={"p" + CLEAR: LINK}, labels={"team" + TITLE: "core" + CSI8}
        )
        run.stage_completed("plan" + CLEAR, {"k\x1b[31m": "v\x07" + LINK}, outcome="ok" + CSI8)
        run.stage_failed("build" + BIDI, "boom" + CLEAR + LINK, error_type="Err" + TITLE)
        run.note("n" + CSI8, MARKUP)
        run.rollback(1, reason="undo" + CLEAR)
        run.add_task("t" + TITLE, title="title" + LINK)
        run.finish("failed", reason={"why" + CLEAR: "because" + LINK})
        fork = engine.fork(run.id, at=2)
        fork.stage_failed("build" + BIDI, "other" + CLEAR, error_type="Other" + TITLE)
        return run.id, fork.id


@pytest.fixture(params=["sqlite_url", "postgres_url"])
def hostile(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    """A store holding a hostile run and its fork, and their ids."""
    url = request.getfixturevalue(request.param)
    run_id, fork_id = record_hostile(url)
    return url, str(run_id), str(fork_id)


COMMANDS = [
    ("runs",),
    ("show", "{run}"),
    ("state", "{run}"),
    ("state", "{run}", "--projection", "task_table"),
    ("state", "{run}", "--at", "3"),
    ("replay", "{run}"),
    ("diff", "{run}", "--from", "1", "--to", "4"),
    ("diff", "{run}", "{fork}"),
    ("diagram", "{run}"),
    ("diagram", "{run}", "--format", "dot"),
    ("verify", "{run}"),
]


def _run(args: tuple[str, ...], hostile: tuple[str, str, str]) -> str:
    url, run_id, fork_id = hostile
    result = invoke(*(arg.format(run=run_id, fork=fork_id) for arg in args), "--store", url)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout + result.stderr


def _strings(value: object) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set(value) | _strings(list(value.values()))
    if isinstance(value, list):
        return set().union(*map(_strings, value)) if value else set()
    return set()


class TestHostileRun:
    @pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
    def test_piped_output_shows_escapes_and_sends_none(
        self, hostile: tuple[str, str, str], args: tuple[str, ...]
    ) -> None:
        """Piped output holds no control character; the recorded ones show as \\x1b-style text."""
        output = _run(args, hostile)
        assert RAW.search(output) is None, repr(RAW.search(output))
        if args[0] != "verify":  # verify's report quotes nothing recorded
            assert "\\x1b" in output or "\\u001b" in output

    @pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
    def test_terminal_output_sends_no_escape_and_no_markup(
        self, hostile: tuple[str, str, str], args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On a terminal (rich tables) the same holds, and rich markup in a name stays text."""
        monkeypatch.setattr(common, "stdout_is_terminal", lambda: True)
        output = _run(args, hostile)
        assert RAW.search(output) is None, repr(RAW.search(output))
        if args[0] == "replay":
            assert "[link=" in output

    @pytest.mark.parametrize(
        "args",
        [("runs", "--json"), ("show", "{run}", "--json"), ("replay", "{run}", "--json")],
        ids=" ".join,
    )
    def test_json_output_is_exact_and_escaped(
        self, hostile: tuple[str, str, str], args: tuple[str, ...]
    ) -> None:
        """--json keeps every recorded str exactly, with the control characters JSON-escaped."""
        output = _run(args, hostile)
        assert RAW.search(output) is None
        text = output.strip()
        documents = (
            [json.loads(text)] if text.startswith("[") else list(map(json.loads, text.splitlines()))
        )
        assert {"evil" + TITLE, "plan" + CLEAR} & _strings(documents)

    def test_export_keeps_the_exact_text(self, hostile: tuple[str, str, str]) -> None:
        """An export holds no raw control character and imports back to the same strs."""
        output = _run(("export", "{run}"), hostile)
        assert RAW.search(output) is None
        first = json.loads(output.splitlines()[0])
        assert first["state"]["labels"] == {"team" + TITLE: "core" + CSI8}

    def test_an_error_naming_a_recorded_name_is_clean(self, hostile: tuple[str, str, str]) -> None:
        """An error message that quotes recorded text is one clean line on stderr."""
        url, run_id, _ = hostile
        result = invoke("fork", run_id, "--at", "7", "--store", url)
        assert result.exit_code == 2
        assert RAW.search(result.stderr) is None
        assert result.stderr.count("\n") == 1


class TestClean:
    @pytest.mark.parametrize(
        ("text", "shown"),
        [
            ("plain", "plain"),
            ("tab\tand\nnewline", "tab\tand\nnewline"),
            ("\x1b[2J", "\\x1b[2J"),
            ("bell\x07", "bell\\x07"),
            ("\r overwrite", "\\x0d overwrite"),
            ("del\x7f", "del\\x7f"),
            ("\x9b31m", "\\x9b31m"),
            ("a\u202eb", "a\\u202eb"),
            ("nul\x00", "nul\\x00"),
            ("accents é ü — ok", "accents é ü — ok"),
        ],
    )
    def test_control_characters_are_shown_not_sent(self, text: str, shown: str) -> None:
        """clean() shows each control character as an escape and leaves other text alone."""
        assert clean(text) == shown

    def test_one_line_also_escapes_newlines_and_tabs(self) -> None:
        """In a table cell or a timeline row, newlines and tabs are escaped too."""
        assert clean("a\nb\tc", one_line=True) == "a\\x0ab\\x09c"

    def test_json_lines_escape_c1_and_bidi_but_decode_the_same(self) -> None:
        """json_line escapes what json.dumps leaves raw, and still decodes to the same value."""
        value = {"k\x9b": "a\u202eb\x1b"}
        line = json_line(value)
        assert RAW.search(line) is None
        assert json.loads(line) == value

    @given(st.text())
    def test_no_text_survives_clean_with_a_control_character(self, text: str) -> None:
        """For any text, clean() leaves no control character but newline and tab."""
        assert RAW.search(clean(text).replace("\n", "").replace("\t", "")) is None
        assert RAW.search(clean(text, one_line=True)) is None

    @given(
        st.recursive(
            st.text() | st.integers() | st.none(),
            lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        )
    )
    def test_any_json_value_prints_safely_and_decodes_the_same(self, value: object) -> None:
        """json_line of any JSON value holds no raw control character and decodes to the value."""
        line = json_line(value)
        assert RAW.search(line) is None
        assert json.loads(line) == value
