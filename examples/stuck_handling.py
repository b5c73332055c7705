"""A progress controller: continue, stuck or partial, and a stuck handler in the table.

Follows design 002 ("Supervisor-Level Progress Controller & Stuck Handler"): a
coder and a verifier each report what they saw in a ``ProgressObserved`` of
their own (changed files; test and diagnostics signatures, whether the
functional goal is met). The supervisor folds them into ``ProgressState`` and,
before each step, decides to continue or to route the run to the
``stuck_handler`` stage (the "snitch") through the table's
``("*", "stuck", "stuck_handler")`` and ``("*", "partial", "stuck_handler")``
rows. The snitch writes a diagnosis note for a human. The same loop ends
``aborted_stuck`` under ``ProgressPolicy.strict()`` and ``done_partial`` under
``ProgressPolicy.lenient()``, since the functional goal is met.

Run it from the repository root: ``python examples/stuck_handling.py [STORE_URL]``
(default ``sqlite:///stagetrail.db``, the store ``stagetrail show`` reads).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any
from uuid import UUID

from engine import Engine, Outcome, Pipeline, ProgressPolicy, StageContext
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
        ("stuck_handler", "completed", "reported"),
    ],
    final=["done", "reported"],
)


def coder(context: StageContext) -> dict[str, Any]:
    """Fix the parser in two steps; after that it finds nothing more to change."""
    changed = ["parser.py", "lexer.py"] if context.attempt <= 2 else []
    context.run.observe_progress(changed)
    return {"step": context.attempt, "changed": changed}


def verifier(context: StageContext) -> Outcome:
    """Run the tests and mypy: the tests pass from step 2, two mypy errors never go."""
    failing = "" if context.attempt >= 2 else "test_parser.py::test_comments FAILED"
    diagnostics = "mypy: 2 errors in parser.py"
    context.run.observe_progress(
        test_signature=failing, diagnostics_signature=diagnostics, functional_ok=not failing
    )
    return Outcome("checks_failing", {"tests": failing or "passed", "diagnostics": diagnostics})


def snitch(context: StageContext) -> dict[str, Any]:
    """Explain why the run stopped, for a human to follow up."""
    top = context.stack.top  # the stuck or partial outcome: its result is the verdict's reason
    assert top is not None
    verdict: Any = top.result
    progress = context.progress
    context.run.note(
        "diagnosis",
        f"no change since step {progress.last_progress_step} of {verdict['steps']} "
        f"({verdict['rule']}); left to fix by hand: {verdict['last_diagnostics_signature']}",
    )
    return {"ticket": f"AGENT-{progress.total_steps}", "rule": verdict["rule"]}


STAGES: dict[str, Callable[[StageContext], Any]] = {
    "coder": coder,
    "verifier": verifier,
    "stuck_handler": snitch,
}


def loop(engine: Engine, profile: str, policy: ProgressPolicy) -> UUID:
    """Drive the coder/verifier loop under `policy`; print how it ended."""
    time = SimulatedTime()
    sup = engine.supervisor(progress=policy, clock=time.clock, sleep=time.sleep)
    run = engine.start_run(AGENT, params={"goal": "parse comments", "profile": profile})
    sup.drive(run, STAGES)
    notes = [e.value for e in engine.events(run.id) if isinstance(e, NoteAdded)]
    print(f"{profile}: run {run.id} ended {run.status} in state {run.state}")
    print(f"  diagnosis: {notes[-1]}")
    return run.id


def main(url: str = "sqlite:///stagetrail.db") -> list[UUID]:
    """The same loop under the strict and the lenient profile."""
    with Engine(url) as engine:
        return [
            loop(engine, "strict", ProgressPolicy.strict()),
            loop(engine, "lenient", ProgressPolicy.lenient()),
        ]


if __name__ == "__main__":
    main(*sys.argv[1:2])
