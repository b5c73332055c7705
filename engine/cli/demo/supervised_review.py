"""A supervised code review: retries with a policy adapted to the review, and a breaker.

The developer stage reads the review's result from the state stack, fails its
build twice and succeeds on an adapted retry policy. In a second run the build
keeps failing: the breaker opens, fails fast while open, and closes again after
a successful trial once its reset timeout has passed.

Run it with ``python -m engine.cli.demo.supervised_review [STORE_URL]``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from engine import (
    CircuitBreaker,
    CircuitOpen,
    Engine,
    Outcome,
    RetryPolicy,
    Run,
    StageContext,
    Supervisor,
)
from engine.cli.demo.code_review import REVIEW, BuildException
from engine.cli.demo.simulated import SimulatedTime

BREAKER = CircuitBreaker(fail_max=3, reset_timeout=600)


def adapt_developer(context: StageContext) -> RetryPolicy:
    """More retries and a longer timeout when the review found more than five critical issues."""
    review: Any = context.stack.latest_result("code_review")
    if review["critical"] > 5:
        return RetryPolicy(max_retries=5, delay=30, backoff=2, max_delay=600, timeout=1800)
    return RetryPolicy(max_retries=1, delay=10, timeout=600)


class Build:
    """A stand-in for a build that breaks `failures` times, then passes."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self, context: StageContext) -> dict[str, Any]:
        """Build the files the review pointed at."""
        review: Any = context.stack.latest_result("code_review")
        self.calls += 1
        if self.calls <= self.failures:
            raise BuildException(f"compile error in {review['files'][0]} (try {self.calls})")
        return {"changed_files": len(review["files"]), "attempt": context.attempt}


def stages(critical: int, build: Build) -> dict[str, Any]:
    """The stage functions of one review."""
    files = ["parser.py", "lexer.py", "ast.py"][: 1 + critical % 3]
    return {
        "project_analysis": lambda context: {"project_type": "python"},
        "code_review": lambda context: {"critical": critical, "files": files},
        "developer": build,
        "testing": lambda context: Outcome("completed", {"passed": 42}),
    }


def supervisor(engine: Engine, time: SimulatedTime) -> Supervisor:
    """The review's supervisor: adapted developer policy, breaker, simulated time."""
    return engine.supervisor(
        retry=RetryPolicy(max_retries=2, delay=5),
        policies={"developer": adapt_developer},
        breaker=BREAKER,
        sleep=time.sleep,
        clock=time.clock,
    )


def record_adapted_retries(engine: Engine, card: str = "C-51") -> Run:
    """A review with 7 critical issues: the build fails twice, then passes."""
    run = engine.start_run(REVIEW, params={"card": card}, labels={"example": "supervised-review"})
    supervisor(engine, SimulatedTime()).drive(run, stages(7, Build(failures=2)))
    return run


def record_breaker_cycle(engine: Engine, card: str = "C-52") -> Run:
    """A review whose build breaks until the breaker opens; after its timeout a trial passes."""
    run = engine.start_run(REVIEW, params={"card": card}, labels={"example": "supervised-review"})
    time = SimulatedTime()
    sup, work = supervisor(engine, time), stages(9, Build(failures=3))
    try:
        sup.drive(run, work)
    except CircuitOpen as opened:
        with contextlib.suppress(CircuitOpen):  # an impatient caller is refused, on record
            sup.drive(run, work)
        time.sleep(opened.retry_after + 1)
        sup.drive(run, work)
    return run


def record_all(engine: Engine) -> list[Run]:
    """Both supervised reviews."""
    return [record_adapted_retries(engine), record_breaker_cycle(engine)]


if __name__ == "__main__":
    with Engine(sys.argv[1] if len(sys.argv) > 1 else None) as main_engine:
        for recorded in record_all(main_engine):
            print(recorded)
