"""The read side of stagetrail: projections folded on demand, at any point, or persistently.

Pure code only: folds, the built-in projections and the projection protocol. No
database code and no imports from `engine` live here: the engine's store runs
these folds persistently (`engine.readside.persistent`) and keeps their snapshots.
"""

from __future__ import annotations

from typing import Any

from projections.base import SCOPES, Projection, as_projection, on
from projections.errors import (
    ProjectionError,
    ProjectionNameTaken,
    ProjectionReplaced,
    ProjectionStateError,
    UnknownProjection,
)
from projections.failures import FailurePatterns, Failures
from projections.progress import Progress, ProgressLimits, ProgressState, Verdict
from projections.results import Attempt, Results, Retries, RetryCounts, StageResults
from projections.rounds import Round, Rounds, RoundsTable
from projections.run_index import PAUSED_STATUSES, RUNNING, STATUS_NOTE, RunIndex, RunSummary
from projections.stack import Frame, Stack, StateStack
from projections.tasks import Task, Tasks, TaskTable

BUILT_INS: tuple[type[Projection[Any]], ...] = (
    FailurePatterns,
    ProgressState,
    RetryCounts,
    RoundsTable,
    RunIndex,
    StageResults,
    StateStack,
    TaskTable,
)
"""Every built-in projection class."""

__all__ = [
    "Attempt",
    "BUILT_INS",
    "FailurePatterns",
    "Failures",
    "Frame",
    "PAUSED_STATUSES",
    "Progress",
    "ProgressLimits",
    "ProgressState",
    "Projection",
    "ProjectionError",
    "ProjectionNameTaken",
    "ProjectionReplaced",
    "ProjectionStateError",
    "RUNNING",
    "Results",
    "Retries",
    "RetryCounts",
    "Round",
    "Rounds",
    "RoundsTable",
    "RunIndex",
    "RunSummary",
    "SCOPES",
    "STATUS_NOTE",
    "Stack",
    "StageResults",
    "StateStack",
    "Task",
    "TaskTable",
    "Tasks",
    "UnknownProjection",
    "Verdict",
    "as_projection",
    "on",
]
