"""stagetrail: outcomes recorded through `Run` by hand, or driven by `Supervisor.drive`."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from benchmarks.peers.workload import STAGES, attempt
from engine import Engine, Pipeline, RetryPolicy
from engine.supervise import StageContext
from projections import StateStack

REVIEW = Pipeline(
    "review",
    initial=STAGES[0],
    transitions=[
        *((here, "completed", there) for here, there in itertools.pairwise(STAGES)),
        (STAGES[-1], "completed", "done"),
        ("developer", "failed", "developer"),
        ("testing", "failed", "testing"),
    ],
    final=["done"],
)


class Stagetrail:
    """stagetrail on a SQLite file at its default durability (WAL, synchronous=FULL)."""

    keeps_failures = True

    def __init__(
        self, path: Path, variant: str, layout: str | None = None, **supervisor: Any
    ) -> None:
        self.variant = variant
        grouped = "" if supervisor.get("group_commits", True) else ", group_commits=False"
        self.name = f"stagetrail ({variant}{grouped})"
        query = "" if layout is None else f"?layout={layout}"  # a new store's events layout
        self.engine = Engine(f"sqlite:///{path}{query}")
        self.supervisor = self.engine.supervisor(
            retry=RetryPolicy(max_retries=3, delay=0.0, jitter=0.0, timeout=None), **supervisor
        )
        self.stages = {stage: self._stage(stage) for stage in STAGES}

    @staticmethod
    def _stage(stage: str) -> Any:
        return lambda context: attempt(stage, context.attempt)

    def record(self, runs: int) -> list[Any]:
        """Record `runs` runs, by hand through `Run` or through `Supervisor.drive`."""
        one = self._supervised if self.variant == "Supervisor.drive" else self._by_hand
        return [one() for _ in range(runs)]

    def _supervised(self) -> Any:
        run = self.engine.start_run(REVIEW)
        self.supervisor.drive(run, self.stages)
        return run.id

    def _by_hand(self) -> Any:
        run = self.engine.start_run(REVIEW)
        for stage in STAGES:
            while True:
                run.stage_started(stage)
                began = time.perf_counter()
                try:
                    result = attempt(stage, run.machine.next_attempt(stage))
                except Exception as error:
                    run.stage_failed(stage, error, duration=time.perf_counter() - began)
                    continue
                run.stage_completed(stage, result, duration=time.perf_counter() - began)
                break
        run.finish("succeeded")
        return run.id

    def history(self, run_id: Any) -> list[Any]:
        """Every event of the run (`engine.events`)."""
        return self.engine.events(run_id)

    def state_at(self, run_id: Any, record: int) -> Any:
        """Time travel: the state stack after event `record` (`engine.project(at=)`)."""
        return self.engine.project(run_id, StateStack, at=record)

    def failures_visible(self, run_id: Any) -> bool:
        """Failed attempts are `StageFailed` events."""
        return any(type(e).__name__ == "StageFailed" for e in self.history(run_id))

    def close(self) -> None:
        """Close the engine's store."""
        self.engine.close()


__all__ = ["REVIEW", "StageContext", "Stagetrail"]
