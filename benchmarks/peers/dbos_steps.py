"""DBOS: ``@DBOS.workflow`` + ``@DBOS.step`` on a SQLite system database.

Two variants. ``retry``: the step retries itself (``retries_allowed``), so a
failed attempt leaves no row. ``loop``: the step does not retry; the workflow
catches its error and calls it again, so every attempt is a step row (the
failures with their error).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

from benchmarks.peers.workload import STAGES, StageError, attempt

_tries: Counter[tuple[str, str]] = Counter()


@DBOS.step(retries_allowed=True, max_attempts=3, interval_seconds=0.0, backoff_rate=1.0)
def retried_stage(stage: str) -> dict[str, Any]:
    """A stage whose failures DBOS retries inside the step."""
    key = (DBOS.workflow_id or "", stage)
    _tries[key] += 1  # nothing durable counts attempts that leave no row
    return attempt(stage, _tries[key])


@DBOS.step()
def one_attempt(stage: str, number: int) -> dict[str, Any]:
    """One attempt of a stage; a failure is recorded as the step's error."""
    return attempt(stage, number)


@DBOS.workflow()
def review_retry() -> str:
    """The workload with step-level retries."""
    for stage in STAGES:
        retried_stage(stage)
    return "succeeded"


@DBOS.workflow()
def review_loop() -> str:
    """The workload with a workflow-level loop that keeps every failed attempt."""
    for stage in STAGES:
        number = 0
        while True:
            number += 1
            try:
                one_attempt(stage, number)
            except StageError:
                continue
            break
    return "succeeded"


class DbosSteps:
    """DBOS on a SQLite system database, in the ``retry`` or ``loop`` variant."""

    def __init__(self, path: Path, variant: str) -> None:
        self.name = f"DBOS ({variant})"
        self.keeps_failures = variant == "loop"
        self.workflow = review_loop if variant == "loop" else review_retry
        DBOS(config={"name": "stagetrail-bench", "system_database_url": f"sqlite:///{path}",
                     "log_level": "ERROR"})  # fmt: skip
        DBOS.launch()

    def record(self, runs: int) -> list[Any]:
        """One workflow per run, each step durable before the next."""
        ids = []
        for _ in range(runs):
            workflow_id = uuid.uuid4().hex
            with SetWorkflowID(workflow_id):
                self.workflow()
            ids.append(workflow_id)
        return ids

    def history(self, run_id: Any) -> list[Any]:
        """The workflow's steps (`DBOS.list_workflow_steps`)."""
        return list(DBOS.list_workflow_steps(run_id))

    def state_at(self, run_id: Any, record: int) -> Any:
        """No point-in-time API: the steps listed, cut after the `record`-th."""
        return self.history(run_id)[:record]

    def failures_visible(self, run_id: Any) -> bool:
        """Whether a step row carries an error."""
        return any(step.get("error") is not None for step in self.history(run_id))

    def close(self) -> None:
        """Shut DBOS down (it is a process-wide singleton)."""
        DBOS.destroy(destroy_registry=False)
