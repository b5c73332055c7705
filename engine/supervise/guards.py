"""What may stop an attempt before it runs: the breaker, and the progress policy.

Both judge folded state they are given (a circuit, a `RunWatch`) and say what
to record; the decision generator yields it, the driver records it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from uuid import UUID

import attrs

from engine.errors import CircuitOpen
from engine.supervise.breaker import Circuit
from engine.supervise.commands import Record
from engine.supervise.policies import CircuitBreaker, ProgressPolicy
from engine.supervise.watch import RunWatch
from events import JSON, CircuitHalfOpened, NoteAdded

CLOSED = Circuit()
"""A circuit no failure has touched."""

_DETECTED = {
    "max_steps": "{steps} steps taken without finishing (max_steps={limit})",
    "no_progress": "{consecutive_no_ops} observations in a row without a changed file, "
    "diagnostic or test result (max_consecutive_no_ops={limit})",
    "same_error": "the same test failure {last_test_signature!r} {same_error_count} times "
    "in a row (max_same_error={limit})",
}


@attrs.frozen
class Admission:
    """A breaker's answer to the next attempt: the circuit it runs under, what to record,
    and the error to raise instead of calling (None: the call goes ahead)."""

    circuit: Circuit
    record: Record | None = None
    refused: CircuitOpen | None = None


class BreakerGuard:
    """A `CircuitBreaker` applied to runs: judges each stage's circuit, admits or refuses."""

    def __init__(self, breaker: CircuitBreaker, clock: Callable[[], float]) -> None:
        self.breaker = breaker
        self.clock = clock

    def admit(self, run_id: UUID, stage: str, circuit: Circuit) -> Admission:
        """Whether the next attempt runs under `circuit`; half-opens it, or refuses."""
        scope = self.breaker.scope
        if circuit.status == "closed" or (circuit.status, scope) == ("half_open", "run"):
            return Admission(circuit)  # in one run, a half-open circuit's trial is this attempt
        wait = self.breaker.waits(circuit, datetime.fromtimestamp(self.clock(), UTC))
        if wait > 0:
            trial = "a trial is under way in another run"
            why = circuit.reason if circuit.status == "open" else trial
            rejected = {"stage": stage, "retry_after": wait, "opened_because": circuit.reason}
            note = Record(((NoteAdded, {"key": "circuit_rejected", "value": rejected}),))
            return Admission(circuit, note, CircuitOpen(run_id, stage, wait, why))
        since = circuit.status.replace("_", "-")
        reason = f"{since} for {self.breaker.reset_timeout:g} s (reset_timeout); one trial allowed"
        half_open = Record(((CircuitHalfOpened, {"stage": stage, "reason": reason}),))
        return Admission(attrs.evolve(circuit, status="half_open"), half_open)


def progress_stop(
    policy: ProgressPolicy, watch: RunWatch, stage: str
) -> tuple[str, dict[str, JSON]] | None:
    """The status and structured reason to finish the run with, if the policy stops it."""
    verdict = watch.progress.evaluate(policy)
    if not verdict.stopped:
        return None
    status = "aborted_stuck" if verdict.decision == "stuck" else "done_partial"
    reason: dict[str, JSON] = {
        **verdict.reason,
        "detected": _DETECTED[verdict.reason["rule"]].format(**verdict.reason),
        "stage": stage,
        "last_failures": [list(failure) for failure in watch.failures.recent],
        "policy": attrs.asdict(policy),
    }
    return status, reason
