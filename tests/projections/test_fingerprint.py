"""Projection.fingerprint(): what makes a persistent projection start again from zero."""

from __future__ import annotations

import importlib.util
import textwrap
import uuid
from pathlib import Path
from typing import Any

import projections
from engine import Engine
from projections import Projection
from tests._helpers import REVIEW

SOURCE = '''
from events import StageCompleted, StageFailed
from projections import Projection, on


class Failures(Projection[int]):
    """Counts the failures of every run."""

    name = "failures"
    STEP = 1

    def initial(self) -> int:
        return 0

    @on(StageFailed)
    def failed(self, state: int, event: StageFailed) -> int:
        """One more failure."""
        assert state >= 0, "a count"
        return self.bump(state)

    def bump(self, state: int) -> int:
        return state + self.STEP
'''


def load(tmp_path: Path, source: str = SOURCE) -> type[Projection[Any]]:
    """The class `Failures` of `source`, imported from a module file of its own."""
    stem = f"fingerprinted_{uuid.uuid4().hex}"
    path = tmp_path / f"{stem}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    projection: type[Projection[Any]] = module.Failures
    return projection


def edited(old: str, new: str, source: str = SOURCE) -> str:
    """`source` with its one occurrence of `old` replaced by `new`."""
    assert source.count(old) == 1, old
    return source.replace(old, new)


def executed(source: str, filename: str, optimize: int = -1) -> type[Projection[Any]]:
    """The class `Failures` of `source` compiled under `filename`, in a namespace of its own."""
    namespace: dict[str, Any] = {"__name__": f"executed_{uuid.uuid4().hex}"}
    exec(compile(source, filename, "exec", optimize=optimize), namespace)
    projection: type[Projection[Any]] = namespace["Failures"]
    return projection


def record_failures(engine: Engine, count: int) -> None:
    """One run that reaches the developer stage and fails there `count` times."""
    run = engine.start_run(REVIEW)
    run.stage_completed("project_analysis", result={})
    run.stage_completed("code_review", result={})
    for _ in range(count):
        run.stage_failed("developer", error="boom", error_type="BuildException")


class TestFingerprint:
    def test_docstring_edits_keep_the_fingerprint(self, tmp_path: Path) -> None:
        """Editing, adding or removing the docstring of the class or a method changes nothing."""
        before = load(tmp_path).fingerprint()
        class_doc = edited('"""Counts the failures of every run."""', '"""Failures, all runs."""')
        handler_doc = edited('"""One more failure."""', '"""Another failure.\n\n        More."""')
        added = edited(
            "def bump(self, state: int) -> int:",
            'def bump(self, state: int) -> int:\n        """Add."""',
        )
        removed = edited('        """One more failure."""\n', "")
        for source in (class_doc, handler_doc, added, removed):
            assert load(tmp_path, source).fingerprint() == before

    def test_comments_blank_lines_and_formatting_keep_the_fingerprint(self, tmp_path: Path) -> None:
        """Comments, blank lines, parentheses and line breaks do not count."""
        before = load(tmp_path).fingerprint()
        reformatted = edited(
            "        return state + self.STEP\n",
            "        # the step is a class constant\n\n        return (\n"
            "            state   +   self.STEP  # one step\n        )\n",
        )
        reformatted = edited(
            "def failed(self, state: int, event: StageFailed) -> int:",
            "def failed(\n        self, state: int, event: StageFailed,\n    ) -> int:",
            reformatted,
        )
        assert load(tmp_path, reformatted).fingerprint() == before

    def test_a_logic_change_changes_the_fingerprint(self, tmp_path: Path) -> None:
        """Another operator in a helper method, or another handler body, is new code."""
        before = load(tmp_path).fingerprint()
        assert (
            load(tmp_path, edited("state + self.STEP", "state - self.STEP")).fingerprint() != before
        )
        handler = edited("return self.bump(state)", "return self.bump(self.bump(state))")
        assert load(tmp_path, handler).fingerprint() != before

    def test_a_class_constant_change_changes_the_fingerprint(self, tmp_path: Path) -> None:
        """A constant the handlers read is covered like their code."""
        before = load(tmp_path).fingerprint()
        assert load(tmp_path, edited("STEP = 1", "STEP = 2")).fingerprint() != before

    def test_the_version_changes_the_fingerprint(self, tmp_path: Path) -> None:
        """Bumping `version` forces a rebuild even when no code changed."""
        before = load(tmp_path).fingerprint()
        bumped = edited('name = "failures"', 'name = "failures"\n    version = 2')
        assert load(tmp_path, bumped).fingerprint() != before

    def test_the_name_changes_the_fingerprint(self, tmp_path: Path) -> None:
        """The same code under another name has another fingerprint."""
        before = load(tmp_path).fingerprint()
        renamed = edited('name = "failures"', 'name = "build_failures"')
        assert load(tmp_path, renamed).fingerprint() != before

    def test_the_scope_changes_the_fingerprint(self, tmp_path: Path) -> None:
        """Partitioning the state otherwise changes the fingerprint."""
        before = load(tmp_path).fingerprint()
        per_run = edited('name = "failures"', 'name = "failures"\n    scope = "run"')
        assert load(tmp_path, per_run).fingerprint() != before

    def test_an_extra_handled_event_type_changes_the_fingerprint(self, tmp_path: Path) -> None:
        """A handler that takes one more event type is new code."""
        before = load(tmp_path).fingerprint()
        wider = edited("@on(StageFailed)", "@on(StageFailed, StageCompleted)")
        assert load(tmp_path, wider).fingerprint() != before

    def test_the_fingerprint_is_read_from_the_source_not_the_bytecode(self, tmp_path: Path) -> None:
        """One file compiled with and without optimization: other bytecode, same fingerprint."""
        path = tmp_path / "optimized.py"
        path.write_text(SOURCE)
        plain = executed(SOURCE, str(path), optimize=0)
        optimized = executed(SOURCE, str(path), optimize=2)  # no asserts, no docstrings
        assert plain is not optimized
        plain_handler, optimized_handler = vars(plain)["failed"], vars(optimized)["failed"]
        assert plain_handler.__code__.co_code != optimized_handler.__code__.co_code
        assert plain_handler.__doc__ is not None
        assert optimized_handler.__doc__ is None
        assert plain.fingerprint() == optimized.fingerprint() == load(tmp_path).fingerprint()

    def test_classes_without_source_ignore_docstrings_but_not_code(self) -> None:
        """A class executed from a string (no source file) falls back to its code objects."""
        before = executed(SOURCE, "<string>")
        assert executed(SOURCE, "<string>") is not before
        assert executed(SOURCE, "<string>").fingerprint() == before.fingerprint()
        documented = edited('"""One more failure."""', '"""Another failure."""')
        assert executed(documented, "<string>").fingerprint() == before.fingerprint()
        changed = edited("state + self.STEP", "state - self.STEP")
        assert executed(changed, "<string>").fingerprint() != before.fingerprint()

    def test_a_docstring_edit_keeps_the_stored_state(self, tmp_path: Path) -> None:
        """Registered again after a docstring edit, a persistent projection keeps its position."""
        url = f"sqlite:///{tmp_path / 'store.db'}"
        with Engine(url) as first:
            first.projections.register(load(tmp_path))
            record_failures(first, 2)
            first.projections.catch_up()
            assert first.projections.get("failures") == 2
        documented = edited('"""One more failure."""', '"""Counted once per event."""')
        with Engine(url) as second:
            second.projections.register(load(tmp_path, documented))
            status = {entry.name: entry for entry in second.projections.status()}["failures"]
            assert status.position == status.head == 5
            assert second.projections.get("failures", catch_up=False) == 2
        changed = edited("state + self.STEP", "state + 2 * self.STEP")
        with Engine(url) as third:  # the control: new logic starts again from zero
            third.projections.register(load(tmp_path, changed))
            status = {entry.name: entry for entry in third.projections.status()}["failures"]
            assert status.position == 0
            assert third.projections.get("failures") == 4


SHIPPED = {
    "FailurePatterns": "c67891c6b49c8d9c",
    "ProgressState": "540d7795bc727fb2",
    "RetryCounts": "f266ecd51f23cdff",
    "RoundsTable": "71247b1acd728cb7",
    "RunIndex": "e67569b1fd44d884",
    "StageResults": "42c570fbc7d0a872",
    "StateStack": "297ec5d71b1fc194",
    "TaskTable": "f18f4f7963c7a98c",
}
"""The shipped projections' fingerprints (as of 909f60c): a change makes every stored
snapshot and persistent state of that projection stale, so it is made on purpose only
(its commit says so and updates this table)."""


class TestShippedFingerprints:
    def test_the_shipped_projections_keep_their_fingerprints(self) -> None:
        """A speed change that keeps a projection's logic keeps its fingerprint, so stored
        snapshots and states of it are still served (no silent refold of every run)."""
        found = {name: getattr(projections, name).fingerprint() for name in SHIPPED}
        assert found == SHIPPED
