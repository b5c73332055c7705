"""The write side of stagetrail: pipelines, runs, the engine, and its subsystems.

The core lives in this folder (`engine.engine`, `run`, `machine`, `pipeline`,
`verify`; `sharded` opens several stores as one engine); `store/` persists
events, `readside/` keeps projections in the store, `supervise/` runs stage
functions under policies, `cli/` is the command line, `integrations/` holds
framework adapters.

This package exports the nouns a user records with and the errors the design's
contract names; every error class is importable from `engine.errors`, and each
other name from the module that owns it (`engine.store.Store`,
`engine.verify.VerifyReport`, `engine.supervise.Circuit`, ...).

Each name is imported from its module on first use, so a program that needs
one corner of the package (`stagetrail --version`) does not load all of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from engine.retention import RetentionRule
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
    "RetentionRule",
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

_HOMES = {
    "Engine": "engine.engine",
    "Pipeline": "engine.pipeline",
    "RetentionRule": "engine.retention",
    "Run": "engine.run",
    **dict.fromkeys(
        ["CircuitOpen", "ConcurrencyConflict", "InvalidTransition", "RunNotFound"],
        "engine.errors",
    ),
    **dict.fromkeys(["StageGaveUp", "StagetrailError", "StoreError"], "engine.errors"),
    **dict.fromkeys(
        ["CircuitBreaker", "CircuitStates", "Outcome", "ProgressPolicy", "RetryPolicy"],
        "engine.supervise",
    ),
    **dict.fromkeys(
        ["Rollback", "SpendingLimit", "Spent", "StageContext", "Supervisor"], "engine.supervise"
    ),
}


def __getattr__(name: str) -> Any:
    """A name of `__all__`, imported from its module on first use (then kept here)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
