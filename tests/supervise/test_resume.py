from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from typing import Any
from uuid import UUID

import pytest

from engine import Engine, RetryPolicy, Run
from engine.cli.demo import coordinator
from engine.cli.demo.code_review import REVIEW
from projections import TaskTable
from tests.supervise._helpers import LOOP, kinds, of_type

POINTS = ["plan"] + [
    f"{task}:{when}" for tasks in coordinator.FEATURES.values() for task in tasks
    for when in ("start", "done")
] + ["integrate"] + [f"{feature}:verify" for feature in coordinator.FEATURES]  # fmt: skip
"""Every point of a coordinator run where the kill test stops it, in order."""


class TestResume:
    def test_an_open_attempt_is_recorded_as_interrupted(self, engine: Engine) -> None:
        """resume closes a started attempt with StageFailed('Interrupted'); drive retries it."""
        run = engine.start_run(LOOP)
        run.stage_started("work")
        resumed = engine.resume(run.id)
        failed = of_type(engine, run, "StageFailed")[0]
        assert (failed.error_type, failed.attempt, failed.retryable) == ("Interrupted", 1, True)  # type: ignore[attr-defined]
        assert "died before it ended" in failed.error  # type: ignore[attr-defined]
        engine.supervisor(retry=RetryPolicy(delay=0)).drive(resumed, {"work": lambda c: c.attempt})
        assert of_type(engine, run, "StageCompleted")[0].result == 2  # type: ignore[attr-defined]

    def test_active_tasks_are_recorded_as_interrupted(self, engine: Engine) -> None:
        """A task left active is TaskFailed('Interrupted'), in the attempt's transaction."""
        run = engine.start_run(LOOP)
        run.stage_started("work")
        run.add_task("t-1")
        run.task_started("t-1")
        before = run.version
        engine.resume(run.id)
        assert kinds(engine, run)[before:] == ["StageFailed", "TaskFailed"]
        assert of_type(engine, run, "TaskFailed")[0].error_type == "Interrupted"  # type: ignore[attr-defined]
        assert dict(engine.load(run.id).tasks) == {"t-1": "failed"}

    def test_nothing_to_do_records_nothing(self, engine: Engine) -> None:
        """A run between attempts, or finished, is loaded unchanged."""
        run = engine.start_run(LOOP)
        assert engine.resume(run.id).version == 1
        run.finish("cancelled")
        assert engine.resume(run.id).status == "cancelled"
        assert run.version == 2

    def test_an_attempt_without_a_failed_row_stays_open(self, engine: Engine) -> None:
        """Where no failure can be recorded, the open attempt is completed by the next call."""
        run = engine.start_run(REVIEW)
        run.stage_started("project_analysis")
        resumed = engine.resume(run.id)
        assert resumed.machine.open_attempt == 1
        sup = engine.supervisor()
        sup.execute(resumed, "project_analysis", lambda: {"t": "py"})
        done = of_type(engine, run, "StageCompleted")[0]
        assert (done.stage, done.attempt) == ("project_analysis", 1)  # type: ignore[attr-defined]


def crashed_tree(engine: Engine) -> tuple[Run, list[Run], Run]:
    """A parent with an open attempt, two crashed child runs (one with a child), a finished one."""
    parent = engine.start_run(LOOP)
    parent.stage_started("work")
    busy = engine.start_run(LOOP, parent=parent)
    busy.stage_started("work")
    busy.add_task("t-1")
    busy.task_started("t-1")
    tasks = engine.start_run(LOOP, parent=parent)
    tasks.add_task("t-2")
    tasks.task_started("t-2")
    grandchild = engine.start_run(LOOP, parent=busy)
    grandchild.stage_started("work")
    done = engine.start_run(LOOP, parent=parent)
    done.stage_started("work")
    done.stage_completed("work")
    done.finish("succeeded")
    return parent, [busy, tasks, grandchild], done


class TestResumeTree:
    def test_every_unfinished_run_of_the_tree_is_resumed(self, engine: Engine) -> None:
        """tree=True records Interrupted events in the parent and every unfinished descendant."""
        parent, (busy, tasks, grandchild), _ = crashed_tree(engine)
        resumed = engine.resume(parent.id, tree=True)
        assert (resumed.id, resumed.machine.open_attempt) == (parent.id, None)
        assert kinds(engine, parent)[-1] == "StageFailed"
        assert kinds(engine, busy)[-2:] == ["StageFailed", "TaskFailed"]
        assert kinds(engine, tasks)[-1] == "TaskFailed"
        assert kinds(engine, grandchild)[-1] == "StageFailed"
        for run in (parent, busy, tasks, grandchild):
            interrupted = of_type(engine, run, "StageFailed") + of_type(engine, run, "TaskFailed")
            assert {e.error_type for e in interrupted} == {"Interrupted"}  # type: ignore[attr-defined]
        assert dict(engine.load(tasks.id).tasks) == {"t-2": "failed"}
        assert engine.load(busy.id).machine.open_attempt is None

    def test_parents_are_resumed_first(self, engine: Engine) -> None:
        """A run's Interrupted events come before its children's, theirs before their children's."""
        parent, (busy, _, grandchild), _ = crashed_tree(engine)
        engine.resume(parent.id, tree=True)
        recorded = [engine.events(run.id)[-1].timestamp for run in (parent, busy, grandchild)]
        assert recorded == sorted(recorded)

    def test_a_finished_child_is_left_alone(self, engine: Engine) -> None:
        """A finished run of the tree gets no new event."""
        parent, _, done = crashed_tree(engine)
        before = kinds(engine, done)
        engine.resume(parent.id, tree=True)
        assert kinds(engine, done) == before
        assert engine.load(done.id).status == "succeeded"

    def test_a_finished_parent_still_resumes_its_children(self, engine: Engine) -> None:
        """The root's own status does not stop its unfinished children from being resumed."""
        parent = engine.start_run(LOOP)
        child = engine.start_run(LOOP, parent=parent)
        child.stage_started("work")
        parent.finish("cancelled")
        assert engine.resume(parent.id, tree=True).status == "cancelled"
        assert kinds(engine, parent) == ["RunStarted", "RunFinished"]
        assert kinds(engine, child)[-1] == "StageFailed"

    def test_without_tree_only_the_root_is_resumed(self, engine: Engine) -> None:
        """The default, tree=False, records nothing in the child runs."""
        parent, children, _ = crashed_tree(engine)
        before = [kinds(engine, child) for child in children]
        engine.resume(parent.id)
        assert kinds(engine, parent)[-1] == "StageFailed"
        assert [kinds(engine, child) for child in children] == before


def kill_at(url: str, point: int) -> UUID:
    """Run the coordinator in a real child process and SIGKILL it at its `point`-th point."""
    child = subprocess.Popen(
        [sys.executable, "-m", "engine.cli.demo.coordinator", url, "--stop-at", str(point)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    run_id = UUID(child.stdout.readline().split()[-1])
    assert child.stdout.readline().startswith(f"stopped at {point} {POINTS[point - 1]}")
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    return run_id


def expected_state(point: str) -> str:
    if point == "plan":
        return "plan"
    return "build" if point.startswith("task-") else "integrate"


@pytest.mark.slow
class TestResumeAfterSigkill:
    @pytest.mark.parametrize("point", range(1, len(POINTS) + 1))
    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    def test_resume_anywhere(
        self, backend: str, point: int, request: pytest.FixtureRequest
    ) -> None:
        """Killed at any point, resume + drive ends succeeded: nothing done twice, budget exact."""
        url = request.getfixturevalue(backend)
        run_id = kill_at(url, point)
        with Engine(url) as engine:
            run = engine.resume(run_id)
            assert run.state == expected_state(POINTS[point - 1])
            coordinator.coordinate(engine, run)
            assert run.status == "succeeded"
            self._check_exactly_once(engine, run)
            assert engine.verify(run.id).ok

    def _check_exactly_once(self, engine: Engine, run: Any) -> None:
        history: list[Any] = engine.events(run.id)
        completed = Counter(e.stage for e in history if type(e).__name__ == "StageCompleted")
        assert completed == {"plan": 1, "build": 1, "integrate": 1}
        done = Counter(e.task_id for e in history if type(e).__name__ == "TaskCompleted")
        assert set(done.values()) == {1}
        assert len(done) == 6
        for task in done:
            started = sum(
                1 for e in history if type(e).__name__ == "TaskStarted" and e.task_id == task
            )
            interrupted = sum(
                1 for e in history
                if type(e).__name__ == "TaskFailed" and e.task_id == task
            )  # fmt: skip
            assert started == 1 + interrupted
        tree = engine.project(run.id, TaskTable, tree=True)
        assert tree.budget == {"usd": 4 * coordinator.TASK_COST}
        children = engine.runs(parent=run.id)
        assert len(children) == len(coordinator.FEATURES)
        assert {child.status for child in children} == {"succeeded"}


GROUPED = """
import os, signal, sys, time
from engine import Engine, Pipeline, RetryPolicy

url, mode, point = sys.argv[1], sys.argv[2], int(sys.argv[3])
engine = Engine(url)
run = engine.start_run(Pipeline("grouped", initial="plan", transitions=[
    ("plan", "completed", "build"), ("plan", "failed", "plan"), ("build", "failed", "build"),
    ("build", "completed", "test"), ("test", "failed", "test"), ("test", "completed", "done"),
], final=["done"]))
print(run.id, flush=True)
calls = groups = 0

def stage(fails):
    def fn(context):
        global calls
        calls += 1
        if mode == "call" and calls == point:
            print("stopped", flush=True)
            time.sleep(60)
        if context.attempt <= fails:
            raise RuntimeError(f"{context.stage} {context.attempt} failed")
        return context.stage
    return fn

def die():
    print("stopped", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

def steps_of(stored):  # the progress callbacks this append's INSERT makes (a dry run)
    import sqlite3
    path = url.removeprefix("sqlite:///")
    schema = sqlite3.connect(path).execute(
        "SELECT sql FROM sqlite_master WHERE name='stagetrail_events'").fetchone()[0]
    scratch = sqlite3.connect(":memory:", isolation_level=None)
    scratch.execute(schema)
    count = [0]
    scratch.set_progress_handler(lambda: count.__setitem__(0, count[0] + 1), 1)
    key = engine.store.recorder.run_key
    topic_ids = getattr(engine.store.recorder, "topic_ids", None)  # a compact store's
    topic = (lambda t: t) if topic_ids is None else (lambda t: topic_ids.get(t, 1))
    params = [value for e in stored for value in
              (key(e.originator_id), e.originator_version, topic(e.topic), e.state)]
    scratch.execute("INSERT INTO stagetrail_events VALUES "
                    + ",".join(["(?,?,?,?)"] * len(stored)), params)
    return count[0]

if mode == "commit":  # SIGKILL inside the point-th grouped write, before it commits
    recorder = type(engine.store.recorder)
    writer = getattr(engine.store.recorder, "writer", None)
    if writer is not None:  # SQLite: one INSERT, its own transaction: die halfway through it
        append = recorder.insert_events
        def killing(self, stored, **kwargs):
            global groups
            if len(stored) > 1:
                groups += 1
                if groups == point:
                    last = steps_of(stored)
                    raw = writer.acquire()._sqlite_conn
                    writer.release()
                    left = [last // 2]  # its last steps run after the commit
                    def step():
                        left[0] -= 1
                        if left[0] <= 0:  # rows half inserted, nothing committed
                            die()
                        return 0
                    raw.set_progress_handler(step, 1)
            return append(self, stored, **kwargs)
        recorder.insert_events = killing
    else:  # PostgreSQL: rows inserted by the append function in a transaction, no COMMIT
        call = recorder._execute_append
        def killing(self, conn, columns):
            global groups
            if len(columns[0]) > 1:
                groups += 1
                if groups == point:
                    conn.execute("BEGIN")  # the call commits as it returns otherwise
                    call(self, conn, columns)
                    die()
            return call(self, conn, columns)
        recorder._execute_append = killing

engine.supervisor(retry=RetryPolicy(delay=0)).drive(
    run, {"plan": stage(0), "build": stage(2), "test": stage(1)}
)
print("finished", flush=True)
"""
"""Drives plan, build (2 failures), test (1 failure) with group commits, killed at a point."""

GROUP_SIZES = [2, 3, 3, 2, 3, 2]
"""The grouped writes of that run: [outcome (+decision) + next start] ..., [outcome + finish]."""


def kill_grouped(url: str, mode: str, point: int) -> UUID:
    """Run GROUPED in a child process and SIGKILL it at its `point`-th call or grouped write."""
    child = subprocess.Popen(
        [sys.executable, "-c", GROUPED, url, mode, str(point)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    run_id = UUID(child.stdout.readline().strip())
    assert child.stdout.readline().strip() == "stopped"
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    return run_id


@pytest.mark.slow
class TestGroupedCommitsAfterSigkill:
    @pytest.mark.parametrize("mode", ["call", "commit"])
    @pytest.mark.parametrize("point", range(1, 7))
    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    def test_every_interrupted_attempt_is_recorded(
        self, backend: str, mode: str, point: int, request: pytest.FixtureRequest
    ) -> None:
        """Killed in a stage function or inside a grouped write, resume records the attempt."""
        url = request.getfixturevalue(backend)
        run_id = kill_grouped(url, mode, point)
        with Engine(url) as engine:
            stored = kinds(engine, engine.load(run_id))
            if mode == "commit":  # the grouped write is gone whole, and nothing after it
                assert len(stored) == 2 + sum(GROUP_SIZES[: point - 1])
            assert stored[-1] == "StageStarted"  # the attempt that was under way
            run = engine.resume(run_id)
            assert of_type(engine, run, "StageFailed")[-1].error_type == "Interrupted"  # type: ignore[attr-defined]
            engine.supervisor(retry=RetryPolicy(delay=0)).drive(
                run, {stage: (lambda context: context.stage) for stage in ("plan", "build", "test")}
            )
            assert run.status == "succeeded"
            assert engine.verify(run.id).ok
            self._check_every_attempt_closed(engine.events(run.id))

    def _check_every_attempt_closed(self, history: list[Any]) -> None:
        started = [(e.stage, e.attempt) for e in history if type(e).__name__ == "StageStarted"]
        ended = [(e.stage, e.attempt) for e in history
                 if type(e).__name__ in ("StageFailed", "StageCompleted")]  # fmt: skip
        assert started == ended
        interrupted = [e for e in history if getattr(e, "error_type", None) == "Interrupted"]
        assert len(interrupted) == 1
        for stage in ("plan", "build", "test"):
            numbers = [attempt for name, attempt in ended if name == stage]
            assert numbers == list(range(1, len(numbers) + 1))
