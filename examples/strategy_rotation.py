"""One pipeline state per issue: a failed strategy leads to the next strategy.

Follows design 001 ("Comprehensive pipeline state management across agent
operations"): instead of a ``PipelineState`` object with ``strategies_tried``
and ``failure_patterns`` lists, every attempt is an event. A strategy that
fails records the outcome ``strategy_failed`` (``RetryPolicy(outcomes=...)``),
and the table sends it to the next strategy (syntax_fix → refactor →
simplify); a flaky model call is retried in place. Each strategy tried is a
``strategy`` note, and the next issue of the same repository reads the failure
patterns learned so far to start with a strategy that has not failed.

Run it from the repository root: ``python examples/strategy_rotation.py [STORE_URL]``
(default ``sqlite:///stagetrail.db``, the store ``stagetrail show`` reads).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from engine import Engine, Outcome, Pipeline, RetryPolicy, StageContext
from engine.cli.demo.simulated import SimulatedTime
from events import NoteAdded
from projections import Failures, StageResults

STRATEGIES = ["syntax_fix", "refactor", "simplify"]
"""The strategies in the order design 001's ``get_next_strategy`` tries them."""

PIPELINE = Pipeline(
    "issue-pipeline",
    initial="plan",
    transitions=[
        *[("plan", strategy, strategy) for strategy in STRATEGIES],
        *[(strategy, "completed", "complete") for strategy in STRATEGIES],
        *[(strategy, "failed", strategy) for strategy in STRATEGIES],  # a flaky call: retry
        *zip(STRATEGIES, ["strategy_failed"] * 3, [*STRATEGIES[1:], "failed"], strict=True),
    ],
    final=["complete", "failed"],
)


class StrategyFailed(Exception):
    """The strategy ran, but the tests still fail: try the next one."""


def plan(context: StageContext) -> Outcome:
    """Pick the first strategy that has not failed on this repository before.

    The context's engine reads the pipeline's persistent `FailurePatterns`: what
    every earlier run of the pipeline learned, not only this run.
    """
    learned: Failures = context.engine.projections.get("failure_patterns", PIPELINE.name)
    failed = {stage for stage, kind, _ in learned.signatures if kind == "StrategyFailed"}
    strategy = next((s for s in STRATEGIES if s not in failed), STRATEGIES[-1])
    return Outcome(strategy, {"skipped": sorted(failed), "strategy": strategy})


def strategy(name: str, works: set[str], flaky: set[str]) -> Callable[[StageContext], Any]:
    """A strategy stage: noted once, flaky on its first call if asked, then it works or not."""

    def attempt(context: StageContext) -> dict[str, Any]:
        if context.attempt == 1:
            context.run.note("strategy", name)
            if name in flaky:
                raise ConnectionError("model endpoint timed out")
        if name not in works:
            raise StrategyFailed(f"{name}: 3 tests still fail in test_parser.py")
        return {"strategy": name, "tests": "passed"}

    return attempt


def fix_issue(engine: Engine, issue: str, works: set[str], flaky: set[str]) -> UUID:
    """Drive one issue through the strategies; return its run id."""
    time = SimulatedTime()
    sup = engine.supervisor(
        retry=RetryPolicy(max_retries=2, delay=5, outcomes={StrategyFailed: "strategy_failed"}),
        clock=time.clock,
        sleep=time.sleep,
    )
    stages = {"plan": plan} | {s: strategy(s, works, flaky) for s in STRATEGIES}
    run = sup.drive(engine.start_run(PIPELINE, params={"issue": issue}), stages)
    tried = [e.value for e in engine.events(run.id) if isinstance(e, NoteAdded)]
    attempts = sum(len(engine.project(run.id, StageResults).attempts(s)) for s in STRATEGIES)
    print(f"{issue}: run {run.id} ended {run.status} in state {run.state}")
    print(f"  strategies tried: {tried} (attempts: {attempts})")
    return run.id


def main(url: str = "sqlite:///stagetrail.db") -> list[UUID]:
    """Fix two issues of one repository; the second learns from the first."""
    with Engine(url) as engine:
        first = fix_issue(engine, "ISSUE-101", works={"simplify"}, flaky={"syntax_fix"})
        second = fix_issue(engine, "ISSUE-102", works={"simplify"}, flaky=set())
        learned: Failures = engine.projections.get("failure_patterns", PIPELINE.name)
        print(f"failure patterns learned: {learned.by_error_type}")
        return [first, second]


if __name__ == "__main__":
    main(*sys.argv[1:2])
