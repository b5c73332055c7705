"""The event vocabulary of stagetrail: immutable facts about runs.

No I/O and no imports from `engine` or `projections` live here.
"""

from __future__ import annotations

from events._strict_json import JSON, strict_json
from events._validation import utc_now
from events.base import EVENT_TYPES, Event
from events.checkpoint import CheckpointSaved, CheckpointsRemoved, WritesSaved, task_writes
from events.codec import decode, encode, encode_timed
from events.errors import (
    EventFormatError,
    InvalidEvent,
    InvalidPayload,
    PayloadTooLarge,
    StagetrailError,
)
from events.run import (
    RUN_STATUSES,
    BudgetSpent,
    NoteAdded,
    RunDeleted,
    RunFinished,
    RunStarted,
    StateRolledBack,
)
from events.stage import (
    DECIDED,
    INTERRUPTED,
    CircuitClosed,
    CircuitHalfOpened,
    CircuitOpened,
    ProgressObserved,
    RetryScheduled,
    StageCompleted,
    StageFailed,
    StageStarted,
)
from events.storable import DEFAULT_MAX_EVENT_BYTES
from events.task import TaskAdded, TaskCompleted, TaskFailed, TaskStarted

__all__ = [
    "BudgetSpent",
    "CheckpointSaved",
    "CheckpointsRemoved",
    "CircuitClosed",
    "CircuitHalfOpened",
    "CircuitOpened",
    "DECIDED",
    "DEFAULT_MAX_EVENT_BYTES",
    "EVENT_TYPES",
    "Event",
    "EventFormatError",
    "INTERRUPTED",
    "InvalidEvent",
    "InvalidPayload",
    "JSON",
    "NoteAdded",
    "PayloadTooLarge",
    "ProgressObserved",
    "RUN_STATUSES",
    "RetryScheduled",
    "RunDeleted",
    "RunFinished",
    "RunStarted",
    "StageCompleted",
    "StageFailed",
    "StageStarted",
    "StagetrailError",
    "StateRolledBack",
    "TaskAdded",
    "TaskCompleted",
    "TaskFailed",
    "TaskStarted",
    "WritesSaved",
    "decode",
    "encode",
    "encode_timed",
    "strict_json",
    "task_writes",
    "utc_now",
]
