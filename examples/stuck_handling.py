"""A progress controller: continue, stuck or partial, and a stuck handler in the table.

Follows design 002 ("Supervisor-Level Progress Controller & Stuck Handler"): a
coder and a verifier each report what they saw in a ``ProgressObserved`` of
their own (changed files; test and diagnostics signatures, whether the
functional goal is met). The supervisor folds them into ``ProgressState`` and,
before each step, decides to continue or to route the run to the
``stuck_handler`` stage (the "snitch") through the table's
``("*", "stuck", "stuck_handler")``, ``("*", "partial", "stuck_handler")`` and
``("*", "over_budget", "stuck_handler")`` rows. The snitch writes a diagnosis
note for a human. The same loop ends ``aborted_stuck`` under
``ProgressPolicy.strict()`` and ``done_partial`` under
``ProgressPolicy.lenient()``, since the functional goal is met; a verifier
that finds a new failure every time (a misconfigured graph) is stopped by
``MAX_STEPS``; a run that spends its budget is stopped by its
``SpendingLimit``. All four reach the snitch. The agent offers a planner node
too, which this pipeline does not use: ``drive`` accepts it and never calls it.

Run it from the repository root: ``python examples/stuck_handling.py [STORE_URL]``
(default ``sqlite:///stagetrail.db``, the store ``stagetrail show`` reads).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from engine import Engine, Outcome, Pipeline, ProgressPolicy, SpendingLimit, StageContext
from engine.cli.demo.simulated import SimulatedTime
from events import NoteAdded

AGENT = Pipeline(
    "coder-verifier",
    initial="coder",
    transitions=[
        ("coder", "completed", "verifier"),
        ("verifier", "checks_failing", "coder"),
        ("verifier", "checks_pass", "done"),
        ("*", "stuck", "stuck_handler"),
        ("*", "partial", "stuck_handler"),
        ("*", "over_budget", "stuck_handler"),
        ("stuck_handler", "completed", "reported"),
    ],
    final=["done", "reported"],
)
MAX_STEPS = 12
STEP_COST = 0.30  # usd per coder step, when the run has a budget


class Agent:
    """The agent's nodes. `misconfigured`: the verifier finds a new failure every time."""

    def __init__(self, misconfigured: bool = False) -> None:
        self.misconfigured = misconfigured

    def planner(self, context: StageContext) -> dict[str, Any]:
        """A node of the agent's other graphs: this pipeline has no planner state."""
        raise AssertionError("the coder-verifier pipeline never plans")

    def coder(self, context: StageContext) -> dict[str, Any]:
        """Fix the parser in two steps; after that it finds nothing more to change."""
        changed = ["parser.py", "lexer.py"] if context.attempt <= 2 or self.misconfigured else []
        context.run.observe_progress(changed)
        if context.params.get("budget"):
            context.run.spend(STEP_COST)
        return {"step": context.attempt, "changed": changed}

    def verifier(self, context: StageContext) -> Outcome:
        """Run the tests and mypy: the tests pass from step 2, two mypy errors never go."""
        failing = "" if context.attempt >= 2 else "test_parser.py::test_comments FAILED"
        if self.misconfigured:
            failing = f"test_parser.py::test_case_{context.attempt} FAILED"
        diagnostics = "mypy: 2 errors in parser.py"
        context.run.observe_progress(
            test_signature=failing, diagnostics_signature=diagnostics, functional_ok=not failing
        )
        return Outcome("checks_failing", {"tests": failing or "passed", "diagnostics": diagnostics})

    def snitch(self, context: StageContext) -> dict[str, Any]:
        """Explain why the run stopped, for a human to follow up."""
        top = context.stack.top  # the routed outcome: its result is the verdict's reason
        assert top is not None
        verdict: Any = top.result
        progress = context.progress
        left = progress.last_diagnostics_signature or "nothing"
        context.run.note(
            "diagnosis",
            f"{verdict['rule']} after {progress.total_steps} steps, the last change at step "
            f"{progress.last_progress_step}; left to fix by hand: {left}",
        )
        return {"ticket": f"AGENT-{progress.total_steps}", "rule": verdict["rule"]}

    def stages(self) -> dict[str, Callable[[StageContext], Any]]:
        """Every node the agent offers (the planner included)."""
        return {
            "planner": self.planner,
            "coder": self.coder,
            "verifier": self.verifier,
            "stuck_handler": self.snitch,
        }


def loop(engine: Engine, profile: str, agent: Agent, **settings: Any) -> UUID:
    """Drive the coder/verifier loop under the supervisor's `settings`; print how it ended."""
    time = SimulatedTime()
    sup = engine.supervisor(clock=time.clock, sleep=time.sleep, **settings)
    budget = "budget" in settings
    params = {"goal": "parse comments", "profile": profile, "budget": budget}
    run = engine.start_run(AGENT, params=params)
    sup.drive(run, agent.stages())
    notes = [e.value for e in engine.events(run.id) if isinstance(e, NoteAdded)]
    print(f"{profile}: run {run.id} ended {run.status} in state {run.state}")
    print(f"  diagnosis: {notes[-1]}")
    return run.id


def main(url: str = "sqlite:///stagetrail.db") -> list[UUID]:
    """The same loop under the strict and the lenient profile, MAX_STEPS and a budget."""
    with Engine(url) as engine:
        return [
            loop(engine, "strict", Agent(), progress=ProgressPolicy.strict()),
            loop(engine, "lenient", Agent(), progress=ProgressPolicy.lenient()),
            loop(engine, "max-steps", Agent(True), progress=ProgressPolicy(max_steps=MAX_STEPS)),
            loop(engine, "budget", Agent(True), budget=SpendingLimit(limit=1.0, unit="usd")),
        ]


if __name__ == "__main__":
    main(*sys.argv[1:2])
