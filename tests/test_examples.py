"""The standalone example in examples/ runs as a reader would run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from uuid import UUID

from engine import Engine
from events import NoteAdded, RunFinished, StageCompleted, TaskFailed
from projections import ProgressState, RoundsTable, StageResults, StateStack, TaskTable

ROOT = Path(__file__).resolve().parent.parent


class TestReviewLoop:
    def test_runs_from_the_repository_root(self, tmp_path: Path) -> None:
        """`python examples/review_loop.py URL` drives a run to done, its failed draft retried."""
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        done = subprocess.run(
            [sys.executable, "examples/review_loop.py", url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        assert "ended succeeded in state done" in done.stdout
        assert "failures by stage: {'write': 1}" in done.stdout
        assert "after event 3 the stack's top was write failed" in done.stdout


def run_example(name: str, tmp_path: Path) -> tuple[str, str]:
    """Run `examples/<name>.py` on a new SQLite file; its store URL and what it printed."""
    url = f"sqlite:///{tmp_path / 'recipes.db'}"
    done = subprocess.run(
        [sys.executable, f"examples/{name}.py", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return url, done.stdout


def kinds(engine: Engine, run_id: UUID) -> list[str]:
    """The class names of a run's events, in order."""
    return [type(event).__name__ for event in engine.events(run_id)]


class TestSupervisorStack:
    def test_review_rolled_back_and_breaker_cycle(self, tmp_path: Path) -> None:
        """The stale review is rolled back, the breaker opens and closes, the review succeeds."""
        url, printed = run_example("supervisor_stack", tmp_path)
        with Engine(url) as engine:
            (summary,) = engine.runs()
            assert (summary.status, summary.state) == ("succeeded", "done")
            assert f"run {summary.run_id} ended succeeded in state done" in printed
            events = kinds(engine, summary.run_id)
            assert events.count("StateRolledBack") == 1
            circuit = [kind for kind in events if kind.startswith("Circuit")]
            assert circuit == ["CircuitOpened", "CircuitHalfOpened", "CircuitClosed"]
            stack = engine.project(summary.run_id, StateStack)
            assert stack.latest_result("code_review") == {
                "critical": 2,
                "files": ["parser.py", "lexer.py"],
            }
            assert stack.latest_result("developer") == {
                "fixed": ["parser.py", "lexer.py"],
                "critical_left": 0,
            }


class TestStrategyRotation:
    def test_failed_strategies_lead_to_the_next_and_are_learned(self, tmp_path: Path) -> None:
        """The first issue tries three strategies; the second starts with the one that worked."""
        url, printed = run_example("strategy_rotation", tmp_path)
        with Engine(url) as engine:
            second, first = engine.runs()  # newest first
            assert [(s.status, s.state) for s in (first, second)] == [("succeeded", "complete")] * 2
            notes = {
                run_id: [e.value for e in engine.events(run_id) if isinstance(e, NoteAdded)]
                for run_id in (first.run_id, second.run_id)
            }
            assert notes[first.run_id] == ["syntax_fix", "refactor", "simplify"]
            assert notes[second.run_id] == ["simplify"]
            outcomes = [
                a.outcome for a in engine.project(first.run_id, StageResults).attempts("syntax_fix")
            ]
            assert outcomes == ["failed", "strategy_failed"]
            learned = engine.projections.get("failure_patterns", "issue-pipeline")
            assert learned.by_error_type == {"ConnectionError": 1, "StrategyFailed": 2}
            assert "failure patterns learned" in printed


class TestStuckHandling:
    def test_every_stop_reaches_the_handler_with_its_own_reason(self, tmp_path: Path) -> None:
        """Strict, lenient, max_steps and budget stops each run the snitch and end as it says."""
        url, _ = run_example("stuck_handling", tmp_path)
        with Engine(url) as engine:
            budget, max_steps, lenient, strict = engine.runs()  # newest first
            ended = [(s.status, s.state) for s in (strict, lenient, max_steps, budget)]
            assert ended == [
                ("aborted_stuck", "reported"),
                ("done_partial", "reported"),
                ("aborted_stuck", "reported"),
                ("failed", "reported"),
            ]
            rules = ["no_progress", "no_progress", "max_steps", "budget"]
            for summary, rule in zip((strict, lenient, max_steps, budget), rules, strict=True):
                events = engine.events(summary.run_id)
                notes = {e.key: e.value for e in events if isinstance(e, NoteAdded)}
                assert notes["progress_verdict"]["reason"]["rule"] == rule
                assert str(notes["diagnosis"]).startswith(rule)
                finish = events[-1]
                assert isinstance(finish, RunFinished)
                assert isinstance(finish.reason, dict)
                assert (finish.reason["rule"], finish.reason["final_state"]) == (rule, "reported")
                routed = [e for e in events if isinstance(e, StageCompleted) and not e.attempt]
                assert len(routed) == 1  # the verdict: an outcome no attempt produced
                steps = engine.project(summary.run_id, ProgressState).total_steps
                assert steps == len([e for e in events if isinstance(e, StageCompleted)]) - 1
            assert engine.events(max_steps.run_id)[-1].reason["steps"] == 12  # type: ignore[attr-defined]


class TestTaskCoordinator:
    def test_resumed_tree_completes_every_task_once(self, tmp_path: Path) -> None:
        """After the crash and the resume, every task is completed once and the budget exact."""
        url, printed = run_example("task_coordinator", tmp_path)
        assert "killed while building task-005" in printed
        assert "resumed: built ['task-005', 'task-006', 'task-007']" in printed
        with Engine(url) as engine:
            (root,) = engine.runs(pipeline="coordinator")
            assert (root.status, root.state) == ("succeeded", "done")
            children = engine.runs(parent=root.run_id)
            assert sorted(s.status for s in children) == ["succeeded"] * 3
            table = engine.project(root.run_id, TaskTable, tree=True)
            assert len(table.completed) == 10
            assert (table.failed, table.active, table.pending) == ((), (), ())
            assert table.budget == {"usd": 1.75}
            assert len(table.runs) == 4
            assert table.task("task-005").attempts == 2
            interrupted = [
                e
                for child in children
                for e in engine.events(child.run_id)
                if isinstance(e, TaskFailed)
            ]
            assert [(e.task_id, e.error_type) for e in interrupted] == [("task-005", "Interrupted")]


class TestToolRounds:
    def test_rolled_back_round_stays_visible_in_the_rounds_table(self, tmp_path: Path) -> None:
        """The stale round is rolled back yet listed, the tool error recovered, the limit hit."""
        url, printed = run_example("tool_rounds", tmp_path)
        assert "rolled back: round 2 read a forecast 30 h old" in printed
        with Engine(url) as engine:
            (summary,) = engine.runs()
            assert (summary.status, summary.state) == ("succeeded", "done")
            rounds = engine.project(summary.run_id, RoundsTable)
            assert [r.outcome for r in rounds.rounds if r.stage == "round"] == [
                "tool_call",
                "tool_call",
                "error_occurred",
                "tool_call",
                "tool_call",
                "max_rounds_reached",
            ]
            (undone,) = rounds.rolled_back
            assert undone.result == {
                "round": 2,
                "tool": "forecast",
                "api": "weather-api",
                "age_hours": 30,
            }
            assert len(rounds.live) == len(rounds.rounds) - 1
            assert rounds.rounds[3].error_type == "ToolError"
            assert engine.project(summary.run_id, StateStack).depth == len(rounds.live)
