"""The write side and the shell of stagetrail: pipelines, the store, runs, the CLI."""

from __future__ import annotations

from engine.breaker import Circuit, CircuitBreaker, CircuitStates
from engine.context import StageContext
from engine.engine import Engine
from engine.errors import (
    AttemptError,
    AttemptTimeout,
    CircuitOpen,
    ConcurrencyConflict,
    InvalidArgument,
    InvalidFork,
    InvalidRollback,
    InvalidTransition,
    PipelineError,
    RuleViolation,
    RunAlreadyExists,
    RunAlreadyFinished,
    RunNotFound,
    RunStopped,
    StageGaveUp,
    StageNotDriven,
    StoreError,
    TaskError,
)
from engine.machine import RunState
from engine.pipeline import Pipeline
from engine.policies import Outcome, RetryPolicy, Spent
from engine.run import Run
from engine.store import Store
from engine.supervisor import Supervisor
from engine.verify import Problem, VerifyReport
from events import InvalidEvent, InvalidPayload, StagetrailError
from projections import ProgressPolicy, ProjectionError, RunSummary

__all__ = [
    "AttemptError",
    "AttemptTimeout",
    "Circuit",
    "CircuitBreaker",
    "CircuitOpen",
    "CircuitStates",
    "ConcurrencyConflict",
    "Engine",
    "InvalidArgument",
    "InvalidEvent",
    "InvalidFork",
    "InvalidPayload",
    "InvalidRollback",
    "InvalidTransition",
    "Outcome",
    "Pipeline",
    "PipelineError",
    "Problem",
    "ProgressPolicy",
    "ProjectionError",
    "RetryPolicy",
    "RuleViolation",
    "Run",
    "RunAlreadyExists",
    "RunAlreadyFinished",
    "RunNotFound",
    "RunState",
    "RunStopped",
    "RunSummary",
    "Spent",
    "StageContext",
    "StageGaveUp",
    "StageNotDriven",
    "StagetrailError",
    "Store",
    "StoreError",
    "Supervisor",
    "TaskError",
    "VerifyReport",
]
