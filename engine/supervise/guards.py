"""What may stop an attempt before it runs: the breaker, and the progress policy.

Both read the run's folded state (a `RunWatch`, or the persistent circuits of a
pipeline) and record what they decide before the supervisor calls anything.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import attrs

from engine.errors import CircuitOpen
from engine.run import Run, unit_of
from engine.supervise.breaker import Circuit, CircuitStates
from engine.supervise.policies import CircuitBreaker, ProgressPolicy
from engine.supervise.reader import RunReader
from engine.supervise.watch import RunWatch
from events import JSON, CircuitHalfOpened

CLOSED = Circuit()
"""A circuit no failure has touched."""

_DETECTED = {
    "max_steps": "{steps} steps taken without finishing (max_steps={limit})",
    "no_progress": "{consecutive_no_ops} observations in a row without a changed file, "
    "diagnostic or test result (max_consecutive_no_ops={limit})",
    "same_error": "the same test failure {last_test_signature!r} {same_error_count} times "
    "in a row (max_same_error={limit})",
}


class BreakerGuard:
    """A `CircuitBreaker` applied to runs: reads each stage's circuit, admits or refuses."""

    def __init__(
        self, engine: RunReader, breaker: CircuitBreaker, clock: Callable[[], float]
    ) -> None:
        self.engine = engine
        self.breaker = breaker
        self.clock = clock

    def circuit(self, run: Run, stage: str, watch: RunWatch) -> Circuit:
        """The stage's circuit: from the run's own events, or from all runs of its pipeline."""
        if self.breaker.scope == "run":
            return watch.circuits.get(stage, CLOSED)
        unit_of(run).commit()  # the other runs' circuits are read from the store: this run's too
        projections = self.engine.projections
        if CircuitStates.name not in projections.names:
            projections.register(CircuitStates)
        projections.catch_up([CircuitStates.name])
        circuits = projections.get(CircuitStates.name, run.pipeline.name) or {}
        return circuits.get(stage, CLOSED)  # type: ignore[no-any-return]

    def admit(self, run: Run, stage: str, watch: RunWatch) -> Circuit:
        """The circuit the next attempt runs under; half-opens it, or refuses with `CircuitOpen`."""
        circuit = self.circuit(run, stage, watch)
        if circuit.status == "closed" or (circuit.status, self.breaker.scope) == (
            "half_open",
            "run",
        ):
            return circuit  # in one run, a half-open circuit's trial is this attempt
        wait = self.breaker.waits(circuit, datetime.fromtimestamp(self.clock(), UTC))
        if wait > 0:
            trial = "a trial is under way in another run"
            why = circuit.reason if circuit.status == "open" else trial
            rejected = {"stage": stage, "retry_after": wait, "opened_because": circuit.reason}
            run.note("circuit_rejected", rejected)
            raise CircuitOpen(run.id, stage, wait, why)
        since = circuit.status.replace("_", "-")
        reason = f"{since} for {self.breaker.reset_timeout:g} s (reset_timeout); one trial allowed"
        run.record(CircuitHalfOpened, stage=stage, reason=reason)
        return attrs.evolve(circuit, status="half_open")


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
        "last_failures": [list(failure) for failure in watch.recent_failures],
        "policy": attrs.asdict(policy),
    }
    return status, reason
