from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine import Engine
from engine.cli.demo import agent_loop, coordinator, record, supervised_review, tool_calls
from projections import TaskTable


def events(engine: Engine, run: Any) -> list[Any]:
    return engine.events(run.id)


def names(engine: Engine, run: Any) -> list[str]:
    return [type(event).__name__ for event in events(engine, run)]


class TestSupervisedReview:
    def test_adapted_retries_then_success(self, engine: Engine) -> None:
        """Seven critical issues give the developer 5 retries; two failed builds, then done."""
        run = supervised_review.record_adapted_retries(engine)
        assert run.status == "succeeded"
        retries = [e for e in events(engine, run) if type(e).__name__ == "RetryScheduled"]
        assert [r.delay for r in retries] == [30, 60]
        assert {r.policy["chosen_by"] for r in retries} == {"adapt_developer"}
        assert {r.policy["max_retries"] for r in retries} == {5}
        assert names(engine, run).count("StageFailed") == 2

    def test_breaker_opens_refuses_then_closes(self, engine: Engine) -> None:
        """Three failed builds open the breaker; a caller is refused; a later trial closes it."""
        run = supervised_review.record_breaker_cycle(engine)
        assert run.status == "succeeded"
        decisions = [n for n in names(engine, run) if n.startswith("Circuit") or n == "NoteAdded"]
        assert decisions == ["CircuitOpened", "NoteAdded", "CircuitHalfOpened", "CircuitClosed"]

    def test_runs_as_a_script(self, sqlite_url: str) -> None:
        """`python -m engine.cli.demo.supervised_review URL` records both runs."""
        done = subprocess.run(
            [sys.executable, "-m", "engine.cli.demo.supervised_review", sqlite_url],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert done.stdout.count("succeeded") == 2


class TestAgentLoop:
    def test_the_stuck_agent_is_stopped(self, engine: Engine) -> None:
        """An agent repeating one failing test without edits ends aborted_stuck, with a reason."""
        run = agent_loop.record_stuck(engine)
        finish = agent_loop.describe(engine, run)
        assert finish["status"] == "aborted_stuck"
        assert finish["reason"]["last_test_signature"] == agent_loop.FAILING_TEST
        assert finish["reason"]["rule"] == "same_error"

    def test_the_partial_agent_ends_done_partial(self, engine: Engine) -> None:
        """The agent that meets its goal with diagnostics left ends done_partial under lenient."""
        run = agent_loop.record_partial(engine)
        finish = agent_loop.describe(engine, run)
        assert finish["status"] == "done_partial"
        assert finish["reason"]["last_diagnostics_signature"] == "mypy: 2 errors in parser.py"
        assert finish["reason"]["policy"]["accept_partial"] is True


class TestCoordinator:
    def test_a_clean_run_builds_every_task_once(self, engine: Engine) -> None:
        """Every task completes once, features close, one child run per feature passes."""
        run = coordinator.coordinate(engine, coordinator.start(engine))
        assert run.status == "succeeded"
        tree = engine.project(run.id, TaskTable, tree=True)
        assert len(tree.completed) == 6
        assert tree.budget == {"usd": 4 * coordinator.TASK_COST}
        children = engine.runs(parent=run.id)
        assert sorted(c.labels["feature"] for c in children) == sorted(coordinator.FEATURES)
        assert {c.status for c in children} == {"succeeded"}

    def test_killed_and_resumed(self, sqlite_url: str) -> None:
        """Killed in a child process at its 6th point and resumed: no task is built twice."""
        with Engine(sqlite_url) as engine:
            run = coordinator.killed_then_resumed(engine, sqlite_url, at=6)
            assert run.status == "succeeded"
            kinds = names(engine, run)
            assert kinds.count("TaskCompleted") == 6
            assert kinds.count("BudgetSpent") == 4
            interrupted = [
                e for e in events(engine, run) if getattr(e, "error_type", "") == "Interrupted"
            ]
            assert [type(e).__name__ for e in interrupted] == ["StageFailed", "TaskFailed"]


class TestToolCalls:
    def test_the_four_conversations(self, engine: Engine) -> None:
        """Direct answer, round limit, failed tool, rolled-back round: each ends as modelled."""
        direct, limited, broken, rolled = tool_calls.record_all(engine)
        assert (direct.state, direct.status) == ("answered", "succeeded")
        rounds = [
            e.outcome
            for e in events(engine, limited)
            if getattr(e, "stage", "") == "tool_round" and hasattr(e, "outcome")
        ]
        assert rounds == ["tool_call", "tool_call", "enough"]  # the limit of 3 rounds
        assert (broken.state, broken.status) == ("failed", "failed")
        failed = next(e for e in events(engine, broken) if type(e).__name__ == "StageFailed")
        assert failed.error_type == "ToolError"
        assert "StateRolledBack" in names(engine, rolled)
        assert rolled.status == "succeeded"


class TestDemo:
    @pytest.mark.parametrize("backend", ["sqlite_url", "postgres_url"])
    def test_demo_records_every_example(self, backend: str, request: pytest.FixtureRequest) -> None:
        """The demo records every example, the coordinator killed in a child process and resumed."""
        url = request.getfixturevalue(backend)
        with Engine(url) as engine:
            runs = record.record_all(engine, url)
            pipelines = {run.pipeline.name for run in runs}
            assert pipelines == {"code-review", "agent-loop", "coordinator", "tool-calling"}
            assert {run.status for run in runs} >= {
                "succeeded",
                "failed",
                "aborted_stuck",
                "done_partial",
            }
            assert all(run.status != "running" for run in runs)


class _WatchedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """subprocess.Popen that keeps each child's argv and its /proc command line."""

    seen: list[tuple[list[str], bytes]] = []

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        super().__init__(args, *rest, **kwargs)
        with open(f"/proc/{self.pid}/cmdline", "rb") as cmdline:
            _WatchedPopen.seen.append(([str(arg) for arg in args], cmdline.read()))


class TestDemoSecrets:
    def test_no_child_command_line_holds_the_password(
        self, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`stagetrail demo` on a URL with a password starts its child without it in argv."""
        secret = "s3cret-Pa55"
        url = postgres_url.replace("postgres@", f"postgres:{secret}@", 1)
        assert secret in url
        _WatchedPopen.seen = []
        monkeypatch.setattr(subprocess, "Popen", _WatchedPopen)
        from tests.cli._helpers import invoke

        result = invoke("demo", "--store", url)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        assert _WatchedPopen.seen, "the demo starts the coordinator in a child process"
        for argv, cmdline in _WatchedPopen.seen:
            assert not any(secret in arg for arg in argv)
            assert secret.encode() not in cmdline
        assert secret not in result.stdout + result.stderr


SCRIPT = Path(sys.executable).parent / "stagetrail"
"""The console script pip installed beside this interpreter."""


def _demo_by_path(directory: Path, path_env: str) -> subprocess.CompletedProcess[str]:
    """`stagetrail demo` run by its full path in `directory`, with `path_env` as $PATH."""
    if not SCRIPT.exists():
        pytest.skip(f"no console script at {SCRIPT} (stagetrail is not installed in this venv)")
    env = {**os.environ, "PATH": path_env, "PYTHONWARNINGS": "default"}
    env.pop("STAGETRAIL_STORE", None)
    env.pop("STAGETRAIL_CIPHER_KEY", None)
    return subprocess.run(
        [str(SCRIPT), "demo"], cwd=directory, env=env, capture_output=True, text=True, check=True
    )


class TestDemoAsAUserRunsIt:
    def test_no_warning_and_the_suggestions_run_as_given(self, tmp_path: Path) -> None:
        """Outside PATH: nothing on stderr, and each suggestion starts with the script's path."""
        done = _demo_by_path(tmp_path, "/usr/bin:/bin")
        assert done.stderr == ""
        suggestions = done.stdout.split("Three commands worth trying next:\n")[1].splitlines()
        assert len(suggestions) == 3
        assert all(line.strip().startswith(f"{SCRIPT} ") for line in suggestions)
        listing = suggestions[0].strip().split()
        again = subprocess.run(listing, cwd=tmp_path, capture_output=True, text=True, check=True)
        assert "failed" in again.stdout

    def test_on_path_the_suggestions_say_stagetrail(self, tmp_path: Path) -> None:
        """With the script's directory on PATH, the suggestions are the bare `stagetrail ...`."""
        done = _demo_by_path(tmp_path, f"{SCRIPT.parent}:/usr/bin:/bin")
        assert "\n  stagetrail runs" in done.stdout

    @pytest.mark.parametrize(
        "module", ["code_review", "agent_loop", "coordinator", "supervised_review", "tool_calls"]
    )
    def test_each_example_runs_as_a_module_without_a_warning(self, module: str) -> None:
        """`python -W error -m engine.cli.demo.X` runs: the package does not import X first."""
        subprocess.run(
            [sys.executable, "-W", "error", "-m", f"engine.cli.demo.{module}", "memory://"],
            capture_output=True,
            check=True,
        )
