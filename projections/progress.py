"""Progress of a run: steps taken, loops without change, the same error again and again.

`ProgressState` folds stage outcomes and `ProgressObserved` events;
`Progress.evaluate(policy)` tells a supervisor whether to go on, give up as
stuck, or stop with a partial success.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import attrs

from events import JSON, Event, ProgressObserved, StageCompleted, StageFailed
from events.values import maker
from projections.base import Projection, folds_with, on
from projections.stretches import folded_in_stretches

DECISIONS = ("continue", "stuck", "partial")
"""What `Progress.evaluate` may decide."""


class ProgressLimits(Protocol):
    """The limits `Progress.evaluate` reads (the supervisor's `ProgressPolicy` has them)."""

    @property
    def max_steps(self) -> int | None:
        """Stop after this many stage outcomes (None: no limit)."""

    @property
    def max_consecutive_no_ops(self) -> int | None:
        """Stop after this many observations in a row without a change."""

    @property
    def max_same_error(self) -> int | None:
        """Stop after the same failing test signature this many times in a row."""

    @property
    def accept_partial(self) -> bool:
        """Whether a stop whose last observation was functional ends as a partial success."""


def _decision(instance: object, field: attrs.Attribute[Any], value: object) -> None:
    if value not in DECISIONS:
        raise ValueError(f"{field.name} must be one of {DECISIONS}, got {value!r}")


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Verdict:
    """A decision of `Progress.evaluate` and why (`{}` when the run may continue)."""

    decision: str = attrs.field(validator=_decision)
    reason: dict[str, JSON] = attrs.field(factory=dict)

    @property
    def stopped(self) -> bool:
        """Whether the run should stop (stuck or partial)."""
        return self.decision != "continue"


@attrs.frozen(weakref_slot=False)  # no weakref slot of its own: built through its writable twin
class Progress:
    """Counters of steps, changes and repeated test failures."""

    total_steps: int = 0
    last_progress_step: int = 0
    consecutive_no_ops: int = 0
    same_error_count: int = 0
    last_test_signature: str | None = None
    last_diagnostics_signature: str | None = None
    functional_ok: bool | None = None

    def evaluate(self, policy: ProgressLimits) -> Verdict:
        """Continue, or stop as stuck or partial when a limit of `policy` is reached.

        Rules in order: max_steps, no_progress, same_error; a None limit is off.
        """
        rules = (
            ("max_steps", self.total_steps, policy.max_steps),
            ("no_progress", self.consecutive_no_ops, policy.max_consecutive_no_ops),
            ("same_error", self.same_error_count, policy.max_same_error),
        )
        for rule, value, limit in rules:
            if limit is not None and value >= limit:
                return Verdict(self._stop(policy), self._reason(rule, limit))
        return Verdict("continue")

    def _stop(self, policy: ProgressLimits) -> str:
        return "partial" if policy.accept_partial and self.functional_ok is True else "stuck"

    def _reason(self, rule: str, limit: int) -> dict[str, JSON]:
        return {
            "rule": rule,
            "steps": self.total_steps,
            "consecutive_no_ops": self.consecutive_no_ops,
            "same_error_count": self.same_error_count,
            "last_test_signature": self.last_test_signature,
            "last_diagnostics_signature": self.last_diagnostics_signature,
            "limit": limit,
        }

    def observed(self, event: ProgressObserved) -> Progress:
        """The counters after an observation; a signal it does not carry keeps its value.

        Progress is a changed file, or a diagnostics or test signature that differs
        from the last one seen. An observation of changed files that shows none counts
        one more no-op; a test signature equal to the last counts one more same error.
        """
        files, diagnostics, test, ok = (
            event.changed_files,
            event.diagnostics_signature,
            event.test_signature,
            event.functional_ok,
        )
        # "" (reported: nothing) and None (never observed) both mean no signature: a
        # first report of nothing is no change.
        changed = (
            bool(files)
            or (diagnostics is not None and diagnostics != (self.last_diagnostics_signature or ""))
            or (test is not None and test != (self.last_test_signature or ""))
        )
        no_ops = 0 if changed else self.consecutive_no_ops + (files is not None)
        return attrs.evolve(
            self,
            last_progress_step=self.total_steps if changed else self.last_progress_step,
            consecutive_no_ops=no_ops,
            same_error_count=self.same_error_count if test is None else self._same_error(test),
            last_test_signature=self.last_test_signature if test is None else test,
            last_diagnostics_signature=(
                self.last_diagnostics_signature if diagnostics is None else diagnostics
            ),
            functional_ok=self.functional_ok if ok is None else ok,
        )

    def _same_error(self, signature: str) -> int:
        if not signature:  # "": nothing fails
            return 0
        return self.same_error_count + 1 if signature == self.last_test_signature else 1


_PROGRESS = maker(Progress)


class ProgressState(Projection[Progress]):
    """Steps, no-op streaks and repeated errors, for detecting runs that are stuck."""

    scope = "run"

    def initial(self) -> Progress:
        """No steps and no observations yet."""
        return Progress()

    @on(StageCompleted, StageFailed)
    def step(self, state: Progress, event: StageCompleted | StageFailed) -> Progress:
        """Count a stage outcome as a step (not a routed verdict: no stage ran)."""
        if not event.attempt:
            return state
        return _PROGRESS(  # by position (`maker`): this runs for every outcome recorded
            state.total_steps + 1,
            state.last_progress_step,
            state.consecutive_no_ops,
            state.same_error_count,
            state.last_test_signature,
            state.last_diagnostics_signature,
            state.functional_ok,
        )

    @on(ProgressObserved)
    def observed(self, state: Progress, event: ProgressObserved) -> Progress:
        """Fold an observation of what changed."""
        return state.observed(event)

    def _fold(
        self, events: Iterable[Event], current: Progress, tick: Callable[[], None]
    ) -> Progress:
        """`Projection._fold`, each stretch of outcomes counted (`_Stepping`), the counters
        made once at its end rather than per outcome. The same state as `apply` event after
        event."""
        if not folds_with(self, ProgressState, StageCompleted, StageFailed):
            return Projection._fold(self, events, current, tick)  # a subclass: its own way
        return folded_in_stretches(self.name, self.apply, _Stepping, events, current, tick)

    def encode(self, state: Progress) -> JSON:
        """The counters as a JSON object."""
        return attrs.asdict(state)

    def decode(self, data: JSON) -> Progress:
        """The counters `encode` turned into `data`."""
        return Progress(**data)


class _Stepping:
    """Outcomes counted as steps from a `Progress` (`ProgressState._fold`), the counters made
    when asked for, as `ProgressState.step` would have made them one outcome after another."""

    __slots__ = ("start", "steps")

    def __init__(self, start: Progress) -> None:
        self.start, self.steps = start, 0

    def took(self, event: StageCompleted | StageFailed) -> bool:
        """Count `event` as a step as `ProgressState.step` would (always taken)."""
        if event.attempt:  # not a routed verdict: a stage ran
            self.steps += 1
        return True

    def made(self) -> Progress:
        """The counters after the outcomes counted (the state it began from if none was a step)."""
        start = self.start
        if not self.steps:
            return start
        return _PROGRESS(
            start.total_steps + self.steps,
            start.last_progress_step,
            start.consecutive_no_ops,
            start.same_error_count,
            start.last_test_signature,
            start.last_diagnostics_signature,
            start.functional_ok,
        )
