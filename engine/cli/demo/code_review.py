"""A code-review pipeline: analysis, review, a developer/testing loop, done.

Run it with ``python -m engine.cli.demo.code_review [STORE_URL]``.
"""

from __future__ import annotations

import sys

from engine import Engine, Pipeline, Run

REVIEW = Pipeline(
    "code-review",
    initial="project_analysis",
    transitions=[
        ("project_analysis", "completed", "code_review"),
        ("code_review", "completed", "developer"),
        ("developer", "failed", "developer"),
        ("developer", "completed", "testing"),
        ("testing", "failed", "developer"),
        ("testing", "completed", "done"),
        ("*", "aborted", "aborted"),
    ],
    final=["done", "aborted"],
)


class BuildException(Exception):
    """The developer stage's build broke."""


class TestFailure(Exception):
    """The testing stage found failing tests."""

    __test__ = False  # not a pytest test class


def record_review(
    engine: Engine, card: str, *, build_failures: int = 0, test_failures: int = 0
) -> Run:
    """Record one review of `card`: the build and the tests fail as often as asked."""
    run = engine.start_run(REVIEW, params={"card": card}, labels={"example": "code-review"})
    run.stage_started("project_analysis")
    run.stage_completed("project_analysis", {"project_type": "python"}, duration=5.2)
    run.stage_completed("code_review", {"critical": 2 + build_failures}, duration=31.0)
    for round_ in range(test_failures + 1):
        _develop(run, build_failures if round_ == 0 else 0)
        run.stage_started("testing")
        if round_ < test_failures:
            run.stage_failed(
                "testing", TestFailure("test_parser.py::test_empty failed"), duration=9.5
            )
    run.stage_completed("testing", {"passed": 42}, duration=12.0)
    run.finish("succeeded")
    return run


def _develop(run: Run, failures: int) -> None:
    for attempt in range(failures):
        run.stage_started("developer")
        run.stage_failed(
            "developer", BuildException(f"compile error #{attempt + 1}"), duration=40.0
        )
    run.stage_started("developer")
    run.stage_completed("developer", {"changed_files": 3}, duration=55.0)


def record_abandoned(engine: Engine, card: str, *, failures: int = 3) -> Run:
    """Record a review whose build keeps failing until it is aborted."""
    run = engine.start_run(REVIEW, params={"card": card}, labels={"example": "code-review"})
    run.stage_completed("project_analysis", {"project_type": "rust"}, duration=4.0)
    run.stage_completed("code_review", {"critical": 9}, duration=40.0)
    for attempt in range(failures):
        run.stage_failed("developer", BuildException(f"linker error #{attempt + 1}"), duration=60.0)
    run.stage_failed("developer", "giving up after repeated build failures", outcome="aborted")
    run.finish("failed", reason=f"build failed {failures} times")
    return run


def record_all(engine: Engine) -> list[Run]:
    """The demo's runs: a clean review, one with retries, one abandoned."""
    return [
        record_review(engine, "C-41"),
        record_review(engine, "C-42", build_failures=2, test_failures=1),
        record_abandoned(engine, "C-43"),
    ]


if __name__ == "__main__":
    with Engine(sys.argv[1] if len(sys.argv) > 1 else None) as main_engine:
        for recorded in record_all(main_engine):
            print(recorded)
