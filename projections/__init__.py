"""The read side of stagetrail: projections folded on demand, at any point, or persistently.

No imports from `engine` live here: the engine hands stores and events in.
"""

from __future__ import annotations

from typing import Any

from projections._views import ProjectionReplaced
from projections.base import SCOPES, Projection, as_projection, on
from projections.errors import (
    ProjectionError,
    ProjectionNameTaken,
    ProjectionStateError,
    UnknownProjection,
)
from projections.failures import FailurePatterns, Failures
from projections.persistent import Projections, ProjectionStatus
from projections.progress import Progress, ProgressPolicy, ProgressState, Verdict
from projections.results import Attempt, Results, Retries, RetryCounts, StageResults
from projections.run_index import RUNNING, RunIndex, RunSummary
from projections.stack import Frame, Stack, StateStack
from projections.tasks import Task, Tasks, TaskTable
from projections.timetravel import SNAPSHOT_INTERVAL, TimeTravel

BUILT_INS: tuple[type[Projection[Any]], ...] = (
    FailurePatterns,
    ProgressState,
    RetryCounts,
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
    "Progress",
    "ProgressPolicy",
    "ProgressState",
    "Projection",
    "ProjectionError",
    "ProjectionNameTaken",
    "ProjectionReplaced",
    "ProjectionStateError",
    "ProjectionStatus",
    "Projections",
    "RUNNING",
    "Results",
    "Retries",
    "RetryCounts",
    "RunIndex",
    "RunSummary",
    "SCOPES",
    "SNAPSHOT_INTERVAL",
    "Stack",
    "StageResults",
    "StateStack",
    "Task",
    "TaskTable",
    "Tasks",
    "TimeTravel",
    "UnknownProjection",
    "Verdict",
    "as_projection",
    "on",
]
