"""The supervisor: runs stage and task functions, retries them, trips breakers and
stops stuck runs, recording every decision as events.

`policies` holds the three policies side by side (`RetryPolicy`,
`CircuitBreaker`, `ProgressPolicy`); `breaker` the breaker's state derived from
events; `decisions` the pure generator that decides; `supervisor` the sync and
async drivers that only call, await and sleep; `context` what an adaptive
policy or a stage function may read; `watch` the per-run fold the decisions read.
"""

from __future__ import annotations

from engine.supervise.breaker import Circuit, CircuitStates
from engine.supervise.context import StageContext
from engine.supervise.outcome import Outcome, Rollback, Spent
from engine.supervise.policies import CircuitBreaker, ProgressPolicy, RetryPolicy, SpendingLimit
from engine.supervise.reader import RunReader
from engine.supervise.supervisor import FINISHED, Supervisor

__all__ = [
    "Circuit",
    "CircuitBreaker",
    "CircuitStates",
    "FINISHED",
    "Outcome",
    "ProgressPolicy",
    "RetryPolicy",
    "Rollback",
    "RunReader",
    "SpendingLimit",
    "Spent",
    "StageContext",
    "Supervisor",
]
