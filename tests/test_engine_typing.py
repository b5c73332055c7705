"""`Engine.project` is typed by the projection it is given: mypy checks these, not only pytest.

Each helper returns what `project` gives under a declared type; were `project` to
return `Any`, mypy (strict, so `warn_return_any`) would refuse this file.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from engine import Engine
from events import NoteAdded
from projections import (
    FailurePatterns,
    Failures,
    Projection,
    RunIndex,
    RunSummary,
    Stack,
    StateStack,
    Tasks,
    TaskTable,
    on,
)
from tests._helpers import REVIEW

ROOT = Path(__file__).resolve().parent.parent


class NoteKeys(Projection[tuple[str, ...]]):
    """The keys of a run's notes, in order: a custom projection with its own state type."""

    def initial(self) -> tuple[str, ...]:
        return ()

    @on(NoteAdded)
    def noted(self, state: tuple[str, ...], event: NoteAdded) -> tuple[str, ...]:
        return (*state, event.key)


def stack_of(engine: Engine, run_id: UUID) -> Stack:
    """A built-in projection's class gives its state type."""
    return engine.project(run_id, StateStack)


def summary_at(engine: Engine, run_id: UUID, at: int) -> RunSummary | None:
    """Time travel keeps the type, None included where the state may be None."""
    return engine.project(run_id, RunIndex, at=at)


def tasks_of_tree(engine: Engine, run_id: UUID) -> Tasks:
    """A tree fold keeps the type too."""
    return engine.project(run_id, TaskTable, tree=True)


def failures_of(engine: Engine, run_id: UUID) -> Failures:
    """An instance types the state as its class does."""
    return engine.project(run_id, FailurePatterns())


def note_keys(engine: Engine, run_id: UUID) -> tuple[str, ...]:
    """A custom projection's declared state type comes back."""
    return engine.project(run_id, NoteKeys)


class TestProjectTyping:
    def test_the_typed_helpers_return_the_states(self, engine: Engine) -> None:
        """The helpers mypy checks return the real states at run time."""
        run = engine.start_run(REVIEW)
        run.stage_completed("project_analysis")
        run.note("first", 1)
        run.note("second", 2)
        assert stack_of(engine, run.id).depth == 1
        summary = summary_at(engine, run.id, 2)
        assert summary is not None
        assert summary.version == 2
        assert tasks_of_tree(engine, run.id).pending == ()
        assert dict(failures_of(engine, run.id).by_stage) == {}
        assert note_keys(engine, run.id) == ("first", "second")

    def test_mypy_refuses_a_state_assigned_to_the_wrong_type(self, tmp_path: Path) -> None:
        """A projection's state assigned to an int is a mypy error: the type is not Any."""
        from mypy import api

        snippet = tmp_path / "wrong.py"
        snippet.write_text(
            "from engine import Engine\n"
            "from projections import StateStack\n\n\n"
            "def wrong(engine: Engine) -> None:\n"
            '    stack: int = engine.project("x", StateStack)\n'
        )
        report, _, status = api.run(
            [
                "--config-file",
                str(ROOT / "setup.cfg"),
                "--cache-dir",
                str(tmp_path / "cache"),
                str(snippet),
            ]
        )
        assert status == 1
        assert 'expression has type "Stack", variable has type "int"' in report
