"""The write side of stagetrail: pipelines, runs, the engine, and its subsystems.

The core lives in this folder (`engine.engine`, `run`, `machine`, `pipeline`,
`verify`); `store/` persists events, `readside/` keeps projections in the store,
`supervise/` runs stage functions under policies, `cli/` is the command line,
`integrations/` holds framework adapters.

This package exports the nouns a user records with and the errors the design's
contract names; every error class is importable from `engine.errors`, and each
other name from the module that owns it (`engine.store.Store`,
`engine.verify.VerifyReport`, `engine.supervise.Circuit`, ...).
"""

from __future__ import annotations

from engine.engine import Engine
from engine.errors import (
    CircuitOpen,
    ConcurrencyConflict,
    InvalidTransition,
    RunNotFound,
    StageGaveUp,
    StagetrailError,
    StoreError,
)
from engine.pipeline import Pipeline
from engine.run import Run
from engine.supervise import (
    CircuitBreaker,
    CircuitStates,
    Outcome,
    ProgressPolicy,
    RetryPolicy,
    Rollback,
    SpendingLimit,
    Spent,
    StageContext,
    Supervisor,
)

__all__ = [
    "CircuitBreaker",
    "CircuitOpen",
    "CircuitStates",
    "ConcurrencyConflict",
    "Engine",
    "InvalidTransition",
    "Outcome",
    "Pipeline",
    "ProgressPolicy",
    "RetryPolicy",
    "Rollback",
    "Run",
    "RunNotFound",
    "SpendingLimit",
    "Spent",
    "StageContext",
    "StageGaveUp",
    "StagetrailError",
    "StoreError",
    "Supervisor",
]
