"""The write side and the shell of stagetrail: pipelines, the store, runs, the CLI."""

from __future__ import annotations

from engine.engine import Engine
from engine.errors import (
    AttemptError,
    ConcurrencyConflict,
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
from events import InvalidEvent, InvalidPayload, StagetrailError

__all__ = [
    "AttemptError",
    "ConcurrencyConflict",
    "Engine",
    "InvalidEvent",
    "InvalidPayload",
    "InvalidRollback",
    "InvalidTransition",
    "Pipeline",
    "PipelineError",
    "RuleViolation",
    "Run",
    "RunAlreadyExists",
    "RunAlreadyFinished",
    "RunNotFound",
    "RunState",
    "StagetrailError",
    "Store",
    "StoreError",
    "TaskError",
]
