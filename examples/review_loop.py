"""A review loop in one file: a pipeline, a supervised run with retries, a custom
projection, and the run read back at an earlier point.

Run it from the repository root: ``python examples/review_loop.py [STORE_URL]``
(default ``memory://``). The pipelines ``stagetrail demo`` records live in the
package, in ``engine/cli/demo/``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from engine import Engine, Pipeline, RetryPolicy, StageContext
from events import StageFailed
from projections import Projection, StateStack, on

REVIEW = Pipeline(
    "review-loop",
    initial="write",
    transitions=[
        ("write", "completed", "review"),
        ("write", "failed", "write"),
        ("review", "completed", "done"),
        ("review", "changes_requested", "write"),
        ("*", "aborted", "aborted"),
    ],
    final=["done", "aborted"],
)


class FailuresByStage(Projection[dict[str, int]]):
    """How many attempts of each stage failed."""

    name = "failures_by_stage"

    def initial(self) -> dict[str, int]:
        """No failures yet."""
        return {}

    @on(StageFailed)
    def failed(self, state: dict[str, int], event: StageFailed) -> dict[str, int]:
        """Count one more failure of the event's stage."""
        return {**state, event.stage: state.get(event.stage, 0) + 1}


class FlakyWriter:
    """A writer whose first draft crashes, then succeeds."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, context: StageContext) -> dict[str, int]:
        """Write a draft; the first call raises."""
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("model endpoint timed out")
        return {"draft": self.calls}


def main(url: str = "memory://") -> dict[str, int]:
    """Drive one run to `done` and return its failures by stage."""
    with Engine(url) as engine:
        sup = engine.supervisor(retry=RetryPolicy(max_retries=2, delay=0), sleep=lambda s: None)
        stages: dict[str, Callable[[StageContext], Any]] = {
            "write": FlakyWriter(),
            "review": lambda context: {"approved": True},
        }
        run = sup.drive(engine.start_run(REVIEW, params={"topic": "docs"}), stages)
        failures: dict[str, int] = engine.project(run.id, FailuresByStage)
        first_outcome = engine.project(run.id, StateStack, at=3).top
        print(f"run {run.id} ended {run.status} in state {run.state}")
        print(f"failures by stage: {failures}")
        if first_outcome is not None:
            print(
                f"after event 3 the stack's top was {first_outcome.stage} {first_outcome.outcome}"
            )
        return failures


if __name__ == "__main__":
    main(*sys.argv[1:2])
