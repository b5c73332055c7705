"""Agent loops under a progress policy: one stuck, one stopped with a partial success.

The first agent keeps producing the same failing test without changing a file:
the strict profile stops it as ``aborted_stuck``, and the recorded reason names
the rule, the failing signature and the steps taken. The second fixes the
functional problem but leaves type-check diagnostics it cannot clear; the
lenient profile accepts that as ``done_partial``.

Run it with ``python -m engine.cli.demo.agent_loop [STORE_URL]``.
"""

from __future__ import annotations

import sys
from typing import Any

from engine import Engine, Outcome, Pipeline, ProgressPolicy, Run, StageContext

AGENT = Pipeline(
    "agent-loop",
    initial="iterate",
    transitions=[
        ("iterate", "tests_failing", "iterate"),
        ("iterate", "failed", "iterate"),
        ("iterate", "tests_pass", "done"),
        ("*", "aborted", "aborted"),
    ],
    final=["done", "aborted"],
)

FAILING_TEST = "tests/test_parser.py::test_empty_input FAILED (IndexError)"


def stuck_iteration(context: StageContext) -> Outcome:
    """An agent step that edits nothing and sees the same failing test again."""
    context.run.observe_progress(0, test_signature=FAILING_TEST, functional_ok=False)
    return Outcome("tests_failing", {"summary": "retried the same patch"})


class PartialFixer:
    """An agent that fixes the behaviour in three steps, then cannot clear two diagnostics."""

    def __init__(self) -> None:
        self.steps = 0

    def __call__(self, context: StageContext) -> Outcome:
        """One step: change files while there is something it can fix."""
        self.steps += 1
        fixing = self.steps <= 3
        context.run.observe_progress(
            ["parser.py", "lexer.py"] if fixing else 0,
            diagnostics_signature="mypy: 2 errors in parser.py",
            test_signature=None if self.steps >= 3 else f"{self.steps} tests failing",
            functional_ok=self.steps >= 3,
        )
        return Outcome("tests_failing", {"step": self.steps, "changed": fixing})


def record_stuck(engine: Engine) -> Run:
    """The agent that loops on one failing test: stopped as aborted_stuck."""
    run = engine.start_run(AGENT, params={"goal": "fix empty input"}, labels={"example": "agent"})
    engine.supervisor(progress=ProgressPolicy.strict()).drive(run, {"iterate": stuck_iteration})
    return run


def record_partial(engine: Engine) -> Run:
    """The agent that meets its functional goal with diagnostics left: done_partial."""
    run = engine.start_run(AGENT, params={"goal": "parse comments"}, labels={"example": "agent"})
    policy = ProgressPolicy.lenient(max_consecutive_no_ops=3)
    engine.supervisor(progress=policy).drive(run, {"iterate": PartialFixer()})
    return run


def record_all(engine: Engine) -> list[Run]:
    """Both agent loops."""
    return [record_stuck(engine), record_partial(engine)]


def describe(engine: Engine, run: Run) -> dict[str, Any]:
    """The run's finish: status and the structured reason."""
    finish: Any = engine.events(run.id)[-1]
    return {"status": finish.status, "reason": finish.reason}


if __name__ == "__main__":
    with Engine(sys.argv[1] if len(sys.argv) > 1 else None) as main_engine:
        for recorded in record_all(main_engine):
            print(recorded, describe(main_engine, recorded))
