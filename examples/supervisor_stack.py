"""A supervisor with a pushdown stack of stage results, a rollback and a circuit breaker.

Follows design 000 ("How the Supervisor Tracks State in Code Review/Refactor
Pipeline"): the supervisor executes each stage with retries, pushes every
result on the state stack, and the developer stage reads the code review's
result from the stack. A review run against a stale branch is rolled back and
done again; the developer's build then breaks until the circuit breaker opens,
and after its reset timeout a trial build closes it again.

Run it from the repository root: ``python examples/supervisor_stack.py [STORE_URL]``
(default ``sqlite:///stagetrail.db``, the store ``stagetrail show`` reads).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from engine import CircuitBreaker, CircuitOpen, Engine, Pipeline, RetryPolicy, StageContext
from engine.cli.demo.simulated import SimulatedTime
from projections import StateStack

PIPELINE = Pipeline(
    "supervised-code-review",
    initial="project_analysis",
    transitions=[
        ("project_analysis", "completed", "code_review"),
        ("code_review", "completed", "developer"),
        ("developer", "completed", "testing"),
        ("developer", "failed", "developer"),
        ("testing", "completed", "done"),
        ("testing", "failed", "developer"),
    ],
    final=["done"],
)


class BuildException(Exception):
    """The developer's build broke."""


class TestFailure(Exception):
    """The testing stage found a failing test."""

    __test__ = False  # not a pytest test class


class Developer:
    """Fixes the files the code review found; the first three builds break."""

    def __init__(self) -> None:
        self.builds = 0

    def __call__(self, context: StageContext) -> dict[str, Any]:
        """Build a fix for the review still on the stack."""
        review: Any = context.stack.latest_result("code_review")
        self.builds += 1
        if self.builds <= 3:
            raise BuildException(f"linker error in {review['files'][0]} (build {self.builds})")
        return {"fixed": review["files"], "critical_left": 0}


class Tests:
    """The test suite: it fails once, on the first fix."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, context: StageContext) -> dict[str, Any]:
        """Run the tests against the developer's latest fix."""
        self.runs += 1
        if self.runs == 1:
            raise TestFailure("test_parser.py::test_empty_input failed")
        return {"passed": 42, "fix": context.stack.latest_result("developer")}


def main(url: str = "sqlite:///stagetrail.db") -> list[UUID]:
    """Record one supervised review and print how it went."""
    time = SimulatedTime()
    with Engine(url) as engine:
        sup = engine.supervisor(
            retry=RetryPolicy(max_retries=3, delay=10, backoff=2),
            breaker=CircuitBreaker(fail_max=3, reset_timeout=300),
            clock=time.clock,
            sleep=time.sleep,
        )
        run = engine.start_run(PIPELINE, params={"card": "C-77"}, labels={"example": "recipes"})
        sup.execute(run, "project_analysis", lambda: {"project_type": "python"})
        sup.execute(run, "code_review", lambda: {"critical": 31, "files": ["vendor/"]})
        run.rollback(steps=1, reason="the review ran on a stale branch")
        stages: dict[str, Callable[[StageContext], Any]] = {
            "code_review": lambda context: {"critical": 2, "files": ["parser.py", "lexer.py"]},
            "developer": Developer(),
            "testing": Tests(),
        }
        try:
            sup.drive(run, stages)
        except CircuitOpen as opened:  # three broken builds in a row: stop calling the build
            print(f"breaker open: {opened.reason}; waiting {opened.retry_after:.0f} s")
            time.sleep(opened.retry_after)
            sup.drive(run, stages)  # the trial build succeeds and closes the breaker
        stack = engine.project(run.id, StateStack)
        print(f"run {run.id} ended {run.status} in state {run.state}")
        print(f"stack depth {stack.depth}, the review used: {stack.latest_result('code_review')}")
        return [run.id]


if __name__ == "__main__":
    main(*sys.argv[1:2])
