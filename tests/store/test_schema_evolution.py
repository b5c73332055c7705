"""A store written by the first released event schema loads, folds, verifies and lists today.

`tests/data/v1_store.db` is checked in; `tests/data/make_v1_store.py` wrote it
with every event in its oldest class version. Each test works on a copy, since
opening a store adds the projection tables beside the events.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from click.testing import CliRunner

from engine import Engine
from engine.cli import main
from projections import FailurePatterns, ProgressState, RetryCounts, StateStack, TaskTable

DATA = Path(__file__).resolve().parent.parent / "data"
STORE = DATA / "v1_store.db"
REVIEW = UUID("00000000-0000-4000-8000-00000000000a")
CHILD = UUID("00000000-0000-4000-8000-00000000000b")
OPEN = UUID("00000000-0000-4000-8000-00000000000c")


def stored_rows(path: Path) -> list[tuple[str, int, str, dict[str, Any]]]:
    """(run id, version, topic, state) of every event in the file, in notification order."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT originator_id, originator_version, topic, state FROM stagetrail_events "
            "ORDER BY rowid"
        ).fetchall()
    return [(str(run), version, topic, json.loads(state)) for run, version, topic, state in rows]


def load_generator() -> Any:
    """The generator script as a module (it lives beside the data, not in a package)."""
    spec = importlib.util.spec_from_file_location("make_v1_store", DATA / "make_v1_store.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def v1_url(tmp_path: Path) -> str:
    """A copy of the checked-in first-schema store."""
    copy = tmp_path / "v1.db"
    shutil.copyfile(STORE, copy)
    return f"sqlite:///{copy}"


class TestTheCheckedInStore:
    def test_it_holds_only_first_schema_events(self) -> None:
        """No stored state carries a class_version; v1 shapes lack the fields added later."""
        rows = stored_rows(STORE)
        assert len(rows) == 37
        assert all("class_version" not in state for *_, state in rows)
        started = [s for _, _, topic, s in rows if topic == "stagetrail:RunStarted"]
        assert all("labels" not in s and "forked_from" not in s for s in started)
        failed = [s for _, _, topic, s in rows if topic == "stagetrail:StageFailed"]
        assert failed
        assert all("details" not in s for s in failed)
        progress = [s for _, _, topic, s in rows if topic == "stagetrail:ProgressObserved"]
        assert [s["functional_ok"] for s in progress] == [None, True]

    def test_the_generator_writes_the_same_events(self, tmp_path: Path) -> None:
        """make_v1_store.py regenerates exactly the checked-in events (the file is not stale)."""
        load_generator().write(tmp_path / "again.db")
        assert stored_rows(tmp_path / "again.db") == stored_rows(STORE)


class TestFirstSchemaStore:
    def test_events_are_upcast_on_load(self, v1_url: str) -> None:
        """Fields added after v1 come back with their upcast values."""
        with Engine(v1_url, create=False) as engine:
            started = engine.events(REVIEW)[0]
            failed = [e for e in engine.events(REVIEW) if type(e).__name__ == "StageFailed"]
            progress = [e for e in engine.events(REVIEW) if type(e).__name__ == "ProgressObserved"]
            child = engine.events(CHILD)[0]
        assert (started.labels, started.forked_from) == ({}, None)  # type: ignore[attr-defined]
        assert [e.details for e in failed] == [None, None, None]  # type: ignore[attr-defined]
        first, second = progress
        assert (first.diagnostics_signature, first.functional_ok) == ("", False)  # type: ignore[attr-defined]
        assert (second.test_signature, second.functional_ok) == ("", True)  # type: ignore[attr-defined]
        assert child.parent_run_id == REVIEW  # type: ignore[attr-defined]

    def test_runs_fold_to_their_recorded_states(self, v1_url: str) -> None:
        """load() and the built-in projections fold the v1 history."""
        with Engine(v1_url, create=False) as engine:
            review, child, unfinished = (engine.load(run) for run in (REVIEW, CHILD, OPEN))
            stack = engine.project(REVIEW, StateStack)
            failures = engine.project(REVIEW, FailurePatterns)
            retries = engine.project(REVIEW, RetryCounts)
            progress = engine.project(REVIEW, ProgressState)
            tasks = engine.project(CHILD, TaskTable)
            at_rollback = engine.project(REVIEW, StateStack, at=12)
        assert (review.state, review.status, review.version) == ("done", "succeeded", 18)
        assert (child.state, child.status) == ("aborted", "failed")
        assert (unfinished.state, unfinished.machine.open_attempt) == ("developer", 1)
        assert stack.top is not None
        assert stack.top.state == "done"
        assert stack.latest_result("developer") == {"changed_files": 3}
        assert at_rollback.top is not None
        assert at_rollback.top.state == "developer"
        assert dict(failures.by_error_type) == {"BuildException": 2, "TestFailure": 1}
        assert retries.retries("developer") == 2
        assert (progress.last_test_signature, progress.functional_ok) == ("", True)
        assert [task.task_id for task in tasks.completed] == ["task-1"]
        assert dict(tasks.budget) == {"tokens": 1200.0}

    def test_every_run_verifies(self, v1_url: str) -> None:
        """verify re-folds each v1 run through its stored table and every projection."""
        with Engine(v1_url, create=False) as engine:
            reports = [engine.verify(run) for run in (REVIEW, CHILD, OPEN)]
        assert [list(report.problems) for report in reports] == [[], [], []]
        assert all(report.ok for report in reports)

    def test_runs_are_listed(self, v1_url: str) -> None:
        """engine.runs() indexes the v1 runs: statuses, states, attempts, parent."""
        with Engine(v1_url, create=False) as engine:
            summaries = {summary.run_id: summary for summary in engine.runs()}
            children = engine.runs(parent=REVIEW)
        assert {run: s.status for run, s in summaries.items()} == {
            REVIEW: "succeeded",
            CHILD: "failed",
            OPEN: "running",
        }
        assert (summaries[REVIEW].attempts, summaries[REVIEW].failures) == (7, 3)
        assert summaries[REVIEW].labels == {}
        assert [child.run_id for child in children] == [CHILD]

    def test_the_command_line_lists_and_verifies(self, v1_url: str) -> None:
        """stagetrail runs --json and verify read the v1 store like any other."""
        runner = CliRunner()
        listed = runner.invoke(main, ["runs", "--json", "--store", v1_url])
        assert listed.exit_code == 0, listed.output
        statuses = sorted(row["status"] for row in json.loads(listed.stdout))
        assert statuses == ["failed", "running", "succeeded"]
        verified = runner.invoke(main, ["verify", str(REVIEW), "--store", v1_url])
        assert verified.exit_code == 0, verified.output
        assert "no problems" in verified.stdout

    def test_resume_appends_current_events_after_v1_ones(self, v1_url: str) -> None:
        """The dead run is resumed: Interrupted events in today's schema follow the v1 ones."""
        with Engine(v1_url) as engine:
            resumed = engine.resume(OPEN)
            tail = engine.events(OPEN)[-2:]
            report = engine.verify(OPEN)
        assert [type(e).__name__ for e in tail] == ["StageFailed", "TaskFailed"]
        assert [e.error_type for e in tail] == ["Interrupted", "Interrupted"]  # type: ignore[attr-defined]
        assert (resumed.machine.open_attempt, resumed.version, report.ok) == (None, 8, True)
        path = Path(v1_url.removeprefix("sqlite:///"))
        newest = stored_rows(path)[-2][3]
        assert newest["class_version"] == 2
