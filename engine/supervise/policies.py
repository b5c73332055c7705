"""The supervisor's three policies, side by side: retry, circuit breaker, progress.

All are frozen attrs values: a policy decides from facts (the failure, the
retry number, a random draw, a circuit's counts, a run's progress) and never
sleeps or reads a clock itself.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import attrs

from engine.supervise import validators as check
from engine.supervise.breaker import Circuit
from events import JSON

DEFAULT_MAX_DELAY = 60.0
"""The cap of a retry's delay when `RetryPolicy` is not given one and its `delay` is shorter."""


def _failure_outcomes(value: object) -> tuple[tuple[type[BaseException], str], ...]:
    """`{ExceptionType: "outcome"}` as pairs, checked: classes to non-empty outcome names."""
    if not isinstance(value, Mapping):
        raise ValueError(f"outcomes must map exception classes to outcomes, got {value!r}")
    pairs = []
    for kind, outcome in value.items():
        _exception_types(kind)
        if type(outcome) is not str or not outcome:
            raise ValueError(f"outcomes[{kind.__name__}] must be a non-empty str, got {outcome!r}")
        pairs.append((kind, outcome))
    return tuple(pairs)


def _exception_types(value: object) -> tuple[type[BaseException], ...]:
    types = value if isinstance(value, tuple | list) else (value,)
    for kind in types:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise ValueError(f"expected exception classes, got {kind!r}")
    return tuple(types)


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """How often and how soon a failed attempt is tried again.

    Attributes:
        max_retries: retries after the first failure of a stage (its failures since
            its last completion count, so the budget survives a restart).
        delay: seconds before the first retry.
        backoff: multiplier of the delay for each further retry.
        max_delay: the delay never exceeds this (default 60 s, or `delay` when that is
            longer: ``RetryPolicy(delay=180, backoff=1.5)`` waits 180 s every time).
        jitter: a random share (0-1) added or taken off each delay.
        timeout: seconds an attempt may take; a late attempt fails as ``"Timeout"``.
        retry_on: exception types that may be retried.
        give_up_on: exception types never retried (checked first).
        outcomes: the outcome a failure with an exception of a type records (the
            first type that matches, in order; else ``"failed"``), so the table can
            route it: ``{ToolError: "error_occurred"}``.
        budget: what `max_retries` counts: ``"stage"`` (default), the stage's failures
            since its last completion; or ``"run"``, the failures of the whole run (a
            run-wide budget, for tables that move failures between stages).
        count_routed: whether a failure the table routes to another state spends the
            budget of the stage that failed (default True: a loop through the table
            still ends). The failure itself is never retried where it happened.
        count_interrupted: whether an attempt a crash cut short (``Interrupted``,
            recorded by `engine.resume`) spends the budget (default False: a
            process killed four times has not failed four times).
        forget_rolled_back: whether a failure taken off the stack by a rollback stops
            spending the budget (default True: a rolled-back round is undone).

    Raises:
        ValueError: a field out of range, or a `delay` above a `max_delay` you gave
            (every delay would be cut to `max_delay`: raise it, or lower `delay`).
    """

    max_retries: int = attrs.field(default=3, validator=check.count)
    delay: float = attrs.field(default=1.0, validator=check.non_negative)
    backoff: float = attrs.field(default=2.0, validator=check.at_least_one)
    max_delay: float = attrs.field(
        default=attrs.Factory(lambda policy: max(DEFAULT_MAX_DELAY, policy.delay), takes_self=True),
        validator=check.non_negative,
    )
    jitter: float = attrs.field(default=0.0, validator=check.fraction)
    timeout: float | None = attrs.field(default=None, validator=check.timeout)
    retry_on: tuple[type[BaseException], ...] = attrs.field(
        default=(Exception,), converter=_exception_types
    )
    give_up_on: tuple[type[BaseException], ...] = attrs.field(
        default=(), converter=_exception_types
    )
    outcomes: tuple[tuple[type[BaseException], str], ...] = attrs.field(
        factory=dict, converter=_failure_outcomes
    )
    budget: str = attrs.field(default="stage", validator=check.budget)
    count_routed: bool = attrs.field(default=True, validator=check.boolean)
    count_interrupted: bool = attrs.field(default=False, validator=check.boolean)
    forget_rolled_back: bool = attrs.field(default=True, validator=check.boolean)

    def __attrs_post_init__(self) -> None:
        if self.delay > self.max_delay:
            raise ValueError(
                f"delay={self.delay:g} is above max_delay={self.max_delay:g}, which would cut "
                f"every delay to {self.max_delay:g} s; raise max_delay or lower delay"
            )

    def outcome_for(self, error: BaseException) -> str:
        """The outcome a failure with `error` records: the first matching type's, or "failed"."""
        for kind, outcome in self.outcomes:
            if isinstance(error, kind):
                return outcome
        return "failed"

    def retryable(self, error: BaseException) -> bool:
        """Whether `error` may be retried at all (`give_up_on` wins over `retry_on`)."""
        return not isinstance(error, self.give_up_on) and isinstance(error, self.retry_on)

    def delay_for(self, retry: int, rng: random.Random | None = None) -> float:
        """The delay before retry number `retry` (1-based): backoff, cap, then jitter."""
        try:
            base = min(self.delay * self.backoff ** (retry - 1), self.max_delay)
        except OverflowError:  # a huge retry number: the cap was reached long ago
            base = self.max_delay
        if not self.jitter or not base:
            return float(base)
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return float(min(max(0.0, base * (1 + spread)), self.max_delay))

    def to_json(self) -> dict[str, JSON]:
        """The policy as JSON, recorded with each decision it made."""
        return {
            "max_retries": self.max_retries,
            "delay": self.delay,
            "backoff": self.backoff,
            "max_delay": self.max_delay,
            "jitter": self.jitter,
            "timeout": self.timeout,
            "retry_on": [kind.__name__ for kind in self.retry_on],
            "give_up_on": [kind.__name__ for kind in self.give_up_on],
            "outcomes": {kind.__name__: outcome for kind, outcome in self.outcomes},
            "budget": self.budget,
            "count_routed": self.count_routed,
            "count_interrupted": self.count_interrupted,
            "forget_rolled_back": self.forget_rolled_back,
        }


@attrs.frozen(kw_only=True)
class CircuitBreaker:
    """When a stage's calls should fail fast, and for how long.

    Attributes:
        fail_max: consecutive failures that trip the breaker (None: off).
        failure_rate: trip when this share of the last `window` attempts failed (None: off).
        window: how many recent attempts the failure rate looks at.
        reset_timeout: seconds an open breaker waits before letting one trial through.
        scope: ``"run"`` (default) or ``"pipeline"`` (across all runs of the pipeline).
        forget_rolled_back: whether a failure a rollback took off the run's stack stops
            counting towards tripping (default False: the call did fail, whatever the
            stack says). Only with ``scope="run"``; it never closes an open breaker.
    """

    fail_max: int | None = attrs.field(default=5, validator=check.positive_or_none)
    failure_rate: float | None = attrs.field(default=None, validator=check.rate_or_none)
    window: int = attrs.field(default=10, validator=check.window)
    reset_timeout: float = attrs.field(default=60.0, validator=check.non_negative)
    scope: str = attrs.field(default="run", validator=check.scope)
    forget_rolled_back: bool = attrs.field(default=False, validator=check.boolean)

    def __attrs_post_init__(self) -> None:
        if self.forget_rolled_back and self.scope != "run":
            raise ValueError(
                f"forget_rolled_back=True needs scope='run', not scope={self.scope!r}: a "
                "rollback undoes one run's stack, not the pipeline's other runs"
            )

    def waits(self, circuit: Circuit, now: datetime) -> float:
        """Seconds before `circuit` lets a trial through (0 when it may now).

        An open circuit waits `reset_timeout` from its opening. Across a pipeline, a
        half-open circuit has a trial under way in some run: others wait for its end,
        or for `reset_timeout` after it began if that trial was cut short.
        """
        waiting = circuit.status == "open" or (
            circuit.status == "half_open" and self.scope == "pipeline"
        )
        if not waiting or circuit.opened_at is None:
            return 0.0
        return max(0.0, self.reset_timeout - (now - circuit.opened_at).total_seconds())

    def trips(self, circuit: Circuit) -> str | None:
        """Why `circuit`, which has just counted a failure, should open; None if it should not."""
        if circuit.status == "half_open":
            return "the trial attempt failed"
        counted = "; rolled-back failures not counted" if self.forget_rolled_back else ""
        if self.fail_max is not None and circuit.consecutive >= self.fail_max:
            return f"{circuit.consecutive} consecutive failures (fail_max={self.fail_max}{counted})"
        rate = circuit.failure_rate(self.window)
        if self.failure_rate is not None and rate is not None and rate >= self.failure_rate:
            return (
                f"{rate:.0%} of the last {self.window} attempts failed "
                f"(failure_rate={self.failure_rate}{counted})"
            )
        return None

    def to_json(self) -> dict[str, JSON]:
        """The settings as JSON, for the record of a decision."""
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class ProgressPolicy:
    """When a run counts as stuck: limits on steps, no-op steps and a repeated error."""

    max_steps: int | None = attrs.field(default=None, validator=check.positive_or_none)
    max_consecutive_no_ops: int | None = attrs.field(default=None, validator=check.positive_or_none)
    max_same_error: int | None = attrs.field(default=None, validator=check.positive_or_none)
    accept_partial: bool = attrs.field(default=False, validator=check.boolean)

    @classmethod
    def strict(cls, **overrides: Any) -> ProgressPolicy:
        """50 steps, 3 no-ops, 3 same errors; partial success is not accepted."""
        defaults = {"max_steps": 50, "max_consecutive_no_ops": 3, "max_same_error": 3}
        return cls(**{**defaults, "accept_partial": False, **overrides})

    @classmethod
    def lenient(cls, **overrides: Any) -> ProgressPolicy:
        """100 steps, 6 no-ops, 5 same errors; partial success is accepted."""
        defaults = {"max_steps": 100, "max_consecutive_no_ops": 6, "max_same_error": 5}
        return cls(**{**defaults, "accept_partial": True, **overrides})


@attrs.frozen(kw_only=True)
class SpendingLimit:
    """How much a run may spend (its `BudgetSpent` events in one unit) before work stops.

    Attributes:
        limit: the most the run may spend; once its spending reaches it, the next
            attempt is refused and the run finishes ``failed`` with a ``budget`` reason.
        unit: the unit counted (``"usd"``, ``"tokens"``...); other units are not.
        scope: ``"run"`` (default): the run's own spending; ``"tree"``: the spending of
            every run in its tree (its topmost parent run and all that run's children),
            for a coordinator whose child runs share one budget.
    """

    limit: float = attrs.field(validator=check.positive)
    unit: str = attrs.field(default="usd", validator=check.name)
    scope: str = attrs.field(default="run", validator=check.spending_scope)

    def to_json(self) -> dict[str, JSON]:
        """The limit as JSON, recorded with the decision it made."""
        return {"limit": self.limit, "unit": self.unit, "scope": self.scope}
