"""The function each event class is recorded through: its own ``__init__``'s checks, faster.

Only stagetrail's own event classes are made another way (`events.values.init_function`):
they are declared here, and a test pins that each keeps to what that function replicates (the
``__init__`` attrs generates, no ``cache_hash``, validator or hook). Any other class (a
user's event kind given to ``Run.record``) is called as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from events.base import Event
from events.checkpoint import CheckpointSaved, CheckpointsRemoved, WritesSaved
from events.run import BudgetSpent, NoteAdded, RunDeleted, RunFinished, RunStarted, StateRolledBack
from events.stage import (
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    ProgressObserved,
    RetryScheduled,
    StageCompleted,
    StageFailed,
    StageStarted,
)
from events.task import TaskAdded, TaskCompleted, TaskFailed, TaskStarted
from events.values import init_function

E = TypeVar("E", bound=Event)

BUILT_IN_EVENTS: frozenset[type[Event]] = frozenset(
    {
        BudgetSpent,
        CheckpointSaved,
        CheckpointsRemoved,
        CircuitClosed,
        CircuitHalfOpened,
        CircuitOpened,
        NoteAdded,
        ProgressObserved,
        RetryScheduled,
        RunDeleted,
        RunFinished,
        RunStarted,
        StageCompleted,
        StageFailed,
        StageStarted,
        StateRolledBack,
        TaskAdded,
        TaskCompleted,
        TaskFailed,
        TaskStarted,
        WritesSaved,
    }
)
"""stagetrail's own event classes: each is recorded through `init_function`."""


def constructor(kind: type[E]) -> Callable[..., E]:
    """What makes a `kind` event from its fields, as ``kind(**fields)`` does: for one of
    `BUILT_IN_EVENTS` its ``__init__`` as a function (no frozen ``__setattr__`` per field),
    else `kind` itself."""
    made: Callable[..., Any] = init_function(kind) if kind in BUILT_IN_EVENTS else kind
    return made
