"""Plain eventsourcing: one aggregate per run, `Application.save` after every event."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from benchmarks.peers.workload import STAGES, attempt


class Review(Aggregate):
    """A run of the review pipeline as an eventsourcing aggregate."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline, self.stage = pipeline, ""
        self.results: dict[str, Any] = {}
        self.failures, self.status = 0, ""

    @event("StageStarted")
    def start(self, stage: str, attempt: int) -> None:
        """An attempt began."""
        self.stage = stage

    @event("StageCompleted")
    def complete(self, stage: str, attempt: int, result: Any, duration: float) -> None:
        """An attempt succeeded."""
        self.results[stage] = result

    @event("StageFailed")
    def fail(self, stage: str, attempt: int, error: str, error_type: str, duration: float) -> None:
        """An attempt failed."""
        self.failures += 1

    @event("Finished")
    def finish(self, status: str) -> None:
        """The run ended."""
        self.status = status


class PlainEventsourcing:
    """What a team gets from eventsourcing alone, saving each event as it happens."""

    name = "eventsourcing"
    keeps_failures = True

    def __init__(self, path: Path) -> None:
        self.app: Application[Any] = Application(
            env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(path)}
        )

    def record(self, runs: int) -> list[Any]:
        """Save after every event, in the workload's order."""
        return [self._run() for _ in range(runs)]

    def _run(self) -> UUID:
        review, save = Review("review"), self.app.save
        save(review)
        for stage in STAGES:
            number = 0
            while True:
                number += 1
                review.start(stage, number)
                save(review)
                began = time.perf_counter()
                try:
                    result = attempt(stage, number)
                except Exception as error:
                    review.fail(stage, number, str(error), type(error).__name__,
                                time.perf_counter() - began)  # fmt: skip
                    save(review)
                    continue
                review.complete(stage, number, result, time.perf_counter() - began)
                save(review)
                break
        review.finish("succeeded")
        save(review)
        return review.id

    def history(self, run_id: Any) -> list[Any]:
        """Every domain event of the aggregate, decoded."""
        return list(self.app.events.get(run_id))

    def state_at(self, run_id: Any, record: int) -> Any:
        """The aggregate as of its `record`-th event (`repository.get(version=)`)."""
        return self.app.repository.get(run_id, version=record)

    def failures_visible(self, run_id: Any) -> bool:
        """Failed attempts are events of their own."""
        return any(type(e).__name__ == "StageFailed" for e in self.history(run_id))

    def close(self) -> None:
        """Close the application's recorder."""
        self.app.close()
