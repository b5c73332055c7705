"""The read side of stagetrail: projections folded on demand, at any point, or persistently.

Pure code only: folds, the built-in projections and the projection protocol. No
database code and no imports from `engine` live here: the engine's store runs
these folds persistently (`engine.readside.persistent`) and keeps their snapshots.

Each name is imported from its module on first use: a program that folds one
projection does not build the classes of the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from projections.base import (
        SCOPES,
        Folding,
        Projection,
        as_projection,
        folding,
        handled_topics,
        on,
    )
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
    from projections.run_index import (
        PAUSED_STATUSES,
        RUNNING,
        STATUS_NOTE,
        RunIndex,
        RunSummary,
    )
    from projections.stack import Frame, Stack, StateStack
    from projections.tasks import Task, Tasks, TaskTable

    BUILT_INS: tuple[type[Projection[Any]], ...]
    """Every built-in projection class."""

_BUILT_INS = (
    "FailurePatterns",
    "ProgressState",
    "RetryCounts",
    "RoundsTable",
    "RunIndex",
    "StageResults",
    "StateStack",
    "TaskTable",
)

__all__ = [
    "Attempt",
    "BUILT_INS",
    "FailurePatterns",
    "Failures",
    "Folding",
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
    "folding",
    "handled_topics",
    "on",
]

_HOMES = {
    **dict.fromkeys(
        ["SCOPES", "Folding", "Projection", "as_projection", "folding", "handled_topics", "on"],
        "projections.base",
    ),
    **dict.fromkeys(
        [
            "ProjectionError",
            "ProjectionNameTaken",
            "ProjectionReplaced",
            "ProjectionStateError",
            "UnknownProjection",
        ],
        "projections.errors",
    ),
    **dict.fromkeys(["FailurePatterns", "Failures"], "projections.failures"),
    **dict.fromkeys(
        ["Progress", "ProgressLimits", "ProgressState", "Verdict"], "projections.progress"
    ),
    **dict.fromkeys(
        ["Attempt", "Results", "Retries", "RetryCounts", "StageResults"], "projections.results"
    ),
    **dict.fromkeys(["Round", "Rounds", "RoundsTable"], "projections.rounds"),
    **dict.fromkeys(
        ["PAUSED_STATUSES", "RUNNING", "STATUS_NOTE", "RunIndex", "RunSummary"],
        "projections.run_index",
    ),
    **dict.fromkeys(["Frame", "Stack", "StateStack"], "projections.stack"),
    **dict.fromkeys(["Task", "Tasks", "TaskTable"], "projections.tasks"),
}


def __getattr__(name: str) -> Any:
    """A name of `__all__`, imported from its module on first use (then kept here)."""
    if name == "BUILT_INS":
        value: Any = tuple(__getattr__(built_in) for built_in in _BUILT_INS)
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
