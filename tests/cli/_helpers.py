"""Stores filled by the examples, and a CLI runner, for the command-line tests."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from uuid import UUID

import attrs
from click.testing import CliRunner, Result

from engine import Engine
from engine.cli import main
from engine.cli.demo.code_review import REVIEW, record_abandoned, record_review
from events import CircuitOpened, RetryScheduled


@attrs.frozen
class Filled:
    """A store and the runs the examples recorded into it."""

    url: str
    clean: UUID
    retried: UUID
    abandoned: UUID
    busy: UUID
    fork: UUID


def record_busy(engine: Engine) -> UUID:
    """A run with every kind of event: decisions, a rollback, tasks, notes, a stuck finish."""
    run = engine.start_run(REVIEW, params={"card": "C-77"}, labels={"team": "core"})
    run.stage_completed("project_analysis", {"project_type": "go"}, duration=1.5)
    run.stage_completed("code_review", {"critical": 1}, duration=2.0)
    run.rollback(1, reason="review too strict")
    run.stage_completed("code_review", {"critical": 0}, duration=2.5)
    run.stage_started("developer")
    run.stage_failed("developer", TimeoutError("build timed out"), duration=30.0)
    run.record(RetryScheduled, stage="developer", attempt=2, delay=2.0, reason="timeout")
    run.record(CircuitOpened, stage="developer", reason="3 failures in a row")
    run.add_task("feature-1", title="Parser")
    run.add_task("task-1", parent="feature-1", title="Tokenizer")
    run.task_started("task-1")
    run.task_completed("task-1", result={"lines": 120})
    run.spend(0.25, "usd")
    run.note("strategy", "smaller steps")
    run.observe_progress(changed_files=0, test_signature="test_empty", functional_ok=False)
    reason = {"rule": "max_same_error", "signatures": ["test_empty"], "steps": 12}
    run.finish("aborted_stuck", reason=reason)
    return run.id


def fill(url: str) -> Filled:
    """Record the examples (a clean run, one with retries, one abandoned, a busy one, a fork)."""
    with Engine(url) as engine:
        clean = record_review(engine, "C-41").id
        retried = record_review(engine, "C-42", build_failures=2, test_failures=1).id
        abandoned = record_abandoned(engine, "C-43").id
        busy = record_busy(engine)
        fork = engine.fork(retried, at=3)
        fork.stage_completed("code_review", {"critical": 1})
        fork.stage_completed("developer", {"changed_files": 1})
        fork.stage_completed("testing", {"passed": 42})
        fork.finish("succeeded")
    return Filled(url, clean, retried, abandoned, busy, fork.id)


def invoke(
    *args: str, input: str | None = None, env: Mapping[str, str | None] | None = None
) -> Result:
    """Run `stagetrail ARGS` in-process (stdout is not a terminal: plain text); `env` sets or
    (None) unsets environment variables for the command."""
    return CliRunner().invoke(main, list(args), input=input, env=env)


def ok(*args: str) -> str:
    """The stdout of a command that must succeed."""
    result = invoke(*args)
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result.stdout


def as_json(*args: str) -> Any:
    """The JSON document a ``--json`` command prints."""
    return json.loads(ok(*args, "--json"))


def json_lines(*args: str) -> list[Any]:
    """The JSON Lines a streaming ``--json`` command prints."""
    return [json.loads(line) for line in ok(*args, "--json").splitlines()]


def fails(*args: str) -> str:
    """The one-line error of a command that must fail with exit code 2."""
    result = invoke(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr
