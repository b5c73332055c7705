"""The write side of stagetrail: pipelines, runs, the engine, and its subsystems.

The core lives in this folder (`engine.engine`, `run`, `machine`, `pipeline`,
`verify`); `store/` persists events, `supervise/` runs stage functions under
policies, `cli/` is the command line, `integrations/` holds framework adapters.
"""

from __future__ import annotations

from engine.engine import Compacted, Engine
from engine.errors import (
    GIVE_UP_CAUSES,
    AttemptError,
    AttemptTimeout,
    CircuitOpen,
    ConcurrencyConflict,
    InvalidArgument,
    InvalidFork,
    InvalidRollback,
    InvalidTransition,
    OutcomeUnknown,
    PipelineError,
    RuleViolation,
    RunAlreadyExists,
    RunAlreadyFinished,
    RunNotFound,
    RunStopped,
    StageGaveUp,
    StageNotDriven,
    StoreError,
    StoreFull,
    StoreReadOnly,
    TaskError,
)
from engine.machine import RunState
from engine.pipeline import Pipeline
from engine.readside import Projections, ProjectionStatus
from engine.run import Run
from engine.store import Store
from engine.supervise import (
    FINISHED,
    Circuit,
    CircuitBreaker,
    CircuitStates,
    Outcome,
    ProgressPolicy,
    RetryPolicy,
    SpendingLimit,
    Spent,
    StageContext,
    Supervisor,
)
from engine.verify import Problem, VerifyReport
from events import InvalidEvent, InvalidPayload, PayloadTooLarge, StagetrailError
from projections import ProjectionError, RunSummary

__all__ = [
    "AttemptError",
    "AttemptTimeout",
    "Circuit",
    "CircuitBreaker",
    "CircuitOpen",
    "CircuitStates",
    "Compacted",
    "ConcurrencyConflict",
    "Engine",
    "FINISHED",
    "GIVE_UP_CAUSES",
    "InvalidArgument",
    "InvalidEvent",
    "InvalidFork",
    "InvalidPayload",
    "InvalidRollback",
    "InvalidTransition",
    "Outcome",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "Pipeline",
    "PipelineError",
    "Problem",
    "ProgressPolicy",
    "ProjectionError",
    "ProjectionStatus",
    "Projections",
    "RetryPolicy",
    "RuleViolation",
    "Run",
    "RunAlreadyExists",
    "RunAlreadyFinished",
    "RunNotFound",
    "RunState",
    "RunStopped",
    "RunSummary",
    "SpendingLimit",
    "Spent",
    "StageContext",
    "StageGaveUp",
    "StageNotDriven",
    "StagetrailError",
    "Store",
    "StoreError",
    "StoreFull",
    "StoreReadOnly",
    "Supervisor",
    "TaskError",
    "VerifyReport",
]
