"""The write side and the shell of stagetrail: pipelines, the store, runs, the CLI."""

from __future__ import annotations

from engine.engine import Engine
from engine.errors import (
    AttemptError,
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
    StoreError,
    TaskError,
)
from engine.machine import RunState
from engine.pipeline import Pipeline
from engine.run import Run
from engine.store import Store
from engine.verify import Problem, VerifyReport
from events import InvalidEvent, InvalidPayload, StagetrailError
from projections import ProgressPolicy, ProjectionError, RunSummary

__all__ = [
    "AttemptError",
    "ConcurrencyConflict",
    "Engine",
    "InvalidArgument",
    "InvalidEvent",
    "InvalidFork",
    "InvalidPayload",
    "InvalidRollback",
    "InvalidTransition",
    "Pipeline",
    "PipelineError",
    "Problem",
    "ProgressPolicy",
    "ProjectionError",
    "RuleViolation",
    "Run",
    "RunAlreadyExists",
    "RunAlreadyFinished",
    "RunNotFound",
    "RunState",
    "RunSummary",
    "StagetrailError",
    "Store",
    "StoreError",
    "TaskError",
    "VerifyReport",
]
